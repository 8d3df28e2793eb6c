"""Local engine replay: rebuild Silver (and hard-mode tombstones) from Bronze alone.

Steps (``cdcflow replay``):

1. :func:`rebuild_shadow` reads Bronze at a pinned Delta version (latest, or ``--to-version``),
   splits the customers into hash buckets (``customer_id.hash() % buckets``) and, per bucket,
   lazily scans only that bucket's first copies (``is_duplicate = false``), re-validates every
   row (the columns of :func:`cdcflow.engines.local.batch_frame.revalidate_frame`, equal to
   :func:`cdcflow.plan.replay.revalidate`), folds it completely with the engine's Polars
   fold (:func:`~cdcflow.engines.local.fold.fold_events`) and appends the result to the shadow
   tables ``_shadow/silver/customers`` and ``_shadow/silver/customer_tombstones``. The fold is
   per customer_id, so the buckets' union equals one fold over all of Bronze, while memory is
   bounded by one bucket.
2. :func:`verify` compares the shadow with the live tables (:mod:`cdcflow.reconcile`).
3. :func:`apply` replaces the tombstones, then Silver, each with the shadow content in ONE Delta
   commit (an overwrite: the previous state stays reachable by time travel), records the delete
   mode in Silver's ``cdcflow.deleteMode`` property, and appends a ``kind = 'replay'`` row to
   ``audit/batch_log``.

Crash safety of ``--apply``: every write of a replay carries the Delta app transaction
``cdcflow-<pipeline>-replay`` with version = the replay id (0, 1, ...), and the batch_log row is
written last. A replay that wrote the tombstones or Silver but not its batch_log row did not
finish (:func:`replay_progress`): micro-batches refuse to run (:func:`check_lakehouse`), and the
next ``replay --apply`` takes over its replay id, rewrites the tombstones and Silver from its own
shadow and writes the one batch_log row, so a killed and re-run replay ends equal to an
uninterrupted one.

The same start-up check refuses a ``processing.delete_mode`` that differs from the mode Silver
was built in (:func:`check_delete_mode`); ``replay --apply`` rebuilds Silver and the tombstones in
the configured mode and then records it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.batch_frame import revalidate_frame
from cdcflow.engines.local.delta import (
    arrow_dataset,
    scan_table,
    txn_done,
    version_after_batch,
)
from cdcflow.engines.local.fold import batch_tombstones, fold_events
from cdcflow.errors import CdcflowError, ConfigError, TableError
from cdcflow.layers.tables import (
    BATCH_LOG,
    BRONZE,
    DELETE_MODE_PROPERTY,
    SILVER,
    TOMBSTONES,
    TableSpec,
)
from cdcflow.logs import get_logger
from cdcflow.model.events import ATTRIBUTES
from cdcflow.plan.replay import DEFAULT_BUCKET_ROWS, bucket_count
from cdcflow.plan.rules import CustomerIdPattern
from cdcflow.reconcile import ReconcileReport, reconcile_state
from cdcflow.report import BatchReport
from cdcflow.state.checkpoint import Checkpoint
from cdcflow.state.faults import crash_point

log = get_logger("engine.local.replay")

SHADOW_PREFIX = "_shadow"
_TOMBSTONE_COLUMNS = ["_cdc_seq", "deleted_at", "last_event_id", "last_lsn", "tombstoned_at"]

_EVENT_DTYPES: dict[str, Any] = {
    "event_timestamp": pl.Datetime("us", "UTC"),
    "ingested_at": pl.Datetime("us", "UTC"),
    "present_mask": pl.Int32,
    **{name: pl.String for name in (*ATTRIBUTES, "lsn", "sequence")},
}


class ReplayError(CdcflowError):
    """A replay cannot run or cannot be applied (e.g. Bronze changed since the rebuild)."""


def shadow_name(spec: TableSpec) -> str:
    """Name of the shadow copy of a table (e.g. ``_shadow/silver/customers``)."""
    return f"{SHADOW_PREFIX}/{spec.name}"


@dataclass
class ReplayResult:
    """What a replay rebuilt.

    Attributes:
        delete_mode: ``soft`` or ``hard``.
        bronze_version: the Bronze Delta version read.
        bronze_rows: Bronze rows at that version (duplicates included).
        duplicates: Bronze rows flagged ``is_duplicate`` (skipped).
        last_batch_id: highest micro-batch id in Bronze (-1 when empty).
        buckets: customer hash buckets processed.
        events: first copies that re-validated (the fold's input).
        inserts / updates / deletes: ``events`` by operation.
        rejected: failure reason → Bronze first copies that no longer validate.
        sequence_mismatches: rows whose re-derived sequence differs from the stored one.
        duplicate_ids: first copies sharing an event_id with an earlier first copy.
        silver_rows / tombstone_rows: rows written to the shadow tables.
        seconds: wall time of the rebuild.
        silver_report / tombstone_report: filled by :func:`verify`.
        applied_version: Silver's Delta version written by :func:`apply`.
        replay_id: the replay id :func:`apply` wrote under (app transaction version).
        resumed: True when :func:`apply` finished an interrupted replay (took over its id).
    """

    delete_mode: str
    bronze_version: int
    bronze_rows: int = 0
    duplicates: int = 0
    last_batch_id: int = -1
    buckets: int = 0
    events: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    sequence_mismatches: int = 0
    duplicate_ids: int = 0
    silver_rows: int = 0
    tombstone_rows: int = 0
    seconds: float = 0.0
    silver_report: ReconcileReport | None = None
    tombstone_report: ReconcileReport | None = None
    applied_version: int | None = None
    replay_id: int | None = None
    resumed: bool = False

    @property
    def verified(self) -> bool | None:
        """True/False after :func:`verify` (shadow equals live), None before."""
        if self.silver_report is None:
            return None
        tomb_ok = self.tombstone_report is None or self.tombstone_report.ok
        return self.silver_report.ok and tomb_ok

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        data = {k: v for k, v in self.__dict__.items() if not k.endswith("_report")}
        data["verified"] = self.verified
        data["silver_report"] = self.silver_report.to_json() if self.silver_report else None
        data["tombstone_report"] = (
            self.tombstone_report.to_json() if self.tombstone_report else None
        )
        return data


def _open(config: CdcflowConfig, name: str, version: int | None = None) -> DeltaTable:
    try:
        return DeltaTable(
            config.table_uri(name),
            version=version,
            storage_options=config.storage.options or None,
        )
    except TableNotFoundError as exc:
        raise TableError(f"{config.table_uri(name)}: Delta table not found") from exc
    except Exception as exc:  # delta-rs raises a generic error for a missing version
        raise TableError(f"{config.table_uri(name)}: cannot open version {version}: {exc}") from exc


def _write(
    config: CdcflowConfig,
    name: str,
    data: pa.Table,
    mode: Literal["append", "overwrite"],
    props: CommitProperties | None,
) -> None:
    options = config.storage.options or None
    uri = config.table_uri(name)
    if mode == "overwrite":
        write_deltalake(
            uri, data, mode="overwrite", storage_options=options, commit_properties=props
        )
    else:
        write_deltalake(uri, data, mode="append", storage_options=options, commit_properties=props)


def _tombstones(events: pl.DataFrame) -> pl.DataFrame:
    """Latest DELETE per customer_id, with the processing time of the batch that brought it."""
    return (
        batch_tombstones(events, carry=("ingested_at",))
        .rename({"ingested_at": "tombstoned_at"})
        .select(TOMBSTONES.schema.names)
    )


def rebuild_shadow(
    config: CdcflowConfig,
    to_version: int | None = None,
    bucket_rows: int = DEFAULT_BUCKET_ROWS,
    on_bucket: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Rebuild Silver (and hard-mode tombstones) from Bronze into the shadow tables.

    Args:
        config: the pipeline configuration (delete mode and validation rules are taken from it).
        to_version: Bronze Delta version to read (time travel); None = latest.
        bucket_rows: target Bronze rows per customer hash bucket (bounds memory).
        on_bucket: called with (buckets done, buckets total) after each bucket.

    Returns:
        The counts of the rebuild; the shadow tables hold the result.

    Raises:
        TableError: Bronze (or the requested version) does not exist.
        ReplayError: an erasure (``cdcflow erase``) ran during the rebuild, or one is
            unfinished (a request without its completion: it may be redacting Bronze while
            the rebuild reads an earlier version): the shadow tables, which may hold what it
            erases, are emptied (and vacuumed); finish the erasure and run the replay again.
    """
    from cdcflow.layers.erasure import erasure_log

    def erasing() -> tuple[int, int]:
        """(rows of the erasure log, requests not completed: an erasure running or killed)."""
        log = erasure_log(config)
        done = set(log.filter(pl.col("status") == "completed")["request_id"].to_list())
        return log.height, len(set(log["request_id"].to_list()) - done)

    before = erasing()
    try:
        result = _rebuild_shadow(config, to_version, bucket_rows, on_bucket)
    except BaseException:
        if erasing() != before or before[1]:
            _empty_shadows(config)
        raise
    after = erasing()
    # a request written before the rebuild began may redact Bronze while the rebuild reads an
    # earlier version of it: an unfinished request then counts as an erasure during it
    if after != before or after[1]:
        _empty_shadows(config)
        raise ReplayError(
            "an erasure ran during the rebuild, or one is unfinished (cdcflow erase): the "
            "shadow tables were emptied; finish the erasure (run the same erase again) and run "
            "the replay again"
        )
    return result


def _empty_shadows(config: CdcflowConfig) -> None:
    """Empty the shadow tables and remove every earlier version's files and log entries."""
    from cdcflow.layers.erasure import purge_history

    for spec in (SILVER, TOMBSTONES):
        _write(config, shadow_name(spec), spec.schema.empty_table(), "overwrite", None)
        purge_history(config, shadow_name(spec))


def _rebuild_shadow(
    config: CdcflowConfig,
    to_version: int | None,
    bucket_rows: int,
    on_bucket: Callable[[int, int], None] | None,
) -> ReplayResult:
    started = time.perf_counter()
    mode = config.processing.delete_mode
    bronze = _open(config, BRONZE.name, to_version)
    version = bronze.version()
    scan = scan_table(bronze)
    stats = scan.select(
        pl.len().alias("rows"),
        pl.col("is_duplicate").sum().alias("dups"),
        pl.col("batch_id").max().alias("last_batch"),
        pl.col("ingested_at").max().alias("last_ingest"),
    ).collect()
    result = ReplayResult(delete_mode=mode, bronze_version=version)
    result.bronze_rows = int(stats["rows"][0])
    result.duplicates = int(stats["dups"][0] or 0)
    last_batch = stats["last_batch"][0]
    result.last_batch_id = -1 if last_batch is None else int(last_batch)
    last_ingest: datetime | None = stats["last_ingest"][0]
    result.buckets = buckets = bucket_count(result.bronze_rows - result.duplicates, bucket_rows)
    rejected: dict[str, int] = {}

    silver_schema = SILVER.schema
    _write(config, shadow_name(SILVER), silver_schema.empty_table(), "overwrite", None)
    _write(config, shadow_name(TOMBSTONES), TOMBSTONES.schema.empty_table(), "overwrite", None)
    cutoff = (
        last_ingest - config.processing.tombstone_retention if last_ingest is not None else None
    )
    read_cols = ["raw_payload", "ingested_at", "sequence"]
    pattern = CustomerIdPattern(config.processing.customer_id_pattern)
    for bucket in range(buckets):
        rows = (
            scan.filter(~pl.col("is_duplicate"))
            .filter((pl.col("customer_id").hash(seed=0) % buckets) == bucket)
            .select(*read_cols, "batch_id", "source_file", "source_line")
            .sort("batch_id", "source_file", "source_line")
            .select(read_cols)
            .collect()
        )
        checked = revalidate_frame(rows, pattern, config.processing.max_clock_skew)
        del rows
        for reason, n in checked.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
        result.sequence_mismatches += checked.sequence_mismatches
        result.duplicate_ids += checked.duplicate_ids
        result.events += checked.accepted
        if checked.accepted:
            events = pl.DataFrame(checked.columns, schema_overrides=_EVENT_DTYPES)
            del checked
            ops = events["operation"].value_counts()
            by_op = dict(zip(ops["operation"].to_list(), ops["count"].to_list(), strict=True))
            result.inserts += by_op.get("INSERT", 0)
            result.updates += by_op.get("UPDATE", 0)
            result.deletes += by_op.get("DELETE", 0)
            folded = fold_events(events, mode).filter(pl.col("_cdc_seq").is_not_null())
            silver_rows = folded.select(silver_schema.names).to_arrow().cast(silver_schema)
            _write(config, shadow_name(SILVER), silver_rows, "append", None)
            result.silver_rows += silver_rows.num_rows
            if mode == "hard":
                tombs = _tombstones(events)
                if cutoff is not None:  # the stream purges tombstones past their retention
                    tombs = tombs.filter(pl.col("tombstoned_at") >= cutoff)
                if tombs.height:
                    table = tombs.to_arrow().cast(TOMBSTONES.schema)
                    _write(config, shadow_name(TOMBSTONES), table, "append", None)
                    result.tombstone_rows += table.num_rows
        if on_bucket is not None:
            on_bucket(bucket + 1, buckets)
    result.rejected = dict(sorted(rejected.items()))
    result.seconds = time.perf_counter() - started
    decided_later = ("verified", "applied_version", "replay_id", "resumed")  # verify / apply
    log.info(
        "replay shadow rebuilt",
        extra={
            k: v
            for k, v in result.to_json().items()
            if not k.endswith("report") and k not in decided_later
        },
    )
    return result


def _read(
    config: CdcflowConfig, name: str, columns: list[str], version: int | None = None
) -> pl.DataFrame:
    return scan_table(_open(config, name, version)).select(columns).collect()


def _exists(config: CdcflowConfig, spec: TableSpec) -> bool:
    uri = config.table_uri(spec.name)
    return DeltaTable.is_deltatable(uri, storage_options=config.storage.options or None)


def _read_live(
    config: CdcflowConfig, spec: TableSpec, columns: list[str], version: int | None = None
) -> pl.DataFrame:
    """The live table's ``columns`` (at ``version``: None = the latest); no rows when the table
    was lost (:func:`check_tables_kept`: then every replayed key shows as missing)."""
    if _exists(config, spec):
        return _read(config, spec.name, columns, version)
    empty = pl.from_arrow(spec.schema.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return empty.select(columns)


def _live_label(
    config: CdcflowConfig, spec: TableSpec, version: int | None = None, batch: int = -1
) -> str:
    if not _exists(config, spec):
        return f"{spec.name} (missing)"
    if version is not None:
        return f"silver v{version} (after micro-batch {batch})"
    return f"silver v{_open(config, spec.name).version()}"


def verify(config: CdcflowConfig, result: ReplayResult) -> ReplayResult:
    """Compare the shadow tables with the live ones and store the reports in ``result``.

    The shadow (rebuilt from Bronze) is the expected side; the live Silver the actual side.
    Every Silver column is compared (public columns and ``_cdc_`` sequence registers). A
    shadow rebuilt from an older Bronze version (``--to-version``) is compared with Silver
    and the tombstones as the last micro-batch in it left them
    (:func:`~cdcflow.engines.local.delta.version_after_batch`), not with today's tables.
    """
    names = SILVER.schema.names
    pinned: dict[str, int | None] = {SILVER.name: None, TOMBSTONES.name: None}
    if result.bronze_version < _open(config, BRONZE.name).version():
        app_id = f"cdcflow-{config.pipeline.name}"
        for spec in (SILVER, TOMBSTONES):
            if _exists(config, spec):
                uri = config.table_uri(spec.name)
                pinned[spec.name] = version_after_batch(
                    uri, config.storage.options, app_id, result.last_batch_id
                )
    result.silver_report = reconcile_state(
        actual=_read_live(config, SILVER, names, pinned[SILVER.name]),
        expected=_read(config, shadow_name(SILVER), names),
        columns=names[1:],
        kind="replay",
        expected_label=f"replay of bronze v{result.bronze_version}",
        actual_label=_live_label(config, SILVER, pinned[SILVER.name], result.last_batch_id),
    )
    if result.delete_mode == "hard":
        cols = ["customer_id", *_TOMBSTONE_COLUMNS]
        result.tombstone_report = reconcile_state(
            actual=_read_live(config, TOMBSTONES, cols, pinned[TOMBSTONES.name]),
            expected=_read(config, shadow_name(TOMBSTONES), cols),
            columns=_TOMBSTONE_COLUMNS,
            kind="replay",
            expected_label="replayed tombstones",
            actual_label="silver/customer_tombstones"
            + ("" if pinned[TOMBSTONES.name] is None else f" v{pinned[TOMBSTONES.name]}"),
        )
    log.info(
        "replay verified",
        extra={
            "verified": result.verified,
            "bronze_version": result.bronze_version,
            "silver_differences": _differences(result.silver_report),
            "tombstone_differences": _differences(result.tombstone_report),
        },
    )
    return result


def _differences(report: ReconcileReport | None) -> int | None:
    """Keys that differ (missing, extra or mismatched) in a verification report."""
    if report is None:
        return None
    return report.missing_keys + report.extra_keys + report.rows_with_differences


def _batches(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield from pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()


def _overwrite_from_shadow(config: CdcflowConfig, spec: TableSpec, props: CommitProperties) -> int:
    # the dataset is opened before the write: delta-rs cannot be re-entered from its writer
    dataset = arrow_dataset(_open(config, shadow_name(spec)))
    reader = pa.RecordBatchReader.from_batches(
        spec.schema, _batches(dataset.to_batches(), spec.schema)
    )
    # a lost table (check_tables_kept): the replay writes it anew
    target = _open(config, spec.name) if _exists(config, spec) else config.table_uri(spec.name)
    write_deltalake(
        target,
        reader,
        mode="overwrite",
        partition_by=list(spec.partition_by) or None,
        configuration=spec.configuration or None,
        storage_options=config.storage.options or None,
        commit_properties=props,
    )
    return _open(config, spec.name).version()


def replay_app_id(config: CdcflowConfig) -> str:
    """App id of the app transactions ``replay --apply`` writes (version = the replay id)."""
    return f"cdcflow-{config.pipeline.name}-replay"


@dataclass(frozen=True)
class ReplayProgress:
    """How far the replays of a lakehouse got, read from their app transactions.

    Attributes:
        tombstones: latest replay id written to ``silver/customer_tombstones`` (-1: none).
        silver: latest replay id written to ``silver/customers`` (-1: none).
        logged: latest replay id whose ``audit/batch_log`` row is written (-1: none). The row
            is a replay's last write: it marks the replay finished.
    """

    tombstones: int
    silver: int
    logged: int

    @property
    def unfinished(self) -> int | None:
        """Id of a replay that wrote a table but not its batch_log row, else None."""
        started = max(self.tombstones, self.silver)
        return started if started > self.logged else None

    @property
    def next_id(self) -> int:
        """Id of the next replay."""
        return max(self.tombstones, self.silver, self.logged) + 1


def _txn_version(config: CdcflowConfig, spec: TableSpec, app_id: str) -> int:
    try:
        table = DeltaTable(
            config.table_uri(spec.name), storage_options=config.storage.options or None
        )
    except TableNotFoundError:
        return -1
    version = table.transaction_version(app_id)
    return -1 if version is None else version


def replay_progress(config: CdcflowConfig) -> ReplayProgress:
    """Read the replay app transactions of the tombstones, Silver and ``audit/batch_log``."""
    app_id = replay_app_id(config)
    return ReplayProgress(
        tombstones=_txn_version(config, TOMBSTONES, app_id),
        silver=_txn_version(config, SILVER, app_id),
        logged=_txn_version(config, BATCH_LOG, app_id),
    )


def recorded_delete_mode(config: CdcflowConfig) -> str | None:
    """The delete mode recorded in Silver's ``cdcflow.deleteMode`` property (None: not recorded)."""
    return _open(config, SILVER.name).metadata().configuration.get(DELETE_MODE_PROPERTY)


def record_delete_mode(
    config: CdcflowConfig, mode: str, props: CommitProperties | None = None
) -> bool:
    """Set Silver's ``cdcflow.deleteMode`` property to ``mode`` unless it already holds it.

    Returns:
        True when a commit was written.
    """
    silver = _open(config, SILVER.name)
    if silver.metadata().configuration.get(DELETE_MODE_PROPERTY) == mode:
        return False
    try:
        silver.alter.set_table_properties(
            {DELETE_MODE_PROPERTY: mode}, raise_if_not_exists=False, commit_properties=props
        )
    except Exception:  # a concurrent start-up recorded it first: fine if it is the same mode
        if recorded_delete_mode(config) != mode:
            raise
        return False
    return True


def _modes_in_content(config: CdcflowConfig) -> set[str]:
    """Delete modes the content of Silver and the tombstones shows (for tables without the
    property): a soft-deleted Silver row only comes from soft mode, a tombstone only from hard.
    """
    modes: set[str] = set()
    deleted = scan_table(_open(config, SILVER.name)).filter(pl.col("is_deleted")).select(pl.len())
    if deleted.collect().item():
        modes.add("soft")
    if scan_table(_open(config, TOMBSTONES.name)).select(pl.len()).collect().item():
        modes.add("hard")
    return modes


def check_delete_mode(config: CdcflowConfig) -> None:
    """Refuse a ``processing.delete_mode`` other than the one Silver was built in.

    The mode is read from Silver's ``cdcflow.deleteMode`` property. A Silver without it (new,
    or created before the property existed) gets the configured mode recorded, unless its
    content shows the other mode (soft-deleted rows, or tombstones).

    Raises:
        ConfigError: the configured mode differs from Silver's (one line, naming the way out:
            ``cdcflow replay --apply``).
    """
    mode = config.processing.delete_mode
    recorded = recorded_delete_mode(config)
    if recorded is None:
        other = sorted(_modes_in_content(config) - {mode})
        if not other:
            record_delete_mode(config, mode)
            return
        recorded = other[0]
    if recorded != mode:
        raise ConfigError(
            f"processing.delete_mode is {mode!r} but silver/customers was built in {recorded!r}"
            f" mode: run `cdcflow replay --apply` to rebuild Silver and the tombstones in {mode!r}"
            f" mode from Bronze, or set processing.delete_mode back to {recorded!r}"
        )


def check_lakehouse(config: CdcflowConfig) -> None:
    """Start-up check of the engines: refuse to run micro-batches on a lakehouse that an
    interrupted ``replay --apply`` left half-written, or that was built in another delete mode.

    Records the delete mode on a Silver that does not hold it yet (see :func:`check_delete_mode`).

    Raises:
        ReplayError: a ``replay --apply`` did not finish.
        ConfigError: ``processing.delete_mode`` differs from Silver's.
    """
    unfinished = replay_progress(config).unfinished
    if unfinished is not None:
        raise ReplayError(
            f"silver/customers: replay {unfinished} (`cdcflow replay --apply`) is running or was"
            " interrupted; run `cdcflow replay --apply` again to finish it before running"
            " micro-batches"
        )
    check_delete_mode(config)


def check_tables_kept(
    config: CdcflowConfig,
    kept: list[TableSpec],
    per_table: list[list[TableSpec]] | None = None,
) -> None:
    """Start-up check of the engines: refuse micro-batches on a lakehouse that lost a table
    its checkpoint's micro-batches wrote (called before the engine creates missing tables).

    A run creates a missing table empty; after committed micro-batches that would silently
    restart the table from nothing (a lost ``silver/customers`` recreated with only the next
    batch's keys), while the checkpoint skips every landing file already taken. So once the
    checkpoint (``checkpoint.location``) holds a micro-batch, the tables must exist. A lost
    Silver or tombstones table is rebuilt from Bronze by ``cdcflow replay --apply``
    (docs/recovery_playbook.md, section 2).

    Args:
        config: the pipeline's config.
        kept: tables that must all exist (the customers pipeline's; the declared tables'
            shared audit tables).
        per_table: the Delta tables of each declared table: refused when some exist and others
            do not; a table added to ``tables:`` after earlier runs (none exist) starts empty.

    Raises:
        TableError: a table is missing; the message names each missing table, the
            checkpoint, and what to do.
    """
    checkpoint = Checkpoint.of(config)
    last = checkpoint.last_batch()
    if last is None:
        return
    lost = [spec.name for spec in kept if not _exists(config, spec)]
    for group in per_table or []:
        missing = [spec.name for spec in group if not _exists(config, spec)]
        if len(missing) < len(group):  # none missing, or a lost one
            lost += missing
    if lost:
        raise TableError(
            f"{', '.join(lost)}: missing under storage.root {config.storage.root}, but the "
            f"checkpoint {checkpoint.location} holds micro-batches up to {last}: a run would "
            "recreate the table empty while skipping the landing data already taken. Rebuild a "
            "lost Silver or tombstones table from Bronze with `cdcflow replay --apply` "
            "(docs/recovery_playbook.md, section 2); restore any other table (or point "
            "storage.root at the right lakehouse), or start over with a new checkpoint.location"
        )


def apply(config: CdcflowConfig, result: ReplayResult) -> ReplayResult:
    """Replace the tombstones and Silver with the shadow content; record mode and replay.

    Under the checkpoint's run lock (no micro-batch runs meanwhile), in this order, each write
    under the app transaction ``cdcflow-<pipeline>-replay`` with version = the replay id:

    1. the tombstones: one overwrite with the shadow (empty in soft mode);
    2. Silver: one overwrite (``DESCRIBE HISTORY`` / time travel still reach the previous
       version);
    3. Silver's ``cdcflow.deleteMode`` property set to the replayed mode (when it differs);
    4. a ``kind = 'replay'`` row appended to ``audit/batch_log`` (skipped when the table already
       holds the replay id) — the mark of a finished replay.

    When an earlier ``--apply`` was killed before its batch_log row, this one takes over its
    replay id: steps 1-3 are written again from this shadow and the row is written once.

    Raises:
        ReplayError: Bronze has moved past the replayed version (the shadow would roll Silver
            back and the newer batches would never be re-applied).
        CheckpointError: a pipeline run holds the checkpoint lock.
    """
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    with Checkpoint.of(config).lock():
        latest = _open(config, BRONZE.name).version()
        if latest != result.bronze_version:
            raise ReplayError(
                f"bronze is at version {latest} but the replay read version "
                f"{result.bronze_version}; --apply needs a replay of the latest Bronze "
                "(see docs/recovery_playbook.md to restore an older state)"
            )
        progress = replay_progress(config)
        unfinished = progress.unfinished
        replay_id = progress.next_id if unfinished is None else unfinished
        result.replay_id, result.resumed = replay_id, unfinished is not None
        if unfinished is not None:
            log.warning("finishing an interrupted replay", extra={"replay_id": replay_id})
        app_id = replay_app_id(config)
        props = CommitProperties(
            custom_metadata={
                "cdcflow.operation": "replay",
                "cdcflow.bronze_version": str(result.bronze_version),
                "cdcflow.replay_id": str(replay_id),
            },
            app_transactions=[Transaction(app_id=app_id, version=replay_id)],
        )
        crash_point("replay_before_write", replay_id)
        _overwrite_from_shadow(config, TOMBSTONES, props)
        crash_point("replay_after_tombstones", replay_id)
        result.applied_version = _overwrite_from_shadow(config, SILVER, props)
        crash_point("replay_after_silver", replay_id)
        record_delete_mode(config, result.delete_mode, props)
        crash_point("replay_after_mode", replay_id)
        report = BatchReport(
            batch_id=result.last_batch_id,
            pipeline=config.pipeline.name,
            kind="replay",
            started_at=started_at,
            duration_ms=int((time.perf_counter() - started + result.seconds) * 1000),
            records_received=result.bronze_rows,
            accepted=result.events,
            quarantined=sum(result.rejected.values()),
            duplicates=result.duplicates,
            inserts=result.inserts,
            updates=result.updates,
            deletes=result.deletes,
            silver_version=result.applied_version,
            delete_mode=result.delete_mode,
        )
        row = pa.Table.from_pylist([report.row()], schema=BATCH_LOG.schema)
        if not txn_done(_open(config, BATCH_LOG.name), app_id, replay_id):
            _write(config, BATCH_LOG.name, row, "append", props)
        crash_point("replay_after_log", replay_id)
    log.info(
        "replay applied",
        extra={
            "silver_version": result.applied_version,
            "bronze_version": result.bronze_version,
            "replay_id": replay_id,
        },
    )
    return result


__all__ = [
    "ReplayError",
    "ReplayProgress",
    "ReplayResult",
    "apply",
    "check_delete_mode",
    "check_lakehouse",
    "check_tables_kept",
    "rebuild_shadow",
    "record_delete_mode",
    "recorded_delete_mode",
    "replay_app_id",
    "replay_progress",
    "shadow_name",
    "verify",
]
