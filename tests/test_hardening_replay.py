"""Hardening (issue 11, items 6 and 7): a crash-safe ``replay --apply`` and a guarded delete mode.

Item 6: ``replay --apply`` killed at every write (``CDCFLOW_CRASH_AT=replay_*``) and re-run ends
equal to an uninterrupted replay and to the reference fold; a ``run`` started after the kill
refuses (one line) instead of streaming onto half-replayed tables; a late low-sequence UPDATE of
a hard-deleted key is then blocked by its tombstone (no resurrection).

Item 7: Silver records its delete mode (``cdcflow.deleteMode``); a run in the other mode refuses
with one line naming ``cdcflow replay --apply``, which migrates Silver and the tombstones, after
which the stream continues and matches the reference fold of the new mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from deltalake import DeltaTable

import cdcflow.cli.app  # noqa: F401  (loads cdcflow.cli.replay the way the CLI does)
from cdcflow.cli.replay import run_replay
from cdcflow.engines.local import replay
from cdcflow.errors import ConfigError
from cdcflow.layers.tables import DELETE_MODE_PROPERTY
from cdcflow.pipeline import Pipeline
from cdcflow.state.faults import CRASH_EXIT_CODE, REPLAY_CRASH_POINTS
from tests import forkrun
from tests.conftest import Lake, ev, full, require_spark

SILVER = "silver/customers"
TOMBSTONES = "silver/customer_tombstones"


# ---------------------------------------------------------------- helpers
def _config_file(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(lake.config.model_dump(mode="json")))
    return path


def _cli(config: Path, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    if crash:
        env["CDCFLOW_CRASH_AT"] = crash
    # a child forked from the warm fork server of tests/forkrun.py (no second import of Polars)
    return forkrun.run([*args, "--config", str(config)], env, Path.cwd(), timeout=180)


def _error(proc: subprocess.CompletedProcess[str]) -> str:
    """The CLI's error message (stderr without the JSON log lines, unwrapped)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return " ".join(line.strip() for line in lines if not line.startswith("{"))


def _set_mode(lake: Lake, mode: str) -> None:
    lake.mode = mode
    lake.config.processing.delete_mode = mode  # type: ignore[assignment]


def _sorted(lake: Lake, name: str) -> list[dict[str, Any]]:
    return lake.table(name).sort("customer_id").to_dicts()


def _property(lake: Lake) -> str | None:
    return (
        DeltaTable(lake.config.table_uri(SILVER)).metadata().configuration.get(DELETE_MODE_PROPERTY)
    )


def _replay_rows(lake: Lake) -> int:
    return lake.table("audit/batch_log").filter(pl.col("kind") == "replay").height


def _check_reference(lake: Lake) -> None:
    """Silver (and, in hard mode, the tombstones) equal the reference fold of every event."""
    expected = lake.expected()
    assert lake.silver() == expected.rows
    tombs = lake.table(TOMBSTONES)
    assert dict(zip(tombs["customer_id"], tombs["_cdc_seq"], strict=True)) == (
        expected.tombstones if lake.mode == "hard" else {}
    )


def _workload(lake: Lake) -> None:
    lake.write(
        [
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full(city="Rennes")),
            ev("E2", "C-2", "INSERT", "0/11", minutes_ago=49, **full(city="Lyon")),
            ev("E3", "C-3", "INSERT", "0/12", minutes_ago=48, **full(city="Oslo")),
        ]
    )
    lake.write(
        [
            ev("E4", "C-2", "DELETE", "0/30", minutes_ago=30),
            ev("E5", "C-1", "UPDATE", "0/20", minutes_ago=40, city="Nantes"),
            ev("E6", "C-3", "DELETE", "0/40", minutes_ago=20),
        ]
    )


def _late_updates(lake: Lake) -> None:
    """Late UPDATEs under each DELETE's sequence, plus a new change for C-1."""
    lake.write(
        [
            ev("E7", "C-2", "UPDATE", "0/25", minutes_ago=35, city="Ghost"),
            ev("E8", "C-3", "UPDATE", "0/15", minutes_ago=45, city="Zombie"),
            ev("E9", "C-1", "UPDATE", "0/50", minutes_ago=1, city="Brest"),
        ]
    )


