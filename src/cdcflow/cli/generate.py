"""``cdcflow generate``: sample CDC landing files, plus the expected outcome for benchmarks.

With ``--config F`` naming a config that declares tables (``tables:``), it writes changes of
every declared table instead (:mod:`cdcflow.table_generator`), into the config's
``source.path`` unless ``--out`` says otherwise; ``--expected DIR`` then writes one
``<table>.parquet`` per table and ``counts.json``.

With ``--expected FILE`` it also writes the expected Silver state (public columns, one row per
customer_id; ``.parquet``, ``.csv`` or JSON lines) computed by the reference fold over the
valid, de-duplicated records in arrival order, and a JSON file of expected counts
(``--expected-counts``, default ``<FILE stem>.counts.json``): records, accepted, duplicates,
quarantined per reason, and Silver rows/active/deleted/tombstones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from cdcflow.cli.app import console
from cdcflow.cli.progress import working
from cdcflow.cli.tables import output_width
from cdcflow.errors import UsageError

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig
    from cdcflow.generator import GenerationSummary
    from cdcflow.table_generator import TablesSummary, TablesWorkload

NOTATIONS = ("postgres", "sqlserver", "decimal", "mixed")


def counts_path_for(expected: Path) -> Path:
    """Default path of the expected-counts JSON next to an expected-state file."""
    return expected.with_name(expected.stem + ".counts.json")


def write_expected(
    summary: GenerationSummary,
    expected: Path,
    counts_path: Path | None = None,
    delete_mode: str = "soft",
    customer_id_pattern: str = r"^C-[0-9]+$",
) -> dict[str, object]:
    """Write the expected Silver state and counts of generated records.

    Returns:
        The counts written (see :meth:`cdcflow.generator.ExpectedOutcome.counts`).
    """
    if delete_mode not in ("soft", "hard"):
        raise UsageError(f"--delete-mode: expected soft or hard, got {delete_mode!r}")
    from cdcflow.generator import expected_outcome
    from cdcflow.reconcile import frame_from_reference, write_state_file

    outcome = expected_outcome(summary.lines, delete_mode, customer_id_pattern)  # type: ignore[arg-type]
    write_state_file(frame_from_reference(outcome.state), expected)
    counts = outcome.counts()
    counts["delete_mode"] = delete_mode
    target = counts_path or counts_path_for(expected)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


def summary_table(
    summary: GenerationSummary,
    out: Path,
    expected: Path | None = None,
    expected_counts: Path | None = None,
    counts: dict[str, Any] | None = None,
    delete_mode: str = "soft",
) -> Table:
    """What ``generate`` wrote, one ``what | value`` line each: the landing files and records,
    and with ``--expected`` both files written (state, counts) and the expected counts."""
    table = Table(title="generate", title_justify="left")
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("landing folder", str(out))
    table.add_row("files", str(len(summary.files)))
    table.add_row(
        "records",
        f"{summary.records:,} ({summary.valid_events:,} changes, {summary.duplicates:,} "
        f"duplicates, {summary.invalid:,} invalid)",
    )
    if expected is not None and counts is not None:
        silver = counts["silver"]
        table.add_row("expected state", f"{expected} ({delete_mode} mode)")
        table.add_row("expected counts", str(expected_counts or counts_path_for(expected)))
        table.add_row(
            "expected Silver rows",
            f"{silver['rows']:,} ({silver['active']:,} active, {silver['deleted']:,} deleted, "
            f"{silver['tombstones']:,} tombstones)",
        )
        reasons = ", ".join(f"{k} {v:,}" for k, v in counts["quarantine"].items())
        table.add_row("expected quarantined", f"{counts['quarantined']:,} ({reasons})")
    return table


def write_tables_expected(
    summary: TablesSummary,
    config: CdcflowConfig,
    folder: Path,
    counts_path: Path | None = None,
) -> dict[str, Any]:
    """Write each declared table's expected Silver state and the expected counts.

    Files: ``<folder>/<table>.parquet`` (one row per key: the table's public Silver columns,
    :func:`cdcflow.reconcile.contract_state_frame`) and the counts JSON (default
    ``<folder>/counts.json``: per table accepted, duplicates, quarantine per reason and Silver
    rows / deleted / tombstones; ``unrouted`` per reason).

    Returns:
        The counts written.
    """
    from cdcflow.reconcile import contract_state_frame, write_state_file
    from cdcflow.table_generator import expected_tables

    contracts = config.contracts()
    outcomes, unrouted = expected_tables(
        summary.lines, contracts, max_clock_skew=config.processing.max_clock_skew
    )
    folder.mkdir(parents=True, exist_ok=True)
    for contract in contracts:
        frame = contract_state_frame(contract, outcomes[contract.name].state)
        write_state_file(frame, folder / f"{contract.name}.parquet")
    counts: dict[str, Any] = {
        "records": summary.records,
        "tables": {name: outcome.counts() for name, outcome in outcomes.items()},
        "unrouted": dict(sorted(unrouted.items())),
    }
    target = counts_path or folder / "counts.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    return counts


def tables_summary_table(
    summary: TablesSummary, out: Path, expected: Path | None, counts: dict[str, Any] | None
) -> Table:
    """What ``generate --config`` wrote for declared tables, one ``what | value`` line each."""
    table = Table(title="generate", title_justify="left")
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("landing folder", str(out))
    table.add_row("files", str(len(summary.files)))
    changes = sum(summary.changes.values())
    table.add_row(
        "records",
        f"{summary.records:,} ({changes:,} changes, {summary.duplicates:,} duplicates, "
        f"{summary.invalid:,} invalid)",
    )
    for name, n in summary.changes.items():
        table.add_row(f"  {name}", f"{n:,} changes")
    if expected is not None and counts is not None:
        table.add_row("expected state", f"{expected}/<table>.parquet")
        for name, tc in counts["tables"].items():
            silver = tc["silver"]
            reasons = ", ".join(f"{k} {v:,}" for k, v in tc["quarantine"].items()) or "none"
            table.add_row(
                f"  {name}",
                f"{silver['rows']:,} Silver rows ({silver['deleted']:,} deleted, "
                f"{silver['tombstones']:,} tombstones); quarantined {reasons}",
            )
        unrouted = ", ".join(f"{k} {v:,}" for k, v in counts["unrouted"].items()) or "none"
        table.add_row("  unrouted", unrouted)
    return table


def _landing_lines(out: Path) -> list[str]:
    """Every record of the generator's landing files in ``out``, in landing order."""
    from cdcflow.sources.files import content_lines

    lines: list[str] = []
    for path in sorted(out.glob("events-*.jsonl*")):
        for _, data, _ in content_lines(str(path), path.read_bytes()):
            if data is not None:
                lines.append(data.decode("utf-8"))
    return lines


