"""The ``cdcflow`` command as a user runs it: generate, run with each trigger, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest


def cdcflow(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "cdcflow", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


CONFIG = """
pipeline: {name: customers, engine: local}
storage: {root: ./lakehouse}
source: {type: files, format: flat, path: ./landing, max_files_per_trigger: 3}
checkpoint: {location: ./lakehouse/_checkpoints/customers}
processing: {delete_mode: soft}
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    return tmp_path


def test_generate_then_run_once_and_available_now(workdir: Path) -> None:
    gen = cdcflow("generate", "--out", "landing", "--events", "400", "--files", "5", cwd=workdir)
    assert gen.returncode == 0, gen.stderr
    assert len(list((workdir / "landing").glob("*.jsonl"))) == 5
    once = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "once", cwd=workdir)
    assert once.returncode == 0, once.stderr
    log = pl.read_delta(str(workdir / "lakehouse" / "audit" / "batch_log"))
    assert log["files"].to_list() == [5]  # once: everything in one micro-batch
    assert '"micro-batch committed"' in once.stderr  # JSON log line
    for pii in ("@example.com", "Sharma"):
        assert pii not in once.stderr and pii not in once.stdout
    more = cdcflow(
        "generate",
        "--out",
        "landing",
        "--events",
        "400",
        "--files",
        "7",
        "--seed",
        "7",
        cwd=workdir,
    )
    assert more.returncode == 0
    now = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "available-now", cwd=workdir)
    assert now.returncode == 0, now.stderr
    log = pl.read_delta(str(workdir / "lakehouse" / "audit" / "batch_log")).sort("batch_id")
    assert log["files"].to_list() == [5, 3, 3, 1]


def test_processing_time_stops_cleanly_on_sigterm(workdir: Path) -> None:
    assert (
        cdcflow(
            "generate", "--out", "landing", "--events", "100", "--files", "2", cwd=workdir
        ).returncode
        == 0
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cdcflow",
            "run",
            "--config",
            "cdcflow.yaml",
            "--trigger",
            "processing-time=1s",
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    commits = workdir / "lakehouse" / "_checkpoints" / "customers" / "commits"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (commits / "0.json").exists():
        time.sleep(0.2)
    assert (commits / "0.json").exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stop requested" in err


def test_errors_are_one_line_with_nonzero_exit(workdir: Path) -> None:
    (workdir / "bad.yaml").write_text("processing: {delete_mod: soft}\n")
    bad = cdcflow("run", "--config", "bad.yaml", cwd=workdir)
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and "processing.delete_mod" in bad.stderr and "bad.yaml" in bad.stderr
    assert "Traceback" not in bad.stderr
    debug = cdcflow("--debug", "run", "--config", "bad.yaml", cwd=workdir)
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    trigger = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "sometimes", cwd=workdir)
    assert trigger.returncode == 2 and "--trigger" in trigger.stderr
    missing = cdcflow("run", "--config", "nope.yaml", cwd=workdir)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
