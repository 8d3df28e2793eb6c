"""The state of a pipeline, read from its audit tables (``cdcflow status``).

Sources: ``audit/batch_log`` (one row per micro-batch), ``audit/table_batch_log`` (declared
tables: one row per micro-batch and table) and ``audit/snowflake_sync`` (one row per Snowflake
table and sync, :mod:`cdcflow.sinks.snowflake.inline`). A table that does not exist yet is an
empty part of the status, never an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig

#: How many of a Snowflake table's latest syncs the recent event-lag figures cover.
RECENT_SYNCS = 20


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


@dataclass
class PipelineStatus:
    """Everything ``cdcflow status`` shows."""

    pipeline: str
    engine: str
    batches: int = 0
    last_batch: LastBatch | None = None
    tables: list[TableStatus] = field(default_factory=list)
    snowflake: list[SnowflakeStatus] = field(default_factory=list)

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


def _frame(config: CdcflowConfig, name: str) -> pl.DataFrame | None:
    uri = config.table_uri(name)
    options = config.storage.options or None
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    frame = pl.from_arrow(DeltaTable(uri, storage_options=options).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def pipeline_status(config: CdcflowConfig) -> PipelineStatus:
    """The status of ``config``'s pipeline (module doc)."""
    status = PipelineStatus(config.pipeline.name, config.pipeline.engine)
    batches = _frame(config, "audit/batch_log")
    if batches is not None and batches.height:
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
    per_table = _frame(config, "audit/table_batch_log") if config.tables else None
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
    syncs = _frame(config, "audit/snowflake_sync")
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


__all__ = ["RECENT_SYNCS", "PipelineStatus", "SnowflakeStatus", "TableStatus", "pipeline_status"]
