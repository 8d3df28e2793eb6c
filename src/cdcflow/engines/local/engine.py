"""Local engine: runs one micro-batch through Bronze, quarantine, Silver and the audit tables.

Order of writes (each guarded by the Delta app transaction ``cdcflow-<pipeline>`` with
version = batch id, so a re-run after a crash writes nothing twice):

1. Bronze append (accepted deliveries, duplicates included)
2. quarantine append (rejected records)
3. Silver MERGE (folded batch) and, in hard mode, the tombstone MERGE and purge
4. ``silver/customer_history`` MERGE, then the Gold refresh (one commit per Gold table, app
   transaction ``cdcflow-<pipeline>-gold``)
5. ``audit/event_outcomes`` and ``audit/batch_log`` appends

A crash point (:mod:`cdcflow.state.faults`) follows each of these commits.

Every value a re-run depends on is deterministic: the batch's processing time comes from the
offset log, duplicate detection reads Bronze strictly before this batch, and outcomes compare
sequences in a way the batch's own Silver commit does not change.
"""

from __future__ import annotations

import time

import polars as pl
import pyarrow as pa

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.batch_frame import (
    bronze_rows as to_bronze,
)
from cdcflow.engines.local.batch_frame import (
    classify_batch,
    scan_batch,
    validate_batch,
)
from cdcflow.engines.local.batch_frame import (
    quarantine_rows as to_quarantine,
)
from cdcflow.engines.local.delta import (
    DeltaStore,
    append_once,
    merge_files_rewritten,
    read_where_in,
    txn_done,
)
from cdcflow.engines.local.fold import batch_tombstones, fold_events, to_source_table
from cdcflow.engines.local.merges import (
    count_outcomes,
    event_outcomes,
    merge_silver,
    merge_tombstones,
)
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.layers.tables import (
    ALL_TABLES,
    BATCH_LOG,
    BRONZE,
    EVENT_OUTCOMES,
    FOLD_COLUMNS,
    QUARANTINE,
    SILVER,
    TOMBSTONES,
)
from cdcflow.logs import get_logger
from cdcflow.plan.merge_spec import TOMBSTONE_MERGE_ON, silver_merge_spec
from cdcflow.plan.rules import CustomerIdPattern, RuleSet
from cdcflow.report import BatchReport
from cdcflow.state.checkpoint import BatchOffsets
from cdcflow.state.faults import crash_point

log = get_logger("engine.local")


