"""Micro-batch driver: triggers, write-ahead offsets, engine call, commit marker.

Triggers (the ``--trigger`` option of ``cdcflow run``):

* ``once`` — all unprocessed landing files as one micro-batch, then return.
* ``available-now`` — all unprocessed files in micro-batches of at most
  ``source.max_files_per_trigger`` files, then return.
* ``processing-time=<duration>`` — one micro-batch (at most ``max_files_per_trigger`` files) per
  interval until SIGINT/SIGTERM; the batch in progress finishes before the run stops.

A batch left without a commit marker by a crash is always re-run first, with its recorded
offsets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cdcflow.config import CdcflowConfig, parse_duration
from cdcflow.engines import Engine, StreamingEngine, get_engine
from cdcflow.errors import ConfigError
from cdcflow.layers.erasure import enforce_erasures
from cdcflow.logs import get_logger
from cdcflow.report import BatchReport
from cdcflow.signals import stop_on_signals
from cdcflow.sources.files import cut_landing, plan_landing
from cdcflow.sources.postgres import make_source
from cdcflow.state.checkpoint import BatchOffsets, Checkpoint
from cdcflow.state.faults import crash_point

log = get_logger("pipeline")


@dataclass(frozen=True)
class Trigger:
    """A parsed ``--trigger`` value.

    Attributes:
        kind: ``once``, ``available-now`` or ``processing-time``.
        interval: the interval of ``processing-time`` (None otherwise).
    """

    kind: str
    interval: timedelta | None = None

    @classmethod
    def parse(cls, text: str) -> Trigger:
        """Parse ``once`` | ``available-now`` | ``processing-time=10s``.

        Raises:
            ConfigError: any other value.
        """
        value = text.strip().lower()
        if value in ("once", "available-now"):
            return cls(value)
        if value.startswith("processing-time="):
            try:
                interval = parse_duration(value.split("=", 1)[1])
            except ValueError as exc:
                raise ConfigError(f"--trigger: {exc}") from None
            if interval.total_seconds() <= 0:
                raise ConfigError("--trigger: processing-time interval must be positive")
            return cls("processing-time", interval)
        raise ConfigError(
            f"--trigger: expected once, available-now or processing-time=<duration>, got {text!r}"
        )


class Pipeline:
    """One configured pipeline: source → engine → checkpoint."""

    def __init__(self, config: CdcflowConfig, engine: Engine | None = None) -> None:
        """Set up a run of ``config``.

        With a ``tables:`` section the engine is
        :class:`cdcflow.engines.local.contracts.LocalContractsEngine` (every declared table in
        each micro-batch, routed by ``metadata.source_table``).

        Raises:
            ConfigError: the engine cannot run this config (e.g. PostgreSQL with declared tables).
        """
        self.config = config
        self.checkpoint = Checkpoint.of(config)
        self.engine = engine or get_engine(config)
        self.source = make_source(config)  # None for plain landing files
        self._stop = threading.Event()
        self._on_recover: Callable[[int], None] | None = None
        self._on_start: Callable[[BatchOffsets], None] | None = None
        self._on_stop: Callable[[], None] | None = None
        self.lineage = None  # OpenLineage run events per micro-batch (config ``lineage``)
        if config.lineage.transport != "none":
            from cdcflow.layers.lineage import LineageEmitter

            self.lineage = LineageEmitter(config)

    def stop(self) -> None:
        """Ask a continuous run to stop after the current micro-batch."""
        if not self._stop.is_set() and self._on_stop is not None:
            self._on_stop()
        self._stop.set()

    def _next_offsets(self, max_files: int | None) -> BatchOffsets | None:
        pending = self.checkpoint.pending()
        if pending is not None:
            self._recovering(pending)
            return pending
        if self.source is not None:
            self.source.stage(self.checkpoint)  # e.g. PostgreSQL slot changes -> landing file
        if self.source is None and not Path(self.config.source.path).is_dir():
            log.warning("landing folder does not exist", extra={"path": self.config.source.path})
        now = datetime.now(UTC)
        new, young = plan_landing(
            self.config.source.path,
            self.checkpoint.taken(),
            now=now,
            min_file_age=self.config.source.min_file_age,
            limit=max_files,
        )
        if young:
            log.info(
                "landing files younger than source.min_file_age held back",
                extra={"files": len(young)},
            )
        if not new:  # at most max_files: plan_landing stops there
            return None
        source = self.config.source
        new = cut_landing(new, source.max_records_per_trigger, source.max_bytes_per_trigger)
        last = self.checkpoint.last_batch()
        offsets = BatchOffsets(
            batch_id=0 if last is None else last + 1,
            processing_time=now,
            files=tuple(new),
        )
        for file in offsets.files:
            if file.change not in ("new", "continued"):
                log.warning(
                    f"landing file {file.change} after an earlier micro-batch took it: "
                    + (
                        "taking only the appended bytes"
                        if file.change in ("appended", "continued")
                        else "taking the whole file again as new content"
                    ),
                    extra={"path": file.path, "batch_id": offsets.batch_id, "start": file.start},
                )
        self.checkpoint.write_offsets(offsets)
        crash_point("after_offsets", offsets.batch_id)
        return offsets

    def _recovering(self, pending: BatchOffsets) -> None:
        log.info("re-running uncommitted micro-batch", extra={"batch_id": pending.batch_id})
        if self._on_recover is not None:
            self._on_recover(pending.batch_id)

    def _run_one(self, offsets: BatchOffsets) -> BatchReport:
        if self._on_start is not None:
            self._on_start(offsets)
        if self.lineage is None:
            return self._run_and_commit(offsets)
        self.lineage.start(offsets.batch_id, offsets.processing_time)
        try:
            report = self._run_and_commit(offsets)
        except BaseException:
            self.lineage.fail(offsets.batch_id)
            raise
        self.lineage.complete(report)
        return report

    def _run_and_commit(self, offsets: BatchOffsets) -> BatchReport:
        report = self.engine.run_batch(offsets)
        # an erased subject's late events: applied with their PII nulled (docs/erasure.md)
        enforce_erasures(self.config, offsets.batch_id)
        crash_point("before_commit", offsets.batch_id)
        self.checkpoint.write_commit(
            offsets.batch_id,
            {
                "committed_at": datetime.now(UTC).isoformat(),
                "silver_version": report.silver_version,
            },
        )
        crash_point("after_commit", offsets.batch_id)
        if self.source is not None:
            self.source.acknowledge(offsets)  # only now may the source forget these changes
        return report

    def run(
        self,
        trigger: Trigger,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_recover: Callable[[int], None] | None = None,
        on_start: Callable[[BatchOffsets], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> list[BatchReport]:
        """Run micro-batches according to the trigger.

        Args:
            trigger: the trigger.
            on_batch: called with each batch report as soon as the batch is committed.
            on_recover: called with the batch id before a micro-batch left uncommitted by an
                interrupted run is re-run (local engine; Spark recovers from its own checkpoint).
            on_start: called with a micro-batch's offsets (its id and files) when it starts
                (local engine: Spark plans its micro-batches itself).
            on_stop: called when SIGINT/SIGTERM asks a ``processing-time`` run to stop (the
                micro-batch in progress finishes first).

        Returns:
            The reports of the batches run, in order.

        Raises:
            CheckpointError: another run holds the checkpoint lock, or it is unreadable.
        """
        try:
            self._on_start, self._on_stop = on_start, on_stop
            return self._run(trigger, on_batch, on_recover)
        finally:
            if self.lineage is not None:  # the run's last events, at most lineage.timeout_s
                self.lineage.flush()

    def _run(
        self,
        trigger: Trigger,
        on_batch: Callable[[BatchReport], None] | None,
        on_recover: Callable[[int], None] | None,
    ) -> list[BatchReport]:
        reports: list[BatchReport] = []
        self._on_recover = on_recover

        def done(report: BatchReport) -> None:
            reports.append(report)
            if on_batch:
                on_batch(report)

        if isinstance(self.engine, StreamingEngine):  # the engine drives its own loop (Spark)
            lineage = self.lineage

            def streamed(report: BatchReport) -> None:
                enforce_erasures(self.config, report.batch_id)  # after Spark's commit
                if lineage is not None:  # START (at its processing time) and COMPLETE
                    lineage.complete(report)
                done(report)

            with self.checkpoint.lock():
                last = self.checkpoint.last_batch()
                if last is not None:  # a run killed between a commit and its enforcement
                    enforce_erasures(self.config, last)
                try:
                    self.engine.run_stream(trigger, streamed)
                except BaseException:
                    if lineage is not None:
                        lineage.fail(None)
                    raise
            return reports
        with self.checkpoint.lock():
            if trigger.kind == "processing-time":
                assert trigger.interval is not None
                with stop_on_signals(self.stop):
                    interval = trigger.interval.total_seconds()
                    while not self._stop.is_set():
                        started = time.monotonic()  # intervals run start to start
                        offsets = self._next_offsets(self.config.source.max_files_per_trigger)
                        if offsets is not None:
                            done(self._run_one(offsets))
                        self._stop.wait(max(0.0, started + interval - time.monotonic()))
                return reports
            # a crashed batch is re-run with its own offsets before anything new
            pending = self.checkpoint.pending()
            if pending is not None:
                self._recovering(pending)
                done(self._run_one(pending))
            limit = None if trigger.kind == "once" else self.config.source.max_files_per_trigger
            while True:
                offsets = self._next_offsets(limit)
                if offsets is None:
                    break
                done(self._run_one(offsets))
                if trigger.kind == "once":
                    break
        return reports
