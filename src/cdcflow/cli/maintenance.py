"""``cdcflow gold`` (recompute the Gold tables), ``cdcflow optimize`` (compact, Z-order, vacuum)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cdcflow.cli.options import ConfigOption, WaitOption, parse_wait
from cdcflow.config import CdcflowConfig


def gold_rows(cfg: CdcflowConfig) -> dict[str, list[dict[str, Any]]]:
    """The rows of every Gold table but ``gold/active_customers`` (one row per customer).

    Returns:
        Table name → rows (column → value), in table order.
    """
    from deltalake import DeltaTable

    from cdcflow.engines.local.delta import read_arrow
    from cdcflow.layers.gold import ACTIVE_CUSTOMERS, GOLD_TABLES

    out = {}
    for spec in GOLD_TABLES:
        if spec is ACTIVE_CUSTOMERS:
            continue
        delta = DeltaTable(cfg.table_uri(spec.name), storage_options=cfg.storage.options or None)
        out[spec.name] = read_arrow(delta).to_pylist()
    return out


def active_customer_count(cfg: CdcflowConfig) -> int:
    """Rows of ``gold/active_customers``."""
    from deltalake import DeltaTable

    from cdcflow.engines.local.delta import arrow_dataset
    from cdcflow.layers.gold import ACTIVE_CUSTOMERS

    uri = cfg.table_uri(ACTIVE_CUSTOMERS.name)
    return int(
        arrow_dataset(DeltaTable(uri, storage_options=cfg.storage.options or None)).count_rows()
    )


def print_gold(cfg: CdcflowConfig, console: Console) -> None:
    """Print the Gold tables (all but ``gold/active_customers``, one row per customer, of which
    only the row count is shown), each fitting the output width (:mod:`cdcflow.cli.tables`)."""
    from cdcflow.cli.tables import print_rows
    from cdcflow.layers.gold import DAILY_METRICS

    for name, rows in gold_rows(cfg).items():
        more = "--output json shows every column"
        if name == DAILY_METRICS.name:
            more += "; percentages in *_pct columns"
        print_rows(console, f"{name} ({len(rows)} rows)", rows, more=more)
    console.print(
        f"gold/active_customers: {active_customer_count(cfg)} rows (one per active customer; "
        "not printed)"
    )


def gold_json(cfg: CdcflowConfig) -> str:
    """The ``gold --output json`` document: table name → ``{"rows": n, "data": [...]}``
    (``gold/active_customers``: its row count only)."""
    from cdcflow.cli.tables import jsonable
    from cdcflow.layers.gold import ACTIVE_CUSTOMERS

    doc: dict[str, Any] = {
        name: {"rows": len(rows), "data": jsonable(rows)} for name, rows in gold_rows(cfg).items()
    }
    doc[ACTIVE_CUSTOMERS.name] = {"rows": active_customer_count(cfg)}
    return json.dumps(doc, indent=2)


def gold(
    config: ConfigOption,
    output: Annotated[
        str,
        typer.Option(
            help="table: each table fitting the terminal (one row as field/value lines); "
            "json: every row of every table, one JSON document."
        ),
    ] = "table",
) -> None:
    """Recompute every Gold table from silver/customer_history and print them.

    Ratios are percentages (columns *_pct, 0-100, 2 decimals). gold/active_customers (one row
    per active customer) is counted, not printed. --output json prints every table as JSON.
    """
    from cdcflow.cli.tables import OUTPUTS
    from cdcflow.errors import UsageError

    if output not in OUTPUTS:
        raise UsageError(f"--output: expected table or json, got {output!r}")
    from cdcflow.cli.app import console, existing_table, load
    from cdcflow.cli.progress import working
    from cdcflow.engines.local.gold import refresh_gold

    cfg = load(config)
    existing_table(cfg, "silver/customer_history", "gold")  # Gold is computed from it
    with working("gold: recomputing the tables"):
        refresh_gold(cfg)
    if output == "json":
        typer.echo(gold_json(cfg))
        return
    print_gold(cfg, console)


def optimize(
    config: ConfigOption,
    vacuum: Annotated[bool, typer.Option(help="Vacuum after compaction.")] = True,
    wait: WaitOption = "0",
) -> None:
    """Z-order Silver, compact the other tables and vacuum (maintenance section of the config).

    Holds the pipeline's checkpoint lock: it runs between pipeline runs, never under one.
    """
    from cdcflow.cli.app import console, load
    from cdcflow.cli.progress import working
    from cdcflow.engines.local.maintenance import optimize_between_runs

    patience = parse_wait(wait)
    cfg = load(config, declared_tables=True)
    with working("optimize", unit="tables") as work:

        def on_table(name: str, number: int, total: int) -> None:
            work.update(completed=number, total=total, detail=name)

        done = optimize_between_runs(cfg, vacuum=vacuum, wait=patience, on_table=on_table)
    table = Table(title="optimize")
    table.add_column("table")
    table.add_column("action")
    for header in ("files added", "files removed", "vacuumed", "version"):
        table.add_column(header, justify="right")
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
