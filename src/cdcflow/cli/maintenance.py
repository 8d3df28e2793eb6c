"""``cdcflow gold`` (recompute the Gold tables), ``cdcflow optimize`` (compact, Z-order, vacuum)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cdcflow.config import CdcflowConfig

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="YAML configuration file.", show_default=False)
]


def print_gold(cfg: CdcflowConfig, console: Console) -> None:
    """Print the Gold tables (all but ``gold/active_customers``, one row per customer)."""
    from deltalake import DeltaTable

    from cdcflow.engines.local.delta import read_arrow
    from cdcflow.layers.gold import ACTIVE_CUSTOMERS, GOLD_TABLES

    for spec in GOLD_TABLES:
        if spec is ACTIVE_CUSTOMERS:
            continue
        delta = DeltaTable(cfg.table_uri(spec.name), storage_options=cfg.storage.options or None)
        data = read_arrow(delta)
        table = Table(title=f"{spec.name} ({data.num_rows} rows)")
        for name in data.column_names:
            table.add_column(name)
        for row in data.to_pylist():
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        console.print(table)


def gold(config: ConfigOption) -> None:
    """Recompute every Gold table from silver/customer_history and print them."""
    from cdcflow.cli.app import console, load
    from cdcflow.engines.local.gold import refresh_gold

    cfg = load(config)
    with console.status("recomputing Gold tables"):
        refresh_gold(cfg)
    print_gold(cfg, console)


def optimize(
    config: ConfigOption,
    vacuum: Annotated[bool, typer.Option(help="Vacuum after compaction.")] = True,
    wait: Annotated[
        str,
        typer.Option(
            help="How long to wait for a running pipeline to release the checkpoint lock "
            "(e.g. 10m; 0: fail at once)."
        ),
    ] = "0",
) -> None:
    """Z-order Silver, compact the other tables and vacuum (maintenance section of the config).

    Holds the pipeline's checkpoint lock: it runs between pipeline runs, never under one.
    """
    from cdcflow.cli.app import console, load
    from cdcflow.config import parse_duration
    from cdcflow.engines.local.maintenance import optimize_between_runs
    from cdcflow.errors import ConfigError

    try:
        patience = parse_duration(wait)
    except ValueError as exc:
        raise ConfigError(f"--wait: {exc}") from None
    cfg = load(config)
    with console.status("optimizing Delta tables"):
        done = optimize_between_runs(cfg, vacuum=vacuum, wait=patience)
    table = Table(title="optimize")
    for header in ("table", "action", "files added", "files removed", "vacuumed", "version"):
        table.add_column(header)
    for entry in done:
        table.add_row(
            entry.table,
            entry.action,
            str(entry.files_added),
            str(entry.files_removed),
            str(entry.files_vacuumed),
            str(entry.version),
        )
    console.print(table)
