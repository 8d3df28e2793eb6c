"""Spark engine: Structured Streaming over the landing folder, one ``foreachBatch`` per micro-batch.

Each micro-batch writes, in the local engine's order and with the same schemas
(:mod:`cdcflow.layers.tables`): Bronze, quarantine, Silver (``DeltaTable.merge`` with the clauses
of :mod:`cdcflow.plan.merge_spec`), hard-mode tombstones (+ purge), the SCD2 history MERGE, the
Gold refresh, ``audit/event_outcomes`` and ``audit/batch_log``; a crash point
(:mod:`cdcflow.state.faults`) follows each commit. Every write carries the Delta app transaction
``cdcflow-<pipeline>`` with version = batch id (writer options ``txnAppId``/``txnVersion``;
the session confs ``spark.databricks.delta.write.txnAppId``/``txnVersion`` for MERGE/DELETE) and
is skipped when the table already holds that version, so a batch re-run from the Spark
checkpoint writes nothing twice.

Batch ids continue the pipeline's checkpoint (``checkpoint.location``): each Spark micro-batch
gets the next id after the last batch of either engine (the mapping is persisted in
``<checkpoint.location>/spark/cdcflow_batch_ids.json`` before the batch writes anything, so a
re-run keeps its id), and is recorded in that offset/commit log too; files any batch of either
engine took are skipped. So the engines can take turns any number of times. Spark's own streaming
checkpoint lives in ``<checkpoint.location>/spark``.

Cross-batch state is read from Delta (Bronze for duplicates, Silver/tombstones for the MERGE and
outcomes), never kept in driver memory; the driver only collects per-batch counts and the file
list.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import (
    DeltaStore,
    append_once,
    merge_files_rewritten,
    nothing_expired,
    txn_done,
)
from cdcflow.errors import CheckpointError, ConfigError, LandingFileChangedError
from cdcflow.layers.tables import (
    ALL_TABLES,
    BATCH_LOG,
    BRONZE,
    EVENT_OUTCOMES,
    FOLD_COLUMNS,
    HISTORY,
    QUARANTINE,
    SILVER,
    TOMBSTONES,
    TableSpec,
)
from cdcflow.logs import get_logger
from cdcflow.plan.merge_spec import TOMBSTONE_MERGE_ON, TOMBSTONE_UPDATE_WHEN, silver_merge_spec
from cdcflow.report import BatchReport
from cdcflow.signals import stop_on_signals
from cdcflow.sources.files import LandingFile, check_taken, fingerprinted, plan_landing
from cdcflow.state.checkpoint import BatchOffsets, Checkpoint
from cdcflow.state.faults import crash_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.conf import RuntimeConfig

    from cdcflow.pipeline import Trigger

log = get_logger("engine.spark")

#: Schema of Spark's ``binaryFile`` source (one row per landing file).
BINARY_FILE_DDL = "path string, modificationTime timestamp, length bigint, content binary"
_CONFLICT_DETAIL = "event_id already received with different content"


def check_source(config: CdcflowConfig, kafka: bool = False) -> None:
    """Refuse a source the Spark engine cannot read.

    Args:
        config: the pipeline's config.
        kafka: the engine reads Kafka topics too (declared tables).

    Raises:
        ConfigError: not landing files (nor Kafka, where ``kafka``), or ``source.min_file_age``
            set.
    """
    if config.source.type == "kafka" and kafka:
        return
    if config.source.type != "files":
        raise ConfigError(
            "pipeline.engine: spark reads landing files (and, with declared tables, Kafka "
            "topics) only (source.type)"
        )
    if config.source.min_file_age:
        raise ConfigError(
            "source.min_file_age: not supported by pipeline.engine: spark (its file source "
            "lists a file once); use the local engine for writers that append in place"
        )


#: Spark settings of a small micro-batch (:meth:`SparkEngine._execution`): interpreted
#: expressions, no whole-stage code generation.
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@contextmanager
def session_settings(confs: list[RuntimeConfig], settings: dict[str, str]) -> Iterator[None]:
    """Set ``settings`` (key → value) on each session configuration for the block, then give
    each key back the value it had before (unset when it had none).

    Args:
        confs: runtime configurations (``SparkSession.conf``) of the sessions concerned.
        settings: the Spark SQL settings of the block.
    """
    previous = [{key: conf.get(key, None) for key in settings} for conf in confs]
    for conf in confs:
        for key, value in settings.items():
            conf.set(key, value)
    try:
        yield
    finally:
        for conf, before in zip(confs, previous, strict=True):
            for key, old in before.items():
                if old is None:
                    conf.unset(key)
                else:
                    conf.set(key, old)


class SparkEngine:
    """The distributed engine (PySpark Structured Streaming + delta-spark)."""

    def __init__(self, config: CdcflowConfig) -> None:
        check_source(config)
        self.mode = config.processing.delete_mode
        self.store = DeltaStore(
            {spec.name: config.table_uri(spec.name) for spec in ALL_TABLES},
            config.storage.options,
        )
        from cdcflow.engines.local.replay import check_lakehouse, check_tables_kept

        check_tables_kept(config, list(ALL_TABLES))  # before a lost table is recreated empty
        for spec in ALL_TABLES:  # same schemas, partitioning and properties as the local engine
            self.store.ensure(spec)

        check_lakehouse(config)  # an unfinished replay --apply or another delete_mode: refuse
        self._start(config)
        from cdcflow.engines.spark.validate import check_pattern

        check_pattern(self.spark, config.processing.customer_id_pattern)

    def _start(self, config: CdcflowConfig) -> None:
        """The session, the checkpoints and the per-run state (every Spark engine's)."""
        from cdcflow.engines.spark.session import get_session

        self.config = config
        self.app_id = f"cdcflow-{config.pipeline.name}"
        self.spark: SparkSession = get_session(config.spark, config.storage)
        self.checkpoint = Checkpoint.of(config)
        #: Spark's own streaming checkpoint, in the pipeline's checkpoint (a folder or a prefix)
        self.spark_checkpoint = self.checkpoint.uri("spark/stream")
        self._ids_file = "spark/cdcflow_batch_ids.json"
        self._stop = threading.Event()
        self._cached: list[DataFrame] = []  # per-batch caches, released when the batch ends
        self._schemas: dict[str, Any] = {}  # table name -> its Delta schema (StructType)
        self._on_batch: Callable[[BatchReport], None] = lambda report: None
        self._run_id = uuid.uuid4().hex[:12]  # job groups: cdcflow-<pipeline>-<run>-<batch>
        self._group = ""

    def run_batch(self, offsets: BatchOffsets) -> BatchReport:
        """Not used: Spark drives its own micro-batches (see :meth:`run_stream`).

        Raises:
            ConfigError: always.
        """
        raise ConfigError("the spark engine runs its own streaming loop (run_stream)")

    def stop(self) -> None:
        """Ask a continuous run to stop after the current micro-batch."""
        self._stop.set()

    # ------------------------------------------------------------------ streaming loop
    def _batch_ids(self) -> dict[str, int]:
        """Spark micro-batch id → pipeline batch id, for every Spark batch given an id so far."""
        data = self.checkpoint.read_state(self._ids_file)
        return {} if data is None else {str(k): int(v) for k, v in data.items()}

    def _allocate_batch_id(self, spark_batch_id: int) -> int:
        """Give a Spark micro-batch the next id of the shared checkpoint, persisted first.

        The id follows the last batch of either engine, so the engines can take turns any number
        of times; a re-run of the Spark batch (restart from Spark's checkpoint) finds its id here.

        Raises:
            CheckpointError: a micro-batch of the other engine is uncommitted.
        """
        if self.checkpoint.pending() is not None:
            raise CheckpointError(
                f"{self.checkpoint.root}: a local-engine micro-batch is uncommitted; "
                "finish it with pipeline.engine: local before switching to spark"
            )
        last = self.checkpoint.last_batch()
        batch_id = 0 if last is None else last + 1
        ids = self._batch_ids()
        ids[str(spark_batch_id)] = batch_id
        self.checkpoint.write_state(self._ids_file, ids)
        return batch_id

    def run_stream(self, trigger: Trigger, on_batch: Callable[[BatchReport], None]) -> None:
        """Run the Structured Streaming query per the trigger.

        ``once``: one micro-batch of everything new; ``available-now``: everything new in
        micro-batches of at most ``source.max_files_per_trigger`` files; ``processing-time``:
        until SIGINT/SIGTERM (the micro-batch in progress finishes first).

        Raises:
            CdcflowError: a micro-batch failed (the original error is re-raised).
        """
        self._on_batch = on_batch
        self._error: BaseException | None = None
        stream = self._source_stream()
        from pyspark.sql import functions as F

        stream = stream.withColumn("_processing_time", F.current_timestamp())
        writer = (
            stream.writeStream.foreachBatch(self._guarded_batch)
            .option("checkpointLocation", self.spark_checkpoint)
            .queryName(f"cdcflow-{self.config.pipeline.name}")
        )
        if trigger.kind == "once":
            writer = writer.trigger(once=True)
        elif trigger.kind == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            assert trigger.interval is not None
            seconds = trigger.interval.total_seconds()
            writer = writer.trigger(processingTime=f"{int(seconds * 1000)} milliseconds")
        query = writer.start()
        try:
            if trigger.kind == "processing-time":
                with stop_on_signals(self.stop):
                    while not self._stop.is_set() and query.isActive:
                        query.awaitTermination(1)
                    while query.isActive and query.status.get("isTriggerActive"):
                        time.sleep(0.2)  # let the micro-batch in progress finish
                    query.stop()
            else:
                query.awaitTermination()
        except Exception:
            if self._error is not None:
                raise self._error from None
            raise
        if self._error is not None:
            raise self._error

    def _source_stream(self) -> DataFrame:
        """The streaming source: the landing folder (Spark's ``binaryFile`` source)."""
        Path(self.config.source.path).mkdir(parents=True, exist_ok=True)
        self._warn_changed_files()
        return (
            self.spark.readStream.format("binaryFile")
            .schema(BINARY_FILE_DDL)
            .option("pathGlobFilter", "*.{jsonl,jsonl.gz}")
            .option("maxFilesPerTrigger", self.config.source.max_files_per_trigger)
            .load(str(Path(self.config.source.path).resolve()))
        )

    @staticmethod
    def _taken_file(row: Any, recorded: LandingFile | None, batch_id: int | None) -> LandingFile:
        """A landing file of the stream's micro-batch, as this batch takes it.

        A re-run takes exactly the recorded bytes; a first attempt fingerprints the file as
        listed.

        Raises:
            LandingFileChangedError: the file is gone.
        """
        from cdcflow.engines.spark.parse import local_path

        if recorded is not None:  # checked against its fingerprint by the caller
            return recorded
        path = local_path(row["path"])
        listed = LandingFile(path, int(row["length"]), _ns(row["modificationTime"]))
        try:
            listed = replace(listed, inode=os.stat(path).st_ino)
            return fingerprinted(listed)
        except FileNotFoundError:
            raise LandingFileChangedError(listed, batch_id, "no longer exists") from None

    def _warn_changed_files(self) -> None:
        """Log a warning per landing file that changed after a micro-batch took it.

        Spark's file source lists a path once, so this engine does not take such a file again;
        the local engine does (appended bytes, or the whole file as new content) on its next
        run over the same checkpoint.
        """
        changed, _ = plan_landing(
            self.config.source.path,
            self.checkpoint.taken(),
            now=datetime.now(UTC),
            new_files=False,
        )
        for file in changed:
            if file.change != "new":
                log.warning(
                    f"landing file {file.change} after an earlier micro-batch took it; the "
                    "spark engine does not read a file twice: run once with "
                    "pipeline.engine: local to take the change",
                    extra={"path": file.path, "start": file.start},
                )

    def _guarded_batch(self, frame: DataFrame, spark_batch_id: int) -> None:
        try:
            self._process(frame, spark_batch_id)
        except BaseException as exc:
            self._error = exc
            raise

    # ------------------------------------------------------------------ one micro-batch
    def _txn(self, spec: TableSpec, batch_id: int, app_id: str | None = None) -> bool:
        return txn_done(self.store.table(spec), app_id or self.app_id, batch_id)

    def _append(
        self, frame: DataFrame, spec: TableSpec, batch_id: int, app_id: str | None = None
    ) -> None:
        if self._txn(spec, batch_id, app_id):
            return
        from pyspark.sql import functions as F

        target = self._schemas.get(spec.name)
        if target is None:  # a table's schema is read once per run (a snapshot load each)
            uri = self.config.table_uri(spec.name)
            target = self._schemas[spec.name] = self.spark.read.format("delta").load(uri).schema
        cols = [F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields]
        (
            frame.select(*cols)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", app_id or self.app_id)
            .option("txnVersion", batch_id)
            .save(self.config.table_uri(spec.name))
        )

    def _append_rows(
        self, rows: list[dict[str, Any]], spec: TableSpec, batch_id: int, app_id: str | None = None
    ) -> None:
        """Append driver-side rows (an audit table's rows of the micro-batch: one per batch or
        per table, never proportional to the data) under the app transaction (``app_id``:
        another than the pipeline's), with delta-rs from the driver.

        Not a Spark write: delta-spark appending one row costs a job, a Delta state rebuild
        to check the app transaction and a commit, about a second per micro-batch on a small
        machine (docs/spark.md, "Per micro-batch"); delta-rs commits it in milliseconds. The
        tables stay one Delta table either engine continues.
        """
        import pyarrow as pa

        table = pa.Table.from_pylist(rows, schema=spec.schema)  # no rows: append_once skips
        append_once(self.store.table(spec), table, app_id or self.app_id, batch_id, spec)

    @contextmanager
    def _txn_conf(self, app_id: str, batch_id: int) -> Iterator[None]:
        txn = {
            "spark.databricks.delta.write.txnAppId": app_id,
            "spark.databricks.delta.write.txnVersion": str(batch_id),
        }
        with session_settings([self.spark.conf], txn):
            yield

    def _read(self, spec: TableSpec, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.config.table_uri(spec.name))

    @contextmanager
    def _job_group(self, spark_batch_id: int) -> Iterator[None]:
        """Run the block's Spark jobs in a job group of their own; :meth:`_jobs_so_far` counts
        them (``audit/batch_log.spark_jobs``).

        The streaming thread's own job group (the query's, by which stopping the query cancels
        its jobs) is restored when the block ends.
        """
        context = self.spark.sparkContext
        keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
        previous = {key: context.getLocalProperty(key) for key in keys}
        group = f"{self.app_id}-{self._run_id}-{spark_batch_id}"
        context.setJobGroup(group, f"{self.app_id} micro-batch", interruptOnCancel=True)
        self._group = group
        try:
            yield
        finally:
            for key, value in previous.items():
                context.setLocalProperty(key, value)  # type: ignore[arg-type]  # None: unset

    def _jobs_so_far(self) -> int:
        """Spark jobs started so far in the current micro-batch's job group (finished or not)."""
        tracker = self.spark.sparkContext.statusTracker()
        return len(tracker.getJobIdsForGroup(self._group))

    @contextmanager
    def _execution(self, frame: DataFrame, offsets: BatchOffsets) -> Iterator[None]:
        """Run the block with Spark's interpreted expressions when the micro-batch is small.

        A micro-batch of landing files of fewer than ``spark.codegen_min_bytes`` bytes runs
        with ``INTERPRETED`` (no whole-stage code generation, no generated expressions): a
        micro-batch of about a thousand records spent more than a third of its time generating
        and compiling code (a profile of the driver and its tasks; docs/spark.md). The settings
        are the session's (the streaming query's and the engine's sessions) for the block only,
        and restored afterwards; a ``spark.conf`` that sets them explicitly wins.
        """
        size = sum(f.size - f.start for f in offsets.files)  # bytes read (.gz: compressed)
        small = bool(offsets.files) and size < self.config.spark.codegen_min_bytes
        if not small or any(key in self.config.spark.conf for key in INTERPRETED):
            yield
            return
        confs = [self.spark.conf]
        if frame.sparkSession is not self.spark:
            confs.append(frame.sparkSession.conf)
        with session_settings(confs, INTERPRETED):
            yield

    def _process(self, frame: DataFrame, spark_batch_id: int) -> None:
        started = time.perf_counter()
        with self._job_group(spark_batch_id):
            taken = self._take(frame, spark_batch_id)
            if taken is None:
                return
            offsets, meta = taken
            with self._execution(frame, offsets):
                report = self._run_files(frame, meta, offsets, started)
        crash_point("before_commit", offsets.batch_id)
        self.checkpoint.write_commit(
            offsets.batch_id, {"committed_at": _now(), "silver_version": report.silver_version}
        )
        crash_point("after_commit", offsets.batch_id)  # before Spark's own commit log
        log.info("micro-batch committed", extra={"batch": report.log_fields()})
        self._on_batch(report)

    def _take(self, frame: DataFrame, spark_batch_id: int) -> tuple[BatchOffsets, list[Any]] | None:
        """The pipeline's micro-batch of this Spark micro-batch, its offsets written.

        Returns:
            (the batch's offsets, the stream rows of its files' metadata), or None when there
            is nothing to process (no file, or only files the other engine took; an empty
            batch is committed here).
        """
        from cdcflow.engines.spark.parse import local_path

        # file metadata only (binaryFile prunes the content column): the batch's files
        meta = frame.select("path", "length", "modificationTime", "_processing_time").collect()
        batch_id = self._batch_ids().get(str(spark_batch_id))  # set: a re-run of this batch
        taken = self.checkpoint.processed_paths()  # files of every batch of either engine
        recorded: dict[str, LandingFile] = {}
        first_attempt = None
        if batch_id is not None and self.checkpoint.has_batch(batch_id):
            first_attempt = self.checkpoint.offsets(batch_id)
            recorded = {f.path: f for f in first_attempt.files}
            taken -= set(recorded)
            if not self.checkpoint.is_committed(batch_id):
                for file in recorded.values():  # Spark skips a file that is gone: stop instead
                    check_taken(file, batch_id)
        if not meta:
            return None
        # a re-run keeps the first attempt's processing time: the same offsets, byte for byte
        # (an object-store checkpoint creates them only once)
        processing_time = (
            first_attempt.processing_time
            if first_attempt is not None
            else meta[0]["_processing_time"].replace(tzinfo=UTC)
        )
        files = sorted(
            (
                self._taken_file(r, recorded.get(local_path(r["path"])), batch_id)
                for r in meta
                if local_path(r["path"]) not in taken
            ),
            key=lambda f: (f.mtime_ns, f.name),
        )
        if batch_id is None:
            if not files:  # only files the other engine already took: nothing to do
                return None
            batch_id = self._allocate_batch_id(spark_batch_id)
        offsets = BatchOffsets(batch_id, processing_time, tuple(files))
        if not self.checkpoint.is_committed(batch_id):
            self.checkpoint.write_offsets(offsets)
        crash_point("after_offsets", batch_id)
        if not files:
            self.checkpoint.write_commit(batch_id, {"committed_at": _now(), "files": 0})
            return None
        return offsets, meta

    def _run_files(
        self, frame: DataFrame, meta: list[Any], offsets: BatchOffsets, started: float
    ) -> BatchReport:
        """Write one micro-batch of the customers tables (every commit up to ``after_audit``).

        Returns:
            The batch's report (also appended to ``audit/batch_log``).
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        batch_id, processing_time, files = offsets.batch_id, offsets.processing_time, offsets.files
        report = BatchReport(
            batch_id=batch_id,
            pipeline=self.config.pipeline.name,
            kind="stream",
            started_at=processing_time,
            files=len(files),
            delete_mode=self.mode,
        )
        stage = report.stage

        with stage("parse"):
            sources, batch_files = self._sources(meta, offsets)
            records = self._records(frame, sources, batch_files, processing_time).persist(
                StorageLevel.MEMORY_AND_DISK
            )
            classified = classify(records.filter("ok"), self._read(BRONZE), batch_id).persist(
                StorageLevel.MEMORY_AND_DISK
            )

            pt = F.lit(processing_time).cast("timestamp")
            bronze = classified.filter(F.col("_class") != "conflict").select(
                F.lit(batch_id).alias("batch_id"),
                pt.alias("ingested_at"),
                F.lit(processing_time.date()).alias("ingestion_date"),
                "source_file",
                "source_line",
                F.col("raw").alias("raw_payload"),
                *BRONZE.schema.names[6:-1],
                (F.col("_class") == "duplicate").alias("is_duplicate"),
            )
            rejected = records.filter(~F.col("ok")).withColumnRenamed("raw", "raw_line")
            quarantine = quarantine_frame(
                rejected, classified, batch_id, processing_time, ["customer_id"]
            )
            count_classes(classified, records, report)
        with stage("bronze"):
            if report.accepted:
                self._append(bronze, BRONZE, batch_id)
        crash_point("after_bronze", batch_id)
        with stage("quarantine"):
            if report.quarantined:
                self._append(quarantine, QUARANTINE, batch_id)
        crash_point("after_quarantine", batch_id)

        with stage("silver"):
            events = classified.filter(F.col("_class") == "first").select(FOLD_COLUMNS)
            keys = events.select("customer_id").distinct()
            silver_before = self.store.table(SILVER).version()
            tombs_before = self.store.table(TOMBSTONES).version()
            targets = (
                self._read(SILVER, silver_before)
                .join(keys, "customer_id")
                .select(
                    "customer_id",
                    F.col("_cdc_seq").alias("_t_seq"),
                    F.col("_cdc_min_seq").alias("_t_min_seq"),
                )
            )
            prior_tombs = (
                self._read(TOMBSTONES, tombs_before)
                .join(keys, "customer_id")
                .select("customer_id", "_cdc_seq")
            )
            if report.accepted - report.duplicates and not self._txn(SILVER, batch_id):
                self._merge_silver(events, targets, prior_tombs, batch_id)
            crash_point("after_silver_merge", batch_id)
            if self.mode == "hard" and report.deletes:
                self._merge_tombstones(events, processing_time, batch_id)
            if self.mode == "hard":
                self._purge_tombstones(processing_time, batch_id)
            silver = self.store.table(SILVER)
            report.silver_version = silver.version()
            report.silver_files_rewritten = merge_files_rewritten(silver, self.app_id, batch_id)
        crash_point("after_silver", batch_id)

        with stage("history"):  # SCD2 timeline of the touched keys
            self._merge_history(keys, batch_id)
        crash_point("after_history", batch_id)
        with stage("gold"):  # computed by Spark (engines/spark/gold.py), the local policy
            from cdcflow.engines.local.gold import after_batch

            after_batch(
                self.config, self.app_id, batch_id, refresh=lambda: self._refresh_gold(batch_id)
            )
        if self.config.snowflake.mode == "inline":  # Silver -> Snowflake, lag into batch_log
            from cdcflow.engines.spark.snowflake import SparkSyncFiles
            from cdcflow.sinks.snowflake.inline import inline_sync

            # the change set computed by Spark, written as Parquet by the executors
            inline_sync(self.config, report, SparkSyncFiles(self.spark, self.config))

        with stage("audit"):
            outcomes = outcome_frame(
                bronze,
                ["customer_id"],
                targets.select("customer_id", "_t_seq"),
                prior_tombs,
                processing_time,
                self.config.processing.late_event_threshold.total_seconds(),
                EVENT_OUTCOMES.schema.names,
            ).persist(StorageLevel.MEMORY_AND_DISK)
            count_outcomes(outcomes, report)
            if report.accepted:
                self._append(outcomes, EVENT_OUTCOMES, batch_id)
            crash_point("after_outcomes", batch_id)
            report.duration_ms = int((time.perf_counter() - started) * 1000)
            report.spark_jobs = self._jobs_so_far()
            self._append_rows([report.row()], BATCH_LOG, batch_id)
        crash_point("after_audit", batch_id)
        for cached in (records, classified, outcomes, *self._cached):
            cached.unpersist()
        self._cached.clear()
        return report

    @staticmethod
    def _sources(
        meta: list[Any], offsets: BatchOffsets
    ) -> tuple[dict[str, str], dict[str, LandingFile]]:
        """(Hadoop path → local path, local path → the file as the offsets record it) of the
        batch's files among the stream rows ``meta``."""
        from cdcflow.engines.spark.parse import local_path

        batch_files = {f.path: f for f in offsets.files}
        sources = {r["path"]: local_path(r["path"]) for r in meta}
        return {h: p for h, p in sources.items() if p in batch_files}, batch_files

    def _records(
        self,
        frame: DataFrame,
        sources: dict[str, str],
        taken: dict[str, LandingFile],
        processing_time: datetime,
    ) -> DataFrame:
        """The batch's landing files → validated records (``RECORD_DDL``), one per line.

        Args:
            frame: the micro-batch of the ``binaryFile`` stream.
            sources: Hadoop path → local path (``source_file``) of the files to read.
            taken: local path → the file as the batch's offsets record it: only its first
                ``size`` bytes are read (a file that grew since is read only that far), and its
                recorded modification time orders arrival (not the file's current one).
            processing_time: the batch's processing time (UTC).

        Column rules (:mod:`cdcflow.engines.spark.validate`) on the hot path; the shared Python
        rules only for what they leave (:mod:`cdcflow.engines.spark.parse`).
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.parse import (
            LINE_COLUMNS,
            RECORD_DDL,
            RECORD_SCHEMA,
            check_lines,
            parse_files,
        )
        from cdcflow.engines.spark.validate import split_lines, validate_lines

        rules = self.config.processing
        params: dict[str, Any] = {
            "pattern": rules.customer_id_pattern,
            "processing_time": processing_time,
            "max_clock_skew": rules.max_clock_skew,
        }
        wanted, content = self._content(frame, sources, taken)
        exact = F.col("path").endswith(".gz") | ~F.expr("is_valid_utf8(cast(content as string))")
        whole = (
            content.join(wanted.select("path"), "path", "left_semi")
            .filter(exact)
            .mapInArrow(partial(parse_files, **params), RECORD_DDL)
        )
        native = (
            content.filter(~exact)
            .join(wanted, "path")
            .select(
                "source_file",
                F.unix_millis("modificationTime").alias("file_mtime_ms"),
                "content",
            )
        )
        checked = validate_lines(
            split_lines(native), rules.customer_id_pattern, processing_time, rules.max_clock_skew
        )
        # cached: a barrier, so the filters below do not inline (and repeat) the rule expressions
        checked = checked.persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(checked)
        accepted = checked.filter(F.col("reason").isNull()).select(
            *LINE_COLUMNS,
            F.lit(True).alias("ok"),
            F.lit(None).cast("string").alias("failure_reason"),
            F.lit(None).cast("string").alias("failure_detail"),
            *RECORD_SCHEMA.names[RECORD_SCHEMA.names.index("event_id") :],
        )
        others = (
            checked.filter(F.col("reason").isNotNull())
            .select(*LINE_COLUMNS)
            .mapInArrow(partial(check_lines, **params), RECORD_DDL)
        )
        return accepted.unionByName(others).unionByName(whole)

    def _content(
        self, frame: DataFrame, sources: dict[str, str], taken: dict[str, LandingFile]
    ) -> tuple[DataFrame, DataFrame]:
        """The batch's files as recorded: (``wanted``: one row per file — path, source_file,
        taken (bytes), mtime_us — and ``content``: path, modificationTime (the recorded one),
        content (the first ``taken`` bytes))."""
        from pyspark.sql import functions as F

        wanted = self.spark.createDataFrame(
            [
                (hadoop, path, taken[path].size, taken[path].mtime_ns // 1000)
                for hadoop, path in sources.items()
            ],
            "path string, source_file string, taken bigint, mtime_us bigint",
        )
        content = frame.join(wanted.select("path", "taken", "mtime_us"), "path").select(
            "path",
            F.timestamp_micros("mtime_us").alias("modificationTime"),
            F.expr("substring(content, 1, taken)").alias("content"),
        )
        return wanted, content

    def _merge_silver(
        self, events: DataFrame, targets: DataFrame, prior_tombs: DataFrame, batch_id: int
    ) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.fold import batch_tombstones, fold_events

        source = fold_events(events, self.mode, prior_tombs if self.mode == "hard" else None)
        if self.mode == "hard":
            # a DELETE between a row's first and last events: refold the key's whole history
            tombs = batch_tombstones(events).select("customer_id", F.col("_cdc_seq").alias("_tb"))
            split = (
                targets.join(tombs, "customer_id")
                .filter((F.col("_t_min_seq") <= F.col("_tb")) & (F.col("_tb") < F.col("_t_seq")))
                .select("customer_id")
            )
            # rare: one small job to find out, instead of a second fold in every MERGE source
            if not split.isEmpty():
                history = (
                    self._read(BRONZE)
                    .filter((F.col("batch_id") <= batch_id) & ~F.col("is_duplicate"))
                    .join(split, "customer_id", "left_semi")
                    .select(FOLD_COLUMNS)
                )
                exact = fold_events(history, "hard", None)
                source = source.join(split, "customer_id", "left_anti").unionByName(exact)
            source = source.join(
                targets.select("customer_id", F.lit(True).alias("_has_target")),
                "customer_id",
                "left",
            ).filter(F.col("_cdc_seq").isNotNull() | F.col("_has_target").isNotNull())
            source = source.drop("_has_target")
        spec = silver_merge_spec(SILVER.schema.names)
        update_set: dict[str, Any] = dict(spec.update_set)
        insert_values: dict[str, Any] = dict(spec.insert_values)
        table = DeltaTable.forPath(self.spark, self.config.table_uri(SILVER.name))
        with self._txn_conf(self.app_id, batch_id):
            (
                table.alias("t")
                .merge(source.alias("s"), spec.on)
                .whenMatchedDelete(spec.delete_when)
                .whenMatchedUpdate(spec.update_when, update_set)
                .whenNotMatchedInsert(spec.insert_when, insert_values)
                .execute()
            )

    def _merge_history(self, keys: DataFrame, batch_id: int) -> None:
        """Recompute the touched keys' SCD2 timelines from Bronze; MERGE the difference."""
        if self._txn(HISTORY, batch_id):
            return
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.history import (
            HISTORY_DELETE_WHEN,
            HISTORY_MERGE_ON,
            HISTORY_UPSERT_WHEN,
            history_changes,
            history_frame,
        )

        events = (
            self._read(BRONZE)
            .filter((F.col("batch_id") <= batch_id) & ~F.col("is_duplicate"))
            .join(keys, "customer_id", "left_semi")
            .select(FOLD_COLUMNS)
        )
        stored = self._read(HISTORY, self.store.table(HISTORY).version()).join(
            keys, "customer_id", "left_semi"
        )
        source = history_changes(history_frame(events, self.mode), stored)
        columns = {name: f"s.{name}" for name in HISTORY.schema.names}
        table = DeltaTable.forPath(self.spark, self.config.table_uri(HISTORY.name))
        with self._txn_conf(self.app_id, batch_id):
            (
                table.alias("t")
                .merge(source.alias("s"), HISTORY_MERGE_ON)
                .whenMatchedDelete(HISTORY_DELETE_WHEN)
                .whenMatchedUpdate(HISTORY_UPSERT_WHEN, dict(columns))
                .whenNotMatchedInsert(HISTORY_UPSERT_WHEN, dict(columns))
                .execute()
            )

    def _refresh_gold(self, batch_id: int) -> None:
        """Recompute every Gold table with Spark and overwrite it with delta-spark.

        Each table's commit carries the app transaction ``<app_id>-gold`` (version
        ``batch_id``) and a table that already holds it is skipped, so a re-run of a committed
        micro-batch writes nothing twice; a crash point follows each table's commit. Nothing
        proportional to the data reaches the driver.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        from cdcflow.engines.local.gold import gold_store, schema_differs
        from cdcflow.engines.spark.gold import compute_gold
        from cdcflow.layers.gold import GOLD_TABLES
        from cdcflow.state.faults import gold_point

        gold_app = f"{self.app_id}-gold"
        store = gold_store(self.config)
        tables = {spec.name: store.open(spec) for spec in GOLD_TABLES}
        todo = [s for s in GOLD_TABLES if not txn_done(tables[s.name], gold_app, batch_id)]
        if not todo:
            return
        history = self._read(HISTORY, self.store.table(HISTORY).version())
        frames = compute_gold(history)
        for spec in todo:
            target = from_arrow_schema(spec.schema)
            writer = (
                frames[spec.name]
                .select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields))
                .write.format("delta")
                .mode("overwrite")
                .option("txnAppId", gold_app)
                .option("txnVersion", batch_id)
            )
            if schema_differs(tables[spec.name], spec):  # a table of an earlier release
                writer = writer.option("overwriteSchema", "true")
            writer.save(self.config.table_uri(spec.name))
            crash_point(gold_point(spec.name), batch_id)

    def _merge_tombstones(
        self, events: DataFrame, processing_time: datetime, batch_id: int
    ) -> None:
        if self._txn(TOMBSTONES, batch_id):
            return
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.fold import batch_tombstones

        source = batch_tombstones(events).withColumn(
            "tombstoned_at", F.lit(processing_time).cast("timestamp")
        )
        table = DeltaTable.forPath(self.spark, self.config.table_uri(TOMBSTONES.name))
        with self._txn_conf(self.app_id, batch_id):
            (
                table.alias("t")
                .merge(source.alias("s"), TOMBSTONE_MERGE_ON)
                .whenMatchedUpdateAll(TOMBSTONE_UPDATE_WHEN)
                .whenNotMatchedInsertAll()
                .execute()
            )

    def _purge_tombstones(self, processing_time: datetime, batch_id: int) -> None:
        """Delete tombstones past ``processing.tombstone_retention`` (own app transaction)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        purge_app = f"{self.app_id}-tombstone-purge"
        if self._txn(TOMBSTONES, batch_id, purge_app):
            return
        cutoff = processing_time - self.config.processing.tombstone_retention
        if nothing_expired(self.store.table(TOMBSTONES), cutoff):  # no Spark job
            return
        expired = F.col("tombstoned_at") < F.lit(cutoff).cast("timestamp")
        if self._read(TOMBSTONES).filter(expired).limit(1).count() == 0:
            return
        table = DeltaTable.forPath(self.spark, self.config.table_uri(TOMBSTONES.name))
        with self._txn_conf(purge_app, batch_id):
            table.delete(expired)


