"""The state of a pipeline, read from its audit tables and checkpoint (``cdcflow status``).

Sources: ``audit/batch_log`` (one row per micro-batch), ``audit/table_batch_log`` (declared
tables: one row per micro-batch and table), ``audit/snowflake_sync`` (one row per Snowflake
table and sync, :mod:`cdcflow.sinks.snowflake.inline`), each table's outcomes and quarantine
tables, the Silver tables' Delta commit times (:mod:`cdcflow.layers.lag`), the checkpoint folder
(run lock, offsets without a commit marker) and the landing folder (the backlog). A table that
does not exist yet is an empty part of the status, never an error. Nothing personal is read
into the status: counts, times, reasons and file names only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow
from cdcflow.layers.lag import TableLag

#: How many of a Snowflake table's latest syncs the recent event-lag figures cover.
RECENT_SYNCS = 20
#: The window of the end-to-end lag figures.
LAG_WINDOW = timedelta(hours=1)
#: The window of the quarantine counts.
QUARANTINE_WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class LastBatch:
    """The latest committed micro-batch.

    Attributes:
        batch_id: its id.
        started_at: its processing time (UTC).
        duration_ms: its wall time, milliseconds.
        records_received / accepted / quarantined: its record counts.
        snowflake_sync_lag_s: the inline sync's lag (seconds; None: no inline sync).
    """

    batch_id: int
    started_at: datetime
    duration_ms: int
    records_received: int
    accepted: int
    quarantined: int
    snowflake_sync_lag_s: float | None


@dataclass(frozen=True)
class TableStatus:
    """One declared table over every micro-batch: sums and the Silver version now."""

    table: str
    batches: int
    accepted: int
    quarantined: int
    duplicates: int
    silver_version: int | None


@dataclass(frozen=True)
class SnowflakeStatus:
    """One Snowflake table's syncs (``audit/snowflake_sync``).

    Attributes:
        target: the Snowflake table.
        syncs: syncs that changed it.
        last_mode: ``inline``, ``once`` or ``continuous`` (None: a log from before modes).
        last_synced_at: the latest sync's Snowflake commit (UTC).
        last_version: the Delta version it synchronized.
        last_lag_s: its Silver commit → Snowflake commit, seconds.
        event_lag_p50_s / event_lag_p95_s: source event time → Snowflake commit of the latest
            incremental sync that measured it (seconds).
        recent_event_lag_p50_s: the median of the per-sync medians over the last
            :data:`RECENT_SYNCS` syncs that measured one; ``recent_event_lag_p95_s``: the
            largest per-sync p95 among them.
    """

    target: str
    syncs: int
    last_mode: str | None
    last_synced_at: datetime | None
    last_version: int
    last_lag_s: float | None
    event_lag_p50_s: float | None
    event_lag_p95_s: float | None
    recent_event_lag_p50_s: float | None
    recent_event_lag_p95_s: float | None


@dataclass(frozen=True)
class Throughput:
    """The latest micro-batches (``audit/batch_log``) taken together.

    Attributes:
        batches: how many (at most the ``recent`` asked for).
        records: records received (every landing record, valid or not).
        events: accepted first copies (accepted − duplicates).
        seconds: the micro-batches' summed wall time (``duration_ms``), seconds.
        records_per_s / events_per_s: records / seconds and events / seconds (None: no time).
    """

    batches: int
    records: int
    events: int
    seconds: float
    records_per_s: float | None
    events_per_s: float | None


@dataclass(frozen=True)
class Backlog:
    """What the landing folder holds that no micro-batch has taken yet.

    Attributes:
        files: new files and files grown or changed since a micro-batch took them.
        bytes: their bytes not taken yet.
        pending_batch: a micro-batch with offsets but no commit marker (a run is processing
            it, or a crashed run left it for the next run to finish); None: none.
        source_records: ``source.type: kafka``: the consumer lag — records of the matched
            topics beyond what the pipeline staged, plus those of staged files not committed
            yet (None: another source, or the broker could not be asked: ``source_error``).
        source_wal_bytes: ``source.type: postgres``: bytes of WAL the replication slot holds
            beyond its confirmed position (:meth:`PostgresSource.wal_behind
            <cdcflow.sources.postgres.PostgresSource.wal_behind>`); None: another source, or
            the database could not be asked (``source_error``).
        source_error: why the broker or the database could not be asked (empty: it was, or
            the source is the landing folder).
        folder_missing: the landing folder (``source.path``) does not exist: nothing can
            arrive (a wrong path, or a folder not made yet).
        ignored_files: regular files in the landing folder that are not landing files (not
            ``*.jsonl`` / ``*.jsonl.gz``; hidden files not counted): never read.
    """

    files: int
    bytes: int
    pending_batch: int | None
    source_records: int | None = None
    source_error: str = ""
    source_wal_bytes: int | None = None
    folder_missing: bool = False
    ignored_files: int = 0


@dataclass(frozen=True)
class SchemaState:
    """A declared table's contract: the version declared in the config and the latest one the
    pipeline recorded (``audit/schema_log``) — they differ until the next run applies the
    change, or refuses an incompatible one (``cdcflow schema``).

    Attributes:
        table: the declared table.
        declared_version / recorded_version: the contract versions (recorded: None before the
            first run).
        recorded_at: when the recorded version was applied (UTC).
        change: what that version changed (as the schema log says it).
    """

    table: str
    declared_version: int
    recorded_version: int | None
    recorded_at: datetime | None
    change: str | None


@dataclass
class PipelineStatus:
    """Everything ``cdcflow status`` shows.

    Attributes:
        pipeline / engine: ``pipeline.name`` and ``pipeline.engine``.
        running: a run holds the checkpoint's lock now; ``lock_holder``: who (``pid N on HOST
            since TIME``; empty when none).
        batches / last_batch: micro-batches committed; the latest.
        recent: the latest micro-batches' throughput.
        lag: per table, source event time → Silver commit (seconds) of the events applied in
            the last :data:`LAG_WINDOW`.
        backlog: landing files not taken yet.
        quarantine: per table, records quarantined in the last :data:`QUARANTINE_WINDOW` by
            reason code.
        tables / snowflake: declared tables' totals; Snowflake syncs.
        schema: declared tables' contract versions, declared and recorded.
        problems: why the pipeline is not healthy (empty: healthy): stopped, its Kafka or
            PostgreSQL source unreachable, or its lag above the threshold asked for.
    """

    pipeline: str
    engine: str
    running: bool = False
    lock_holder: str = ""
    batches: int = 0
    last_batch: LastBatch | None = None
    recent: Throughput | None = None
    lag: list[TableLag] = field(default_factory=list)
    backlog: Backlog | None = None
    quarantine: dict[str, dict[str, int]] = field(default_factory=dict)
    tables: list[TableStatus] = field(default_factory=list)
    snowflake: list[SnowflakeStatus] = field(default_factory=list)
    schema: list[SchemaState] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (datetimes as ISO-8601 text)."""

        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return value

        out: dict[str, Any] = plain(asdict(self))
        return out


