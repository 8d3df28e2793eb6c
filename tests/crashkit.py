"""Shared pieces of the crash tests: the workload, a killed child run, and the lake comparison.

A crash test kills a child ``cdcflow run`` (:mod:`tests.forkrun`) at a crash point
(``CDCFLOW_CRASH_AT``, :mod:`cdcflow.state.faults`; the child sends itself ``SIGKILL``), restarts
the pipeline, and compares the recovered lakehouse with an uninterrupted run of the same landing
files in another folder (:func:`assert_same_lake`).

What is compared, and what is not:

* Silver, hard-mode tombstones, ``silver/customer_history``, the four Gold tables, Bronze,
  quarantine, ``audit/event_outcomes`` and ``audit/batch_log``, row for row; landing file paths
  reduced to the file name (the two runs live in different folders).
* Not compared with the other run: the columns that hold the batch's processing time (Bronze
  ``ingested_at``/``ingestion_date``, quarantine ``quarantined_at``, tombstones
  ``tombstoned_at``, batch_log ``started_at``) and the values derived from it (outcomes
  ``lag_s``, batch_log ``max_event_lag_s``; the processing time quoted in a
  ``FUTURE_EVENT_TIMESTAMP`` detail is replaced by a placeholder), plus batch_log
  ``duration_ms`` and ``stage_seconds`` (wall time) and ``spark_jobs`` (a re-run skips the
  commits already written, so it runs fewer jobs). Each run takes its own clock reading per
  batch, so these differ between two correct runs. Instead :func:`assert_processing_times`
  checks them, in each lake, against the processing time its offset log recorded for the batch:
  a re-run after a crash must reuse the recorded time, not take a new one. The workload keeps
  every event lag far from ``late_event_threshold`` (24 h) and the future event far past
  ``max_clock_skew``, so ``is_late`` and the rejections do not depend on the few seconds between
  the runs.
* Between a run of each engine only, not compared either: batch_log ``silver_files_rewritten``
  (:data:`ENGINE_COLUMNS`: each engine lays Silver out in files of its own). Between two runs of
  one engine it is compared: a re-run reads it from the MERGE commit the killed run wrote.
* The Delta version of every table (a re-run that wrote a commit twice, even an empty one,
  would show), the checkpoint (offsets of every batch: file names and byte counts; a commit
  marker each; nothing pending) and the reference fold (``Lake.expected()``) for Silver.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import yaml
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.state.checkpoint import Checkpoint
from cdcflow.state.faults import gold_point
from tests import forkrun
from tests.conftest import REPO, Lake, ev, full


class AnyLake(Protocol):
    """A pipeline's lakehouse as the tests see it (:class:`tests.conftest.Lake`, or the
    PostgreSQL tests' ``PgLake``)."""

    config: CdcflowConfig

    def table(self, name: str) -> pl.DataFrame:
        """The rows of Delta table ``name``."""
        ...


def _mode(lake: AnyLake) -> str:
    return lake.config.processing.delete_mode


#: Micro-batches of :func:`write_workload` (one landing file each, ``max_files_per_trigger=1``).
BATCHES = 3
#: The batches a crash is injected in: the first, a middle and the last one.
CRASH_BATCHES = {"first": 0, "middle": 1, "last": BATCHES - 1}

_DAY = 24 * 60


