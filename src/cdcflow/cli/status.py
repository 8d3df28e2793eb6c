"""``cdcflow status``: is the pipeline running, how far behind is it, what is it rejecting —
its latest micro-batches, end-to-end lag, backlog, quarantine reasons, declared tables and
Snowflake syncs, read from the audit tables and the checkpoint (:mod:`cdcflow.layers.status`).
With ``--check`` it is a health check: exit 1 when the pipeline is stopped, its Kafka or
PostgreSQL source cannot be reached, or its lag is above ``--max-lag`` (default: the config's
``status.max_lag``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.errors import ConfigError


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def status(
    config: ConfigOption,
    output: Annotated[str, typer.Option(help="text | json")] = "text",
    batches: Annotated[
        int, typer.Option(min=1, help="how many of the latest micro-batches the rate covers")
    ] = 10,
    max_lag: Annotated[
        str | None,
        typer.Option(
            help="health threshold: a table's p95 end-to-end lag over the last hour above it "
            "(e.g. 30s, 5m) is a problem [default: the config's status.max_lag]"
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="health check: exit 1 when the pipeline is stopped, its source cannot be "
            "reached or its lag is above --max-lag (the reasons on stderr)",
        ),
    ] = False,
) -> None:
    """Whether a run is active (the lock holder), the latest micro-batch, the records and
    events per second of the last --batches micro-batches, the end-to-end lag (source event
    time → Silver commit: p50 / p95 / max over the last hour), the backlog (landing files not
    taken yet), quarantined records by reason over the last 24 hours, each declared table's
    totals, and per Snowflake table its syncs: the last one's mode and lag (Silver commit →
    Snowflake commit) and the lag from the source event time to the Snowflake commit (p50 /
    p95; incremental syncs)."""
    if output not in ("text", "json"):
        raise ConfigError(f"--output: expected text or json, got {output!r}")
    from cdcflow.config import parse_duration
    from cdcflow.layers.status import RECENT_SYNCS, pipeline_status

    try:
        threshold = None if max_lag is None else parse_duration(max_lag)
    except ValueError:
        raise ConfigError(
            f"--max-lag: expected a duration such as 30s or 5m, got {max_lag!r}"
        ) from None
    settings = load(config, declared_tables=True)
    if threshold is None:
        threshold = settings.status.max_lag
    found = pipeline_status(settings, batches, threshold)
    if output == "json":
        typer.echo(json.dumps(found.to_json(), indent=1))
    else:
        _show(found, RECENT_SYNCS)
    if check and found.problems:  # a health check's verdict, not an error: exit 1, one line
        typer.echo("unhealthy: " + "; ".join(found.problems), err=True)
        raise typer.Exit(1)


def _show(found: Any, recent_syncs: int) -> None:
    """Print ``found`` (a :class:`~cdcflow.layers.status.PipelineStatus`) as text."""
    if found.running:
        console.print(f"running: {found.lock_holder}", markup=False, highlight=False)
    else:
        console.print("stopped: no run holds the checkpoint's lock", markup=False)
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
    for x in found.schema:
        recorded = (
            "none recorded yet"
            if x.recorded_version is None
            else (f"v{x.recorded_version} recorded {x.recorded_at:%Y-%m-%d %H:%M} UTC ({x.change})")
        )
        pending = (
            ""
            if x.recorded_version in (None, x.declared_version)
            else (
                "; the next run applies the declared version (or stops on an incompatible change)"
            )
        )
        console.print(
            f"contract {x.table}: declared v{x.declared_version}, {recorded}{pending}",
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
    _show_flow(found)
    if not found.snowflake:
        console.print("snowflake: no sync recorded yet", markup=False)
        return
    table = Table(
        title="Snowflake syncs (seconds; lag: Silver commit → Snowflake commit; event: source "
        f"event time → Snowflake commit, of the last sync and the last {recent_syncs})"
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


def _show_flow(found: Any) -> None:
    """Throughput, lag, backlog and quarantine reasons as text."""
    recent = found.recent
    if recent is not None:
        console.print(
            f"last {recent.batches} micro-batch{'es' if recent.batches != 1 else ''}: "
            f"{recent.records} records, {recent.events} events in {recent.seconds:.1f} s of "
            f"batch time: {_s(recent.records_per_s)} records/s, {_s(recent.events_per_s)} "
            "events/s",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    backlog = found.backlog
    if backlog is not None:
        pending = (
            ""
            if backlog.pending_batch is None
            else f"; micro-batch {backlog.pending_batch} has offsets and no commit marker yet"
        )
        source = ""
        if backlog.source_records is not None:
            source = f"; Kafka consumer lag: {backlog.source_records} records"
        elif backlog.source_wal_bytes is not None:
            source = f"; PostgreSQL slot: {backlog.source_wal_bytes} bytes of WAL not confirmed"
        elif backlog.source_error:  # the error names the broker or the database
            source = f"; source lag unknown: {backlog.source_error}"
        if backlog.folder_missing:
            source += "; the landing folder (source.path) does not exist"
        if backlog.ignored_files:
            n = backlog.ignored_files
            source += (
                f"; {n} other file{'s' if n != 1 else ''} in the landing folder ignored (only "
                "*.jsonl and *.jsonl.gz are read)"
            )
        console.print(
            f"backlog: {backlog.files} landing file{'s' if backlog.files != 1 else ''} "
            f"({backlog.bytes} bytes) not taken yet{pending}{source}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if found.lag:
        table = Table(title="end-to-end lag, last hour: source event time → Silver commit (s)")
        for name in ("table", "events", "p50", "p95", "max"):
            table.add_column(name, justify="left" if name == "table" else "right")
        for x in found.lag:
            table.add_row(x.table, str(x.events), _s(x.p50), _s(x.p95), _s(x.max))
        console.print(table)
    reasons = [(t, r, n) for t, counts in found.quarantine.items() for r, n in counts.items()]
    if reasons:
        table = Table(title="quarantined, last 24 hours")
        for name in ("table", "reason", "records"):
            table.add_column(name, justify="right" if name == "records" else "left")
        for t, r, n in reasons:
            table.add_row(t, r, str(n))
        console.print(table)
    else:
        console.print("quarantined, last 24 hours: none", markup=False)
