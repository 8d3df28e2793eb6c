"""Snowflake tables written by the sync: names, columns and DDL.

* ``DIM_CUSTOMER_CURRENT`` — one row per customer_id: every public Silver column (the ``_cdc_``
  registers excluded) in upper case, plus ``SYNCED_VERSION`` (the Silver Delta version of the
  sync that last wrote the row). Soft-deleted customers have ``IS_DELETED = TRUE``;
  hard-deleted customers are absent.
* ``DIM_CUSTOMER_CURRENT_STAGE`` — rows loaded by one sync attempt (``SYNC_ID``), with
  ``CHANGE_KIND`` ``UPSERT`` or ``DELETE``; rows of failed attempts are removed after a day.
* ``CDC_SYNC_STATE`` — one row per target table: the Delta version of its source it reflects.
* ``AGG_*`` — one table per Gold table (full copy, columns as in Delta, upper case).
"""

from __future__ import annotations

import pyarrow as pa

from cdcflow.plan.reference import SILVER_COLUMNS

DIM_TABLE = "DIM_CUSTOMER_CURRENT"
STAGE_TABLE = "DIM_CUSTOMER_CURRENT_STAGE"
STATE_TABLE = "CDC_SYNC_STATE"
SILVER_TABLE = "silver/customers"

#: Gold Delta table (under ``storage.root``) → Snowflake table.
GOLD_TABLES = {
    "gold/daily_customer_metrics": "AGG_CUSTOMER_METRICS",
    "gold/active_customers_by_geo": "AGG_ACTIVE_CUSTOMERS_BY_GEO",
    "gold/status_distribution": "AGG_STATUS_DISTRIBUTION",
}

_TS_COLUMNS = ("created_at", "last_updated_at", "deleted_at")
_BOOL_COLUMNS = ("is_deleted", "is_active")

#: Public Silver columns, in table order (``customer_id`` first).
PUBLIC_COLUMNS: tuple[str, ...] = SILVER_COLUMNS
TIMESTAMP_COLUMNS: tuple[str, ...] = _TS_COLUMNS


def sf_type(column: str) -> str:
    """Snowflake type of a public Silver column."""
    if column in _TS_COLUMNS:
        return "TIMESTAMP_TZ"
    if column in _BOOL_COLUMNS:
        return "BOOLEAN"
    return "VARCHAR"


def _column_defs() -> str:
    defs = []
    for col in PUBLIC_COLUMNS:
        not_null = " NOT NULL" if col in ("customer_id", *_BOOL_COLUMNS) else ""
        defs.append(f"{col.upper()} {sf_type(col)}{not_null}")
    return ", ".join(defs)


def ddl(database: str, schema: str) -> list[str]:
    """``CREATE ... IF NOT EXISTS`` statements of the DIM, stage and state tables."""
    cols = _column_defs()
    return [
        f"CREATE SCHEMA IF NOT EXISTS {database}.{schema}",
        f"CREATE TABLE IF NOT EXISTS {DIM_TABLE} ({cols}, SYNCED_VERSION NUMBER(38,0) NOT NULL, "
        "PRIMARY KEY (CUSTOMER_ID))",
        f"CREATE TABLE IF NOT EXISTS {STAGE_TABLE} (SYNC_ID VARCHAR NOT NULL, "
        "CHANGE_KIND VARCHAR NOT NULL, LOADED_AT TIMESTAMP_TZ NOT NULL, "
        f"{cols})",
        f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (TARGET_TABLE VARCHAR NOT NULL, "
        "SOURCE_TABLE VARCHAR NOT NULL, DELTA_VERSION NUMBER(38,0) NOT NULL, "
        "SYNCED_AT TIMESTAMP_TZ NOT NULL, SYNC_ID VARCHAR NOT NULL, PRIMARY KEY (TARGET_TABLE))",
    ]


def arrow_to_sf(dtype: pa.DataType) -> str:
    """Snowflake type of an Arrow type (Gold tables).

    Raises:
        TypeError: a nested or otherwise unsupported type.
    """
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "VARCHAR"
    if pa.types.is_boolean(dtype):
        return "BOOLEAN"
    if pa.types.is_integer(dtype):
        return "NUMBER(38,0)"
    if pa.types.is_floating(dtype):
        return "FLOAT"
    if pa.types.is_decimal(dtype):
        return f"NUMBER({dtype.precision},{dtype.scale})"
    if pa.types.is_date(dtype):
        return "DATE"
    if pa.types.is_timestamp(dtype):
        return "TIMESTAMP_TZ" if dtype.tz else "TIMESTAMP_NTZ"
    raise TypeError(f"no Snowflake mapping for Arrow type {dtype}")