# ---------------------------------------------------------------- item 6
@pytest.mark.slow
@pytest.mark.parametrize("point", REPLAY_CRASH_POINTS)
def test_replay_apply_killed_at_each_point_then_rerun(tmp_path: Path, point: str) -> None:
    lake = Lake(tmp_path / "crash", mode="hard")
    _workload(lake)
    lake.run()
    # what replay --apply is for: damaged derived tables (tombstones lost, a wrong city)
    DeltaTable(lake.config.table_uri(TOMBSTONES)).delete()
    DeltaTable(lake.config.table_uri(SILVER)).update(
        updates={"city": "'Atlantis'"}, predicate="customer_id = 'C-1'"
    )
    config = _config_file(lake)
    # the same lakehouse, replayed without interruption
    shutil.copytree(tmp_path / "crash", tmp_path / "clean")
    clean = Lake(tmp_path / "clean", mode="hard")
    run_replay(clean.config, apply=True, show_progress=False)

    killed = _cli(config, "replay", "--apply", crash=point)
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr
    half_written = point not in ("replay_before_write", "replay_after_log")
    # a normal run does not stream onto a half-replayed lakehouse: it refuses in one line
    run = _cli(config, "run", "--trigger", "available-now")
    if half_written:
        assert run.returncode == 1, run.stderr
        assert "replay --apply" in _error(run) and "Traceback" not in run.stderr
        with pytest.raises(replay.ReplayError) as refused:
            Pipeline(lake.config)
        assert "\n" not in str(refused.value)
    else:
        assert run.returncode == 0, run.stderr

    rerun = _cli(config, "replay", "--apply")
    assert rerun.returncode == 0, rerun.stderr
    assert _sorted(lake, SILVER) == _sorted(clean, SILVER)
    assert _sorted(lake, TOMBSTONES) == _sorted(clean, TOMBSTONES)
    assert _property(lake) == _property(clean) == "hard"
    # one replay row, written once; after a kill past it, the re-run is a second replay
    assert _replay_rows(lake) == (2 if point == "replay_after_log" else 1)
    assert replay.replay_progress(lake.config).unfinished is None
    _check_reference(lake)

    # a late low-sequence UPDATE of a hard-deleted key is blocked by the rebuilt tombstone
    _late_updates(lake)
    lake.run()
    assert "C-2" not in lake.silver() and "C-3" not in lake.silver()
    assert lake.outcomes()["E7"] == ["TOMBSTONED"]
    assert lake.silver()["C-1"]["city"] == "Brest"
    _check_reference(lake)


def test_unfinished_replay_is_taken_over_in_process(tmp_path: Path) -> None:
    """A replay that wrote Silver but not its batch_log row: runs refuse, the next apply
    takes over its id and logs it once."""
    lake = Lake(tmp_path, mode="hard")
    _workload(lake)
    lake.run()
    first = run_replay(lake.config, apply=True, show_progress=False)
    assert (first.replay_id, first.resumed) == (0, False)
    # simulate the kill after the Silver commit: the replay's tombstone and Silver writes of
    # replay 1 exist, its batch_log row does not
    result = replay.rebuild_shadow(lake.config)
    app = replay.replay_app_id(lake.config)
    from deltalake import CommitProperties, Transaction

    props = CommitProperties(app_transactions=[Transaction(app_id=app, version=1)])
    replay._overwrite_from_shadow(lake.config, replay.TOMBSTONES, props)
    replay._overwrite_from_shadow(lake.config, replay.SILVER, props)
    assert replay.replay_progress(lake.config).unfinished == 1
    with pytest.raises(replay.ReplayError, match="replay 1"):
        lake.run()
    replay.apply(lake.config, result)
    assert (result.replay_id, result.resumed) == (1, True)
    assert _replay_rows(lake) == 2
    lake.run()  # the stream continues
    nxt = run_replay(lake.config, apply=True, show_progress=False)
    assert (nxt.replay_id, nxt.resumed) == (2, False)


# ---------------------------------------------------------------- item 7
def test_delete_mode_is_recorded_when_silver_is_created(tmp_path: Path) -> None:
    lake = Lake(tmp_path, mode="hard")
    Pipeline(lake.config)
    assert _property(lake) == "hard"


