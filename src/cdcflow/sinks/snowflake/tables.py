"""Snowflake tables written by the sync: names, columns and DDL.

* ``DIM_CUSTOMER_CURRENT`` — one row per customer_id: every public Silver column (the ``_cdc_``
  registers excluded) in upper case, plus ``SYNCED_VERSION`` (the Silver Delta version of the
  sync that last wrote the row). Soft-deleted customers have ``IS_DELETED = TRUE``;
  hard-deleted customers are absent.
* ``DIM_CUSTOMER_CURRENT_STAGE`` — rows loaded by one sync attempt (``SYNC_ID``), with
  ``CHANGE_KIND`` ``UPSERT`` or ``DELETE``; rows of failed attempts are removed after a day.
* ``CDC_SYNC_STATE`` — one row per target table: the Delta version of its source it reflects.
* ``AGG_*`` — one table per Gold table (full copy, columns as in Delta, upper case).

A declared table (``tables:``) syncs the same way to its contract's Snowflake table
(``tables.snowflake``, default ``<NAME>_CURRENT``, keyed on its key columns) through a stage of
its own (``<TABLE>_STAGE``): :class:`SyncTarget` describes either. Its column types map from the
contract (:func:`contract_sf_type`): string → VARCHAR, integer → NUMBER(38,0), decimal(p,s) →
NUMBER(p,s), double → FLOAT, boolean → BOOLEAN, date → DATE, timestamp → TIMESTAMP_TZ (UTC
instants), json → VARIANT (staged as text, ``PARSE_JSON`` in the MERGE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from cdcflow.plan.reference import SILVER_COLUMNS

if TYPE_CHECKING:
    from cdcflow.model.contracts import TableContract

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


@dataclass(frozen=True)
class SyncTarget:
    """One Silver table and the Snowflake table it syncs to.

    Attributes:
        silver: the Delta table under ``storage.root``.
        table: the Snowflake table (one row per key).
        keys: the key columns (Silver names).
        columns: the public Silver columns in table order, each (name, Snowflake type, NOT
            NULL).
    """

    silver: str
    table: str
    keys: tuple[str, ...]
    columns: tuple[tuple[str, str, bool], ...]

    @property
    def stage(self) -> str:
        """The stage table of a sync attempt's rows."""
        return f"{self.table}_STAGE"

    @property
    def names(self) -> tuple[str, ...]:
        """The public Silver columns (lower case, as in Delta)."""
        return tuple(name for name, _, _ in self.columns)

    def sf_type(self, column: str) -> str:
        """The Snowflake type of a public column."""
        return next(t for name, t, _ in self.columns if name == column)

    def stage_type(self, column: str) -> str:
        """The type of a column in the stage (VARIANT is staged as VARCHAR text)."""
        kind = self.sf_type(column)
        return "VARCHAR" if kind == "VARIANT" else kind

    def column_defs(self, stage: bool = False) -> str:
        """``NAME TYPE [NOT NULL]`` of every column (the stage's types with ``stage``)."""
        return ", ".join(
            f"{name.upper()} {self.stage_type(name) if stage else kind}"
            f"{' NOT NULL' if not_null else ''}"
            for name, kind, not_null in self.columns
        )


#: The shipped customers contract's target: ``DIM_CUSTOMER_CURRENT``.
CUSTOMERS_TARGET = SyncTarget(
    silver=SILVER_TABLE,
    table=DIM_TABLE,
    keys=("customer_id",),
    columns=tuple(
        (col, sf_type(col), col in ("customer_id", *_BOOL_COLUMNS)) for col in PUBLIC_COLUMNS
    ),
)


def contract_sf_type(type_text: str) -> str:
    """The Snowflake type of a contract column type (module doc)."""
    from cdcflow.model.contracts import parse_type

    kind, precision, scale = parse_type(type_text)
    if kind == "decimal":
        return f"NUMBER({precision},{scale})"
    return {
        "string": "VARCHAR",
        "integer": "NUMBER(38,0)",
        "double": "FLOAT",
        "boolean": "BOOLEAN",
        "date": "DATE",
        "timestamp": "TIMESTAMP_TZ",
        "json": "VARIANT",
    }[kind]


def contract_target(contract: TableContract) -> SyncTarget:
    """The Snowflake target of a declared table: its public Silver columns, typed from the
    contract (system columns: BOOLEAN, TIMESTAMP_TZ, VARCHAR); keys and booleans NOT NULL."""
    from cdcflow.reconcile import contract_public_schema

    declared = {c.name: c.type for c in contract.columns}
    columns = []
    for f in contract_public_schema(contract):
        kind = contract_sf_type(declared[f.name]) if f.name in declared else arrow_to_sf(f.type)
        columns.append((f.name, kind, f.name in contract.keys or not f.nullable))
    return SyncTarget(
        silver=contract.table_names.silver,
        table=contract.table_names.snowflake,
        keys=tuple(contract.keys),
        columns=tuple(columns),
    )


def state_ddl(database: str, schema: str) -> list[str]:
    """The schema and ``CDC_SYNC_STATE`` (shared by every target)."""
    return [
        f"CREATE SCHEMA IF NOT EXISTS {database}.{schema}",
        f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (TARGET_TABLE VARCHAR NOT NULL, "
        "SOURCE_TABLE VARCHAR NOT NULL, DELTA_VERSION NUMBER(38,0) NOT NULL, "
        "SYNCED_AT TIMESTAMP_TZ NOT NULL, SYNC_ID VARCHAR NOT NULL, PRIMARY KEY (TARGET_TABLE))",
    ]


def target_ddl(target: SyncTarget) -> list[str]:
    """``CREATE ... IF NOT EXISTS`` of a target's table and stage."""
    keys = ", ".join(k.upper() for k in target.keys)
    return [
        f"CREATE TABLE IF NOT EXISTS {target.table} ({target.column_defs()}, "
        f"SYNCED_VERSION NUMBER(38,0) NOT NULL, PRIMARY KEY ({keys}))",
        f"CREATE TABLE IF NOT EXISTS {target.stage} (SYNC_ID VARCHAR NOT NULL, "
        "CHANGE_KIND VARCHAR NOT NULL, LOADED_AT TIMESTAMP_TZ NOT NULL, "
        f"{target.column_defs(stage=True)})",
    ]


def ddl(database: str, schema: str) -> list[str]:
    """``CREATE ... IF NOT EXISTS`` statements of the DIM, stage and state tables."""
    first, state = state_ddl(database, schema)
    return [first, *target_ddl(CUSTOMERS_TARGET), state]


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
