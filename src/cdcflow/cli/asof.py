"""``cdcflow as-of``: customer state at an instant (history) or at a Silver version."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cdcflow.errors import CdcflowError

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
    and columns (timestamps in ISO-8601).
    """
    from cdcflow.cli.app import console, load
    from cdcflow.cli.tables import OUTPUTS, jsonable, print_rows
    from cdcflow.layers.asof import customer_state_as_of, silver_at_version

    if (timestamp is None) == (version is None):
        raise CdcflowError("as-of: give exactly one of --timestamp or --version")
    if output not in OUTPUTS:
        raise CdcflowError(f"--output: expected table or json, got {output!r}")
    cfg = load(config)
    if timestamp is not None:
        try:
            instant = datetime.fromisoformat(timestamp.strip())
        except ValueError:
            raise CdcflowError(f"--timestamp: not an ISO-8601 instant: {timestamp!r}") from None
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
