"""delta-rs helpers: table creation, app-transaction-guarded (idempotent) writes, filtered reads.

delta-rs records app transactions (``txn`` actions: app id + version) but does not enforce them,
so every write first reads the table's version for its app id and skips itself when the table
already holds that version (Delta protocol, "Transaction Identifiers").

Reads: every read of a Delta table's rows goes through :func:`scan_table` (lazy Polars) or
:func:`read_arrow` (eager PyArrow). delta-rs reports a table's files as URIs whose root is
percent-encoded (a storage root ``/data/sp ace`` gives ``/data/sp%20ace/...``) and Polars' native
Delta scan opens those strings literally, so a root with a space or a non-ASCII character would
read nothing but ``FileNotFoundError``. :func:`scan_table` keeps the native scan when the table's
URI has no escape and otherwise reads through delta-rs' own dataset, which resolves the paths of
local and object-store tables itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdcflow.errors import ConfigError
from cdcflow.layers.tables import TableSpec


def local_path(uri: str) -> Path | None:
    """The local file-system path of a table URI, or None for an object-store URI."""
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        return Path(unquote(urlsplit(uri).path))
    if "://" in uri:
        return None
    return Path(uri)


def unwritable_root(uri: str, exc: BaseException) -> ConfigError:
    """The configuration error for a table that cannot be created under ``storage.root``.

    For a local path the reason names the folder in the way: the nearest existing ancestor of
    the table's folder when it is a file or is not writable; a ``%XX`` sequence in the path
    (delta-rs decodes it, a bug of delta-rs); else the error of creating the folder. For an
    object-store URI: the first line of the delta-rs error.

    Args:
        uri: the table's URI (``storage.root`` / table name).
        exc: the error delta-rs raised when creating the table.

    Returns:
        A one-line :class:`~cdcflow.errors.ConfigError` naming the path.
    """
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    path = local_path(uri)
    if path is not None:
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            reason = f"{existing} is a file, not a folder"
        elif existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            reason = f"{existing} is not writable"
        elif re.search("%[0-9A-Fa-f]{2}", str(path)):
            reason = (
                "delta-rs reads '%XX' in a local path as an escaped character: "
                "choose a storage.root without it"
            )
        else:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                reason = f"{err.strerror}: {err.filename}" if err.filename else str(err)
    return ConfigError(f"storage.root: cannot create Delta table {uri} ({reason})")


class DeltaStore:
    """Opens the pipeline's Delta tables under ``storage.root``."""

    def __init__(self, uri_of: dict[str, str], storage_options: dict[str, str] | None = None):
        self.uri_of = uri_of
        self.storage_options = storage_options or None
        self._pinned: dict[str, DeltaTable] | None = None
        #: objects of earlier blocks, brought up to date on their first use in the next one
        self._kept: dict[str, DeltaTable] = {}

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, :meth:`table` returns one object per table, at its latest version.

        delta-rs moves a table object to the version of each commit it writes itself (append,
        MERGE, delete), so the object stays the latest version as long as the block is the
        only writer of the table: a micro-batch under the checkpoint's lock. Opening a table
        replays its log (about 8 ms for a table of a few dozen commits); a micro-batch asks for
        its tables about twenty times. An object outlives the block: its first use in the next
        block reads only the commits written since (``update_incremental``, under 1 ms), which
        also takes in what other writers (Gold refresh, optimize, another process) committed
        in between.
        """
        self._pinned = {}
        try:
            yield
        finally:
            self._kept.update(self._pinned)
            self._pinned = None

    def ensure(self, spec: TableSpec) -> None:
        """Create the table (empty, with schema, partitioning and properties) if missing.

        A table an earlier cdcflow created gets the nullable columns ``spec`` has added since
        (e.g. ``audit/batch_log.spark_jobs``), in one schema-only commit, so that every writer
        appends ``spec.schema`` as it is.
        """
        table = self.open(spec)
        names = set(table.schema().to_arrow().names)
        missing = [f for f in spec.schema if f.name not in names and f.nullable]
        if missing:
            from deltalake.schema import Field

            table.alter.add_columns([Field.from_arrow(f) for f in missing])

    def open(self, spec: TableSpec) -> DeltaTable:
        """Open the latest version of a table, creating it (empty) first if missing.

        Raises:
            ConfigError: the table cannot be created under ``storage.root``.
        """
        uri = self.uri_of[spec.name]
        try:
            return DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            try:
                return DeltaTable.create(
                    uri,
                    schema=spec.schema,
                    partition_by=list(spec.partition_by) or None,
                    configuration=spec.configuration or None,
                    mode="ignore",
                    storage_options=self.storage_options,
                )
            except Exception as exc:  # delta-rs raises TableNotFoundError, OSError, DeltaError
                raise unwritable_root(uri, exc) from exc

    def forget(self) -> None:
        """Inside :meth:`pinned`: before another writer of the same tables commits (e.g. an
        automatic optimize), so that the next :meth:`table` brings its object up to date."""
        if self._pinned is not None:
            self._kept.update(self._pinned)
            self._pinned.clear()

    def table(self, spec: TableSpec) -> DeltaTable:
        """Open the latest version of a table (inside :meth:`pinned`: its one object, the table
        created empty first if missing)."""
        if self._pinned is None:
            return DeltaTable(self.uri_of[spec.name], storage_options=self.storage_options)
        table = self._pinned.get(spec.name)
        if table is None:
            table = self._kept.pop(spec.name, None)
            if table is None:
                table = self.open(spec)
            else:
                table.update_incremental()
            self._pinned[spec.name] = table
        return table


def nothing_expired(table: DeltaTable, cutoff: datetime) -> bool:
    """True when the Delta file statistics of a tombstone table prove no row is older than
    ``cutoff`` (both engines check this before reading rows for the tombstone purge).

    Args:
        table: the tombstone table.
        cutoff: the retention cutoff (UTC); a row with ``tombstoned_at < cutoff`` is expired.

    Returns:
        True when the table has no file, or when every file records a ``min.tombstoned_at``
        statistic and none is before ``cutoff``; False when a row may be expired (a statistic
        says so, or a file has none: only reading the rows can tell).
    """
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return True
    if "min.tombstoned_at" not in actions.column_names:
        return False
    mins = actions.column("min.tombstoned_at")
    if mins.null_count:
        return False
    oldest: datetime = pc.min(mins).as_py()
    return (oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)) >= cutoff


def txn_done(table: DeltaTable, app_id: str, version: int) -> bool:
    """True when the table already holds app transaction ``app_id`` at ``version`` or later."""
    current = table.transaction_version(app_id)
    return current is not None and current >= version


def version_after_batch(
    uri: str, storage_options: dict[str, str] | None, app_id: str, batch_id: int
) -> int:
    """The version of a table that micro-batch ``batch_id`` left it at: its last version
    holding app transaction ``app_id`` at ``batch_id`` or lower (before the next micro-batch's
    write; maintenance commits in between, such as an optimize or a replay, are included).

    A micro-batch's writes carry the app transaction (``app_id``, ``batch_id``), and its
    version never decreases along the table's versions, so the version is found by bisection
    (one log read per probe).

    Args:
        uri: the table's URI (it exists).
        storage_options: the object store's options, or None.
        app_id: the app transaction id of the pipeline's micro-batches.
        batch_id: the micro-batch.

    Returns:
        A table version: the latest when no later micro-batch wrote the table; 0 when the
        first write was a later micro-batch's (the table as created).
    """

    def txn(version: int | None) -> tuple[int, int]:
        table = DeltaTable(uri, version=version, storage_options=storage_options or None)
        done = table.transaction_version(app_id)
        return table.version(), -1 if done is None else done

    latest, done = txn(None)
    if done <= batch_id:
        return latest
    low, high = -1, latest  # txn(low) <= batch_id < txn(high); txn(-1) stands for "before"
    while high - low > 1:
        middle = (low + high) // 2
        if txn(middle)[1] <= batch_id:
            low = middle
        else:
            high = middle
    return max(low, 0)


#: How many of a table's newest commits :func:`merge_files_rewritten` looks through for the
#: micro-batch's MERGE (after it only maintenance commits can follow before the batch's audit).
_MERGE_LOOKBACK = 20


def merge_files_rewritten(table: DeltaTable, app_id: str, batch_id: int) -> int | None:
    """Data files the micro-batch's MERGE into ``table`` removed (rewrote whole), from its commit.

    delta-rs and Delta Lake both write MERGE as copy-on-write: every file holding a matched row
    is read and rewritten, and the commit's ``operationMetrics`` counts them
    (``num_target_files_removed`` in a delta-rs commit, ``numTargetFilesRemoved`` in a Delta
    Lake / Spark one). The number is read from the commit, not from the call, so a re-run after
    a crash reports what the committed MERGE did.

    Args:
        table: the Silver table, at a version after the micro-batch's MERGE.
        app_id: the app transaction id of the micro-batch's writes.
        batch_id: the micro-batch id.

    Returns:
        0 when the table holds no commit of ``(app_id, batch_id)`` (the micro-batch changed
        nothing there); else the count of the newest MERGE commit (the micro-batch's: a later
        one can only be a later micro-batch's, and those run after this one's audit); None
        when that commit is not among the newest ``_MERGE_LOOKBACK`` or has no such metric.
    """
    if not txn_done(table, app_id, batch_id):
        return 0
    for commit in table.history(_MERGE_LOOKBACK):
        if commit.get("operation") != "MERGE":
            continue
        metrics = commit.get("operationMetrics") or {}
        value = metrics.get("num_target_files_removed", metrics.get("numTargetFilesRemoved"))
        return None if value is None else int(value)
    return None


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
    """Lazy Polars scan of the table's loaded version: the one way to read a Delta table.

    Polars' native Delta scan opens the strings of ``DeltaTable.file_uris()`` literally; their
    table root is percent-encoded (``/data/sp%20ace/...``), so it only finds the files when the
    table's URI has no ``%`` escape. Otherwise:

    * a local table is scanned natively from the exact file paths (the decoded root followed by
      each file's path relative to it, which is already the name on disk);
    * an object-store table is streamed from delta-rs' own PyArrow dataset, which resolves the
      URIs itself (no Delta statistics file skipping there).

    Args:
        table: the table at the version to read.

    Returns:
        A lazy frame of every row of that version (same columns and types as ``pl.scan_delta``).
    """
    uri = table.table_uri
    if "%" not in uri:
        return pl.scan_delta(table)
    if uri.startswith("file://") and not _has_deletion_vectors(table):
        paths = _local_file_paths(table)
        if paths is not None:
            return _scan_local(table, paths)
    return _scan_via_delta_rs(table)


def _has_deletion_vectors(table: DeltaTable) -> bool:
    features = table.protocol().reader_features
    return features is not None and "deletionVectors" in features


def _local_file_paths(table: DeltaTable) -> list[str] | None:
    """The data files of a local table as file-system paths (None: a file outside its root)."""
    from urllib.parse import unquote

    encoded = table.table_uri.removeprefix("file://").rstrip("/") + "/"
    decoded = unquote(encoded)
    paths = []
    for uri in table.file_uris():
        if not uri.startswith(encoded):
            return None
        paths.append(decoded + uri[len(encoded) :])
    return paths


def _scan_local(table: DeltaTable, paths: list[str]) -> pl.LazyFrame:
    """Native Parquet scan of a local table's files, with the options of ``pl.scan_delta``."""
    from polars.io.scan_options.cast_options import ScanCastOptions

    schema = pl.Schema(table.schema())
    partitions = set(table.metadata().partition_columns)
    if not paths:
        return pl.LazyFrame(schema=schema)
    scan = pl.scan_parquet(
        paths,
        hive_schema=pl.Schema({k: v for k, v in schema.items() if k in partitions})
        if partitions
        else None,
        hive_partitioning=bool(partitions),
        cast_options=ScanCastOptions._default_iceberg(),
        missing_columns="insert",
        extra_columns="ignore",
    )
    return scan.select(list(schema))


def _scan_via_delta_rs(table: DeltaTable) -> pl.LazyFrame:
    """Stream the table's rows from delta-rs' PyArrow dataset (it resolves every URI itself)."""
    from polars.io.plugins import register_io_source

    schema = pl.Schema(table.schema())
    dataset = arrow_dataset(table)

    def batches(
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        left = n_rows
        for batch in dataset.to_batches(columns=with_columns, batch_size=batch_size or 131_072):
            frame = pl.DataFrame(pl.from_arrow(batch))
            frame = frame.cast({k: schema[k] for k in frame.columns})
            if predicate is not None:
                frame = frame.filter(predicate)
            if left is not None:
                frame = frame.head(left)
                left -= frame.height
            yield frame
            if left is not None and left <= 0:
                return

    return register_io_source(batches, schema=schema, is_pure=True)


def log_versions(uri: str, options: dict[str, str] | None = None) -> list[int]:
    """The versions whose commit file (``<version>.json``) the table's ``_delta_log`` still
    holds, sorted: after a vacuum that truncated the log (``cdcflow erase``), the first is
    where time travel starts.

    Args:
        uri: the table's URI (local path or object-store URI).
        options: the storage options (``storage.options``).

    Raises:
        OSError / CdcflowError: the log cannot be listed.
    """
    from cdcflow.state.storage import open_storage

    names = open_storage(f"{uri}/_delta_log", options).names()
    return sorted(
        int(n.split(".")[0]) for n in names if n.endswith(".json") and n.split(".")[0].isdigit()
    )


def read_arrow(table: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """Eager PyArrow read of the table's loaded version (Arrow types kept as stored).

    Reads through delta-rs' own dataset, which resolves percent-encoded file URIs (see
    :func:`scan_table`), over :func:`arrow_dataset`'s file system. Use this, not
    ``DeltaTable.to_pyarrow_table``.

    Args:
        table: the table at the version to read.
        columns: the columns to read (None: all).

    Returns:
        Every row of that version.
    """
    if _native_object_store(table):
        return _read_native(table, columns)
    return arrow_dataset(table).to_table(columns=None if columns is None else list(columns))


def _native_object_store(table: DeltaTable) -> bool:
    """An object-store table whose URI Polars' native Delta scan opens (no ``%`` escape)."""
    uri = table.table_uri
    return not uri.startswith("file://") and "%" not in uri


def _read_native(table: DeltaTable, columns: Sequence[str] | None) -> pa.Table:
    """An object-store table read by Polars' native Delta scan (the Rust object store, not a
    Python file system: nothing of the read is left for Arrow's threads to release at exit),
    cast back to the table's Arrow types."""
    return _stored_types(table, _native_scan(table, columns).collect().to_arrow())


def _native_scan(table: DeltaTable, columns: Sequence[str] | None) -> pl.LazyFrame:
    scan = scan_table(table)
    return scan if columns is None else scan.select(list(columns))


def _stored_types(table: DeltaTable, data: pa.Table) -> pa.Table:
    stored = pa.schema(table.schema().to_arrow())
    return data.cast(pa.schema([stored.field(name) for name in data.column_names]))


def arrow_batches(
    table: DeltaTable, columns: Sequence[str] | None = None, batch_size: int = 131_072
) -> Iterator[pa.RecordBatch]:
    """Streamed PyArrow read of the table's loaded version: record batches of at most
    ``batch_size`` rows, read as by :func:`read_arrow`.

    Args:
        table: the table at the version to read.
        columns: the columns to read (None: all).
        batch_size: most rows per batch.

    Yields:
        The rows of that version, batch by batch.
    """
    if _native_object_store(table):  # streamed by Polars, batch by batch
        for frame in _native_scan(table, columns).collect_batches(chunk_size=batch_size):
            yield from _stored_types(table, frame.to_arrow()).to_batches(max_chunksize=batch_size)
        return
    yield from arrow_dataset(table).to_batches(
        columns=None if columns is None else list(columns),
        batch_size=batch_size,
    )


def arrow_dataset(table: DeltaTable) -> ds.Dataset:
    """delta-rs' PyArrow dataset of the table's loaded version (metadata and row counts; read
    its rows with :func:`read_arrow` or :func:`arrow_batches`).

    A local table whose files all lie under its root is read through PyArrow's native local
    file system. Otherwise delta-rs resolves the (percent-encoded) file URIs itself, through a
    Python file system; Arrow releases a scan's fragments on its own threads after the scan
    returns, and one that does so while the interpreter exits needs the GIL there and aborts the
    process ("terminate called without an active exception", apache/arrow#34314) — which the
    native file system avoids.
    """
    if table.table_uri.startswith("file://") and _local_file_paths(table) is not None:
        from urllib.parse import unquote

        import pyarrow.fs as pa_fs

        root = unquote(table.table_uri.removeprefix("file://").rstrip("/"))
        local = pa_fs.SubTreeFileSystem(root, pa_fs.LocalFileSystem())
        return table.to_pyarrow_dataset(filesystem=local)
    return table.to_pyarrow_dataset()


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
