"""``cdcflow status``: the pipeline's latest micro-batch, its declared tables and the lag of
its Snowflake syncs, read from the audit tables (:mod:`cdcflow.layers.status`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.errors import ConfigError


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def status(
    config: ConfigOption,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """The latest micro-batch, each declared table's totals, and per Snowflake table its
    syncs: the last one's mode and lag (Silver commit → Snowflake commit) and the lag from the
    source event time to the Snowflake commit (p50 / p95; incremental syncs)."""
    if output not in ("text", "json"):
        raise ConfigError(f"--output: expected text or json, got {output!r}")
    from cdcflow.layers.status import RECENT_SYNCS, pipeline_status

    found = pipeline_status(load(config, declared_tables=True))
    if output == "json":
        typer.echo(json.dumps(found.to_json(), indent=1))
        return
    last = found.last_batch
    if last is None:
        console.print(f"pipeline {found.pipeline} ({found.engine}): no micro-batch yet")
    else:
        console.print(
            f"pipeline {found.pipeline} ({found.engine}): {found.batches} "
            f"micro-batch{'es' if found.batches != 1 else ''}; the "
            f"last, {last.batch_id}, at {last.started_at:%Y-%m-%d %H:%M:%S} UTC in "
            f"{last.duration_ms} ms: {last.records_received} records, {last.accepted} accepted, "
            f"{last.quarantined} quarantined",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if found.tables:
        table = Table(title="declared tables (every micro-batch)")
        for name in ("table", "batches", "accepted", "quarantined", "duplicates", "silver v"):
            table.add_column(name, justify="left" if name == "table" else "right")
        for t in found.tables:
            version = "-" if t.silver_version is None else str(t.silver_version)
            table.add_row(
                t.table, str(t.batches), str(t.accepted), str(t.quarantined), str(t.duplicates),
                version,
            )  # fmt: skip
        console.print(table)
    if not found.snowflake:
        console.print("snowflake: no sync recorded yet", markup=False)
        return
    table = Table(
        title="Snowflake syncs (seconds; lag: Silver commit → Snowflake commit; event: source "
        f"event time → Snowflake commit, of the last sync and the last {RECENT_SYNCS})"
    )
    names = ("table", "syncs", "last", "mode", "lag", "event p50 / p95", "recent p50 / p95")
    for name in names:  # the table names whole; a narrow terminal folds the other columns
        left = name in ("table", "last", "mode")
        table.add_column(
            name,
            justify="left" if left else "right",
            no_wrap=name == "table",
            overflow="fold",
        )
    for s in found.snowflake:
        when = "-" if s.last_synced_at is None else f"{s.last_synced_at:%H:%M:%S}"
        table.add_row(
            s.target, str(s.syncs), when, s.last_mode or "-", _s(s.last_lag_s),
            f"{_s(s.event_lag_p50_s)} / {_s(s.event_lag_p95_s)}",
            f"{_s(s.recent_event_lag_p50_s)} / {_s(s.recent_event_lag_p95_s)}",
        )  # fmt: skip
    console.print(table)