def _generate_tables(
    config: CdcflowConfig,
    out: Path,
    workload: TablesWorkload,
    expected: Path | None,
    expected_counts: Path | None,
    resume: bool = False,
) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime

    from cdcflow.table_generator import generate_tables, load_state, save_state

    if expected is not None and expected.suffix:
        raise UsageError(
            f"--expected: with declared tables it is a folder (one <table>.parquet each), "
            f"got the file name {expected}"
        )
    earlier = sorted(out.glob("events-*.jsonl*")) if out.is_dir() else []
    source = None
    if resume:
        source, last_event, last_lsn, until = load_state(out)
        now = datetime.now(UTC)
        # the new changes follow the earlier ones: later event ids, LSNs and event times
        span = max((now - until).total_seconds() / 3600 - 1 / 60, 1 / 3600)
        workload = replace(
            workload, first_event=last_event + 1, first_lsn=last_lsn, span_hours=span, now=now
        )
    elif earlier:
        raise UsageError(
            f"generate: {out} already holds {len(earlier)} landing file(s) of an earlier "
            "workload; a new one would reuse its event ids and LSNs (quarantined as "
            "DUPLICATE_EVENT_CONFLICT): add --continue to continue it, or use an empty folder "
            "and a new lakehouse"
        )
    until = workload.now or datetime.now(UTC)
    workload = replace(workload, now=until)
    with working("generate: writing landing files"):
        summary = generate_tables(out, config.contracts(), workload, source)
        save_state(out, summary, until)
    counts = None
    if expected is not None:
        landed = summary
        if resume:  # the expected state of everything landed, the earlier workloads' too
            everything = _landing_lines(out)
            landed = replace(summary, lines=everything, records=len(everything))
        with working("generate: computing the expected state"):
            counts = write_tables_expected(landed, config, expected, expected_counts)
    table = tables_summary_table(summary, out, expected, counts)
    console.print(table, width=output_width(console))


