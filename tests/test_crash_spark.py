"""Crash test of the Spark engine: a real SIGKILL of a child ``cdcflow run`` (engine: spark).

A child ``cdcflow run`` (:mod:`tests.forkrun`) with ``pipeline.engine: spark`` is killed with
``SIGKILL`` at a crash point of the middle micro-batch (batch 1 of the three of
:func:`tests.crashkit.write_workload`), in hard mode; its JVM ends with it (PySpark's gateway
exits at the end of its stdin) before the child's pipes close. The lake must then hold exactly
the commits before the point. The next child restarts (Structured Streaming re-runs the
uncommitted micro-batch from its own checkpoint, every earlier commit skipped by its app
transaction) and is killed at the next point, and so on through :data:`SPARK_POINTS`; a kill
during a recovery is a case of its own. Then a child restarts the pipeline and runs to the end,
and the result is compared with an uninterrupted run of the same landing files by the local
engine, which writes the same tables and Delta versions
(:func:`tests.crashkit.assert_same_lake`: Silver, tombstones, history, Gold, Bronze, quarantine,
outcomes, batch_log, Delta versions, checkpoint).

Why one batch, one mode and one chain: every child starts its own JVM (20–30 s on an idle
machine) and runs Spark micro-batches (seconds each), against a few seconds per cell on the
local engine, whose matrix (tests/test_crash.py) covers every point × mode × first/middle/last
batch. Here each distinct commit of the Spark engine gets one kill, in the batch that has a
committed batch before it and one after it, in hard mode (which has every commit, the tombstone
MERGE too); chaining the kills costs one child per point and one restart and comparison in
all, instead of a child, a restart of two batches and a comparison per point. The restart is a
child too (no SparkSession in the test process, whose JVM would start and compile for two
micro-batches only). Every Delta commit and checkpoint file of the micro-batch is a point of
the chain (the four Gold commits included); left out is only ``before_commit``, which leaves
the same files as ``after_audit`` (in between the engine only releases its caches).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cdcflow.state.faults import CRASH_EXIT_CODE, CRASH_POINTS
from tests.conftest import SPARK_MASTER, Lake, require_spark
from tests.crashkit import (
    BATCHES,
    assert_crashed_at,
    assert_same_lake,
    assert_workload_covered,
    config_file,
    run_cli,
    snapshot,
    write_workload,
)

#: What Spark's default log4j2 profile prints on every start: its banner, the shell's log level
#: hint, and WARN lines (``26/12/02 08:23:53 WARN Utils: Your hostname ...``).
SPARK_CHATTER = re.compile(
    r"Using Spark's default log4j profile|Setting default log level|"
    r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN ",
    re.MULTILINE,
)

#: ``spark_crash``: an xdist group of its own (tests/conftest.py), so the chain — the longest
#: test of the suite — runs on one worker (every Spark session in a child of its own) while the
#: other Spark tests share another worker's SparkSession.
pytestmark = [pytest.mark.spark_crash, pytest.mark.spark, pytest.mark.slow]

MODE = "hard"
BATCH = 1
#: Points left out of the chain (module docstring: why).
LEFT_OUT = ("before_commit",)
#: Every distinct commit of a Spark micro-batch, in micro-batch order.
SPARK_POINTS = tuple(point for point in CRASH_POINTS if point not in LEFT_OUT)
#: The chain on the standalone cluster (tests/test_spark_cluster.py), where each child also
#: starts two executor JVMs: the micro-batch's first Delta commit, a Gold table computed by the
#: executors, and the checkpoint's commit (every point: this chain on ``local[2]``).
CLUSTER_POINTS = ("after_bronze", "after_gold_daily_customer_metrics", "after_commit")
POINTS = SPARK_POINTS if SPARK_MASTER.startswith("local") else CLUSTER_POINTS


#: Spark settings of the killed children: expressions interpreted, not compiled, and the JVM's
#: JIT stopped at its first tier (C1). A child's JVM is cold and runs one micro-batch, so
#: compiling the generated code of every plan cost more than running it (about a quarter of a
#: child's CPU time), and so did C2's optimising compiles of code that runs for a minute: a child
#: killed after its first commit took 102 s of CPU with both, 73 s with C1 only, in the same 59 s
#: (its code cache made large enough for C1's bigger code). The question here is which commits a
#: kill leaves, not expression semantics, which the conformance suite checks with code generation
#: and the default JIT (the shared session of the other Spark tests).
CHILD_SPARK_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m",
}


def spark_crash_lake(root: Path) -> Lake:
    """A Spark lake of the crash workload (three landing files, one micro-batch each)."""
    lake = Lake(root, mode=MODE, max_files=1)
    lake.config.pipeline.engine = "spark"
    lake.config.spark.conf.update(CHILD_SPARK_CONF)
    write_workload(lake)
    return lake


@pytest.fixture(scope="module")
def spark_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """:func:`snapshot` of an uninterrupted run of the crash workload by the local engine.

    The engines write the same tables, row for row, Delta version for version (the conformance
    suite, tests/test_spark_conformance.py): the killed Spark runs must end where an
    uninterrupted local run ends, which also proves the engines agree on this workload. (An
    uninterrupted Spark run took 260 s of the two cores in CI; the local one takes a second.)
    """
    lake = Lake(tmp_path_factory.mktemp("local-reference"), mode=MODE, max_files=1)
    write_workload(lake)
    assert [r.batch_id for r in lake.run()] == list(range(BATCHES))
    assert_workload_covered(lake)
    assert_same_lake(lake, snapshot(lake))  # its own clock columns and expected() hold
    return snapshot(lake, across_engines=True)


def test_spark_killed_at_every_commit_of_a_batch_then_restart(
    tmp_path: Path, spark_reference: dict[str, Any]
) -> None:
    require_spark()
    lake = spark_crash_lake(tmp_path)
    config = config_file(lake)
    for point in POINTS:  # each child re-runs batch 1 and is killed one commit further
        crashed = run_cli(config, crash=f"{point}@{BATCH}", timeout=900)
        assert crashed.returncode == CRASH_EXIT_CODE, (point, crashed.stderr[-3000:])
        assert_crashed_at(lake, point, BATCH)
        # the driver's log4j2 configuration (engines/spark/log4j2.properties): no Spark banner,
        # no WARN lines a user cannot act on, on a cdcflow run's stderr
        assert not SPARK_CHATTER.search(crashed.stderr), crashed.stderr[:3000]
    # a child left alone: Spark re-runs its batch 1 (committed by cdcflow, not by Spark), then
    # batch 2
    restarted = run_cli(config, timeout=900)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert_same_lake(lake, spark_reference, across_engines=True)
    # the Silver files each micro-batch's MERGE rewrote, from Spark's MERGE commits (a file
    # layout of its own, so not compared with the local run): none in batch 0 (an empty
    # Silver), some in each later batch (each updates rows of earlier ones), a re-run included
    log = lake.table("audit/batch_log").sort("batch_id")
    first, *later = log["silver_files_rewritten"].to_list()
    assert first == 0 and later and all(n is not None and n >= 1 for n in later), log
    # (that a further run is a no-op, not a commit more, not a checkpoint entry more, is
    # checked in the shared session: tests/test_spark_conformance.py, a child less here)
