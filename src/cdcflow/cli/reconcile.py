"""``cdcflow reconcile``: compare Silver with an expected state or a source snapshot.

Exit code 0 only when everything matches, 1 on any mismatch (2 on a usage or config error).

Targets (``--target``): ``silver`` (the Delta table, default) and ``snowflake``. A target is a
function ``config -> polars.DataFrame`` returning one row per customer_id with Silver's public
columns (:data:`TARGETS`); ``snowflake`` is read by ``cdcflow.sinks.snowflake.reconcile``
``read_state(config)``, imported lazily.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import MissingDependencyError, UsageError
from cdcflow.plan.reference import SILVER_COLUMNS

if TYPE_CHECKING:
    import polars as pl

    from cdcflow.reconcile import ReconcileReport


def read_silver(config: CdcflowConfig) -> pl.DataFrame:
    """Silver's public columns at its latest version (one row per customer_id)."""
    from cdcflow.cli.app import existing_table
    from cdcflow.engines.local.delta import scan_table

    table = existing_table(config, "silver/customers", "reconcile")
    return scan_table(table).select(list(SILVER_COLUMNS)).collect()


def read_snowflake(config: CdcflowConfig) -> pl.DataFrame:
    """Snowflake's copy of Silver (public columns, one row per customer_id).

    Reads it with ``cdcflow.sinks.snowflake.reconcile.read_state(config)`` (imported lazily).

    Raises:
        MissingDependencyError: the Snowflake extra is not installed.
        UsageError: the Snowflake sink has no ``read_state`` reader.
    """
    import importlib

    import polars as pl

    try:
        module = importlib.import_module("cdcflow.sinks.snowflake.reconcile")
    except ImportError as exc:
        raise MissingDependencyError(
            f"--target snowflake needs the Snowflake sink: pip install 'cdcflow[snowflake]' ({exc})"
        ) from exc
    reader = getattr(module, "read_state", None)
    if reader is None:
        raise UsageError(
            "--target snowflake: cdcflow.sinks.snowflake.reconcile has no read_state(config); "
            "compare Silver with Snowflake with the Snowflake sink's own reconciliation"
        )
    frame = reader(config)
    if not isinstance(frame, pl.DataFrame):
        raise UsageError("--target snowflake: read_state(config) must return a polars frame")
    return frame


#: --target name → reader of the state to check (add a target here).
TARGETS: dict[str, Callable[[CdcflowConfig], pl.DataFrame]] = {
    "silver": read_silver,
    "snowflake": read_snowflake,
}


def run_reconcile(
    config: CdcflowConfig,
    expected: Path | None = None,
    source_snapshot: Path | None = None,
    target: str = "silver",
) -> ReconcileReport:
    """Compare a target with an expected-state file or a source-snapshot file.

    Raises:
        UsageError: neither or both files given, unknown target, unreadable file.
    """
    if (expected is None) == (source_snapshot is None):
        raise UsageError("give exactly one of --expected FILE or --source-snapshot FILE")
    if target not in TARGETS:
        raise UsageError(f"--target: expected one of {sorted(TARGETS)}, got {target!r}")
    from cdcflow.layers.erasure import mask_erased
    from cdcflow.reconcile import read_state_file, reconcile_snapshot, reconcile_state

    actual = TARGETS[target](config)
    if expected is not None:
        frame = mask_erased(config, "customers", read_state_file(expected))
        return reconcile_state(actual, frame, expected_label=str(expected), actual_label=target)
    assert source_snapshot is not None
    if str(source_snapshot) == "postgres" and not source_snapshot.exists():
        # the live source table (source.postgres), at the LSN the pipeline consumed
        from cdcflow.sources.postgres_reconcile import reconcile_postgres

        return reconcile_postgres(config, actual)
    snapshot = mask_erased(config, "customers", read_state_file(source_snapshot))
    return reconcile_snapshot(actual, snapshot, snapshot_label=str(source_snapshot))


def reconcile_tables(config: CdcflowConfig, expected: Path) -> dict[str, ReconcileReport]:
    """Compare every declared table's Silver with ``<expected>/<table>.parquet``.

    The folder is what ``cdcflow generate --config F --expected DIR`` writes.

    Returns:
        table → its report, in declared order.

    Raises:
        UsageError: the folder or a table's expected file is missing or unreadable.
    """
    import polars as pl

    from cdcflow.cli.app import existing_table
    from cdcflow.layers.erasure import mask_erased
    from cdcflow.reconcile import contract_public_schema, reconcile_table

    if not expected.is_dir():
        raise UsageError(
            f"--expected: with declared tables it is the folder `cdcflow generate --config F "
            f"--expected DIR` wrote (one <table>.parquet each); {expected} is not a folder"
        )
    reports: dict[str, ReconcileReport] = {}
    for contract in config.contracts():
        path = expected / f"{contract.name}.parquet"
        if not path.is_file():
            raise UsageError(f"--expected: no expected state of table {contract.name}: {path}")
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:
            raise UsageError(f"--expected: cannot read {path} ({type(exc).__name__})") from exc
        frame = mask_erased(config, contract.name, frame)
        columns = contract_public_schema(contract).names
        silver = existing_table(config, contract.table_names.silver, "reconcile")
        actual = pl.from_arrow(read_arrow(silver, columns=columns))
        assert isinstance(actual, pl.DataFrame)
        reports[contract.name] = reconcile_table(
            actual, frame, contract, expected_label=str(path), actual_label=contract.name
        )
    return reports


