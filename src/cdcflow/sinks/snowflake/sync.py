"""Incremental, exactly-once synchronization of Silver (and Gold) to Snowflake.

Silver → ``DIM_CUSTOMER_CURRENT``, one sync:

1. Read the synchronized Silver Delta version ``v`` from ``CDC_SYNC_STATE`` (none: full refresh).
2. Read Silver's Change Data Feed for versions ``v+1 .. current`` and reduce it to one row per
   customer_id: the change of the highest commit version wins; a ``delete`` change (hard delete,
   tombstone expiry) becomes ``DELETE``, every other change ``UPSERT`` of the post-image.
3. Load those rows into ``DIM_CUSTOMER_CURRENT_STAGE`` under a fresh ``SYNC_ID``.
4. In one transaction: MERGE the stage rows into the target keyed on ``CUSTOMER_ID`` (rows whose
   public columns already equal the stage are left untouched), then move the state row from
   ``v`` to ``current`` (``UPDATE ... WHERE DELTA_VERSION = v``: a concurrent sync that got
   there first makes this one roll back), then commit.
5. Remove the attempt's stage rows.

A failure anywhere before the commit leaves target and state as they were (the transaction rolls
back), so the next sync recomputes the same change set from the same ``v``; after the commit
the state says ``current`` and the next sync has nothing to do. A full refresh (``--full``,
bootstrap, or a state ahead of Silver after a rebuild) stages the whole Silver snapshot, MERGEs
it, deletes target rows absent from it and upserts the state, in one transaction too.

Gold → ``AGG_*``: each existing Gold table whose Delta version differs from its state row is
copied in full (DELETE + INSERT + state, one transaction).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import arrow_batches, arrow_dataset, log_versions, read_arrow
from cdcflow.errors import CdcflowError, ConfigError, TableError
from cdcflow.logs import get_logger
from cdcflow.sinks.snowflake.connection import connect, target_of
from cdcflow.sinks.snowflake.faults import fail_point
from cdcflow.sinks.snowflake.tables import (
    CUSTOMERS_TARGET,
    GOLD_TABLES,
    STATE_TABLE,
    SyncTarget,
    arrow_to_sf,
    contract_target,
    ddl,
    state_ddl,
    target_ddl,
)

log = get_logger("snowflake.sync")

SyncKind = Literal["incremental", "full", "noop"]
_STAGE_RETENTION = timedelta(days=1)


class SyncConflictError(CdcflowError):
    """Another sync moved ``CDC_SYNC_STATE`` first; this attempt was rolled back (retry it)."""


@dataclass
class TableSyncReport:
    """Outcome of synchronizing one Snowflake table.

    Attributes:
        target: Snowflake table name.
        source: Delta table name under ``storage.root``.
        kind: ``incremental``, ``full`` or ``noop`` (already at the source's version).
        from_version: Delta version synchronized before (None on bootstrap).
        to_version: Delta version synchronized now.
        staged: rows loaded (stage table, or rows copied for Gold).
        inserted / updated / deleted: rows changed in the target.
        source_committed_at: commit time of ``to_version`` in Delta (UTC).
        synced_at: commit time of the Snowflake transaction (UTC).
        load_method: how the rows reached the stage table: ``bulk`` (Parquet, PUT, COPY INTO)
            or ``bind`` (``executemany``); empty for a no-op or a Gold copy.
        median_event_at / early_event_at: an incremental sync's upserted rows' source event
            times (``last_updated_at``): the median and the 5th percentile (None: a full sync,
            a Gold copy, or no upserted row) — the event-time lags below.
        sync_id: the attempt's id (its stage rows' ``SYNC_ID``, the state row's); empty for a
            no-op.
    """

    target: str
    source: str
    kind: SyncKind
    from_version: int | None
    to_version: int
    staged: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    source_committed_at: datetime | None = None
    synced_at: datetime | None = None
    load_method: str = ""
    median_event_at: datetime | None = None
    early_event_at: datetime | None = None
    sync_id: str = ""

    @property
    def lag_s(self) -> float | None:
        """Seconds from the Delta commit of ``to_version`` to the Snowflake commit."""
        if self.source_committed_at is None or self.synced_at is None:
            return None
        return (self.synced_at - self.source_committed_at).total_seconds()

    @property
    def event_lag_p50_s(self) -> float | None:
        """Seconds from the source event time to the Snowflake commit, median over the rows
        the incremental sync upserted (None: see ``median_event_at``)."""
        if self.median_event_at is None or self.synced_at is None:
            return None
        return (self.synced_at - self.median_event_at).total_seconds()

    @property
    def event_lag_p95_s(self) -> float | None:
        """The same lag, 95th percentile (the 5th percentile of the event times)."""
        if self.early_event_at is None or self.synced_at is None:
            return None
        return (self.synced_at - self.early_event_at).total_seconds()

    def log_fields(self) -> dict[str, Any]:
        """Counts, versions and timings (no attribute values)."""
        return {
            "target": self.target,
            "kind": self.kind,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "staged": self.staged,
            "load_method": self.load_method,
            "inserted": self.inserted,
            "updated": self.updated,
            "deleted": self.deleted,
            "lag_s": None if self.lag_s is None else round(self.lag_s, 3),
            "event_lag_p50_s": _rounded(self.event_lag_p50_s),
            "event_lag_p95_s": _rounded(self.event_lag_p95_s),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


#: The Silver column holding a row's source event time (its last event's ``event_timestamp``).
EVENT_TIME_COLUMN = "last_updated_at"


def event_time_quantiles(
    changes: pl.DataFrame, target: SyncTarget
) -> tuple[datetime | None, datetime | None]:
    """The median and the 5th percentile of the upserted rows' source event times.

    Args:
        changes: a change set (``CHANGE_KIND`` + the public columns, :func:`read_changes`).
        target: the table synchronized; without ``last_updated_at`` there is nothing to
            measure.

    Returns:
        (median, 5th percentile) as UTC datetimes; (None, None) without an upserted row (a
        hard-deleted row carries its last event's time, not the delete's: not measured).
    """
    if EVENT_TIME_COLUMN not in target.names or changes.is_empty():
        return None, None
    micros = (
        changes.filter(pl.col("CHANGE_KIND") == "UPSERT")
        .get_column(EVENT_TIME_COLUMN)
        .drop_nulls()
        .dt.epoch("us")
    )
    if micros.is_empty():
        return None, None

    def at(q: float) -> datetime:
        value = micros.quantile(q, interpolation="nearest")
        assert value is not None
        return datetime.fromtimestamp(float(value) / 1e6, UTC)

    return at(0.5), at(0.05)


@dataclass
class SyncReport:
    """Outcome of one sync: the DIM table and every Gold table found.

    Attributes:
        tables: one report per Snowflake table, DIM first.
        duration_ms: wall time in milliseconds.
    """

    tables: list[TableSyncReport] = field(default_factory=list)
    duration_ms: int = 0

    @property
    def dim(self) -> TableSyncReport:
        """The ``DIM_CUSTOMER_CURRENT`` report."""
        return self.tables[0]


# ---------------------------------------------------------------- engine-written files


@dataclass
class WrittenFiles:
    """Parquet files an engine wrote for one sync (:class:`SyncFileWriter`).

    Attributes:
        files: the Parquet files, each ``PUT`` to the stage as it is (local paths).
        rows: rows in all of them (from their footers).
        median_event_at / early_event_at: as :class:`TableSyncReport`'s (None: not measured).
    """

    files: list[Path]
    rows: int
    median_event_at: datetime | None = None
    early_event_at: datetime | None = None


class SyncFileWriter(Protocol):
    """An engine that computes a sync's rows and writes them as Parquet files itself, so that
    the process running the sync only stages and loads files (the Spark engine: Silver's
    Change Data Feed reduced by Spark, the files written by its executors).

    Each method writes into ``folder`` (which does not exist yet; the caller removes it) and
    returns the files; the columns are the stage's (``SYNC_ID``, ``LOADED_AT``,
    ``CHANGE_KIND`` and the public columns in upper case) for Silver, the table's own (upper
    case) for a Gold copy.
    """

    def changes(
        self, target: SyncTarget, from_version: int, to_version: int, stamp: StageStamp,
        folder: Path,
    ) -> WrittenFiles:  # fmt: skip
        """Silver's CDF for versions ``from_version+1 .. to_version`` as :func:`read_changes`
        reduces it (one row per key); raises when the CDF cannot be read."""
        ...

    def snapshot(
        self, target: SyncTarget, version: int, stamp: StageStamp, folder: Path
    ) -> WrittenFiles:
        """Silver's public columns at ``version`` as ``UPSERT`` rows (a full refresh)."""
        ...

    def table(self, name: str, version: int, folder: Path) -> WrittenFiles:
        """Every row of the Delta table ``name`` at ``version`` (a Gold copy)."""
        ...


