"""``cdcflow as-of``: customer state at an instant (history) or at a Silver version."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cdcflow.errors import UsageError

if TYPE_CHECKING:  # Polars is imported by the command itself (a fast --help and usage error)
    import polars as pl

#: Column order of the table output: what tells customers apart first, so that the columns a
#: narrow terminal leaves out are the bookkeeping ones (JSON keeps the Silver order).
TABLE_ORDER = (
    "customer_id",
    "status",
    "is_deleted",
    "customer_name",
    "city",
    "country",
    "email",
    "phone",
    "last_updated_at",
    "last_operation",
    "last_event_id",
    "last_lsn",
    "created_at",
    "deleted_at",
    "is_active",
)


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dicts()


def table_columns(columns: list[str]) -> list[str]:
    """``columns`` in :data:`TABLE_ORDER` (unknown ones after it, in their order)."""
    known = [c for c in TABLE_ORDER if c in columns]
    return known + [c for c in columns if c not in TABLE_ORDER]


def parse_key(contract: Any, pairs: list[str]) -> dict[str, Any]:
    """``COLUMN=VALUE`` pairs → the typed key values of ``contract`` (a subset of its keys).

    A value is read as text first, then as the JSON value a record may carry instead (a date
    key as epoch days, a timestamp key as epoch milliseconds): any form a record's key takes.

    Raises:
        UsageError: not COLUMN=VALUE, not a key column, or a value not of its type.
    """
    from cdcflow.model.contracts import TypeMismatch, coerce_given

    out: dict[str, Any] = {}
    for pair in pairs:
        column, sep, value = pair.partition("=")
        if not sep or column.strip() not in contract.keys:
            raise UsageError(
                f"--key: expected COLUMN=VALUE with a key column of {contract.name} "
                f"({', '.join(contract.keys)}), got {pair!r}"
            )
        spec = contract.column(column.strip())
        if spec.name in out:
            raise UsageError(f"--key: {spec.name} given twice")
        try:
            out[spec.name] = coerce_given(value, spec.type)
        except TypeMismatch:
            raise UsageError(f"--key: {spec.name} is not a value of type {spec.type}") from None
    return out


def _declared_as_of(
    cfg: Any,
    timestamp: str | None,
    version: int | None,
    table: str | None,
    pairs: list[str],
    customer: str | None,
    output: str,
) -> None:
    """``as-of`` for a declared table: its history or its Silver at a version."""
    from cdcflow.cli.app import console, existing_table
    from cdcflow.cli.tables import jsonable, print_rows
    from cdcflow.layers.asof import table_at_version, table_state_as_of
    from cdcflow.layers.contract_replay import held_contracts

    # the contracts the tables hold: columns evolved from event fields included
    contracts = {c.name: c for c in held_contracts(cfg)}
    if customer is not None:
        raise UsageError("--customer: the config declares tables; use --table and --key")
    if table is None and len(contracts) == 1:
        table = next(iter(contracts))
    if table is None:
        raise UsageError(f"as-of: the config declares several tables: add --table (one of "
                         f"{', '.join(contracts)})")  # fmt: skip
    if table not in contracts:
        raise UsageError(f"--table: expected one of {', '.join(contracts)}, got {table!r}")
    contract = contracts[table]
    key = parse_key(contract, pairs)
    names = contract.table_names
    existing_table(cfg, names.history if timestamp is not None else names.silver, "as-of")
    if timestamp is not None:
        try:
            instant = datetime.fromisoformat(timestamp.strip())
        except ValueError:
            raise UsageError(f"--timestamp: not an ISO-8601 instant: {timestamp!r}") from None
        frame = table_state_as_of(cfg, contract, instant, key)
        title = f"{table} as of {instant.isoformat()}"
    else:
        assert version is not None
        frame = table_at_version(cfg, contract, version, key)
        title = f"{contract.table_names.silver} at version {version}"
    rows = _rows(frame)
    if output == "json":
        typer.echo(json.dumps(jsonable(rows), indent=2))
        return
    noun = "row" if len(rows) == 1 else "rows"
    more = "--output json shows every column, --key COLUMN=VALUE one key's"
    print_rows(console, f"{title} ({len(rows)} {noun})", rows, frame.columns, more=more)


def as_of(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="YAML configuration file.", show_default=False)
    ],
    timestamp: Annotated[
        str | None,
        typer.Option(help="ISO-8601 instant, e.g. 2025-05-12T10:00:00Z (naive = UTC)."),
    ] = None,
    version: Annotated[
        int | None, typer.Option(min=0, help="Delta version of silver/customers.")
    ] = None,
    customer: Annotated[str | None, typer.Option(help="Only this customer_id.")] = None,
    table: Annotated[
        str | None,
        typer.Option(help="A declared table (config with tables:); default: the only one."),
    ] = None,
    key: Annotated[
        list[str] | None,
        typer.Option(
            help="A declared table's key column value, COLUMN=VALUE (once per key column).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str,
        typer.Option(
            help="table: one customer as field/value lines, several as a table of the columns "
            "that fit the terminal; json: every column of every row, a JSON list."
        ),
    ] = "table",
) -> None:
    """Customer state as of --timestamp (from history) or at Silver --version (time travel).

    With --customer the one row is shown as field/value lines; --output json prints all rows
    and columns (timestamps in ISO-8601). With a config that declares tables: --table T (and
    --key COLUMN=VALUE for each key column to pick one row).
    """
    from cdcflow.cli.app import console, existing_table, load
    from cdcflow.cli.tables import OUTPUTS, jsonable, print_rows
    from cdcflow.layers.asof import customer_state_as_of, silver_at_version

    if (timestamp is None) == (version is None):
        raise UsageError("as-of: give exactly one of --timestamp or --version")
    if output not in OUTPUTS:
        raise UsageError(f"--output: expected table or json, got {output!r}")
    cfg = load(config, declared_tables=True)
    if cfg.tables:
        _declared_as_of(cfg, timestamp, version, table, key or [], customer, output)
        return
    if table is not None or key:
        raise UsageError("--table / --key: for a config that declares tables (tables:)")
    read = "silver/customer_history" if timestamp is not None else "silver/customers"
    existing_table(cfg, read, "as-of")
    if timestamp is not None:
        try:
            instant = datetime.fromisoformat(timestamp.strip())
        except ValueError:
            raise UsageError(f"--timestamp: not an ISO-8601 instant: {timestamp!r}") from None
        frame = customer_state_as_of(cfg, instant, customer)
        title = f"customers as of {instant.isoformat()}"
    else:
        assert version is not None
        frame = silver_at_version(cfg, version, customer)
        title = f"silver/customers at version {version}"
    rows = _rows(frame)
    if output == "json":
        typer.echo(json.dumps(jsonable(rows), indent=2))
        return
    noun = "row" if len(rows) == 1 else "rows"
    more = "--output json shows every column, --customer ID one customer's"
    columns = table_columns(frame.columns) if len(rows) != 1 else frame.columns
    print_rows(console, f"{title} ({len(rows)} {noun})", rows, columns, more=more)
