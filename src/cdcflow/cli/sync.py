"""``cdcflow sync snowflake``: synchronize Silver and Gold to Snowflake, once or continuously.

Exit codes: 0 done (and, with ``--verify``, Snowflake equals Silver/Gold); 1 ``--verify`` found
differences; 2 a usage, configuration or sync error.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from cdcflow.cli.options import ConfigOption, HelpCommand, HelpGroup
from cdcflow.config import parse_duration
from cdcflow.errors import ConfigError

sync_app = typer.Typer(
    name="sync",
    help="Synchronize lakehouse tables to external systems.",
    no_args_is_help=True,
    cls=HelpGroup,
)


def sync_table(report: object) -> Table:
    """One row per synchronized Snowflake table: the versions, staged and merged rows, the lag
    from the Silver commit and (incremental syncs) from the source event time, p50 / p95."""
    from cdcflow.sinks.snowflake.sync import SyncReport

    assert isinstance(report, SyncReport)
    table = Table(
        title=f"Snowflake sync ({report.duration_ms} ms)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    names = ("table", "kind", "versions", "staged", "ins", "upd", "del", "lag s",
             "ev p50 s", "ev p95 s")  # fmt: skip
    for name in names:
        text = name in ("table", "kind")
        # the names and versions whole; a narrow terminal wraps the lag headers instead
        table.add_column(
            name,
            justify="left" if text else "right",
            no_wrap=text or name == "versions",
            overflow="fold",
        )
    for t in report.tables:
        table.add_row(
            t.target,
            t.kind,
            f"{t.from_version if t.from_version is not None else '-'} → {t.to_version}",
            str(t.staged),
            str(t.inserted),
            str(t.updated),
            str(t.deleted),
            *("-" if v is None else f"{v:.2f}" for v in (t.lag_s, t.event_lag_p50_s,
                                                         t.event_lag_p95_s)),
        )  # fmt: skip
    return table


def verify_snowflake(config_path: Path) -> int:
    """Reconcile Snowflake with Silver/Gold, print one line; 0 when equal, else 1.

    A ready-made body for ``cdcflow reconcile --target snowflake`` without expected files.
    """
    from cdcflow.cli.app import console, load
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake

    report = reconcile_snowflake(load(config_path))
    console.print(report.summary(), markup=False, highlight=False, soft_wrap=True)
    return 0 if report.equal else 1


@sync_app.command("snowflake", cls=HelpCommand)
def snowflake(
    config: ConfigOption,
    full: Annotated[bool, typer.Option("--full", help="Full refresh (bootstrap, repair).")] = False,
    continuous: Annotated[
        bool,
        typer.Option(
            "--continuous",
            help="Keep syncing until SIGINT/SIGTERM (the table printed after the first sync "
            "and after each one that changed something).",
        ),
    ] = False,
    interval: Annotated[str, typer.Option(help="Pause between continuous syncs.")] = "10s",
    verify: Annotated[
        bool, typer.Option("--verify", help="Reconcile after syncing; exit 1 on differences.")
    ] = False,
) -> None:
    """Silver -> DIM_CUSTOMER_CURRENT and Gold -> AGG_* in Snowflake (emulator by default);
    declared tables: each Silver table -> its Snowflake table."""
    from cdcflow.cli.app import console, load
    from cdcflow.cli.progress import working
    from cdcflow.signals import off_main_thread
    from cdcflow.sinks.snowflake.inline import record_sync
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import SyncReport, sync_snowflake

    try:
        pause = parse_duration(interval).total_seconds()
    except ValueError as exc:
        raise ConfigError(f"--interval: {exc}") from None
    cfg = load(config, declared_tables=True)
    from cdcflow.cli.app import existing_table
    from cdcflow.layers.contract_replay import held_contracts

    silvers = [c.table_names.silver for c in held_contracts(cfg)] if cfg.tables else []
    for name in silvers or ["silver/customers"]:  # what a sync reads
        existing_table(cfg, name, "sync snowflake")
    stop = threading.Event()
    from cdcflow.engines import sync_file_writer

    writer = sync_file_writer(cfg)  # pipeline.engine: spark: the rows written by Spark

    rounds = [0]  # syncs done

    def once(refresh: bool) -> None:
        def work() -> SyncReport:
            report = sync_snowflake(cfg, full=refresh, writer=writer)
            record_sync(cfg, report, None, "continuous" if continuous else "once")
            return report

        with working("snowflake: synchronizing silver and gold"):
            # continuous: off the main thread, where the connector's own SIGINT handler
            # (cancel the query, KeyboardInterrupt) would break the clean stop
            report = off_main_thread(work) if continuous else work()
        rounds[0] += 1
        moved = any(t.staged or t.inserted or t.updated or t.deleted for t in report.tables)
        if rounds[0] == 1 or moved:  # continuous: a quiet round (nothing new) prints nothing
            console.print(sync_table(report))

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # continuous: SIGINT/SIGTERM (even during the first sync) stop after the sync in progress
    previous = (
        {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        if continuous
        else {}
    )
    try:
        once(full)
        while continuous and not stop.is_set() and not stop.wait(pause):
            once(False)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if verify and cfg.tables:  # each declared table's Silver vs its Snowflake table
        from cdcflow.layers.contract_replay import held_contracts
        from cdcflow.sinks.snowflake.reconcile import reconcile_target
        from cdcflow.sinks.snowflake.tables import contract_target

        with working("snowflake: comparing with silver"):
            comparisons = [reconcile_target(cfg, contract_target(c)) for c in held_contracts(cfg)]
        for c in comparisons:
            console.print(
                f"{c.target}: {'EQUAL' if c.equal else 'DIFFERENT'} — {c.source} "
                f"{c.source_rows} rows vs {c.target_rows} rows; missing {c.missing}, extra "
                f"{c.extra}, mismatched {c.mismatched}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        if not all(c.equal for c in comparisons):
            raise typer.Exit(1)
        return
    if verify:
        with working("snowflake: comparing with silver and gold"):
            result = reconcile_snowflake(cfg)
        console.print(result.summary(), markup=False, highlight=False, soft_wrap=True)
        if not result.equal:
            raise typer.Exit(1)