def write_workload(lake: Lake) -> None:
    """Write the three landing files of the crash workload (one micro-batch each).

    Every batch has a hard DELETE (so each has a tombstone commit in hard mode), a rejected
    record (a quarantine commit) and several customers (history and Gold commits). Over the
    batches: malformed JSON, an unknown operation, an invalid customer_id, an event one year in
    the future; an exact duplicate in the same batch and in later batches, a conflicting
    duplicate (same event_id, other content); a DELETE slotted between a row's first and last
    events (hard mode re-folds the key from Bronze); revivals after hard deletes; an event older
    than the row (STALE) and one older than its tombstone (TOMBSTONED in hard mode); two events
    of one key in a batch (SUPERSEDED_IN_BATCH); late events (lag of 2 and 3 days).
    """
    lake.write(
        [
            ev("E01", "C-1", "INSERT", "0/10", minutes_ago=300, **full()),
            ev("E02", "C-2", "INSERT", "0/20", minutes_ago=290, **full(city="Lyon")),
            "{broken",
            ev("E03", "C-1", "UPDATE", "0/30", minutes_ago=280, email="n@x.com"),
            ev("E02", "C-2", "INSERT", "0/20", minutes_ago=290, **full(city="Lyon")),
            ev("E04", "C-3", "INSERT", "0/40", minutes_ago=270, **full(status="INACTIVE")),
            ev("E05", "C-3", "DELETE", "0/50", minutes_ago=260),
            ev("E06", "C-5", "INSERT", "0/60", minutes_ago=250, **full(city="Oslo")),
            ev("E07", "C-5", "UPDATE", "0/80", minutes_ago=230, city="Nice"),
            ev("E08", "C-6", "INSERT", "0/90", minutes_ago=3 * _DAY, **full()),
            ev("E09", "C-9", "INSERT", "0/95", minutes_ago=-365 * _DAY, **full()),
        ]
    )
    lake.write(
        [
            ev("E10", "C-2", "DELETE", "1/0", minutes_ago=200),
            ev("E03", "C-1", "UPDATE", "0/30", minutes_ago=280, email="n@x.com"),
            ev("E01", "C-1", "INSERT", "0/10", minutes_ago=300, **full(city="Elsewhere")),
            ev("E11", "C-1", "UPDATE", "0/25", minutes_ago=285, city="Paris"),
            ev("E12", "C-5", "DELETE", "0/70", minutes_ago=240),
            ev("E13", "C-7", "BOGUS", "1/1", minutes_ago=195),
            ev("E14", "C-3", "INSERT", "1/10", minutes_ago=190, **full(city="Rome")),
            ev("E15", "C-10", "INSERT", "1/12", minutes_ago=185, **full()),
            ev("E16", "C-10", "UPDATE", "1/14", minutes_ago=180, status="INACTIVE"),
        ]
    )
    lake.write(
        [
            ev("E17", "C-2", "INSERT", "1/20", minutes_ago=100, **full(city="Brest")),
            ev("E18", "C-3", "UPDATE", "0/45", minutes_ago=265, city="Old"),
            ev("E19", "X-9", "INSERT", "1/22", minutes_ago=90, **full()),
            ev("E10", "C-2", "DELETE", "1/0", minutes_ago=200),
            ev("E20", "C-1", "DELETE", "1/30", minutes_ago=50),
            ev("E21", "C-6", "UPDATE", "1/40", minutes_ago=2 * _DAY, city="Late"),
            ev("E22", "C-11", "INSERT", "1/50", minutes_ago=10, **full(status="SUSPENDED")),
            ev("E23", "C-2", "UPDATE", "1/60", minutes_ago=5, phone="+33-1"),
        ]
    )


def config_file(lake: Lake, **sections: dict[str, Any]) -> Path:
    """Write ``lake``'s configuration (plus ``sections``, merged per section) as YAML.

    Returns:
        The path of ``<lake root>/cdcflow.yaml``.
    """
    data = lake.config.model_dump(mode="json", by_alias=True)
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    path = lake.root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


TRIGGER = ("--trigger", "available-now")