@dataclass(frozen=True)
class StageStamp:
    """The constant stage columns of one sync attempt: ``SYNC_ID`` and ``LOADED_AT`` (UTC)."""

    sync_id: str
    loaded_at: datetime


def files_folder(config: CdcflowConfig, sync_id: str) -> Path:
    """Where an engine writes a sync attempt's files: ``<storage.root>/_snowflake_files/
    <sync_id>`` (the storage root is the path every Spark executor and the driver see).

    Raises:
        ConfigError: ``storage.root`` is an object-store URI (the files are ``PUT`` from a
            local path).
    """
    if "://" in config.storage.root:
        scheme = config.storage.root.split("://", 1)[0]
        raise ConfigError(
            f"storage.root in {config.file or 'the config'}: the Spark engine's Snowflake sync "
            f"PUTs the Parquet files its executors write from a local or mounted storage root, "
            f"not {scheme}:// (sync with pipeline.engine: local instead)"
        )
    return Path(config.storage.root).resolve() / "_snowflake_files" / sync_id


# ---------------------------------------------------------------- helpers


def _execute(cur: Any, sql: str, params: Sequence[Any] | None = None) -> Any:
    cur.execute(sql, params)
    return cur


#: ``CDC_SYNC_STATE.DELTA_VERSION`` of a target never synchronized.
NEVER_SYNCED = -1