def generate(
    out: Annotated[
        Path | None,
        typer.Option(
            help="Landing folder to write into [default: ./landing; with --config, its "
            "source.path].",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="A config declaring tables: write changes of every declared table (values "
            "drawn from each contract); --expected is then a folder.",
            show_default=False,
        ),
    ] = None,
    events: Annotated[int, typer.Option(min=1, help="Number of source changes.")] = 2000,
    customers: Annotated[int, typer.Option(min=1, help="Number of distinct customers.")] = 300,
    keys: Annotated[
        int, typer.Option(min=1, help="Distinct keys per declared table (with --config).")
    ] = 100,
    files: Annotated[int, typer.Option(min=1, help="Number of files to split into.")] = 10,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 42,
    duplicate_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.05,
    out_of_order_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.15,
    late_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.02,
    invalid_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.01,
    partial_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.5,
    lsn_notation: Annotated[str, typer.Option(help="postgres | sqlserver | decimal | mixed")] = (
        "postgres"
    ),
    gzip_every: Annotated[int, typer.Option(min=0, help="Gzip every n-th file (0: none).")] = 0,
    expected: Annotated[
        Path | None,
        typer.Option(
            help="Also write the expected Silver state here (.parquet/.csv/.jsonl; with "
            "--config declaring tables: a folder, one <table>.parquet each)."
        ),
    ] = None,
    expected_counts: Annotated[
        Path | None,
        typer.Option(help="Expected counts JSON (default: <expected stem>.counts.json)."),
    ] = None,
    delete_mode: Annotated[str, typer.Option(help="Delete mode of the expected state.")] = "soft",
    resume: Annotated[
        bool,
        typer.Option(
            "--continue",
            help="With --config: continue the workload already in the landing folder (later "
            "event ids, LSNs and times, the same keys); --expected covers everything landed.",
        ),
    ] = False,
) -> None:
    """Write realistic JSON-lines CDC event files (with duplicates, late and invalid records).

    Each call writes one self-contained workload (event ids from EVT-00000001, LSNs from the
    start): use an empty landing folder and a new lakehouse for each, since a second workload in
    the same lakehouse reuses event ids (quarantined as DUPLICATE_EVENT_CONFLICT). With
    --config (declared tables), --continue adds to the workload already in the landing folder.
    """
    if lsn_notation not in NOTATIONS:
        raise UsageError(f"--lsn-notation: unknown notation {lsn_notation!r}")
    if config is not None:
        from cdcflow.cli.app import load

        loaded = load(config, declared_tables=True)
        if out is None:
            out = Path(loaded.source.path)
        if loaded.tables:
            from cdcflow.table_generator import TablesWorkload

            if lsn_notation != "postgres":
                raise UsageError("--lsn-notation: declared tables get integer LSNs only")
            workload = TablesWorkload(
                events=events,
                keys=keys,
                files=files,
                seed=seed,
                duplicate_rate=duplicate_rate,
                out_of_order_rate=out_of_order_rate,
                late_rate=late_rate,
                invalid_rate=invalid_rate,
                partial_rate=partial_rate,
                gzip_every=gzip_every,
            )
            _generate_tables(loaded, out, workload, expected, expected_counts, resume)
            return
    if resume:
        raise UsageError("--continue: only with --config declaring tables")
    out = out or Path("./landing")
    earlier = sorted(out.glob("events-*.jsonl*")) if out.is_dir() else []
    if earlier:  # the generator would overwrite some of them and leave the rest
        raise UsageError(
            f"generate: {out} already holds {len(earlier)} landing file(s) of an earlier "
            "workload; a new one would overwrite some of them and reuse its event ids and LSNs "
            "(quarantined as DUPLICATE_EVENT_CONFLICT): use an empty folder and a new lakehouse"
        )
    from cdcflow.generator import GeneratorConfig
    from cdcflow.generator import generate as write_events

    with working("generate: writing landing files"):
        summary = write_events(
            out,
            GeneratorConfig(
                events=events,
                customers=customers,
                files=files,
                seed=seed,
                duplicate_rate=duplicate_rate,
                out_of_order_rate=out_of_order_rate,
                late_rate=late_rate,
                invalid_rate=invalid_rate,
                partial_rate=partial_rate,
                lsn_notation=lsn_notation,  # type: ignore[arg-type]
                gzip_every=gzip_every,
            ),
        )
    counts = None
    if expected is not None:
        with working("generate: computing the expected state"):
            counts = write_expected(summary, expected, expected_counts, delete_mode)
    table = summary_table(summary, out, expected, expected_counts, counts, delete_mode)
    console.print(table, width=output_width(console))
