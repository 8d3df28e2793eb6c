"""``cdcflow as-of``: customer state at an instant (history) or at a Silver version."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import polars as pl
import typer
from rich.table import Table

from cdcflow.errors import CdcflowError


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    out = []
    for row in frame.to_dicts():
        out.append({k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()})
    return out


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
    output: Annotated[str, typer.Option(help="json | table")] = "table",
) -> None:
    """Customer state as of --timestamp (from history) or at Silver --version (time travel)."""
    from cdcflow.cli.app import console, load
    from cdcflow.layers.asof import customer_state_as_of, silver_at_version

    if (timestamp is None) == (version is None):
        raise CdcflowError("as-of: give exactly one of --timestamp or --version")
    if output not in ("json", "table"):
        raise CdcflowError(f"--output: expected json or table, got {output!r}")
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
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{title} ({len(rows)} rows)")
    for name in frame.columns:
        table.add_column(name)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(table)