def classify(candidates: DataFrame, bronze: DataFrame, batch_id: int) -> DataFrame:
    """Duplicate classification of a micro-batch's valid records (:mod:`cdcflow.plan.dedup`).

    The first-arriving copy of an event id wins (arrival: file modification time, file name,
    line); an id that earlier batches' Bronze rows already hold has its copy there.

    Args:
        candidates: the batch's valid records: event_id, content_hash, file_mtime_ms,
            file_name, source_line, ...
        bronze: the table's Bronze (rows of batches before ``batch_id`` are read).
        batch_id: the micro-batch.

    Returns:
        ``candidates`` with ``_class``: ``first``, ``duplicate`` (same content as the kept
        copy) or ``conflict`` (other content: ``DUPLICATE_EVENT_CONFLICT``).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    prior = (
        bronze.filter(F.col("batch_id") < batch_id)
        .groupBy("event_id")
        .agg(F.min("content_hash").alias("_prior_hash"))
    )
    order = ("file_mtime_ms", "file_name", "source_line")
    arrival = Window.partitionBy("event_id").orderBy(*order)
    first = arrival.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    ranked = (
        candidates.join(prior, "event_id", "left")
        .withColumn("_rn", F.row_number().over(arrival))
        .withColumn("_first_hash", F.first("content_hash").over(first))
    )
    known = F.coalesce(F.col("_prior_hash"), F.col("_first_hash"))
    is_first = F.col("_prior_hash").isNull() & (F.col("_rn") == 1)
    return ranked.withColumn(
        "_class",
        F.when(is_first, F.lit("first"))
        .when(F.col("content_hash") == known, F.lit("duplicate"))
        .otherwise(F.lit("conflict")),
    )


def quarantine_frame(
    rejected: DataFrame,
    classified: DataFrame,
    batch_id: int,
    processing_time: datetime,
    keys: list[str],
) -> DataFrame:
    """A micro-batch's quarantine rows: the rejected records and the duplicate conflicts.

    Args:
        rejected: records the rules rejected: source_file, source_line, raw_line,
            failure_reason, failure_detail, event_id and ``keys`` (as text).
        classified: the valid records with ``_class`` (:func:`classify`): the ``conflict``
            ones become ``DUPLICATE_EVENT_CONFLICT`` rows (their ``raw`` as raw_line).
        batch_id: the micro-batch.
        processing_time: its processing time (``quarantined_at``).
        keys: the key columns the quarantine table holds.

    Returns:
        One row per quarantined record: batch_id, quarantined_at, source_file, source_line,
        raw_line, failure_reason, failure_detail, event_id, ``keys``.
    """
    from pyspark.sql import functions as F

    conflicts = classified.filter(F.col("_class") == "conflict").select(
        "source_file",
        "source_line",
        F.col("raw").alias("raw_line"),
        F.lit("DUPLICATE_EVENT_CONFLICT").alias("failure_reason"),
        F.lit(_CONFLICT_DETAIL).alias("failure_detail"),
        "event_id",
        *keys,
    )
    columns = ["source_file", "source_line", "raw_line", "failure_reason", "failure_detail"]
    return (
        rejected.select(*columns, "event_id", *keys)
        .unionByName(conflicts)
        .select(
            F.lit(batch_id).alias("batch_id"),
            F.lit(processing_time).cast("timestamp").alias("quarantined_at"),
            *columns,
            "event_id",
            *keys,
        )
    )


def count_classes(classified: DataFrame, records: DataFrame, report: Any) -> None:
    """Fill ``report``'s records_received, accepted, quarantined, duplicates, inserts, updates
    and deletes from the classified valid records and all records, in one job.

    Args:
        classified: the valid records with ``_class`` (:func:`classify`) and ``operation``.
        records: every record of the micro-batch (valid or not).
        report: a :class:`~cdcflow.report.BatchReport` or a table's report (same fields).
    """
    from pyspark.sql import functions as F

    first = F.col("_class") == "first"
    counts = (
        classified.agg(
            F.count("*").alias("candidates"),
            F.count(F.when(F.col("_class") == "duplicate", 1)).alias("duplicates"),
            F.count(F.when(F.col("_class") == "conflict", 1)).alias("conflicts"),
            *[
                F.count(F.when(first & (F.col("operation") == op), 1)).alias(op)
                for op in ("INSERT", "UPDATE", "DELETE")
            ],
        )
        .crossJoin(records.agg(F.count("*").alias("received")))
        .first()
    )
    assert counts is not None
    report.records_received = counts["received"]
    report.accepted = counts["candidates"] - counts["conflicts"]
    report.quarantined = report.records_received - report.accepted
    report.duplicates = counts["duplicates"]
    report.inserts = counts["INSERT"]
    report.updates = counts["UPDATE"]
    report.deletes = counts["DELETE"]


def outcome_frame(
    bronze: DataFrame,
    keys: list[str],
    targets: DataFrame,
    tombstones: DataFrame | None,
    processing_time: datetime,
    late_after_s: float,
    columns: list[str],
    changes: DataFrame | None = None,
) -> DataFrame:
    """What became of each accepted delivery of a micro-batch: the rules of
    :func:`cdcflow.engines.local.merges.event_outcomes` (``DUPLICATE``,
    ``SUPERSEDED_IN_BATCH``, ``TOMBSTONED``, ``STALE``, else ``APPLIED``) as Spark columns.

    Args:
        bronze: the batch's Bronze rows (the key columns, ``sequence``, ``is_duplicate``,
            ``event_timestamp``, ...).
        keys: the key columns.
        targets: the key columns and ``_t_seq`` (Silver's ``_cdc_seq``).
        tombstones: the key columns and ``_cdc_seq`` of the stored tombstones (None: none,
            soft mode).
        processing_time: the batch's processing time (``lag_s`` = it − event time, seconds).
        late_after_s: ``processing.late_event_threshold`` in seconds (``is_late``: above it).
        columns: the outcomes table's columns, in order.
        changes: the key columns and ``sequence`` of the changes the batch folded (its first
            copies and the DELETEs of truncates); None: the Bronze rows that are not
            duplicates.

    Returns:
        One row per delivery with ``columns`` (``outcome``, ``lag_s``, ``is_late`` among them).
    """
    from pyspark.sql import functions as F

    pt = F.lit(processing_time).cast("timestamp")
    if changes is None:
        changes = bronze.filter(~F.col("is_duplicate"))
    batch_max = changes.groupBy(*keys).agg(F.max("sequence").alias("_b_max"))
    frame = bronze.join(batch_max, keys, "left").join(targets, keys, "left")
    tomb = F.lit("")
    if tombstones is not None:
        frame = frame.join(tombstones.withColumnRenamed("_cdc_seq", "_t_tomb"), keys, "left")
        tomb = F.coalesce(F.col("_t_tomb"), F.lit(""))
    return (
        frame.select(
            "*",
            F.when(F.col("is_duplicate"), F.lit("DUPLICATE"))
            .when(F.col("sequence") < F.col("_b_max"), F.lit("SUPERSEDED_IN_BATCH"))
            .when(F.col("sequence") < tomb, F.lit("TOMBSTONED"))
            .when(F.col("sequence") < F.coalesce(F.col("_t_seq"), F.lit("")), F.lit("STALE"))
            .otherwise(F.lit("APPLIED"))
            .alias("outcome"),
            ((F.unix_micros(pt) - F.unix_micros(F.col("event_timestamp"))) / 1e6).alias("lag_s"),
        )
        .withColumn("is_late", F.col("lag_s") > late_after_s)
        .select(*columns)
    )


def count_outcomes(outcomes: DataFrame, report: Any) -> None:
    """Add a batch's (or one table's) outcomes to ``report`` in one job: ``stale_ignored``,
    ``tombstoned``, ``late_events`` and ``max_event_lag_s`` (the largest so far)."""
    from pyspark.sql import functions as F

    summary = outcomes.agg(
        F.count(F.when(F.col("outcome") == "STALE", 1)).alias("stale"),
        F.count(F.when(F.col("outcome") == "TOMBSTONED", 1)).alias("tombstoned"),
        F.count(F.when(F.col("is_late"), 1)).alias("late"),
        F.max("lag_s").alias("max_lag"),
    ).first()
    assert summary is not None
    report.stale_ignored += summary["stale"]
    report.tombstoned += summary["tombstoned"]
    report.late_events += summary["late"]
    lag = summary["max_lag"]
    if lag is not None and (report.max_event_lag_s is None or lag > report.max_event_lag_s):
        report.max_event_lag_s = lag


def _ns(modified: Any) -> int:
    if isinstance(modified, datetime):
        stamp = modified if modified.tzinfo else modified.replace(tzinfo=UTC)
        return int(stamp.timestamp() * 1_000_000) * 1000
    return int(modified)


def _now() -> str:
    return datetime.now(UTC).isoformat()


__all__ = ["SparkEngine"]
