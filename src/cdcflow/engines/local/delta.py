"""delta-rs helpers: table creation, app-transaction-guarded (idempotent) writes, filtered reads.

delta-rs records app transactions (``txn`` actions: app id + version) but does not enforce them,
so every write first reads the table's version for its app id and skips itself when the table
already holds that version (Delta protocol, "Transaction Identifiers").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdcflow.layers.tables import TableSpec


class DeltaStore:
    """Opens the pipeline's Delta tables under ``storage.root``."""

    def __init__(self, uri_of: dict[str, str], storage_options: dict[str, str] | None = None):
        self.uri_of = uri_of
        self.storage_options = storage_options or None

    def ensure(self, spec: TableSpec) -> None:
        """Create the table (empty, with schema, partitioning and properties) if missing."""
        uri = self.uri_of[spec.name]
        try:
            DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            DeltaTable.create(
                uri,
                schema=spec.schema,
                partition_by=list(spec.partition_by) or None,
                configuration=spec.configuration or None,
                mode="ignore",
                storage_options=self.storage_options,
            )

    def table(self, spec: TableSpec) -> DeltaTable:
        """Open the latest version of a table."""
        return DeltaTable(self.uri_of[spec.name], storage_options=self.storage_options)


def txn_done(table: DeltaTable, app_id: str, version: int) -> bool:
    """True when the table already holds app transaction ``app_id`` at ``version`` or later."""
    current = table.transaction_version(app_id)
    return current is not None and current >= version


def commit_props(app_id: str, version: int) -> CommitProperties:
    """Commit properties carrying the app transaction (app_id, version)."""
    return CommitProperties(app_transactions=[Transaction(app_id=app_id, version=version)])


def append_once(
    table: DeltaTable, data: pa.Table, app_id: str, version: int, spec: TableSpec
) -> bool:
    """Append ``data`` unless the table already holds (app_id, version).

    Returns:
        True when a commit was written (False when skipped or when ``data`` is empty).
    """
    if data.num_rows == 0 or txn_done(table, app_id, version):
        return False
    write_deltalake(
        table,
        data.cast(spec.schema),
        mode="append",
        commit_properties=commit_props(app_id, version),
    )
    return True


def scan_table(table: DeltaTable) -> pl.LazyFrame:
    """Lazy Polars scan of the table's loaded version."""
    return pl.scan_delta(table)


def read_where_in(
    table: DeltaTable,
    column: str,
    values: Iterable[str],
    columns: Sequence[str],
    extra: pl.Expr | None = None,
) -> pl.DataFrame:
    """Read ``columns`` of the rows whose ``column`` is in ``values`` (and ``extra`` holds)."""
    keys = pl.Series(column, sorted(set(values)), dtype=pl.String)
    condition = pl.col(column).is_in(keys.implode())
    if extra is not None:
        condition = condition & extra
    return scan_table(table).filter(condition).select(columns).collect()