class LocalEngine:
    """The embedded engine (delta-rs + Polars + PyArrow)."""

    def __init__(self, config: CdcflowConfig) -> None:
        self.config = config
        self.mode = config.processing.delete_mode
        self.app_id = f"cdcflow-{config.pipeline.name}"
        self.store = DeltaStore(  # Gold too: the refresh after a batch uses the batch's objects
            {spec.name: config.table_uri(spec.name) for spec in (*ALL_TABLES, *GOLD_TABLES)},
            config.storage.options,
        )
        from cdcflow.engines.local.replay import check_lakehouse, check_tables_kept

        check_tables_kept(config, list(ALL_TABLES))  # before a lost table is recreated empty
        for spec in ALL_TABLES:
            self.store.ensure(spec)

        self._pattern = CustomerIdPattern(config.processing.customer_id_pattern)
        check_lakehouse(config)  # an unfinished replay --apply or another delete_mode: refuse

    # ------------------------------------------------------------------ stages
    def _parse(self, offsets: BatchOffsets) -> tuple[pl.DataFrame, pl.DataFrame, int]:
        """Read, validate and classify the batch's records, in columns.

        Returns:
            (deliveries — accepted records with ``is_duplicate``, in arrival order; rejected
            records with reason and detail, in arrival order; records received).
        """
        rules = RuleSet(
            customer_id_pattern=self._pattern,  # one per engine: its cache outlives a batch
            processing_time=offsets.processing_time,
            max_clock_skew=self.config.processing.max_clock_skew,
        )
        frame, others = scan_batch(offsets.files, offsets.batch_id)
        validated = validate_batch(frame, others, rules)
        accepted = validated.filter(pl.col("reason").is_null())
        prior = self._prior_hashes(accepted["event_id"].unique().to_list(), offsets.batch_id)
        deliveries, rejected = classify_batch(validated, prior)
        return deliveries, rejected, validated.height

    def _prior_hashes(self, event_ids: list[str], batch_id: int) -> pl.DataFrame:
        """``event_id``, ``content_hash`` of the copies of ``event_ids`` earlier batches
        accepted (Bronze first copies and duplicates: the same hash)."""
        if not event_ids:
            return pl.DataFrame(schema={"event_id": pl.String, "content_hash": pl.String})
        found = read_where_in(
            self.store.table(BRONZE),
            "event_id",
            event_ids,
            ["event_id", "content_hash"],
            extra=(pl.col("batch_id") < batch_id) & ~pl.col("is_duplicate"),
        )
        return found.unique("event_id", keep="first")

    def _read_tombstones(self, keys: list[str]) -> pl.DataFrame:
        return read_where_in(
            self.store.table(TOMBSTONES), "customer_id", keys, ["customer_id", "_cdc_seq"]
        )

    def _read_targets(self, keys: list[str]) -> pl.DataFrame:
        frame = read_where_in(
            self.store.table(SILVER),
            "customer_id",
            keys,
            ["customer_id", "_cdc_seq", "_cdc_min_seq"],
        )
        return frame.rename({"_cdc_seq": "_t_seq", "_cdc_min_seq": "_t_min_seq"})

    def _history_of(self, keys: list[str], batch_id: int) -> pl.DataFrame:
        """All first-copy Bronze events of ``keys`` up to and including ``batch_id``."""
        return read_where_in(
            self.store.table(BRONZE),
            "customer_id",
            keys,
            FOLD_COLUMNS,
            extra=(pl.col("batch_id") <= batch_id) & ~pl.col("is_duplicate"),
        )

    def _merge_silver(
        self, events: pl.DataFrame, targets: pl.DataFrame, batch_id: int, now_tombs: pl.DataFrame
    ) -> None:
        silver = self.store.table(SILVER)
        if events.height == 0 or txn_done(silver, self.app_id, batch_id):
            return
        source = fold_events(events, self.mode, now_tombs if self.mode == "hard" else None)
        if self.mode == "hard":
            # A DELETE slotted between a row's first and last events: the row's created_at (and
            # which events survive) needs the key's whole history, so fold it from Bronze.
            tombs = batch_tombstones(events).select("customer_id", pl.col("_cdc_seq").alias("_tb"))
            split = targets.join(tombs, on="customer_id").filter(
                (pl.col("_t_min_seq") <= pl.col("_tb")) & (pl.col("_tb") < pl.col("_t_seq"))
            )
            if split.height:
                keys = split["customer_id"].to_list()
                exact = fold_events(self._history_of(keys, batch_id), "hard", None)
                source = pl.concat(
                    [source.filter(~pl.col("customer_id").is_in(keys)), exact], how="vertical"
                )
            # a tombstone-only row matters only where a Silver row exists (delta-rs validates
            # NOT NULL columns on source rows that no clause inserts)
            source = source.filter(
                pl.col("_cdc_seq").is_not_null()
                | pl.col("customer_id").is_in(targets["customer_id"].implode())
            )
        merge = silver_merge_spec(SILVER.schema.names)
        merge_silver(self.store, SILVER, to_source_table(source), merge, self.app_id, batch_id)

    def _merge_tombstones(self, events: pl.DataFrame, offsets: BatchOffsets) -> None:
        merge_tombstones(
            self.store,
            TOMBSTONES,
            batch_tombstones(events),
            TOMBSTONE_MERGE_ON,
            self.app_id,
            offsets,
            self.config.processing.tombstone_retention,
        )

    def _outcomes(
        self,
        offsets: BatchOffsets,
        deliveries: pl.DataFrame,
        targets: pl.DataFrame,
        prior_tombs: pl.DataFrame,
        report: BatchReport,
    ) -> pa.Table:
        threshold = self.config.processing.late_event_threshold.total_seconds()
        now = pl.lit(offsets.processing_time, pl.Datetime("us", "UTC"))
        frame = deliveries.select(
            pl.lit(offsets.batch_id, pl.Int64).alias("batch_id"),
            "event_id",
            "customer_id",
            "operation",
            "lsn",
            "sequence",
            "is_duplicate",
            ((now - pl.col("event_timestamp")).dt.total_microseconds() / 1_000_000).alias("lag_s"),
            "source_file",
            "source_line",
        )
        frame = event_outcomes(frame, ["customer_id"], targets, prior_tombs, threshold)
        count_outcomes(frame, report)
        return frame.select(EVENT_OUTCOMES.schema.names).to_arrow().cast(EVENT_OUTCOMES.schema)

    # ------------------------------------------------------------------ batch
    def run_batch(self, offsets: BatchOffsets) -> BatchReport:
        """Process one micro-batch (idempotent: a re-run after a crash writes nothing twice).

        Each table is opened once for the batch (:meth:`DeltaStore.pinned`).

        Args:
            offsets: the batch's files and processing time, from the checkpoint's offset log.

        Returns:
            The batch report (also appended to ``audit/batch_log``).
        """
        with self.store.pinned():
            return self._run_batch(offsets)

    def _run_batch(self, offsets: BatchOffsets) -> BatchReport:
        batch_id = offsets.batch_id
        report = BatchReport(
            batch_id=batch_id,
            pipeline=self.config.pipeline.name,
            kind="stream",
            started_at=offsets.processing_time,
            files=len(offsets.files),
            delete_mode=self.mode,
        )
        started = time.perf_counter()

        with report.stage("parse"):
            deliveries, rejected, report.records_received = self._parse(offsets)
            now = offsets.processing_time
            bronze_rows = to_bronze(deliveries, batch_id, now, BRONZE.schema)
            quarantine_rows = to_quarantine(rejected, batch_id, now, QUARANTINE.schema)
        report.accepted = bronze_rows.num_rows
        report.quarantined = quarantine_rows.num_rows
        report.duplicates = int(deliveries["is_duplicate"].sum())
        ops = deliveries.filter(~pl.col("is_duplicate"))["operation"].value_counts()
        counts = dict(zip(ops["operation"].to_list(), ops["count"].to_list(), strict=True))
        report.inserts = counts.get("INSERT", 0)
        report.updates = counts.get("UPDATE", 0)
        report.deletes = counts.get("DELETE", 0)

        with report.stage("bronze"):
            append_once(self.store.table(BRONZE), bronze_rows, self.app_id, batch_id, BRONZE)
        crash_point("after_bronze", batch_id)
        with report.stage("quarantine"):
            append_once(
                self.store.table(QUARANTINE), quarantine_rows, self.app_id, batch_id, QUARANTINE
            )
        crash_point("after_quarantine", batch_id)

        with report.stage("silver"):
            events = pl.from_arrow(
                bronze_rows.filter(pa.compute.invert(bronze_rows["is_duplicate"])).select(
                    FOLD_COLUMNS
                )
            )
            assert isinstance(events, pl.DataFrame)
            keys = events["customer_id"].unique().to_list()
            targets = self._read_targets(keys)
            prior_tombs = self._read_tombstones(keys)
            self._merge_silver(events, targets, batch_id, prior_tombs)
            crash_point("after_silver_merge", batch_id)
            if self.mode == "hard":
                self._merge_tombstones(events, offsets)
            silver = self.store.table(SILVER)
            report.silver_version = silver.version()
            report.silver_files_rewritten = merge_files_rewritten(silver, self.app_id, batch_id)
        crash_point("after_silver", batch_id)

        with report.stage("history"):  # SCD2 timeline of the touched keys, then Gold/maintenance
            from cdcflow.engines.local.gold import after_batch
            from cdcflow.engines.local.history import merge_history
            from cdcflow.layers.tables import HISTORY

            history = self.store.table(HISTORY)
            merge_history(
                history,
                lambda late: self._history_of(late["customer_id"].to_list(), batch_id),
                pl.DataFrame({"customer_id": keys}, schema={"customer_id": pl.String}),
                self.mode,
                self.app_id,
                batch_id,
                lambda names: read_where_in(history, "customer_id", keys, names),
                events,
            )
        crash_point("after_history", batch_id)
        with report.stage("gold"):  # through this batch's table objects (optimize: its own)
            after_batch(self.config, self.app_id, batch_id, self.store)

        if self.config.snowflake.mode == "inline":  # Silver -> Snowflake, lag into batch_log
            from cdcflow.sinks.snowflake.inline import inline_sync

            inline_sync(self.config, report)

        with report.stage("audit"):
            outcomes = self._outcomes(offsets, deliveries, targets, prior_tombs, report)
            append_once(
                self.store.table(EVENT_OUTCOMES), outcomes, self.app_id, batch_id, EVENT_OUTCOMES
            )
            crash_point("after_outcomes", batch_id)
            report.duration_ms = int((time.perf_counter() - started) * 1000)
            log_row = pa.Table.from_pylist([report.row()], schema=BATCH_LOG.schema)
            append_once(self.store.table(BATCH_LOG), log_row, self.app_id, batch_id, BATCH_LOG)
        crash_point("after_audit", batch_id)
        log.info("micro-batch committed", extra={"batch": report.log_fields()})
        return report


__all__ = ["LocalEngine"]
