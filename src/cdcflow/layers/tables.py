"""Delta table definitions: name under ``storage.root``, Arrow schema, partitioning, properties.

Grain of each table:

* ``bronze/customer_events`` — one row per accepted delivery (duplicates included), append-only,
  partitioned by ``ingestion_date``; the raw payload is kept.
* ``quarantine/customer_events`` — one row per rejected record, append-only, with the reason.
* ``silver/customers`` — one row per customer_id (hard-deleted customers absent); public columns
  plus ``_cdc_`` sequence registers (one per attribute, the row's highest and lowest sequence).
  Its table property ``cdcflow.deleteMode`` (:data:`DELETE_MODE_PROPERTY`) records the
  ``processing.delete_mode`` its content was built in.
* ``silver/customer_tombstones`` — hard mode: one row per hard-deleted customer_id, holding the
  sequence of its latest DELETE.
* ``audit/batch_log`` — one row per micro-batch.
* ``audit/event_outcomes`` — one row per accepted delivery with its outcome.
* ``silver/customer_history`` — SCD2: one row per (customer_id, sequence) of an applied change,
  the row image after it plus ``valid_from`` / ``valid_to`` / ``is_current``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from cdcflow.model.events import ATTRIBUTES

TS = pa.timestamp("us", tz="UTC")
CDF = {"delta.enableChangeDataFeed": "true"}

#: Table property of ``silver/customers`` holding the delete mode (``soft`` | ``hard``) its
#: content was built in. delta-rs cannot create a table with a property outside ``delta.*``, so
#: it is set by a metadata commit right after the table is created (or, on a table created
#: before the property existed, on the first run) and by ``replay --apply``.
DELETE_MODE_PROPERTY = "cdcflow.deleteMode"


def register(name: str) -> str:
    """Name of the sequence register column of attribute ``name``."""
    return f"_cdc_seq_{name}"


@dataclass(frozen=True)
class TableSpec:
    """Definition of one Delta table.

    Attributes:
        name: path under ``storage.root`` (e.g. ``silver/customers``).
        schema: Arrow schema.
        partition_by: partition columns.
        configuration: Delta table properties.
    """

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    configuration: dict[str, str] = field(default_factory=dict)


_ATTR_FIELDS = [pa.field(name, pa.string()) for name in ATTRIBUTES]

BRONZE = TableSpec(
    "bronze/customer_events",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("ingested_at", TS, nullable=False),
            pa.field("ingestion_date", pa.date32(), nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("raw_payload", pa.string(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("customer_id", pa.string(), nullable=False),
            pa.field("operation", pa.string(), nullable=False),
            pa.field("event_timestamp", TS, nullable=False),
            *_ATTR_FIELDS,
            pa.field("present_mask", pa.int32(), nullable=False),
            pa.field("source_table", pa.string()),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("lsn_key", pa.string(), nullable=False),
            pa.field("tx_id", pa.string()),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("is_duplicate", pa.bool_(), nullable=False),
        ]
    ),
    partition_by=("ingestion_date",),
    configuration=CDF,
)

QUARANTINE = TableSpec(
    "quarantine/customer_events",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("quarantined_at", TS, nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("raw_line", pa.string(), nullable=False),
            pa.field("failure_reason", pa.string(), nullable=False),
            pa.field("failure_detail", pa.string(), nullable=False),
            pa.field("event_id", pa.string()),
            pa.field("customer_id", pa.string()),
        ]
    ),
)

SILVER_FIELDS = [
    pa.field("customer_id", pa.string(), nullable=False),
    *_ATTR_FIELDS,
    pa.field("is_deleted", pa.bool_(), nullable=False),
    pa.field("is_active", pa.bool_(), nullable=False),
    pa.field("created_at", TS),
    pa.field("last_updated_at", TS),
    pa.field("deleted_at", TS),
    pa.field("last_event_id", pa.string()),
    pa.field("last_operation", pa.string()),
    pa.field("last_lsn", pa.string()),
    pa.field("_cdc_seq", pa.string(), nullable=False),
    pa.field("_cdc_min_seq", pa.string(), nullable=False),
    *[pa.field(register(name), pa.string()) for name in ATTRIBUTES],
]

SILVER = TableSpec("silver/customers", pa.schema(SILVER_FIELDS), configuration=CDF)

TOMBSTONES = TableSpec(
    "silver/customer_tombstones",
    pa.schema(
        [
            pa.field("customer_id", pa.string(), nullable=False),
            pa.field("_cdc_seq", pa.string(), nullable=False),
            pa.field("deleted_at", TS, nullable=False),
            pa.field("last_event_id", pa.string(), nullable=False),
            pa.field("last_lsn", pa.string(), nullable=False),
            pa.field("tombstoned_at", TS, nullable=False),
        ]
    ),
)

BATCH_LOG = TableSpec(
    "audit/batch_log",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("started_at", TS, nullable=False),
            pa.field("duration_ms", pa.int64(), nullable=False),
            pa.field("files", pa.int64(), nullable=False),
            pa.field("records_received", pa.int64(), nullable=False),
            pa.field("accepted", pa.int64(), nullable=False),
            pa.field("quarantined", pa.int64(), nullable=False),
            pa.field("duplicates", pa.int64(), nullable=False),
            pa.field("inserts", pa.int64(), nullable=False),
            pa.field("updates", pa.int64(), nullable=False),
            pa.field("deletes", pa.int64(), nullable=False),
            pa.field("stale_ignored", pa.int64(), nullable=False),
            pa.field("tombstoned", pa.int64(), nullable=False),
            pa.field("late_events", pa.int64(), nullable=False),
            pa.field("max_event_lag_s", pa.float64()),
            pa.field("silver_version", pa.int64()),
            pa.field("delete_mode", pa.string(), nullable=False),
            pa.field("snowflake_sync_lag_s", pa.float64()),
            pa.field("spark_jobs", pa.int64()),
            pa.field("stage_seconds", pa.string()),  # JSON: stage name -> seconds
            pa.field("silver_files_rewritten", pa.int64()),
        ]
    ),
)

EVENT_OUTCOMES = TableSpec(
    "audit/event_outcomes",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("customer_id", pa.string(), nullable=False),
            pa.field("operation", pa.string(), nullable=False),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("outcome", pa.string(), nullable=False),
            pa.field("is_late", pa.bool_(), nullable=False),
            pa.field("lag_s", pa.float64(), nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
        ]
    ),
)

HISTORY = TableSpec(
    "silver/customer_history",
    pa.schema(
        [
            *[f for f in SILVER_FIELDS if not f.name.startswith("_cdc_")],
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("operation", pa.string(), nullable=False),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("valid_from", TS, nullable=False),
            pa.field("valid_to", TS),
            pa.field("is_current", pa.bool_(), nullable=False),
        ]
    ),
    configuration=CDF,
)
"""``silver/customer_history`` (SCD2): one row per applied change of a customer (see
:mod:`cdcflow.plan.history`)."""

ALL_TABLES = (BRONZE, QUARANTINE, SILVER, TOMBSTONES, BATCH_LOG, EVENT_OUTCOMES, HISTORY)

#: Outcome values of ``audit/event_outcomes``.
OUTCOMES = ("APPLIED", "SUPERSEDED_IN_BATCH", "STALE", "DUPLICATE", "TOMBSTONED")

#: Bronze columns the fold reads (one row per accepted, first-copy event), in this order.
FOLD_COLUMNS = [
    "customer_id",
    "event_id",
    "operation",
    "event_timestamp",
    *ATTRIBUTES,
    "present_mask",
    "lsn",
    "sequence",
]
