"""Point-in-time reads: customer state as of an instant (from history) or a Silver version;
the same for a declared table (:func:`table_state_as_of`, :func:`table_at_version`).

* :func:`customer_state_as_of` — from ``silver/customer_history``: for every customer, the
  version of highest sequence whose ``valid_from`` is at or before the instant (see
  :mod:`cdcflow.plan.history`); in hard mode a customer whose state is a DELETE has no row.
* :func:`silver_at_version` — ``silver/customers`` read through Delta time travel (a version older
  than ``maintenance.vacuum_retention`` may have lost its files to vacuum).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import log_versions, scan_table
from cdcflow.errors import CdcflowError, TableError
from cdcflow.layers.tables import HISTORY, SILVER
from cdcflow.model.contracts import TableContract
from cdcflow.plan.reference import SILVER_COLUMNS


def open_version(config: CdcflowConfig, name: str, version: int | None = None) -> DeltaTable:
    """The Delta table ``name`` under ``storage.root`` at ``version`` (None: the latest).

    Raises:
        TableError: no such table, or no such version (:func:`unreadable_version` says why:
            after the latest, or vacuumed away).
    """
    try:
        return DeltaTable(
            config.table_uri(name), version=version, storage_options=config.storage.options or None
        )
    except TableNotFoundError as exc:
        if version is not None and DeltaTable.is_deltatable(
            config.table_uri(name), storage_options=config.storage.options or None
        ):  # the table is there, not that version (its log entry is gone)
            raise TableError(unreadable_version(config, name, version, exc)) from exc
        raise TableError(f"{name}: table not found under {config.storage.root}") from exc
    except DeltaError as exc:
        raise TableError(unreadable_version(config, name, version, exc)) from exc


def unreadable_version(
    config: CdcflowConfig, name: str, version: int | None, exc: Exception
) -> str:
    """Why ``version`` of ``name`` cannot be read: before the earliest version its Delta log
    still holds (a vacuum ended time travel there: ``optimize``, ``cdcflow erase``), after the
    latest, a version the log lists whose data files a vacuum removed, or the error itself."""
    if version is not None:
        try:
            commits = log_versions(config.table_uri(name), config.storage.options)
        except (OSError, CdcflowError):
            commits = []
        if commits and version < min(commits):
            return (
                f"{name}: version {version} can no longer be read: time travel starts at "
                f"version {min(commits)} (earlier versions were vacuumed, e.g. by cdcflow erase "
                "or optimize)"
            )
        if commits and version > max(commits):
            return f"{name}: no version {version} (the latest is {max(commits)})"
    text = str(exc)
    if isinstance(exc, FileNotFoundError) or "No such file" in text or "NotFound" in text:
        # the log still lists the version, but a vacuum removed the files it reads
        return (
            f"{name}: version {version} can no longer be read: its data files were vacuumed "
            "(e.g. by cdcflow optimize or erase, after maintenance.vacuum_retention)"
        )
    return f"{name}: cannot read version {version} ({exc})"


def _customer_filter(frame: pl.LazyFrame, customer_id: str | None) -> pl.LazyFrame:
    return frame if customer_id is None else frame.filter(pl.col("customer_id") == customer_id)


def customer_state_as_of(
    config: CdcflowConfig, timestamp: datetime, customer_id: str | None = None
) -> pl.DataFrame:
    """Customer state as of ``timestamp``, from ``silver/customer_history``.

    Args:
        config: the pipeline configuration.
        timestamp: the instant (a naive datetime is taken as UTC).
        customer_id: only this customer (None: all).

    Returns:
        One row per customer_id that existed at ``timestamp`` (soft-deleted customers included,
        hard-deleted ones absent), with the public Silver columns (``SILVER_COLUMNS``), sorted by
        customer_id.

    Raises:
        TableError: the history table does not exist.
    """
    instant = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
    history = scan_table(open_version(config, HISTORY.name))
    versions = _customer_filter(history, customer_id).filter(pl.col("valid_from") <= instant)
    state = versions.sort("sequence").group_by("customer_id").last()
    if config.processing.delete_mode == "hard":
        state = state.filter(~pl.col("is_deleted"))
    return state.select(SILVER_COLUMNS).sort("customer_id").collect()


def silver_at_version(
    config: CdcflowConfig, version: int, customer_id: str | None = None
) -> pl.DataFrame:
    """``silver/customers`` as it was at Delta ``version`` (time travel).

    Returns:
        One row per customer_id in Silver at that version, public columns, sorted by customer_id.

    Raises:
        TableError: the table or the version does not exist (or its files were vacuumed).
    """
    table = open_version(config, SILVER.name, version)
    try:
        frame = _customer_filter(scan_table(table), customer_id)
        return frame.select(SILVER_COLUMNS).sort("customer_id").collect()
    except (DeltaError, OSError, pl.exceptions.ComputeError) as exc:
        raise TableError(unreadable_version(config, SILVER.name, version, exc)) from exc


def _key_filter(frame: pl.LazyFrame, key: dict[str, Any] | None) -> pl.LazyFrame:
    if not key:
        return frame
    return frame.filter(pl.all_horizontal([pl.col(k) == v for k, v in key.items()]))


def table_state_as_of(
    config: CdcflowConfig,
    contract: TableContract,
    timestamp: datetime,
    key: dict[str, Any] | None = None,
) -> pl.DataFrame:
    """A declared table's state as of ``timestamp``, from its history (the rules of
    :func:`customer_state_as_of`, per key tuple).

    Args:
        config: the pipeline configuration.
        contract: the declared table's contract.
        timestamp: the instant (a naive datetime is taken as UTC).
        key: only the rows whose key columns have these (typed) values (None: all).

    Returns:
        One row per key that existed at ``timestamp`` (hard-deleted keys absent), with the
        table's public Silver columns, sorted by key.

    Raises:
        TableError: the history table does not exist.
    """
    from cdcflow.reconcile import contract_public_schema

    instant = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
    keys = list(contract.keys)
    history = scan_table(open_version(config, contract.table_names.history))
    versions = _key_filter(history, key).filter(pl.col("valid_from") <= instant)
    state = versions.sort("sequence").group_by(keys).last()
    if contract.delete_mode == "hard":
        state = state.filter(~pl.col("is_deleted"))
    return state.select(contract_public_schema(contract).names).sort(keys).collect()


def table_at_version(
    config: CdcflowConfig, contract: TableContract, version: int, key: dict[str, Any] | None = None
) -> pl.DataFrame:
    """A declared table's Silver as it was at Delta ``version`` (time travel): public columns,
    one row per key, sorted by key.

    Raises:
        TableError: the table or the version does not exist (or its files were vacuumed).
    """
    from cdcflow.reconcile import contract_public_schema

    name = contract.table_names.silver
    table = open_version(config, name, version)
    try:
        frame = _key_filter(scan_table(table), key)
        present = set(frame.collect_schema().names())
        # a version from before a column was added (schema evolution) reads it as null
        columns = [
            pl.col(c) if c in present else pl.lit(None).alias(c)
            for c in contract_public_schema(contract).names
        ]
        return frame.select(columns).sort(list(contract.keys)).collect()
    except (DeltaError, OSError, pl.exceptions.ComputeError) as exc:
        raise TableError(unreadable_version(config, name, version, exc)) from exc


__all__ = [
    "customer_state_as_of",
    "open_version",
    "silver_at_version",
    "table_at_version",
    "table_state_as_of",
    "unreadable_version",
]