def _state_version(cur: Any, target: str, source: str) -> int | None:
    """The target's synchronized Delta version (None: never), creating its state row if missing.

    The row is created outside the sync transaction so that the transaction only UPDATEs it
    (fakesnow: a second MERGE inside a transaction commits it). A state row recorded for
    another source identity (``source``: the Delta table's name and id — e.g. a lakehouse rebuilt
    from scratch, whose versions start again at 0) counts as never synchronized.
    """
    _execute(
        cur,
        f"INSERT INTO {STATE_TABLE} (TARGET_TABLE, SOURCE_TABLE, DELTA_VERSION, SYNCED_AT, "
        f"SYNC_ID) SELECT %s, %s, %s, %s, '' WHERE NOT EXISTS (SELECT 1 FROM {STATE_TABLE} "
        "WHERE TARGET_TABLE = %s)",
        (target, source, NEVER_SYNCED, datetime.now(UTC), target),
    )
    row = _execute(
        cur,
        f"SELECT DELTA_VERSION, SOURCE_TABLE FROM {STATE_TABLE} WHERE TARGET_TABLE = %s",
        (target,),
    ).fetchone()
    version = int(row[0])
    if row[1] != source:  # another source table: start over with a full refresh
        _execute(
            cur,
            f"UPDATE {STATE_TABLE} SET DELTA_VERSION = %s, SOURCE_TABLE = %s "
            "WHERE TARGET_TABLE = %s",
            (NEVER_SYNCED, source, target),
        )
        return None
    return None if version == NEVER_SYNCED else version


def _advance_state(cur: Any, report: TableSyncReport, sync_id: str) -> None:
    """Move the state row from ``report.from_version`` to ``report.to_version``.

    Raises:
        SyncConflictError: the row is no longer at ``from_version``.
    """
    _execute(
        cur,
        f"UPDATE {STATE_TABLE} SET DELTA_VERSION = %s, SYNCED_AT = %s, SYNC_ID = %s, "
        "SOURCE_TABLE = %s WHERE TARGET_TABLE = %s AND DELTA_VERSION = %s",
        (
            report.to_version,
            datetime.now(UTC),
            sync_id,
            report.source,
            report.target,
            NEVER_SYNCED if report.from_version is None else report.from_version,
        ),
    )
    if cur.rowcount != 1:
        raise SyncConflictError(
            f"{STATE_TABLE}: {report.target} is no longer at Delta version "
            f"{report.from_version} (a concurrent sync); rolled back"
        )


def _commit_time(table: DeltaTable, version: int) -> datetime | None:
    current = table.version()
    for entry in table.history(limit=max(1, current - version + 1)):
        if entry.get("version") == version and "timestamp" in entry:
            return datetime.fromtimestamp(entry["timestamp"] / 1000, tz=UTC)
    return None


def open_delta(config: CdcflowConfig, name: str) -> DeltaTable:
    """Open the Delta table ``name`` under ``storage.root``.

    Raises:
        TableError: it does not exist or cannot be read.
    """
    uri = config.table_uri(name)
    try:
        return DeltaTable(uri, storage_options=config.storage.options or None)
    except Exception as exc:  # deltalake raises TableNotFoundError and others
        raise TableError(f"{name}: cannot open Delta table ({type(exc).__name__})") from None


def to_polars(data: Any) -> pl.DataFrame:
    """A Polars frame of a PyArrow table or any Arrow C stream (e.g. ``load_cdf``'s reader)."""
    table = (
        data if isinstance(data, pa.Table) else pa.RecordBatchReader.from_stream(data).read_all()
    )
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _full_refresh_instead(config: CdcflowConfig, silver: str, synced: int, exc: Exception) -> None:
    """Log why an incremental sync becomes a full refresh: at info level when Silver's log
    starts after the synced version (its earlier versions were vacuumed and the log truncated:
    ``cdcflow erase``, an expected case), as a warning otherwise."""
    try:
        commits = log_versions(config.table_uri(silver), config.storage.options)
    except (OSError, CdcflowError):
        commits = []
    extra = {"from_version": synced, "error_type": type(exc).__name__}
    if commits and min(commits) > synced + 1:
        log.info(
            "Silver's log starts after the synced version (truncated, e.g. by cdcflow erase): "
            "a full refresh",
            extra={**extra, "log_starts_at": min(commits)},
        )
        return
    log.warning("Silver change data feed unreadable, falling back to a full refresh", extra=extra)


def read_changes(
    table: DeltaTable, from_version: int, to_version: int, target: SyncTarget = CUSTOMERS_TARGET
) -> pl.DataFrame:
    """Silver's CDF for versions ``from_version+1 .. to_version``, one row per key.

    Returns:
        Columns ``CHANGE_KIND`` (``UPSERT``/``DELETE``) and the public Silver columns; the row
        of the highest ``_commit_version`` per key (within one version a post-image wins over a
        delete).
    """
    columns = list(target.names)
    keys = list(target.keys)
    cdf = to_polars(table.load_cdf(starting_version=from_version + 1, ending_version=to_version))
    if cdf.is_empty():
        return pl.DataFrame(schema={"CHANGE_KIND": pl.String, **dict(cdf.select(columns).schema)})
    reduced = (
        cdf.filter(pl.col("_change_type") != "update_preimage")
        .with_columns(
            (pl.col("_change_type") != "delete").cast(pl.Int8).alias("_rank"),
        )
        .sort([*keys, "_commit_version", "_rank"])
        .group_by(keys, maintain_order=True)
        .last()
    )
    return reduced.select(
        pl.when(pl.col("_change_type") == "delete")
        .then(pl.lit("DELETE"))
        .otherwise(pl.lit("UPSERT"))
        .alias("CHANGE_KIND"),
        *columns,
    )


def read_snapshot(
    table: DeltaTable, version: int, target: SyncTarget = CUSTOMERS_TARGET
) -> pl.DataFrame:
    """The public Silver columns at ``version`` as ``UPSERT`` rows (full refresh)."""
    table.load_as_version(version)
    frame = to_polars(read_arrow(table, list(target.names)))
    return frame.select(pl.lit("UPSERT").alias("CHANGE_KIND"), *target.names)


