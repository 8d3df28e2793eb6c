"""``cdcflow replay``: rebuild Silver from Bronze into shadow tables; verify or apply it.

Exit code 0 when the replay (and ``--verify``) succeeded, 1 when ``--verify`` found a
difference between the rebuilt and the live Silver.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.config import CdcflowConfig
from cdcflow.errors import UsageError
from cdcflow.plan.replay import DEFAULT_BUCKET_ROWS

if TYPE_CHECKING:
    from cdcflow.engines.local.replay import ReplayResult


def run_replay(
    config: CdcflowConfig,
    verify: bool = False,
    apply: bool = False,
    to_version: int | None = None,
    bucket_rows: int = DEFAULT_BUCKET_ROWS,
    show_progress: bool = True,
) -> ReplayResult:
    """Rebuild the shadow tables, then verify and/or apply, showing progress on a terminal.

    Returns:
        The :class:`~cdcflow.engines.local.replay.ReplayResult`.

    The replay runs on the local engine (delta-rs + Polars) whatever ``pipeline.engine`` says:
    both engines write the same tables, so a Spark pipeline is replayed the same way (e.g. to
    migrate its Silver to another ``processing.delete_mode``).

    Raises:
        UsageError: ``--apply`` with ``--to-version``.
        ReplayError: Bronze moved since the rebuild.
    """
    from cdcflow.cli.progress import working
    from cdcflow.engines.local import replay as engine_replay

    with working("replay: rebuilding from bronze", unit="buckets", enabled=show_progress) as work:

        def on_bucket(done: int, total: int) -> None:
            work.update(completed=done, total=total)

        result = engine_replay.rebuild_shadow(config, to_version, bucket_rows, on_bucket)
    if verify:
        with working("replay: comparing with the live silver", enabled=show_progress):
            engine_replay.verify(config, result)
    if apply:
        with working("replay: replacing silver with the rebuilt state", enabled=show_progress):
            engine_replay.apply(config, result)
    return result


def replay_table(result: ReplayResult) -> Table:
    """Rich summary of a replay."""
    table = Table(title=f"replay from bronze v{result.bronze_version} ({result.delete_mode} mode)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("bronze rows", result.bronze_rows),
        ("duplicates skipped", result.duplicates),
        ("buckets", result.buckets),
        ("events re-validated", result.events),
        ("rejected on replay", sum(result.rejected.values())),
        ("sequence mismatches", result.sequence_mismatches),
        ("silver rows rebuilt", result.silver_rows),
        ("tombstones rebuilt", result.tombstone_rows),
        ("seconds", f"{result.seconds:.2f}"),
    ]
    if result.verified is not None:
        rows.append(("verified vs live silver", "yes" if result.verified else "NO"))
    if result.applied_version is not None:
        rows.append(("silver version written", result.applied_version))
        rows.append(("replay id", f"{result.replay_id}{' (resumed)' if result.resumed else ''}"))
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def _replay_declared(
    cfg: CdcflowConfig, verify: bool, apply: bool, to_version: int | None, output: str
) -> None:
    """``replay --verify`` / ``--apply`` of declared tables (:mod:`cdcflow.layers.
    contract_replay`, :mod:`cdcflow.engines.local.contract_replay`)."""
    from cdcflow.cli.progress import working
    from cdcflow.cli.reconcile import print_report
    from cdcflow.layers.contract_replay import replay_tables

    if not (verify or apply):
        raise UsageError("replay: declared tables are replayed with --verify and/or --apply")
    if apply and to_version is not None:
        raise UsageError("replay: --apply rebuilds from the latest Bronze (no --to-version)")
    with working("replay: rebuilding each declared table from bronze", enabled=output == "text"):
        results = replay_tables(cfg, to_version)
    replay_id = None
    if apply:
        from cdcflow.engines.local.contract_replay import apply_tables

        with working("replay: writing each rebuilt Silver", enabled=output == "text"):
            replay_id = apply_tables(cfg, results)
            results = replay_tables(cfg)  # the written state, checked again
    if output == "json":
        typer.echo(json.dumps([r.to_json() for r in results], indent=1, default=str))
    else:
        for r in results:
            rejected = sum(r.rejected.values())
            verdict = "[green]verified[/]" if r.verified else "[red]DIFFERENT[/]"
            console.print(
                f"{r.table}: bronze v{r.bronze_version}, {r.events} events re-validated, "
                f"{rejected} rejected on replay, {r.silver_rows} Silver rows rebuilt: {verdict}",
                soft_wrap=True,
            )
            if r.report is not None and not r.report.ok:
                print_report(r.report)
        if replay_id is not None:
            console.print(f"replay {replay_id} applied: every declared table's Silver rewritten")
    if not all(r.verified for r in results):
        raise typer.Exit(1)


def _check_bronze(cfg: CdcflowConfig, to_version: int | None) -> None:
    """Each Bronze table a replay reads exists, and holds ``to_version``.

    Raises:
        UsageError: no such table yet (the pipeline has not run), or no such version.
    """
    from cdcflow.cli.app import existing_table
    from cdcflow.errors import TableError
    from cdcflow.layers.asof import open_version
    from cdcflow.layers.contract_replay import held_contracts
    from cdcflow.layers.tables import BRONZE

    names = [c.table_names.bronze for c in held_contracts(cfg)] if cfg.tables else [BRONZE.name]
    for name in names:
        existing_table(cfg, name, "replay")
        if to_version is not None:  # after the latest, or vacuumed away (optimize, erase)
            try:
                open_version(cfg, name, to_version)
            except TableError as exc:
                raise UsageError(f"--to-version {to_version}: {exc}") from None


def replay(
    config: ConfigOption,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compare the rebuilt state with the live Silver.")
    ] = False,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Replace Silver and the tombstones with the rebuilt state and record the"
            " delete mode (re-run it to finish an interrupted --apply).",
        ),
    ] = False,
    to_version: Annotated[
        int | None, typer.Option(min=0, help="Read Bronze at this Delta version.")
    ] = None,
    bucket_rows: Annotated[
        int, typer.Option(min=1, help="Bronze rows per customer hash bucket (memory bound).")
    ] = DEFAULT_BUCKET_ROWS,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """Rebuild Silver from Bronze alone into _shadow/ tables; --verify or --apply it."""
    from cdcflow.cli.reconcile import print_report

    if output not in ("text", "json"):
        raise UsageError(f"--output: expected text or json, got {output!r}")
    if verify and apply:  # the usage line offers one or the other
        raise UsageError(
            "replay: give one of --verify (compare) or --apply (replace Silver): run --verify "
            "first, then --apply"
        )
    cfg = load(config, declared_tables=True)
    _check_bronze(cfg, to_version)
    if cfg.tables:
        _replay_declared(cfg, verify, apply, to_version, output)
        return
    result = run_replay(cfg, verify, apply, to_version, bucket_rows, show_progress=output == "text")
    if output == "json":
        typer.echo(json.dumps(result.to_json(), indent=1, default=str))
    else:
        console.print(replay_table(result))
        for report in (result.silver_report, result.tombstone_report):
            if report is not None:
                print_report(report)
    if result.verified is False:
        raise typer.Exit(1)