@pytest.mark.parametrize(("old", "new"), [("soft", "hard"), ("hard", "soft")])
def test_switching_delete_mode_refuses_then_replay_migrates(
    tmp_path: Path, old: str, new: str
) -> None:
    lake = Lake(tmp_path, mode=old)
    _workload(lake)
    lake.run()
    assert _property(lake) == old
    silver_version = DeltaTable(lake.config.table_uri(SILVER)).version()

    _set_mode(lake, new)
    with pytest.raises(ConfigError) as refused:
        lake.run()
    message = str(refused.value)
    assert "\n" not in message and "replay --apply" in message and "delete_mode" in message
    config = _config_file(lake)
    run = _cli(config, "run", "--trigger", "available-now")
    assert run.returncode == 2 and "replay --apply" in _error(run), run.stderr
    assert DeltaTable(lake.config.table_uri(SILVER)).version() == silver_version  # untouched

    result = run_replay(lake.config, apply=True, show_progress=False)
    assert result.delete_mode == new
    assert _property(lake) == new
    _check_reference(lake)
    assert replay.verify(lake.config, replay.rebuild_shadow(lake.config)).verified is True

    _late_updates(lake)
    lake.run()  # the stream continues in the new mode
    _check_reference(lake)
    if new == "hard":
        assert "C-2" not in lake.silver()
    else:
        assert lake.silver()["C-2"]["is_deleted"] and lake.silver()["C-2"]["city"] == "Ghost"


def test_killed_mode_migration_refuses_until_the_replay_is_rerun(tmp_path: Path) -> None:
    """soft -> hard: a replay killed after Silver (before the tombstones existed in the old
    order) must not let a run resurrect a deleted key."""
    lake = Lake(tmp_path, mode="soft")
    _workload(lake)
    lake.run()
    _set_mode(lake, "hard")
    config = _config_file(lake)
    for point in ("replay_after_tombstones", "replay_after_silver", "replay_after_mode"):
        killed = _cli(config, "replay", "--apply", crash=point)
        assert killed.returncode == CRASH_EXIT_CODE, killed.stderr
        run = _cli(config, "run", "--trigger", "available-now")
        assert run.returncode == 1 and "replay --apply" in _error(run), run.stderr
    assert _cli(config, "replay", "--apply").returncode == 0
    assert _property(lake) == "hard" and _replay_rows(lake) == 1
    _late_updates(lake)
    lake.run()
    assert "C-2" not in lake.silver() and "C-3" not in lake.silver()
    _check_reference(lake)


@pytest.mark.parametrize(("built", "configured"), [("soft", "hard"), ("hard", "soft")])
def test_silver_without_the_property(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: str, configured: str
) -> None:
    """A Silver created before the property existed: its content tells the mode it was built
    in (soft-deleted rows / tombstones); the configured mode is recorded when it agrees."""
    lake = Lake(tmp_path, mode=built)
    _workload(lake)
    with monkeypatch.context() as patch:  # the engines of before: nothing recorded
        patch.setattr(replay, "check_lakehouse", lambda config: None)
        lake.run()
    assert _property(lake) is None
    _set_mode(lake, configured)
    with pytest.raises(ConfigError, match=f"built in '{built}' mode"):
        lake.run()
    assert _property(lake) is None
    _set_mode(lake, built)
    lake.run()
    assert _property(lake) == built


@pytest.mark.spark
def test_spark_engine_refuses_another_delete_mode(tmp_path: Path) -> None:
    require_spark()
    from cdcflow.engines.spark.engine import SparkEngine

    lake = Lake(tmp_path, mode="soft")
    _workload(lake)
    lake.run()
    lake.config.pipeline.engine = "spark"  # type: ignore[assignment]
    _set_mode(lake, "hard")
    with pytest.raises(ConfigError, match="replay --apply"):
        SparkEngine(lake.config)  # refused before the Spark session starts
    run_replay(lake.config, apply=True, show_progress=False)  # replay works for a Spark config
    assert _property(lake) == "hard"
    _late_updates(lake)
    lake.run()  # on Spark, in hard mode
    assert "C-2" not in lake.silver()
    _check_reference(lake)