def run_cli(
    config: Path, crash: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``cdcflow run --trigger available-now`` in a child process.

    The child is forked from a warm fork server (:mod:`tests.forkrun`: the same entry point as
    the console script, without paying the imports again for every child).

    Args:
        config: the configuration file.
        crash: ``CDCFLOW_CRASH_AT`` for the child (``<point>@<batch>``), or None.
        timeout: seconds before the child is killed and the test fails.

    Returns:
        The finished child (``returncode`` is ``CRASH_EXIT_CODE`` when the crash point fired).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    if crash:
        env["CDCFLOW_CRASH_AT"] = crash
    return forkrun.run(["run", "--config", str(config), *TRIGGER], env, REPO, timeout)


# -- which commits a crash point leaves -------------------------------------------------------

#: (table, app-transaction suffix) of each Delta commit of a micro-batch of the workload, in
#: order; the tombstone commit exists in hard mode only.
BATCH_COMMITS: tuple[tuple[str, str], ...] = (
    ("bronze/customer_events", ""),
    ("quarantine/customer_events", ""),
    ("silver/customers", ""),
    ("silver/customer_tombstones", ""),
    ("silver/customer_history", ""),
    *((spec.name, "-gold") for spec in GOLD_TABLES),
    ("audit/event_outcomes", ""),
    ("audit/batch_log", ""),
)
#: Crash point → number of :data:`BATCH_COMMITS` written before it.
COMMITS_BEFORE = {
    "after_offsets": 0,
    "after_bronze": 1,
    "after_quarantine": 2,
    "after_silver_merge": 3,
    "after_silver": 4,
    "after_history": 5,
    **{gold_point(spec.name): 6 + i for i, spec in enumerate(GOLD_TABLES)},
    "after_outcomes": 10,
    "after_audit": 11,
    "before_commit": 11,
    "after_commit": 11,
}


def _txn_version(uri: str, app_id: str) -> int | None:
    """The table's version of app transaction ``app_id`` (None: none, or no table yet — the
    Gold tables are created by the first Gold refresh)."""
    try:
        return DeltaTable(uri).transaction_version(app_id)
    except TableNotFoundError:
        return None


def assert_crashed_at(lake: AnyLake, point: str, batch: int) -> None:
    """The lake right after a crash at ``point`` of ``batch``: exactly the commits before it.

    Checks the app transaction (``cdcflow-<pipeline>``, version = batch id) of each Delta table
    and the checkpoint's commit markers, so a crash point that moved, or a commit that moved
    across one, fails here.
    """
    app_id = f"cdcflow-{lake.config.pipeline.name}"
    done = COMMITS_BEFORE[point]
    for i, (name, suffix) in enumerate(BATCH_COMMITS):
        if name == "silver/customer_tombstones" and _mode(lake) == "soft":
            continue
        version = _txn_version(lake.config.table_uri(name), app_id + suffix)
        expected = batch if i < done else (batch - 1 if batch else None)
        assert version == expected, (name, point, batch)
    checkpoint = Checkpoint(lake.config.checkpoint.location)
    committed = [b for b in range(BATCHES) if checkpoint.is_committed(b)]
    assert committed == list(range(batch + (point == "after_commit"))), (point, batch)


# -- comparison with an uninterrupted run -------------------------------------------------------

SILVER = "silver/customers"
TOMBSTONES = "silver/customer_tombstones"
HISTORY = "silver/customer_history"
BRONZE = "bronze/customer_events"
QUARANTINE = "quarantine/customer_events"
OUTCOMES = "audit/event_outcomes"
BATCH_LOG = "audit/batch_log"

#: Columns that hold the processing time or depend on it or on the wall clock (module doc).
CLOCK_COLUMNS = {
    BRONZE: ("ingested_at", "ingestion_date"),
    QUARANTINE: ("quarantined_at",),
    TOMBSTONES: ("tombstoned_at",),
    OUTCOMES: ("lag_s",),
    BATCH_LOG: ("started_at", "duration_ms", "max_event_lag_s", "spark_jobs", "stage_seconds"),
}
#: Columns that follow an engine's file layout: equal between two runs of one engine (a re-run
#: reads them from the commits the crashed run wrote), compared across engines only when asked.
ENGINE_COLUMNS = {BATCH_LOG: ("silver_files_rewritten",)}
COMPARED = (
    SILVER,
    TOMBSTONES,
    HISTORY,
    *(spec.name for spec in GOLD_TABLES),
    BRONZE,
    QUARANTINE,
    OUTCOMES,
    BATCH_LOG,
)


def processing_times(lake: AnyLake) -> dict[int, datetime]:
    """Batch id → processing time, from the lake's offset log."""
    checkpoint = Checkpoint(lake.config.checkpoint.location)
    last = checkpoint.last_batch()
    batches = range(0 if last is None else last + 1)
    return {b: checkpoint.offsets(b).processing_time for b in batches}


def comparable(lake: AnyLake, name: str, across_engines: bool = False) -> list[dict[str, Any]]:
    """The rows of table ``name`` as compared between two runs (sorted, clock columns dropped,
    landing paths reduced to file names, processing times in details replaced; with
    ``across_engines``, the :data:`ENGINE_COLUMNS` dropped too)."""
    dropped = CLOCK_COLUMNS.get(name, ()) + (ENGINE_COLUMNS.get(name, ()) if across_engines else ())
    frame = lake.table(name).drop(dropped)
    if "source_file" in frame.columns:
        frame = frame.with_columns(
            pl.col("source_file").map_elements(lambda p: Path(p).name, return_dtype=pl.String)
        )
    rows = frame.to_dicts()
    if name == QUARANTINE:
        times = processing_times(lake)
        for row in rows:
            stamp = times[row["batch_id"]].isoformat()
            row["failure_detail"] = row["failure_detail"].replace(stamp, "<processing_time>")
    return sorted(rows, key=lambda row: [(v is None, str(v)) for v in row.values()])


def assert_processing_times(lake: AnyLake) -> None:
    """Every clock column of the lake holds its batch's recorded processing time.

    Bronze ``ingested_at``/``ingestion_date``, quarantine ``quarantined_at``, batch_log
    ``started_at``; outcomes ``lag_s`` = processing time − event_timestamp; a tombstone's
    ``tombstoned_at`` = the processing time of the batch that received its DELETE.
    """
    times = processing_times(lake)
    bronze = lake.table(BRONZE)
    for row in bronze.select("batch_id", "ingested_at", "ingestion_date").to_dicts():
        stamp = times[row["batch_id"]]
        assert (row["ingested_at"], row["ingestion_date"]) == (stamp, stamp.date()), row
    for row in lake.table(QUARANTINE).select("batch_id", "quarantined_at").to_dicts():
        assert row["quarantined_at"] == times[row["batch_id"]], row
    for row in lake.table(BATCH_LOG).select("batch_id", "started_at").to_dicts():
        assert row["started_at"] == times[row["batch_id"]], row
    key = ["batch_id", "source_file", "source_line"]
    lags = lake.table(OUTCOMES).join(bronze.select(*key, "event_timestamp"), on=key)
    assert lags.height == bronze.height
    for row in lags.select("batch_id", "event_timestamp", "lag_s").to_dicts():
        lag = (times[row["batch_id"]] - row["event_timestamp"]).total_seconds()
        assert abs(row["lag_s"] - lag) < 1e-3, row
    if _mode(lake) == "hard":
        received = bronze.filter(~pl.col("is_duplicate")).select("event_id", "batch_id")
        tombs = lake.table(TOMBSTONES).join(received, left_on="last_event_id", right_on="event_id")
        assert tombs.height == lake.table(TOMBSTONES).height
        for row in tombs.to_dicts():
            assert row["tombstoned_at"] == times[row["batch_id"]], row


def versions(lake: AnyLake) -> dict[str, int]:
    """Table name → Delta version, for every compared table."""
    return {name: DeltaTable(lake.config.table_uri(name)).version() for name in COMPARED}


def checkpoint_state(lake: AnyLake) -> dict[str, Any]:
    """The lake's checkpoint: each batch's files (name, start, size), commit markers, pending."""
    checkpoint = Checkpoint(lake.config.checkpoint.location)
    last = checkpoint.last_batch()
    batches = range(0 if last is None else last + 1)
    return {
        "files": [
            [(Path(f.path).name, f.start, f.size) for f in checkpoint.offsets(b).files]
            for b in batches
        ],
        "committed": [checkpoint.is_committed(b) for b in batches],
        "pending": checkpoint.pending(),
    }


def snapshot(lake: AnyLake, across_engines: bool = False) -> dict[str, Any]:
    """Everything :func:`assert_same_lake` compares: table name → :func:`comparable` rows, plus
    ``versions`` and ``checkpoint`` (``across_engines``: for a lake of the other engine)."""
    tables: dict[str, Any] = {name: comparable(lake, name, across_engines) for name in COMPARED}
    return {**tables, "versions": versions(lake), "checkpoint": checkpoint_state(lake)}


def assert_same_tables(
    lake: AnyLake, reference: dict[str, Any], across_engines: bool = False
) -> None:
    """``lake`` (recovered from a crash) holds what the uninterrupted run holds.

    See the module docstring for what is compared; also checks the processing-time columns of
    ``lake`` against its offset log.

    Args:
        lake: the recovered lake.
        reference: :func:`snapshot` of the uninterrupted run.
        across_engines: the reference is a run of the other engine (its snapshot taken with
            ``across_engines`` too).
    """
    got = snapshot(lake, across_engines)
    for name in reference:
        assert got[name] == reference[name], name
    if _mode(lake) == "soft":
        assert got[TOMBSTONES] == []
    assert_processing_times(lake)
    assert sorted(lake.table(BATCH_LOG)["batch_id"].to_list()) == list(
        range(len(got["checkpoint"]["committed"]))
    )


def assert_same_lake(lake: Lake, reference: dict[str, Any], across_engines: bool = False) -> None:
    """:func:`assert_same_tables`, and Silver (and tombstones) equal ``lake.expected()``."""
    assert_same_tables(lake, reference, across_engines)
    expected = lake.expected()
    assert lake.silver() == expected.rows
    if lake.mode == "hard":
        tombs = lake.table(TOMBSTONES)
        assert dict(zip(tombs["customer_id"], tombs["_cdc_seq"], strict=True)) == (
            expected.tombstones
        )
    assert sorted(lake.table(BATCH_LOG)["batch_id"].to_list()) == list(range(BATCHES))


def assert_workload_covered(lake: Lake) -> None:
    """The uninterrupted run shows every case the workload is meant to contain."""
    outcomes = lake.table(OUTCOMES)
    seen = set(outcomes["outcome"].to_list())
    wanted = {"APPLIED", "DUPLICATE", "STALE", "SUPERSEDED_IN_BATCH"}
    if lake.mode == "hard":
        wanted.add("TOMBSTONED")
    assert wanted <= seen, seen
    assert outcomes["is_late"].sum() == 2
    reasons = set(lake.table(QUARANTINE)["failure_reason"].to_list())
    assert {"MALFORMED_JSON", "DUPLICATE_EVENT_CONFLICT", "FUTURE_EVENT_TIMESTAMP"} <= reasons
    assert len(reasons) == 5, reasons  # plus the unknown operation and the invalid customer_id
    assert lake.table(QUARANTINE)["batch_id"].unique().sort().to_list() == list(range(BATCHES))
    deletes = lake.table(BRONZE).filter(pl.col("operation") == "DELETE")
    assert deletes["batch_id"].unique().sort().to_list() == list(range(BATCHES))