def _chunks(rows: list[tuple[Any, ...]], size: int) -> Iterable[list[tuple[Any, ...]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _load_stage(
    cur: Any,
    sync_id: str,
    changes: pl.DataFrame,
    chunk_rows: int,
    target: SyncTarget = CUSTOMERS_TARGET,
) -> int:
    """Row binding: the change rows inserted ``chunk_rows`` at a time (``executemany``)."""
    loaded_at = datetime.now(UTC)
    columns = ["SYNC_ID", "LOADED_AT", "CHANGE_KIND", *(c.upper() for c in target.names)]
    sql = (
        f"INSERT INTO {target.stage} ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    total = 0
    for chunk in changes.iter_slices(chunk_rows):
        rows = [(sync_id, loaded_at, *row) for row in chunk.iter_rows()]
        cur.executemany(sql, rows)
        total += len(rows)
    return total


#: The internal stage of the bulk load when ``snowflake.stage`` names none.
DEFAULT_STAGE = "CDCFLOW_STAGE"


def use_bulk(config: CdcflowConfig, rows: int) -> bool:
    """Whether a change set of ``rows`` rows is loaded through a stage (``load_method``)."""
    method = config.snowflake.load_method
    return method == "bulk" or (method == "auto" and rows >= config.snowflake.bulk_min_rows)


def snapshot_chunks(
    table: DeltaTable, rows: int, target: SyncTarget = CUSTOMERS_TARGET
) -> Iterator[pl.DataFrame]:
    """The public Silver columns of ``table``'s loaded version as ``UPSERT`` rows, ``rows`` at a
    time (a full refresh streamed: never the whole table in memory)."""
    for batch in arrow_batches(table, target.names, batch_size=rows):
        frame = pl.from_arrow(batch)
        assert isinstance(frame, pl.DataFrame)
        if frame.height:
            yield frame.select(pl.lit("UPSERT").alias("CHANGE_KIND"), *target.names)


def _bulk_load_stage(
    config: CdcflowConfig,
    cur: Any,
    sync_id: str,
    chunks: Iterable[pl.DataFrame],
    fail_at: str | None,
    target: SyncTarget = CUSTOMERS_TARGET,
) -> int:
    """Bulk load: the change rows as Parquet files (``bulk_file_rows`` rows each, written one at
    a time to a temporary folder), ``PUT`` to ``@<stage>/<stage table>/<sync_id>/``, then one
    ``COPY INTO`` the stage table matching columns by name (Snowflake docs: "Loading data",
    "COPY INTO <table>", Parquet with ``MATCH_BY_COLUMN_NAME``). The files of an attempt live
    under its own path, so a retried sync never copies another attempt's rows; the stage path
    is removed after the copy where the server supports ``REMOVE``.

    Args:
        chunks: the change rows (``CHANGE_KIND`` + the public columns), one file each.

    Returns:
        Rows loaded.
    """

    path, files = _put_files(
        config,
        cur,
        sync_id,
        target.stage,
        (
            chunk.select(
                pl.lit(sync_id).alias("SYNC_ID"),
                pl.lit(datetime.now(UTC)).alias("LOADED_AT"),
                pl.col("CHANGE_KIND"),
                *(pl.col(c).alias(c.upper()) for c in target.names),
            ).to_arrow()
            for chunk in chunks
        ),
    )
    fail_point("after_put", fail_at)
    if files:
        _execute(cur, _copy_sql(target.stage, path))
    fail_point("after_copy", fail_at)
    total = int(
        _execute(
            cur, f"SELECT COUNT(*) FROM {target.stage} WHERE SYNC_ID = %s", (sync_id,)
        ).fetchone()[0]
    )
    _remove(cur, path)
    return total


def _load_written(
    config: CdcflowConfig,
    cur: Any,
    sync_id: str,
    written: WrittenFiles,
    fail_at: str | None,
    target: SyncTarget,
) -> int:
    """:func:`_bulk_load_stage` for files an engine wrote: ``PUT`` them, one ``COPY INTO``
    the stage table; the rows loaded."""
    path = _put_written(config, cur, sync_id, target.stage, written)
    fail_point("after_put", fail_at)
    if written.files:
        _execute(cur, _copy_sql(target.stage, path))
    fail_point("after_copy", fail_at)
    total = int(
        _execute(
            cur, f"SELECT COUNT(*) FROM {target.stage} WHERE SYNC_ID = %s", (sync_id,)
        ).fetchone()[0]
    )
    _remove(cur, path)
    return total


def _arrow_chunks(table: pa.Table, rows: int) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def _copy_sql(table: str, path: str) -> str:
    """``COPY INTO`` a table from the Parquet files under a stage path, columns by name."""
    return (
        f"COPY INTO {table} FROM {path} FILE_FORMAT=(TYPE=PARQUET) "
        "MATCH_BY_COLUMN_NAME=CASE_INSENSITIVE"
    )


def _put_files(
    config: CdcflowConfig, cur: Any, sync_id: str, table: str, parts: Iterable[pa.Table]
) -> tuple[str, int]:
    """Each Arrow table of ``parts`` as one Parquet file (written to a temporary folder, one at
    a time), ``PUT`` to ``@<stage>/<table>/<sync_id>/``; the path (with an empty file when
    ``parts`` is empty, so a ``COPY`` of it loads nothing).

    Every attempt has a path of its own: Snowflake's load metadata would skip a file copied
    before, and a retried sync must never see another attempt's rows.
    """
    import shutil
    import tempfile
    from pathlib import Path

    import pyarrow.parquet as pq

    path = _stage_path(config, cur, sync_id, table)
    folder = Path(tempfile.mkdtemp(prefix="cdcflow-sf-"))
    number = -1
    try:
        for number, part in enumerate(parts):
            file = folder / f"part-{number:05d}.parquet"
            pq.write_table(part, file)
            _put(cur, file, path)
            file.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return path, number + 1


def _stage_path(config: CdcflowConfig, cur: Any, sync_id: str, table: str) -> str:
    """``@<stage>/<table>/<sync_id>``: an attempt's own path (the default stage created)."""
    stage = config.snowflake.stage or DEFAULT_STAGE
    if not config.snowflake.stage:
        _execute(cur, f"CREATE STAGE IF NOT EXISTS {DEFAULT_STAGE}")
    return f"@{stage}/{table.lower()}/{sync_id}"


def _put(cur: Any, file: Path, path: str) -> None:
    _execute(cur, f"PUT 'file://{file.as_posix()}' {path} AUTO_COMPRESS=FALSE OVERWRITE=TRUE")


def _put_written(
    config: CdcflowConfig, cur: Any, sync_id: str, table: str, written: WrittenFiles
) -> str:
    """``PUT`` the files an engine wrote (:class:`SyncFileWriter`) to the attempt's stage
    path, as :func:`_put_files` does with its own; the path."""
    path = _stage_path(config, cur, sync_id, table)
    for file in written.files:
        _put(cur, file, path)
    return path


def _remove(cur: Any, path: str) -> None:
    """Remove a copied attempt's files from the stage (the emulator has no ``REMOVE``: they
    stay, under the attempt's own path)."""
    try:
        _execute(cur, f"REMOVE {path}")
    except Exception:
        log.debug("stage path not removed", extra={"path": path})


def _key_match(target: SyncTarget) -> str:
    """``t.K = s.K`` for every key column, joined by AND."""
    return " AND ".join(f"t.{k.upper()} = s.{k.upper()}" for k in target.keys)


def _merge_sql(target: SyncTarget = CUSTOMERS_TARGET) -> str:
    cols = [c.upper() for c in target.names]
    others = [c.upper() for c in target.names if c not in target.keys]
    differs = " OR ".join(f"t.{c} IS DISTINCT FROM s.{c}" for c in others)
    sets = ", ".join(f"{c} = s.{c}" for c in others)
    variant = [c.upper() for c in target.names if target.sf_type(c) == "VARIANT"]
    if variant:  # staged as JSON text: parsed in the source query (a plain column in the MERGE)
        parsed = ", ".join(f"PARSE_JSON({c}) AS {c}" if c in variant else c for c in cols)
        rows = f"SELECT CHANGE_KIND, {parsed} FROM {target.stage} WHERE SYNC_ID = %s"
    else:
        rows = f"SELECT * FROM {target.stage} WHERE SYNC_ID = %s"
    return (
        f"MERGE INTO {target.table} t "
        f"USING ({rows}) s "
        f"ON {_key_match(target)} "
        "WHEN MATCHED AND s.CHANGE_KIND = 'DELETE' THEN DELETE "
        f"WHEN MATCHED AND ({differs}) THEN UPDATE SET {sets}, SYNCED_VERSION = %s "
        "WHEN NOT MATCHED AND s.CHANGE_KIND = 'UPSERT' THEN "
        f"INSERT ({', '.join(cols)}, SYNCED_VERSION) "
        f"VALUES ({', '.join('s.' + c for c in cols)}, %s)"
    )


def _merge_counts(row: Sequence[Any] | None) -> tuple[int, int, int]:
    """(inserted, updated, deleted) of a MERGE result row (all three clauses present)."""
    if not row:
        return 0, 0, 0
    values = [int(v or 0) for v in row] + [0, 0, 0]
    return values[0], values[1], values[2]


def ensure_tables(config: CdcflowConfig, cur: Any, target: SyncTarget | None = None) -> None:
    """Create the schema, state table and the target's table and stage if missing (default:
    the customers DIM)."""
    where = target_of(config)
    if target is None or target == CUSTOMERS_TARGET:
        statements = ddl(where.database, where.schema)
    else:
        statements = [*state_ddl(where.database, where.schema), *target_ddl(target)]
    for statement in statements:
        _execute(cur, statement)
    if target is not None and target != CUSTOMERS_TARGET:
        add_columns(cur, target)


def ensure_state(config: CdcflowConfig, cur: Any) -> None:
    """Create the schema and ``CDC_SYNC_STATE`` if missing (a Gold copy needs no other)."""
    where = target_of(config)
    for statement in state_ddl(where.database, where.schema):
        _execute(cur, statement)


def add_columns(cur: Any, target: SyncTarget) -> list[str]:
    """``ALTER TABLE … ADD COLUMN`` on the target and its stage for each public column the
    Silver table has and they lack (a contract evolved since the tables were created: a new
    nullable column, ``docs/tables.md``).

    Returns:
        The columns added (upper case).
    """
    added: list[str] = []
    for table, stage in ((target.table, False), (target.stage, True)):
        present = {
            d[0].upper() for d in _execute(cur, f"SELECT * FROM {table} LIMIT 0").description
        }
        for name in target.names:
            if name.upper() in present:
                continue
            kind = target.stage_type(name) if stage else target.sf_type(name)
            _execute(cur, f"ALTER TABLE {table} ADD COLUMN {name.upper()} {kind}")
            if not stage:
                added.append(name.upper())
    if added:
        log.info("snowflake columns added", extra={"target": target.table, "columns": added})
    return added


def _held_type(data_type: Any, precision: Any, scale: Any) -> tuple[str, int | None, int | None]:
    """A column type as ``INFORMATION_SCHEMA.COLUMNS`` names it: (kind, precision, scale)."""
    kind = str(data_type).upper()
    if kind != "NUMBER" or precision is None or scale is None:
        return kind, None, None
    return kind, int(precision), int(scale)


def _wanted_type(sf_type: str) -> tuple[str, int | None, int | None]:
    """A target column's Snowflake type (:func:`contract_sf_type`) as
    ``INFORMATION_SCHEMA.COLUMNS`` names it (``VARCHAR`` is ``TEXT`` there)."""
    if sf_type.startswith("NUMBER(") and sf_type.endswith(")"):
        precision, scale = sf_type[7:-1].split(",")
        return "NUMBER", int(precision), int(scale)
    return {"VARCHAR": "TEXT"}.get(sf_type, sf_type), None, None


def retyped_columns(config: CdcflowConfig, cur: Any, target: SyncTarget) -> list[str]:
    """The columns of a declared table's Snowflake table whose type is not the one its
    contract now maps to (a widened decimal, a key column of another type after ``cdcflow
    schema accept``): upper case, in table order; empty when the table does not exist."""
    where = target_of(config)
    rows = _execute(
        cur,
        "SELECT COLUMN_NAME, DATA_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE "
        "FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (where.schema, target.table.upper()),
    ).fetchall()
    held = {str(r[0]).upper(): _held_type(r[1], r[2], r[3]) for r in rows}
    return [
        name.upper()
        for name, kind, _ in target.columns
        if name.upper() in held and held[name.upper()] != _wanted_type(kind)
    ]


def rebuild_retyped(config: CdcflowConfig, cur: Any, target: SyncTarget) -> list[str]:
    """Rebuild a declared table's Snowflake table when a column's type changed in its
    contract: the table and its stage are dropped and created with the contract's types, and
    its ``CDC_SYNC_STATE`` row removed, so this sync is a full refresh from Silver (which
    holds every value exactly). Snowflake cannot change a NUMBER's scale in place, and a
    value of the new type would otherwise be rounded to the old one or fail the MERGE on
    every sync. Until the refresh commits the table is empty; a crash in between leaves no
    state row, so the next sync refreshes it.

    Returns:
        The retyped columns (:func:`retyped_columns`); empty: nothing done.
    """
    retyped = retyped_columns(config, cur, target)
    if not retyped:
        return []
    log.warning(
        "snowflake table rebuilt: column types changed",
        extra={"target": target.table, "columns": retyped},
    )
    _execute(cur, f"DELETE FROM {STATE_TABLE} WHERE TARGET_TABLE = %s", (target.table,))
    _execute(cur, f"DROP TABLE IF EXISTS {target.stage}")
    _execute(cur, f"DROP TABLE IF EXISTS {target.table}")
    for statement in target_ddl(target):
        _execute(cur, statement)
    return retyped


# ---------------------------------------------------------------- Silver → DIM


def sync_dim(
    config: CdcflowConfig,
    full: bool = False,
    fail_at: str | None = None,
    target: SyncTarget = CUSTOMERS_TARGET,
    writer: SyncFileWriter | None = None,
) -> TableSyncReport:
    """Synchronize a Silver table to its Snowflake table (see the module docstring).

    Args:
        config: the pipeline configuration.
        full: full refresh instead of the CDF increment.
        fail_at: failure injection point (tests), see :mod:`cdcflow.sinks.snowflake.faults`.
        target: the Silver table and its Snowflake table (default: ``silver/customers`` →
            ``DIM_CUSTOMER_CURRENT``; a declared table's: :func:`contract_target`).
        writer: the engine that writes the change set as Parquet files (always the bulk
            load: nothing of the data passes through this process); None: read here with
            delta-rs and Polars.

    Returns:
        The table report.

    Raises:
        TableError: Silver does not exist.
        SyncConflictError: a concurrent sync advanced the state first (nothing was changed).
        InjectedSyncFailure: ``fail_at`` selected a point.
    """
    silver = open_delta(config, target.silver)
    current = silver.version()
    with connect(config) as conn:
        cur = conn.cursor()
        ensure_tables(config, cur, target)
        if target != CUSTOMERS_TARGET:  # a contract's column changed type: refreshed in full
            rebuild_retyped(config, cur, target)
        source = f"{target.silver}#{silver.metadata().id}"  # a rebuilt lakehouse: another source
        synced = _state_version(cur, target.table, source)
        kind: SyncKind = "incremental"
        if full or synced is None or synced > current:
            kind = "full"
        elif synced == current:
            return TableSyncReport(target.table, source, "noop", synced, current)
        if writer is not None:
            report = _sync_written(config, cur, silver, writer, kind, synced, target, fail_at)
            _finish_dim(config, cur, report, fail_at, target)
            return report
        changes: pl.DataFrame | None = None
        if kind == "incremental":
            assert synced is not None
            try:
                changes = read_changes(silver, synced, current, target)
            except Exception as exc:  # CDF files vacuumed or not recorded for a version
                _full_refresh_instead(config, target.silver, synced, exc)
                kind = "full"
        report = TableSyncReport(target.table, source, kind, synced, current)
        report.source_committed_at = _commit_time(silver, current)
        if changes is not None:  # incremental: the changed rows' event times
            report.median_event_at, report.early_event_at = event_time_quantiles(changes, target)
        sync_id = uuid.uuid4().hex
        file_rows = config.snowflake.bulk_file_rows
        if changes is None and use_bulk(config, arrow_dataset(silver).count_rows()):
            chunks: Iterable[pl.DataFrame] = snapshot_chunks(silver, file_rows, target)
        elif changes is None:
            changes = read_snapshot(silver, current, target)
        if changes is not None and use_bulk(config, changes.height):
            chunks = changes.iter_slices(file_rows)
        if changes is None or use_bulk(config, changes.height):
            report.staged = _bulk_load_stage(config, cur, sync_id, chunks, fail_at, target)
            report.load_method = "bulk"
        else:
            chunk = config.snowflake.load_chunk_rows
            report.staged = _load_stage(cur, sync_id, changes, chunk, target)
            report.load_method = "bind"
        report.sync_id = sync_id
        _finish_dim(config, cur, report, fail_at, target)
    return report


def _finish_dim(
    config: CdcflowConfig, cur: Any, report: TableSyncReport, fail_at: str | None,
    target: SyncTarget,
) -> None:  # fmt: skip
    """After the stage is loaded: the commit, then the attempt's (and old) stage rows removed."""
    fail_point("after_load", fail_at)
    _commit_dim(config, report, report.sync_id, fail_at, target)
    fail_point("after_commit", fail_at)
    _execute(
        cur,
        f"DELETE FROM {target.stage} WHERE SYNC_ID = %s OR LOADED_AT < %s",
        (report.sync_id, datetime.now(UTC) - _STAGE_RETENTION),
    )


def _sync_written(
    config: CdcflowConfig,
    cur: Any,
    silver: DeltaTable,
    writer: SyncFileWriter,
    kind: SyncKind,
    synced: int | None,
    target: SyncTarget,
    fail_at: str | None,
) -> TableSyncReport:
    """The stage loaded from the files ``writer`` wrote (the change set, or the snapshot of a
    full refresh or of an unreadable CDF); the report, before the commit."""
    import shutil

    current = silver.version()
    sync_id = uuid.uuid4().hex
    stamp = StageStamp(sync_id, datetime.now(UTC))
    folder = files_folder(config, sync_id)
    try:
        written = None
        if kind == "incremental":
            assert synced is not None
            try:
                written = writer.changes(target, synced, current, stamp, folder)
            except Exception as exc:  # CDF files vacuumed or not recorded for a version
                _full_refresh_instead(config, target.silver, synced, exc)
                kind = "full"
                shutil.rmtree(folder, ignore_errors=True)
        if written is None:
            written = writer.snapshot(target, current, stamp, folder)
        report = TableSyncReport(target.table, "", kind, synced, current)
        report.source = f"{target.silver}#{silver.metadata().id}"
        report.source_committed_at = _commit_time(silver, current)
        report.median_event_at, report.early_event_at = (
            written.median_event_at, written.early_event_at,
        )  # fmt: skip
        report.sync_id = sync_id
        report.staged = _load_written(config, cur, sync_id, written, fail_at, target)
        report.load_method = "bulk"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


def _commit_dim(
    config: CdcflowConfig,
    report: TableSyncReport,
    sync_id: str,
    fail_at: str | None,
    target: SyncTarget = CUSTOMERS_TARGET,
) -> None:
    """MERGE + state update in one transaction (the MERGE is its first statement)."""
    with connect(config, autocommit=False) as tx:
        cur = tx.cursor()
        try:
            # fakesnow: a MERGE right after an explicit BEGIN fails, and a MERGE after other
            # statements commits them; with autocommit off the MERGE, as the first statement,
            # opens the transaction itself (the same on Snowflake). No other MERGE follows.
            merged = _execute(
                cur, _merge_sql(target), (sync_id, report.to_version, report.to_version)
            ).fetchone()
            report.inserted, report.updated, report.deleted = _merge_counts(merged)
            if report.kind == "full":
                _execute(
                    cur,
                    f"DELETE FROM {target.table} t WHERE NOT EXISTS (SELECT 1 FROM "
                    f"{target.stage} s WHERE s.SYNC_ID = %s AND {_key_match(target)})",
                    (sync_id,),
                )
                report.deleted += max(int(cur.rowcount or 0), 0)
            fail_point("after_merge", fail_at)
            _advance_state(cur, report, sync_id)
            fail_point("after_state", fail_at)
            tx.commit()
        except BaseException:
            tx.rollback()
            raise
    report.synced_at = datetime.now(UTC)


# ---------------------------------------------------------------- Gold → AGG_*


def gold_table_exists(config: CdcflowConfig, name: str) -> bool:
    """Whether the Delta table ``name`` exists under ``storage.root``."""
    return DeltaTable.is_deltatable(
        config.table_uri(name), storage_options=config.storage.options or None
    )


def sync_gold_table(
    config: CdcflowConfig,
    name: str,
    target_table: str,
    full: bool = False,
    setup: Any = None,
    writer: SyncFileWriter | None = None,
) -> TableSyncReport:
    """Copy one Gold table to ``target_table`` in full when its Delta version changed.

    Args:
        config: the pipeline configuration.
        name: the Gold Delta table.
        target_table: its Snowflake table.
        full: copy even when the version was synchronized.
        setup: an open autocommit connection whose state table exists (:func:`sync_gold`
            shares one between the Gold tables); None: one of its own.
        writer: the engine that writes the table's rows as Parquet files (the bulk load);
            None: read here with delta-rs.

    Raises:
        TableError: the table cannot be opened or has a column type without Snowflake mapping.
    """
    gold = open_delta(config, name)
    version = gold.version()
    schema = pa.schema(gold.schema().to_arrow())  # the log's schema: no data read for a no-op
    try:
        cols = [(f.name.upper(), arrow_to_sf(f.type)) for f in schema]
    except TypeError as exc:
        raise TableError(f"{name}: {exc}") from None
    columns_ddl = ", ".join(f"{c} {t}" for c, t in cols)
    with contextlib.ExitStack() as stack:
        if setup is None:
            setup = stack.enter_context(connect(config))
            ensure_state(config, setup.cursor())
        cur = setup.cursor()
        _execute(cur, f"CREATE TABLE IF NOT EXISTS {target_table} ({columns_ddl})")
        # a full copy of a Gold table: one created from an earlier schema (e.g. SHARE before
        # SHARE_PCT) is recreated with the current columns, then filled
        existing = [
            d[0].upper() for d in _execute(cur, f"SELECT * FROM {target_table} LIMIT 0").description
        ]
        recreated = existing != [c for c, _ in cols]
        if recreated:
            _execute(cur, f"CREATE OR REPLACE TABLE {target_table} ({columns_ddl})")
        source = f"{name}#{gold.metadata().id}"
        synced = _state_version(cur, target_table, source)
    if synced == version and not full and not recreated:
        return TableSyncReport(target_table, source, "noop", synced, version)
    report = TableSyncReport(target_table, source, "full", synced, version)
    report.source_committed_at = _commit_time(gold, version)
    sync_id = uuid.uuid4().hex
    path = None
    rows: list[tuple[Any, ...]] = []
    if writer is not None:  # the engine's files staged first; the copy in the transaction
        import shutil

        folder = files_folder(config, sync_id)
        try:
            written = writer.table(name, version, folder)
            with connect(config) as conn:
                path = _put_written(config, conn.cursor(), sync_id, target_table, written)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        count = written.rows
        report.load_method = "bulk"
    else:
        data = read_arrow(gold)
        count = data.num_rows
        if use_bulk(config, count):  # the files staged first; the copy in the transaction
            with connect(config) as conn:
                path, _ = _put_files(
                    config,
                    conn.cursor(),
                    sync_id,
                    target_table,
                    _arrow_chunks(data, config.snowflake.bulk_file_rows),
                )
            report.load_method = "bulk"
        else:
            report.load_method = "bind"
            rows = [tuple(r.values()) for r in data.to_pylist()]
    insert = (
        f"INSERT INTO {target_table} ({', '.join(c for c, _ in cols)}) "
        f"VALUES ({', '.join(['%s'] * len(cols))})"
    )
    with connect(config, autocommit=False) as tx:
        cur = tx.cursor()
        try:
            _execute(cur, f"DELETE FROM {target_table}")
            report.deleted = max(int(cur.rowcount or 0), 0)
            if path is not None and count:
                _execute(cur, _copy_sql(target_table, path))
            for chunk in _chunks(rows, config.snowflake.load_chunk_rows):
                cur.executemany(insert, chunk)
            _advance_state(cur, report, sync_id)
            tx.commit()
        except BaseException:
            tx.rollback()
            raise
    report.staged = report.inserted = count
    report.sync_id = sync_id
    report.synced_at = datetime.now(UTC)
    return report


def sync_gold(
    config: CdcflowConfig, full: bool = False, writer: SyncFileWriter | None = None
) -> list[TableSyncReport]:
    """Copy every existing Gold table (``GOLD_TABLES``) to its ``AGG_*`` table (``writer``: as
    :func:`sync_gold_table`)."""
    present = {n: t for n, t in GOLD_TABLES.items() if gold_table_exists(config, n)}
    if not present:
        return []
    with connect(config) as setup:  # one connection for every table's checks (logins cost)
        ensure_state(config, setup.cursor())
        return [
            sync_gold_table(config, name, target, full, setup, writer)
            for name, target in present.items()
        ]


# ---------------------------------------------------------------- entry point


def sync_snowflake(
    config: CdcflowConfig,
    full: bool = False,
    fail_at: str | None = None,
    writer: SyncFileWriter | None = None,
) -> SyncReport:
    """Synchronize Silver → ``DIM_CUSTOMER_CURRENT`` and Gold → ``AGG_*`` once; with declared
    tables, each table's Silver → its Snowflake table (``contract_target``).

    Args:
        config: the pipeline configuration.
        full: full refresh (bootstrap/repair) instead of the incremental CDF sync.
        fail_at: failure injection point (tests).
        writer: the engine that writes every table's rows as Parquet files
            (:class:`SyncFileWriter`, the Spark engine's); None: read here with delta-rs.

    Returns:
        The sync report (DIM first).

    Raises:
        TableError / SyncConflictError / InjectedSyncFailure: see :func:`sync_dim`.
        MissingDependencyError: the ``snowflake`` extra is not installed.
    """
    started = time.monotonic()
    if config.tables:  # declared tables: each Silver table to its Snowflake table (no Gold)
        from cdcflow.layers.contract_replay import held_contracts

        # the contracts as the Delta tables hold them: columns evolved from events included
        report = SyncReport(
            [
                sync_dim(config, full, fail_at, contract_target(c), writer)
                for c in held_contracts(config)
            ]
        )
    else:
        report = SyncReport([sync_dim(config, full=full, fail_at=fail_at, writer=writer)])
        report.tables.extend(sync_gold(config, full=full, writer=writer))
    report.duration_ms = int((time.monotonic() - started) * 1000)
    for table in report.tables:
        log.info("snowflake sync", extra=table.log_fields())
    return report