def report_table(report: ReconcileReport, title: str | None = None) -> Table:
    """Rich summary of a reconciliation: counts per side, key and field differences."""
    verdict = "[green]MATCH[/]" if report.ok else "[red]MISMATCH[/]"
    table = Table(title=title or f"reconciliation ({report.kind}): {verdict}")
    table.add_column("check")
    table.add_column(report.expected_label, justify="right")
    table.add_column(report.actual_label, justify="right")
    table.add_column("ok", justify="center")

    def mark(good: bool) -> str:
        return "[green]ok[/]" if good else "[red]x[/]"

    e, a = report.expected_counts, report.actual_counts
    for name in ("rows", "active", "deleted"):
        x, y = getattr(e, name), getattr(a, name)
        if x is None and y is None:
            continue
        shown = (str(x) if x is not None else "-", str(y) if y is not None else "-")
        table.add_row(name, *shown, mark(x is None or y is None or x == y))
    table.add_row("missing keys", str(report.missing_keys), "", mark(report.missing_keys == 0))
    table.add_row("extra keys", "", str(report.extra_keys), mark(report.extra_keys == 0))
    if report.duplicate_keys:
        table.add_row("duplicate keys", "", str(report.duplicate_keys), mark(False))
    table.add_row(
        "rows with differences",
        "",
        str(report.rows_with_differences),
        mark(report.rows_with_differences == 0),
    )
    table.add_row(
        "row hash mismatches", "", str(report.hash_mismatches), mark(report.hash_mismatches == 0)
    )
    for column, n in report.field_differences.items():
        table.add_row(f"  {column} differs", "", str(n), mark(False))
    return table


def print_report(report: ReconcileReport, title: str | None = None) -> None:
    """Print the summary table and the samples of what differs."""
    console.print(report_table(report, title))
    if report.missing_sample:
        sample = report.missing_sample
        console.print(f"missing keys (first {len(sample)}): {sample}", soft_wrap=True)
    if report.extra_sample:
        sample = report.extra_sample
        console.print(f"extra keys (first {len(sample)}): {sample}", soft_wrap=True)
    for diff in report.difference_sample:
        console.print(
            f"  {diff.customer_id}.{diff.column}: expected {diff.expected!r}, got {diff.actual!r}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def reconcile(
    config: ConfigOption,
    expected: Annotated[
        Path | None,
        typer.Option(
            help="Expected Silver state (.parquet, .csv or JSON lines).", show_default=False
        ),
    ] = None,
    source_snapshot: Annotated[
        Path | None,
        typer.Option(
            help="Source table snapshot: customer_id + attributes, deleted customers absent; "
            "'postgres' reads the live source table (source.postgres).",
            show_default=False,
        ),
    ] = None,
    target: Annotated[str, typer.Option(help="State to check: silver | snowflake.")] = "silver",
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """Compare Silver with an expected state or a source snapshot; exit 1 on any mismatch."""
    if output not in ("text", "json"):
        raise UsageError(f"--output: expected text or json, got {output!r}")
    if target == "snowflake" and expected is None and source_snapshot is None:
        # Silver (and Gold) vs DIM_CUSTOMER_CURRENT (and the AGG_ tables)
        from cdcflow.cli.sync import verify_snowflake

        raise typer.Exit(verify_snowflake(config))
    loaded = load(config, declared_tables=True)
    if loaded.tables:
        live = source_snapshot is not None and str(source_snapshot) == "postgres"
        live = live and source_snapshot is not None and not source_snapshot.exists()
        if live and expected is None and target == "silver":
            from cdcflow.sources.postgres_reconcile import reconcile_postgres_tables

            reports = reconcile_postgres_tables(loaded)
        elif expected is None or source_snapshot is not None or target != "silver":
            raise UsageError(
                "reconcile: declared tables are compared with --expected DIR (what `cdcflow "
                "generate --config F --expected DIR` wrote) or with --source-snapshot postgres "
                "(the live source tables), on the silver target"
            )
        else:
            reports = reconcile_tables(loaded, expected)
        ok = all(r.ok for r in reports.values())
        if output == "json":
            data = {"ok": ok, "tables": {n: r.to_json() for n, r in reports.items()}}
            typer.echo(json.dumps(data, indent=1, default=str))
        else:
            for name, report in reports.items():
                verdict = "[green]MATCH[/]" if report.ok else "[red]MISMATCH[/]"
                print_report(report, f"{name}: reconciliation ({report.kind}): {verdict}")
        if not ok:
            raise typer.Exit(1)
        return
    report = run_reconcile(loaded, expected, source_snapshot, target)
    if output == "json":
        typer.echo(json.dumps(report.to_json(), indent=1, default=str))
    else:
        print_report(report)
    if not report.ok:
        raise typer.Exit(1)
