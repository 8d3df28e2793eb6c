"""``cdcflow erase``: the right to erasure — purge data subjects' personal data from every layer
(:mod:`cdcflow.layers.erasure`), show the erasure log (``--status``) or prove an erasure
(``--verify``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from cdcflow.cli.options import ConfigOption, WaitOption, parse_wait


def erase(
    config: ConfigOption,
    table: Annotated[
        str | None,
        typer.Option(help="the table (a contract's name) [default: customers, or the only one]"),
    ] = None,
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key",
            help="a subject's key (repeat for several; a composite key as a JSON array or "
            "comma-separated)",
        ),
    ] = None,
    from_file: Annotated[Path | None, typer.Option(help="a file of keys, one per line")] = None,
    reason: Annotated[
        str,
        typer.Option(help="why (e.g. a ticket id), kept in audit/erasure_log; no personal data"),
    ] = "",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be redacted, write nothing")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", help="confirm that time travel of the changed tables ends at the erasure"
        ),
    ] = False,
    status: Annotated[
        bool,
        typer.Option(
            "--status", help="show audit/erasure_log instead of erasing (with --key: its rows)"
        ),
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="check that the --key subjects are erased (exit 1 when not); with --value, "
            "scan every file of the lakehouse and the checkpoint for those values",
        ),
    ] = False,
    value: Annotated[
        list[str] | None,
        typer.Option("--value", help="--verify: a value of the subject's data to search for"),
    ] = None,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
    wait: WaitOption = "0",
) -> None:
    """Erase the personal data (the columns a contract marks pii) of data subjects from Bronze,
    quarantine, Silver, history and Gold, vacuum those tables (their time travel ends there),
    sync Snowflake, and record the request in audit/erasure_log by a keyed hash of the key
    (docs/erasure.md)."""
    from cdcflow.cli.app import console, load
    from cdcflow.cli.progress import working
    from cdcflow.errors import ConfigError
    from cdcflow.layers import erasure as er

    if output not in ("text", "json"):
        raise ConfigError(f"--output: expected text or json, got {output!r}")
    patience = parse_wait(wait)
    cfg = load(config, declared_tables=True)
    names = [c.name for c in cfg.contracts()]
    name = table or ("customers" if "customers" in names or len(names) != 1 else names[0])
    if status:
        rows = er.erasure_log(cfg)
        if key:  # one subject's requests: found by the keyed hash of the key
            contract = er.find_contract(cfg, name)
            secret = er.erasure_key(cfg)
            hashes = [er.subject_hash(er.parse_key(k, contract), secret) for k in key]
            rows = rows.filter(
                (rows["table_name"] == contract.name) & rows["subject_hash"].is_in(hashes)
            )
        if output == "json":
            typer.echo(rows.write_json())
            return
        view = Table(title="audit/erasure_log")
        for column in ("request_id", "table_name", "subject_hash", "reason", "requested_at",
                       "completed_at", "status"):  # fmt: skip
            view.add_column(column)
        for row in rows.sort("requested_at").iter_rows(named=True):
            view.add_row(
                row["request_id"], row["table_name"], row["subject_hash"][:16] + "…",
                row["reason"], f"{row['requested_at']:%Y-%m-%d %H:%M:%S}",
                "" if row["completed_at"] is None else f"{row['completed_at']:%Y-%m-%d %H:%M:%S}",
                row["status"],
            )  # fmt: skip
        console.print(view)
        return
    keys = list(key or [])
    if from_file is not None:
        try:
            text = from_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--from-file: cannot read {from_file} ({exc.strerror})") from None
        keys += [line.strip() for line in text.splitlines() if line.strip()]
    if any(not k.strip() for k in keys):
        raise ConfigError("--key: an empty key")
    if not keys:
        what = "--verify" if verify else "erase"
        raise ConfigError(f"{what}: give the subjects with --key or --from-file")
    if any(not v.strip() for v in value or []):
        raise ConfigError("--value: an empty value (it would be found in every file)")
    if verify:
        checks = er.verify_erasure(cfg, name, keys, list(value or []))
        if output == "json":
            typer.echo(json.dumps([vars(c) for c in checks], indent=1))
        else:
            for check in checks:
                mark = "PASS" if check.ok else "FAIL"
                detail = f" ({check.detail})" if check.detail else ""
                console.print(f"{mark}  {check.what}{detail}", markup=False, highlight=False)
        if not all(c.ok for c in checks):
            raise typer.Exit(1)
        return
    from cdcflow.engines.local.maintenance import checkpoint_lock
    from cdcflow.state.checkpoint import Checkpoint

    lock = checkpoint_lock(Checkpoint.of(cfg), wait=patience, command="erase")
    with lock, working("erase") as work:
        report = er.erase(
            cfg, name, keys, reason=reason, dry_run=dry_run, confirmed=yes,
            on_step=lambda step: work.update(detail=step),
        )  # fmt: skip
    if output == "json":
        typer.echo(json.dumps(report.to_json(), indent=1))
        return
    title = "erase (dry run: nothing written)" if dry_run else f"erase {report.request_id}"
    if report.unknown:
        title += f" — {report.unknown} key(s) held by no layer: left out"
    view = Table(title=title)
    view.add_column("table")
    view.add_column("rows redacted", justify="right")
    view.add_column("files vacuumed", justify="right")
    view.add_column("version", justify="right")
    for table_name in dict.fromkeys([*report.rows, *report.vacuumed]):
        view.add_row(
            table_name,
            str(report.rows.get(table_name, "-")),
            str(report.vacuumed.get(table_name, "-")),
            str(report.versions.get(table_name, "-")),
        )
    console.print(view)
    if not dry_run:
        console.print(
            f"{report.subjects} subject(s) erased from {name}; Snowflake: {report.snowflake}. "
            "Time travel of these tables now starts at the versions above.",
            markup=False,
            highlight=False,
        )
