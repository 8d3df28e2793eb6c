"""Crash matrix: kill the process at every commit point of a micro-batch, restart, verify.

The process is killed with ``os._exit`` at a point chosen by ``CDCFLOW_CRASH_AT`` (see
:mod:`cdcflow.state.faults`). After a restart the final state must equal the reference fold and
Bronze/quarantine/outcomes must hold each input record exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdcflow.state.faults import CRASH_EXIT_CODE, CRASH_POINTS
from tests.conftest import Lake, ev, full


def _cli(lake: Lake, config: Path, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    if crash:
        env["CDCFLOW_CRASH_AT"] = crash
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cdcflow",
            "run",
            "--config",
            str(config),
            "--trigger",
            "available-now",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _workload(lake: Lake) -> None:
    lake.write(
        [
            ev("E1", "C-1", "INSERT", "0/FFFFFF", minutes_ago=50, **full()),
            ev("E2", "C-2", "INSERT", "0/1000001", minutes_ago=49, **full(city="Lyon")),
            "{broken",
            ev("E3", "C-1", "UPDATE", "0/1000005", minutes_ago=40, email="n@x.com"),
        ]
    )
    lake.write(
        [
            ev("E5", "C-2", "DELETE", "1/0", minutes_ago=20),
            ev("E3", "C-1", "UPDATE", "0/1000005", minutes_ago=40, email="n@x.com"),
            ev("E4", "C-1", "UPDATE", "0/1000003", minutes_ago=45, city="Paris", status="inactive"),
            ev("E6", "C-3", "BOGUS", "1/1", minutes_ago=5),
        ]
    )
    lake.write([ev("E7", "C-2", "INSERT", "1/10", minutes_ago=3, status="ACTIVE")])


def _config(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(lake.config.model_dump(mode="json")))
    return path


def _check(lake: Lake, records: int, batches: int) -> None:
    assert lake.silver() == lake.expected().rows
    if lake.mode == "hard":
        tombs = lake.table("silver/customer_tombstones")
        assert dict(zip(tombs["customer_id"], tombs["_cdc_seq"], strict=True)) == (
            lake.expected().tombstones
        )
    bronze = lake.table("bronze/customer_events")
    quarantine = lake.table("quarantine/customer_events")
    positions = [
        *zip(bronze["source_file"], bronze["source_line"], strict=True),
        *zip(quarantine["source_file"], quarantine["source_line"], strict=True),
    ]
    assert len(positions) == len(set(positions)) == records
    outcomes = lake.table("audit/event_outcomes")
    assert outcomes.height == bronze.height
    assert sorted(lake.table("audit/batch_log")["batch_id"].to_list()) == list(range(batches))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_every_commit_point_then_restart(tmp_path: Path, point: str, mode: str) -> None:
    lake = Lake(tmp_path, mode=mode, max_files=1)
    config = _config(lake)
    _workload(lake)
    crashed = _cli(lake, config, crash=f"{point}@1")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    restarted = _cli(lake, config)
    assert restarted.returncode == 0, restarted.stderr
    _check(lake, records=9, batches=3)
    # a second restart is a no-op
    assert _cli(lake, config).returncode == 0
    _check(lake, records=9, batches=3)


def test_crash_in_first_batch_then_restart(tmp_path: Path) -> None:
    lake = Lake(tmp_path, max_files=1)
    config = _config(lake)
    _workload(lake)
    assert _cli(lake, config, crash="after_silver@0").returncode == CRASH_EXIT_CODE
    assert _cli(lake, config).returncode == 0
    _check(lake, records=9, batches=3)
