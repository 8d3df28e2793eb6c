"""Crash matrix (local engine): a real SIGKILL at every commit point of a micro-batch.

For every crash point (:data:`cdcflow.state.faults.CRASH_POINTS`: each checkpoint file and each
Delta commit of a micro-batch) × delete mode (soft, hard) × batch (the first, the middle and the
last of three), a child ``cdcflow run`` (:mod:`tests.forkrun`) is killed with ``SIGKILL`` at the
point; the lake is checked to hold exactly the commits before it; the pipeline is restarted; and
the result is compared with an uninterrupted run of the same landing files in another folder
(Silver, tombstones, history, Gold, Bronze, quarantine, outcomes, batch_log, Delta versions,
checkpoint: :func:`tests.crashkit.assert_same_lake`). A second restart must change nothing.

Left out of the matrix are the cells whose crash leaves the very files of another cell
(:data:`SAME_AS`): ``after_audit`` (the local engine writes nothing between it and
``before_commit``) and, in soft mode, ``after_silver_merge`` (no tombstone commit follows the
Silver MERGE: the files of ``after_silver``). That leaves 75 of the 84 cells.

Cost: a child started as ``python -m cdcflow`` spends about 3 s of CPU on its imports, most of a
cell's time; the children are therefore forked from a warm fork server (:mod:`tests.forkrun`,
about 0.5 s each), and the restart runs in the test process (``Pipeline.run``, the code path of
``cdcflow run``; :func:`test_restart_by_the_cli_after_a_crash` restarts through the CLI) and the
uninterrupted run is made once per delete mode and module (per xdist worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.state.faults import CRASH_EXIT_CODE, CRASH_POINTS, gold_point
from tests.conftest import Lake
from tests.crashkit import (
    BATCHES,
    COMMITS_BEFORE,
    CRASH_BATCHES,
    assert_crashed_at,
    assert_same_lake,
    assert_workload_covered,
    checkpoint_state,
    config_file,
    run_cli,
    snapshot,
    versions,
    write_workload,
)


def crash_lake(root: Path, mode: str) -> Lake:
    """A lake of the crash workload: three landing files, one micro-batch each."""
    lake = Lake(root, mode=mode, max_files=1)
    write_workload(lake)
    return lake


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The uninterrupted run of the crash workload, per delete mode (its :func:`snapshot`)."""
    snapshots = {}
    for mode in ("soft", "hard"):
        lake = crash_lake(tmp_path_factory.mktemp(f"reference-{mode}"), mode)
        assert [r.batch_id for r in lake.run()] == list(range(BATCHES))
        assert_workload_covered(lake)
        assert_same_lake(lake, snapshot(lake))  # its own clock columns and expected() hold
        snapshots[mode] = snapshot(lake)
    return snapshots


#: (point, mode) → the point whose crash leaves the same files (mode None: both modes).
SAME_AS = {("after_audit", None): "before_commit", ("after_silver_merge", "soft"): "after_silver"}
CELLS = [
    pytest.param(point, mode, batch, id=f"{point}-{mode}-{name}")
    for point in CRASH_POINTS
    for mode in ("soft", "hard")
    for name, batch in CRASH_BATCHES.items()
    if (point, None) not in SAME_AS and (point, mode) not in SAME_AS
]


def test_matrix_covers_every_crash_point() -> None:
    """Every point of :data:`CRASH_POINTS` is in the matrix or has a cell of the same files; the
    Gold points are those of the Gold tables; :data:`COMMITS_BEFORE` knows every point."""
    covered = {cell.values[0] for cell in CELLS}
    assert covered | {point for point, mode in SAME_AS if mode is None} == set(CRASH_POINTS)
    assert set(SAME_AS.values()) <= covered
    assert {gold_point(spec.name) for spec in GOLD_TABLES} <= set(CRASH_POINTS)
    assert list(COMMITS_BEFORE) == list(CRASH_POINTS)
    assert len(CELLS) == 75


@pytest.mark.slow
@pytest.mark.parametrize(("point", "mode", "batch"), CELLS)
def test_crash_at_every_commit_point_then_restart(
    tmp_path: Path, reference: dict[str, dict[str, Any]], point: str, mode: str, batch: int
) -> None:
    lake = crash_lake(tmp_path, mode)
    crashed = run_cli(config_file(lake), crash=f"{point}@{batch}")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    assert_crashed_at(lake, point, batch)
    reports = lake.run()
    first = batch + (point == "after_commit")  # the crashed batch is re-run unless committed
    assert [r.batch_id for r in reports] == list(range(first, BATCHES))
    assert_same_lake(lake, reference[mode])
    assert lake.run() == []  # a second restart is a no-op: not a commit more
    assert (versions(lake), checkpoint_state(lake)) == (
        reference[mode]["versions"],
        reference[mode]["checkpoint"],
    )


def test_restart_by_the_cli_after_a_crash(
    tmp_path: Path, reference: dict[str, dict[str, Any]]
) -> None:
    """The restart as a user runs it: ``cdcflow run`` again, in a new process."""
    lake = crash_lake(tmp_path, "hard")
    config = config_file(lake)
    assert run_cli(config, crash="after_silver_merge@1").returncode == CRASH_EXIT_CODE
    restarted = run_cli(config)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "recovering micro-batch 1" in restarted.stdout
    assert_same_lake(lake, reference["hard"])
