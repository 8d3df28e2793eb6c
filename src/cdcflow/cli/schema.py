"""``cdcflow schema``: the contracts of declared tables (``audit/schema_log``).

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
    help="Contracts of declared tables: acknowledge an incompatible change.",
    no_args_is_help=True,
    cls=HelpGroup,
)


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
