"""Delta table definitions of one table contract: Bronze, quarantine, Silver, tombstones, history.

The same grain and columns as the customers tables of :mod:`cdcflow.layers.tables`, with the
contract's key and typed columns in place of ``customer_id`` and the six string attributes; for
the shipped customers contract the specs are exactly those tables (tested).

Arrow types of the column types: string → string, integer → int64, decimal(p,s) →
decimal128(p,s), double → float64, boolean → bool, date → date32, timestamp →
timestamp(us, UTC), json → string (canonical JSON text).

* Bronze: one row per accepted delivery; key columns typed, non-key columns typed (null when
  absent, ``present_mask`` bit i set when the i-th non-key column is present).
* Quarantine: one row per rejected record; each key column as text (the record's own text when
  it could be read: a rejected key may not fit its type).
* Silver: one row per key; the contract's columns, ``is_deleted``, ``is_active`` (only with
  ``derived_active``), timestamps, ``last_*``, and the ``_cdc_`` sequence registers.
* Tombstones (hard mode) and history (SCD2) as for customers.
* Outcomes: one row per accepted delivery: what became of it (``APPLIED``, ``DUPLICATE``,
  ``SUPERSEDED_IN_BATCH``, ``TOMBSTONED``, ``STALE``), its lag and whether it was late; the
  key columns typed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from cdcflow.layers.tables import CDF, TS, TableSpec, register
from cdcflow.model.contracts import ColumnSpec, TableContract, parse_type


def arrow_type(type_text: str) -> pa.DataType:
    """The Arrow type of a contract column type (see module doc)."""
    kind, precision, scale = parse_type(type_text)
    if kind == "decimal":
        return pa.decimal128(precision, scale)
    return {
        "string": pa.string(),
        "integer": pa.int64(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "date": pa.date32(),
        "timestamp": TS,
        "json": pa.string(),
    }[kind]


def _field(spec: ColumnSpec, nullable: bool = True) -> pa.Field:
    return pa.field(spec.name, arrow_type(spec.type), nullable=nullable)


@dataclass(frozen=True)
class ContractTables:
    """The Delta tables of one contract (paths from its ``table_names``)."""

    bronze: TableSpec
    quarantine: TableSpec
    silver: TableSpec
    tombstones: TableSpec
    history: TableSpec
    outcomes: TableSpec


def mask_type(contract: TableContract) -> pa.DataType:
    """``present_mask``'s type: int32 up to 31 non-key columns (customers), else int64."""
    count = len(contract.attributes)
    if count > 62:
        raise ValueError(f"table {contract.name}: at most 62 non-key columns (has {count})")
    return pa.int32() if count <= 31 else pa.int64()


def fold_columns(contract: TableContract) -> list[str]:
    """The Bronze columns the fold and the history read (one row per first-copy event): the
    key columns, ``event_id``, ``operation``, ``event_timestamp``, the non-key columns,
    ``present_mask``, ``lsn``, ``sequence`` (customers: :data:`cdcflow.layers.tables.
    FOLD_COLUMNS`)."""
    return [
        *contract.keys,
        "event_id",
        "operation",
        "event_timestamp",
        *(c.name for c in contract.attributes),
        "present_mask",
        "lsn",
        "sequence",
    ]


def contract_tables(contract: TableContract) -> ContractTables:
    """The table specs of a contract.

    Raises:
        ValueError: more than 62 non-key columns.
    """
    names = contract.table_names
    keys = [_field(contract.column(k), nullable=False) for k in contract.keys]
    attrs = [_field(c) for c in contract.attributes]
    bronze = pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("ingested_at", TS, nullable=False),
            pa.field("ingestion_date", pa.date32(), nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("raw_payload", pa.string(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            *keys,
            pa.field("operation", pa.string(), nullable=False),
            pa.field("event_timestamp", TS, nullable=False),
            *attrs,
            pa.field("present_mask", mask_type(contract), nullable=False),
            pa.field("source_table", pa.string()),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("lsn_key", pa.string(), nullable=False),
            pa.field("tx_id", pa.string()),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("is_duplicate", pa.bool_(), nullable=False),
        ]
    )
    quarantine = pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("quarantined_at", TS, nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("raw_line", pa.string(), nullable=False),
            pa.field("failure_reason", pa.string(), nullable=False),
            pa.field("failure_detail", pa.string(), nullable=False),
            pa.field("event_id", pa.string()),
            *[pa.field(k, pa.string()) for k in contract.keys],
        ]
    )
    active = [pa.field("is_active", pa.bool_(), nullable=False)] if contract.derived_active else []
    public = [
        *keys,
        *attrs,
        pa.field("is_deleted", pa.bool_(), nullable=False),
        *active,
        pa.field("created_at", TS),
        pa.field("last_updated_at", TS),
        pa.field("deleted_at", TS),
        pa.field("last_event_id", pa.string()),
        pa.field("last_operation", pa.string()),
        pa.field("last_lsn", pa.string()),
    ]
    silver = pa.schema(
        [
            *public,
            pa.field("_cdc_seq", pa.string(), nullable=False),
            pa.field("_cdc_min_seq", pa.string(), nullable=False),
            *[pa.field(register(c.name), pa.string()) for c in contract.attributes],
        ]
    )
    tombstones = pa.schema(
        [
            *keys,
            pa.field("_cdc_seq", pa.string(), nullable=False),
            pa.field("deleted_at", TS, nullable=False),
            pa.field("last_event_id", pa.string(), nullable=False),
            pa.field("last_lsn", pa.string(), nullable=False),
            pa.field("tombstoned_at", TS, nullable=False),
        ]
    )
    history = pa.schema(
        [
            *public,
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("operation", pa.string(), nullable=False),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("valid_from", TS, nullable=False),
            pa.field("valid_to", TS),
            pa.field("is_current", pa.bool_(), nullable=False),
        ]
    )
    outcomes = pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            *keys,
            pa.field("operation", pa.string(), nullable=False),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("outcome", pa.string(), nullable=False),
            pa.field("is_late", pa.bool_(), nullable=False),
            pa.field("lag_s", pa.float64(), nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
        ]
    )
    return ContractTables(
        bronze=TableSpec(names.bronze, bronze, partition_by=("ingestion_date",), configuration=CDF),
        quarantine=TableSpec(names.quarantine, quarantine),
        silver=TableSpec(names.silver, silver, configuration=CDF),
        tombstones=TableSpec(names.tombstones, tombstones),
        history=TableSpec(names.history, history, configuration=CDF),
        outcomes=TableSpec(contract.outcomes_table, outcomes),
    )


__all__ = ["ContractTables", "arrow_type", "contract_tables", "fold_columns", "mask_type"]