def read_table(
    config: CdcflowConfig, name: str, columns: list[str] | None = None
) -> pl.DataFrame | None:
    """The Delta table ``name`` under ``storage.root`` (only those of ``columns`` it has: an
    older table may lack a newer column), or None when it does not exist yet."""
    uri = config.table_uri(name)
    options = config.storage.options or None
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    table = DeltaTable(uri, storage_options=options)
    if columns is not None:
        names = set(table.schema().to_arrow().names)
        columns = [c for c in columns if c in names]
    frame = pl.from_arrow(read_arrow(table, columns=columns))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _running(holder_file: Any) -> tuple[bool, str]:
    """(a run holds the lock, its description) from the lock file's content, without taking
    the lock (a status probe must never make a run's start fail): a holder on this host counts
    only while its process lives (a killed run leaves its line behind)."""
    import json

    try:
        data = json.loads(holder_file.read_text(encoding="utf-8"))
        pid, host, since = int(data["pid"]), str(data["host"]), str(data["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return False, ""
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, ""
        except PermissionError:
            pass  # alive, another user's
    return True, f"pid {pid} on {host} since {since}"


def _throughput(batches: pl.DataFrame, recent: int) -> Throughput:
    last = batches.sort("batch_id").tail(recent)
    seconds = float(last["duration_ms"].sum()) / 1000
    records = int(last["records_received"].sum())
    events = int(last["accepted"].sum()) - int(last["duplicates"].sum())
    return Throughput(
        batches=last.height,
        records=records,
        events=events,
        seconds=round(seconds, 3),
        records_per_s=round(records / seconds, 1) if seconds > 0 else None,
        events_per_s=round(events / seconds, 1) if seconds > 0 else None,
    )


def _backlog(config: CdcflowConfig) -> Backlog:
    from cdcflow.sources.files import SUFFIXES, list_landing, unchanged
    from cdcflow.state.checkpoint import Checkpoint

    checkpoint = Checkpoint.of(config)
    taken = checkpoint.taken() if checkpoint.has_offsets() else {}
    files, left = 0, 0
    for listed in list_landing(config.source.path):
        before = taken.get(listed.path)
        if unchanged(listed, before):
            continue
        files += 1
        grown = before is not None and listed.size > before.size  # only the new bytes left
        left += listed.size - (before.size if before is not None and grown else 0)
    pending = checkpoint.pending() if checkpoint.has_offsets() else None
    folder = Path(config.source.path)
    ignored = (
        sum(
            1
            for entry in folder.iterdir()
            if not entry.name.endswith(SUFFIXES)
            and not entry.name.startswith(".")
            and entry.is_file()
        )
        if folder.is_dir()
        else 0
    )
    backlog = Backlog(
        files,
        left,
        None if pending is None else pending.batch_id,
        folder_missing=not folder.is_dir(),
        ignored_files=ignored,
    )
    if config.source.type == "kafka":
        from dataclasses import replace

        from cdcflow.errors import CdcflowError
        from cdcflow.sources.kafka import KafkaSource

        try:
            lag = KafkaSource(config).pending(checkpoint)
        except CdcflowError as exc:  # the broker down: the rest of the status still shows
            return replace(backlog, source_error=str(exc))
        return replace(backlog, source_records=lag)
    if config.source.type == "postgres":
        from dataclasses import replace

        from cdcflow.errors import CdcflowError
        from cdcflow.sources.postgres import PostgresSource

        try:
            behind = PostgresSource(config).wal_behind()
        except CdcflowError as exc:  # the database down: the rest of the status still shows
            return replace(backlog, source_error=str(exc))
        return replace(backlog, source_wal_bytes=behind)
    return backlog


def _quarantine(config: CdcflowConfig, since: datetime) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for contract in config.contracts():
        columns = ["quarantined_at", "failure_reason"]
        rows = read_table(config, contract.table_names.quarantine, columns)
        if rows is None:
            continue
        counts = (
            rows.filter(pl.col("quarantined_at") >= since)
            .group_by("failure_reason")
            .len()
            .sort("failure_reason")
        )
        out[contract.name] = {r: int(n) for r, n in counts.iter_rows()}
    return out


def _schema_states(config: CdcflowConfig) -> list[SchemaState]:
    log = read_table(config, "audit/schema_log")
    out = []
    for contract in config.contracts():
        rows = (
            log.filter(pl.col("table_name") == contract.name).sort("version", "applied_at")
            if log is not None
            else pl.DataFrame()
        )
        last = rows.row(-1, named=True) if rows.height else {}
        out.append(
            SchemaState(
                table=contract.name,
                declared_version=contract.version,
                recorded_version=last.get("version"),
                recorded_at=last.get("applied_at"),
                change=last.get("change"),
            )
        )
    return out


def pipeline_status(
    config: CdcflowConfig,
    recent: int = 10,
    max_lag: timedelta | None = None,
    now: datetime | None = None,
) -> PipelineStatus:
    """The status of ``config``'s pipeline (module doc).

    Args:
        config: the pipeline's config.
        recent: how many of the latest micro-batches the throughput covers.
        max_lag: the health threshold: a table whose p95 end-to-end lag over the last hour
            is above it is a problem (None: the lag is not checked).
        now: the time the windows end (UTC; default: now).

    Returns:
        The status; ``problems`` lists what is unhealthy (the pipeline is not running, the
        Kafka broker or the PostgreSQL database cannot be reached, a table's lag is above
        ``max_lag``).
    """

    now = now or datetime.now(UTC)
    status = PipelineStatus(config.pipeline.name, config.pipeline.engine)
    from cdcflow.state.checkpoint import Checkpoint

    checkpoint = Checkpoint.of(config)
    if checkpoint.is_object_store:  # a lease: held while it names a holder and has not expired
        status.lock_holder = checkpoint.holder()
        status.running = bool(status.lock_holder)
    else:
        status.running, status.lock_holder = _running(Path(config.checkpoint.location) / "lock")
    if not status.running:
        status.problems.append("stopped: no run holds the checkpoint's lock")
    status.backlog = _backlog(config)
    if status.backlog.source_error:  # no micro-batch can take new changes
        status.problems.append(f"source: {status.backlog.source_error}")
    status.quarantine = _quarantine(config, now - QUARANTINE_WINDOW)
    batches = read_table(config, "audit/batch_log")
    if batches is not None and "kind" in batches.columns:  # micro-batches, not replays
        batches = batches.filter(pl.col("kind").fill_null("stream") == "stream")
    if batches is not None and batches.height:
        from cdcflow.layers.lag import end_to_end_lag

        status.recent = _throughput(batches, recent)
        from deltalake.exceptions import TableNotFoundError

        try:
            status.lag = end_to_end_lag(config, since=now - LAG_WINDOW)
        except TableNotFoundError:  # a first micro-batch that wrote no outcomes yet
            status.lag = []
        if max_lag is not None:
            limit = max_lag.total_seconds()
            status.problems += [
                f"lag: {x.table} p95 {x.p95:.1f} s over the last hour, above {limit:g} s"
                for x in status.lag
                if x.p95 is not None and x.p95 > limit
            ]
        status.batches = batches.height
        last = batches.sort("batch_id").row(-1, named=True)
        status.last_batch = LastBatch(
            batch_id=last["batch_id"],
            started_at=last["started_at"],
            duration_ms=last["duration_ms"],
            records_received=last["records_received"],
            accepted=last["accepted"],
            quarantined=last["quarantined"],
            snowflake_sync_lag_s=_float(last.get("snowflake_sync_lag_s")),
        )
    per_table = read_table(config, "audit/table_batch_log") if config.tables else None
    if per_table is not None:
        for contract in config.contracts():
            rows = per_table.filter(pl.col("table_name") == contract.name)
            status.tables.append(
                TableStatus(
                    table=contract.name,
                    batches=rows.height,
                    accepted=int(rows["accepted"].sum()),
                    quarantined=int(rows["quarantined"].sum()),
                    duplicates=int(rows["duplicates"].sum()),
                    silver_version=rows["silver_version"].max() if rows.height else None,  # type: ignore[arg-type]
                )
            )
    if config.tables:
        status.schema = _schema_states(config)
    syncs = read_table(config, "audit/snowflake_sync")
    if syncs is not None and syncs.height:
        added = {"mode": pl.String, "event_lag_p50_s": pl.Float64, "event_lag_p95_s": pl.Float64}
        for name, dtype in added.items():
            if name not in syncs.columns:  # a log written before these columns
                syncs = syncs.with_columns(pl.lit(None, dtype).alias(name))
        for target in sorted(syncs["target_table"].unique().to_list()):
            rows = syncs.filter(pl.col("target_table") == target).sort("synced_at")
            last = rows.row(-1, named=True)
            measured = rows.filter(pl.col("event_lag_p50_s").is_not_null()).tail(RECENT_SYNCS)
            latest = measured.row(-1, named=True) if measured.height else {}
            status.snowflake.append(
                SnowflakeStatus(
                    target=target,
                    syncs=rows.height,
                    last_mode=last["mode"],
                    last_synced_at=last["synced_at"],
                    last_version=last["to_version"],
                    last_lag_s=_float(last["lag_s"]),
                    event_lag_p50_s=_float(latest.get("event_lag_p50_s")),
                    event_lag_p95_s=_float(latest.get("event_lag_p95_s")),
                    recent_event_lag_p50_s=_float(measured["event_lag_p50_s"].median())
                    if measured.height
                    else None,
                    recent_event_lag_p95_s=_float(measured["event_lag_p95_s"].max())
                    if measured.height
                    else None,
                )
            )
    return status


__all__ = [
    "LAG_WINDOW",
    "QUARANTINE_WINDOW",
    "RECENT_SYNCS",
    "Backlog",
    "PipelineStatus",
    "SchemaState",
    "SnowflakeStatus",
    "TableStatus",
    "Throughput",
    "pipeline_status",
    "read_table",
]
