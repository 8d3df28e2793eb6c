"""Inline mode: synchronize Snowflake right after each micro-batch's Silver commit; the
record of every sync.

Every sync — inline after a micro-batch, or ``cdcflow sync snowflake`` once or
``--continuous`` — appends one row per Snowflake table it changed to the Delta table
``audit/snowflake_sync`` (:data:`SYNC_LOG_SCHEMA`): its mode, versions, row counts, the lag from
the Silver commit to the Snowflake commit (``lag_s``) and, for an incremental sync, from the
source event time of the rows it upserted to the Snowflake commit (``event_lag_p50_s`` /
``event_lag_p95_s``); ``cdcflow status`` shows them. An inline sync's time is put in the batch
report's ``stage_seconds['snowflake_sync']``. A failed sync is logged (error
type only) and does not fail the micro-batch: Silver is committed, and the next sync — inline or
``cdcflow sync snowflake`` — catches up from the version recorded in ``CDC_SYNC_STATE``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

import pyarrow as pa
from deltalake import write_deltalake

from cdcflow.config import CdcflowConfig
from cdcflow.logs import get_logger
from cdcflow.report import BatchReport
from cdcflow.signals import off_main_thread
from cdcflow.sinks.snowflake.sync import SyncFileWriter, SyncReport, sync_snowflake

log = get_logger("snowflake.inline")

SYNC_LOG_TABLE = "audit/snowflake_sync"
_TS = pa.timestamp("us", tz="UTC")
SYNC_LOG_SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64()),
        pa.field("target_table", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("from_version", pa.int64()),
        pa.field("to_version", pa.int64(), nullable=False),
        pa.field("inserted", pa.int64(), nullable=False),
        pa.field("updated", pa.int64(), nullable=False),
        pa.field("deleted", pa.int64(), nullable=False),
        pa.field("source_committed_at", _TS),
        pa.field("synced_at", _TS),
        pa.field("lag_s", pa.float64()),
        pa.field("mode", pa.string()),
        pa.field("event_lag_p50_s", pa.float64()),
        pa.field("event_lag_p95_s", pa.float64()),
    ]
)

#: ``audit/snowflake_sync.mode`` values: after a micro-batch, a one-off CLI sync, a sync of
#: ``cdcflow sync snowflake --continuous``.
SyncMode = Literal["inline", "once", "continuous"]


def record_sync(
    config: CdcflowConfig, report: SyncReport, batch_id: int | None, mode: SyncMode = "inline"
) -> None:
    """Append one ``audit/snowflake_sync`` row per table that changed (noop syncs skipped).

    Args:
        config: the pipeline configuration (``storage.root``).
        report: the sync's report.
        batch_id: the micro-batch an inline sync followed (None for a CLI sync).
        mode: how the sync ran (:data:`SyncMode`).
    """
    rows = [
        {
            "batch_id": batch_id,
            "target_table": t.target,
            "kind": t.kind,
            "from_version": t.from_version,
            "to_version": t.to_version,
            "inserted": t.inserted,
            "updated": t.updated,
            "deleted": t.deleted,
            "source_committed_at": t.source_committed_at,
            "synced_at": t.synced_at,
            "lag_s": t.lag_s,
            "mode": mode,
            "event_lag_p50_s": t.event_lag_p50_s,
            "event_lag_p95_s": t.event_lag_p95_s,
        }
        for t in report.tables
        if t.kind != "noop"
    ]
    if not rows:
        return
    write_deltalake(
        config.table_uri(SYNC_LOG_TABLE),
        pa.Table.from_pylist(rows, schema=SYNC_LOG_SCHEMA),
        mode="append",
        schema_mode="merge",  # a log written before the mode / event-lag columns existed
        storage_options=config.storage.options or None,
    )


def inline_sync(
    config: CdcflowConfig, report: BatchReport, writer: SyncFileWriter | None = None
) -> None:
    """``snowflake.mode: inline``: synchronize after the micro-batch's Silver commits (every
    engine calls this before its audit commit) and put the sync lag in the batch's report.

    Args:
        config: the pipeline configuration; nothing happens unless ``snowflake.mode`` is
            ``inline``.
        report: the micro-batch's report; ``snowflake_sync_lag_s`` is set to the lag of
            ``DIM_CUSTOMER_CURRENT`` (customers) or the largest lag of the declared tables'
            Snowflake tables (seconds; None when the sync failed or had no lag to measure).
        writer: the engine that writes the rows to load as Parquet files (the Spark
            engine's); None: read by the sync with delta-rs.
    """
    if config.snowflake.mode != "inline":
        return
    from cdcflow.layers.erasure import enforce_erasures

    # an erased subject's late events: their PII nulled before anything reaches Snowflake
    enforce_erasures(config, report.batch_id)
    synced = sync_after_batch(config, report, writer)
    if synced is None:
        return
    if config.tables:
        lags = [t.lag_s for t in synced.tables if t.lag_s is not None]
        report.snowflake_sync_lag_s = max(lags) if lags else None
    else:
        report.snowflake_sync_lag_s = synced.dim.lag_s


def sync_after_batch(
    config: CdcflowConfig, report: BatchReport, writer: SyncFileWriter | None = None
) -> SyncReport | None:
    """Synchronize Snowflake after a committed micro-batch and record the sync lag.

    Args:
        config: the pipeline configuration (``snowflake.mode`` should be ``inline``).
        report: the micro-batch's report; ``stage_seconds['snowflake_sync']`` is set.
        writer: as :func:`inline_sync`'s.

    Returns:
        The sync report, or None when the sync failed (logged with its error type).
    """
    started = time.monotonic()
    try:
        # off the main thread: the connector's SIGINT handler (cancel, KeyboardInterrupt)
        # must not replace the continuous run's clean stop (cdcflow.signals.off_main_thread)
        result = off_main_thread(lambda: sync_snowflake(config, writer=writer))
        record_sync(config, result, report.batch_id)
    except Exception as exc:  # the batch is committed; the next sync catches up
        log.error(
            "inline Snowflake sync failed; the next sync catches up",
            extra={"batch_id": report.batch_id, "error_type": type(exc).__name__},
        )
        return None
    finally:
        report.stage_seconds["snowflake_sync"] = time.monotonic() - started
    dim = result.dim
    log.info(
        "inline Snowflake sync",
        extra={
            "batch_id": report.batch_id,
            "silver_version": dim.to_version,
            "lag_s": dim.lag_s,
            "at": datetime.now(UTC).isoformat(),
        },
    )
    return result
