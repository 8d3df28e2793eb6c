"""``cdcflow schema``: the contracts of declared tables (``audit/schema_log``).

``cdcflow schema log --config F [--table T] [--output json]`` lists the recorded contract
changes (one row per change: table, contract version, change, when it was applied).

``cdcflow schema accept --config F --table T`` acknowledges an incompatible contract change
of table T (a changed key column, a changed type, a removed column...): its Delta tables are
moved aside under ``_retired/`` and the next run starts it afresh under the declared contract
(:mod:`cdcflow.layers.schema_log`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from cdcflow.cli.options import ConfigOption, HelpCommand, HelpGroup

schema_app = typer.Typer(
    name="schema",
    help="Contracts of declared tables: their recorded changes (log), acknowledge an "
    "incompatible change (accept).",
    no_args_is_help=True,
    cls=HelpGroup,
)


@schema_app.command("log", cls=HelpCommand)
def show_log(
    config: ConfigOption,
    table: Annotated[str | None, typer.Option(help="Only this declared table's changes.")] = None,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """List the recorded contract changes of the declared tables (audit/schema_log): created,
    added or evolved columns, widened types, accepted incompatible changes."""
    import json

    from deltalake import DeltaTable

    from cdcflow.cli.app import console, load
    from cdcflow.engines.local.delta import scan_table
    from cdcflow.errors import ConfigError, UsageError
    from cdcflow.layers.schema_log import SCHEMA_LOG

    if output not in ("text", "json"):
        raise ConfigError(f"--output: expected text or json, got {output!r}")
    cfg = load(config, declared_tables=True)
    if not cfg.tables:
        raise ConfigError(f"{config}: key 'tables': schema log lists declared tables' contracts")
    names = [c.name for c in cfg.contracts()]
    if table is not None and table not in names:
        import difflib

        close = difflib.get_close_matches(table, names, n=1, cutoff=0.6)
        hint = f", did you mean {close[0]}?" if close else ""
        raise ConfigError(
            f"{config}: --table {table}: not a declared table (declared: {', '.join(names)}){hint}"
        )
    uri, options = cfg.table_uri(SCHEMA_LOG.name), cfg.storage.options or None
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        raise UsageError(f"{uri}: no contract recorded yet (no run of declared tables yet)")
    frame = scan_table(DeltaTable(uri, storage_options=options)).select(
        "table_name", "version", "change", "applied_at"
    )
    rows = frame.sort("applied_at").collect().to_dicts()
    if table is not None:
        rows = [r for r in rows if r["table_name"] == table]
    if output == "json":
        typer.echo(json.dumps(rows, indent=1, default=str))
        return
    from rich.table import Table

    shown = Table(title=f"{SCHEMA_LOG.name} ({len(rows)} changes)")
    for header in ("table", "version", "change", "applied at"):
        shown.add_column(header, justify="right" if header == "version" else "left")
    for row in rows:
        shown.add_row(
            row["table_name"],
            str(row["version"]),
            row["change"],
            row["applied_at"].isoformat(timespec="seconds"),
        )
    console.print(shown)


@schema_app.command(cls=HelpCommand)
def accept(
    config: ConfigOption,
    table: Annotated[str, typer.Option(help="The declared table whose change to accept.")],
) -> None:
    """Accept a table's incompatible contract change: move its Delta tables aside (nothing is
    deleted) and let the next run start it afresh under the declared contract."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from cdcflow.cli.app import console, load
    from cdcflow.errors import ConfigError
    from cdcflow.layers.schema_log import SCHEMA_LOG, accept, utc_now

    cfg = load(config, declared_tables=True)
    declared = {c.name: c for c in cfg.contracts()} if cfg.tables else {}
    if table not in declared:
        known = ", ".join(declared) or "none (no tables: section)"
        raise ConfigError(f"{config}: --table {table}: not a declared table (declared: {known})")
    try:
        log_table = DeltaTable(
            cfg.table_uri(SCHEMA_LOG.name), storage_options=cfg.storage.options or None
        )
    except TableNotFoundError:
        console.print(
            f"table {table}: no contract recorded yet (no run yet): nothing to accept",
            soft_wrap=True,
        )
        return
    done = accept(log_table, cfg.storage.root, declared[table], utc_now())
    if not done.changes:
        console.print(
            f"table {table}: no incompatible change to accept (compatible ones are applied by "
            "the next run)",
            soft_wrap=True,
        )
        return
    console.print(
        f"table {table}: accepted {'; '.join(done.changes)}; earlier tables moved to "
        f"{done.retired_to}; the next run starts the table afresh",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
