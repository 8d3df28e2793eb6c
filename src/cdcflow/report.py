"""Typed run reports: what ``audit/batch_log`` stores and the CLI prints."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class BatchReport:
    """Counts and timings of one micro-batch (one row of ``audit/batch_log``).

    Attributes:
        batch_id: micro-batch number (0-based).
        pipeline: pipeline name.
        kind: ``stream`` for a micro-batch of the source, ``replay`` for a rebuild from Bronze.
        started_at: UTC start of processing.
        duration_ms: wall time in milliseconds.
        files: landing files in the batch.
        records_received: non-blank records read (accepted + quarantined).
        accepted: records written to Bronze (duplicates included).
        quarantined: records written to quarantine.
        duplicates: exact re-deliveries (outcome DUPLICATE).
        inserts / updates / deletes: accepted, non-duplicate events by operation.
        stale_ignored: events older than the row's current sequence (outcome STALE).
        tombstoned: events blocked by a hard-mode tombstone (outcome TOMBSTONED).
        late_events: deliveries whose lag exceeds ``processing.late_event_threshold``.
        max_event_lag_s: largest ingestion time − event_timestamp, in seconds (None if empty).
        silver_version: Delta version of Silver after the batch.
        delete_mode: ``soft`` or ``hard``.
        snowflake_sync_lag_s: inline Snowflake sync: seconds from the Silver commit to the
            Snowflake commit of this batch's changes (None when not synced inline).
        spark_jobs: Spark jobs the micro-batch ran up to its ``audit/batch_log`` row (that
            row's own append not counted); None for the local engine.
        stage_seconds: seconds spent per stage (stored as JSON text).
        silver_files_rewritten: Silver data files the micro-batch's MERGE rewrote (removed and
            wrote anew: Delta MERGE is copy-on-write), from the MERGE commit's metrics; 0 when
            the micro-batch did not change Silver; with declared tables, the sum over their
            Silver tables; None for a replay or when the commit no longer tells.
    """

    batch_id: int
    pipeline: str
    kind: str
    started_at: datetime
    duration_ms: int = 0
    files: int = 0
    records_received: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    stale_ignored: int = 0
    tombstoned: int = 0
    late_events: int = 0
    max_event_lag_s: float | None = None
    silver_version: int | None = None
    delete_mode: str = "soft"
    snowflake_sync_lag_s: float | None = None
    spark_jobs: int | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    silver_files_rewritten: int | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``stage_seconds[name]`` (seconds)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + elapsed

    def row(self) -> dict[str, Any]:
        """The ``audit/batch_log`` row: every field, ``stage_seconds`` as JSON text (an object
        of stage name → seconds, rounded to 0.1 ms, in the order the stages ran; None when no
        stage was timed)."""
        data = asdict(self)
        stages = {k: round(v, 4) for k, v in self.stage_seconds.items()}
        data["stage_seconds"] = json.dumps(stages) if stages else None
        return data

    def log_fields(self) -> dict[str, Any]:
        """JSON-log form (no PII: counts, ids and timings only)."""
        data = self.row()
        data["started_at"] = self.started_at.isoformat()
        data["stage_seconds"] = {k: round(v, 4) for k, v in self.stage_seconds.items()}
        return data
