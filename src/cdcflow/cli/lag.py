"""``cdcflow lag``: the end-to-end lag of each table (source commit → Silver commit)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.errors import UsageError


def lag(
    config: ConfigOption,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """Per table (the declared tables, else customers): events and the p50 / p95 / max seconds
    from the source's commit of a change to the Silver commit that applied it
    (cdcflow.layers.lag)."""
    if output not in ("text", "json"):
        raise UsageError(f"--output: expected text or json, got {output!r}")
    loaded = load(config, declared_tables=True)
    from deltalake.exceptions import TableNotFoundError

    from cdcflow.layers.lag import end_to_end_lag

    try:
        lags = end_to_end_lag(loaded)
    except TableNotFoundError:
        raise UsageError("lag: the pipeline has not run yet (no audit tables)") from None
    if output == "json":
        typer.echo(json.dumps([vars(x) for x in lags], indent=1))
        return
    table = Table(title="end-to-end lag: source commit → Silver commit (seconds)")
    for name in ("table", "events", "p50", "p95", "max"):
        table.add_column(name, justify="left" if name == "table" else "right")
    shown = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for x in lags:
        table.add_row(x.table, str(x.events), shown(x.p50), shown(x.p95), shown(x.max))
    console.print(table)
