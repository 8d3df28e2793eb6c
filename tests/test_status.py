"""``cdcflow status`` as an on-call engineer uses it: running or stopped (the lock holder),
throughput of the latest micro-batches, end-to-end lag over the last hour, backlog,
quarantine reasons over the last 24 hours, and ``--check`` as a health check (exit 1 with the
reasons on stderr)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from cdcflow.config import load_config
from cdcflow.generator import GeneratorConfig, generate
from cdcflow.layers.status import pipeline_status
from tests.test_cli import CONFIG, cdcflow


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    generate(tmp_path / "landing", GeneratorConfig(events=300, customers=40, files=4, seed=3))
    return tmp_path


def _status(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cdcflow("status", "--config", "cdcflow.yaml", *args, cwd=workdir)


def _lake(workdir: Path, name: str) -> pl.DataFrame:
    return pl.read_delta(str(workdir / "lakehouse" / name))


def test_a_stopped_pipeline_its_flow_backlog_and_reasons(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = json.loads(_status(workdir, "--output", "json").stdout)
    assert before["batches"] == 0 and not before["running"]
    sizes = sorted(p.stat().st_size for p in (workdir / "landing").glob("*.jsonl"))
    assert before["backlog"] == {
        "files": 4, "bytes": sum(sizes), "pending_batch": None,
        "source_records": None, "source_error": "",  # a Kafka source's consumer lag only
        "source_wal_bytes": None,  # a PostgreSQL source's slot lag only
        "folder_missing": False, "ignored_files": 0,
    }  # fmt: skip

    run = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "once", cwd=workdir)
    assert run.returncode == 0, run.stderr
    extra = workdir / "landing" / "late.jsonl"
    extra.write_text('{"event_id": "x"}\n')  # one more file, not taken yet
    found = json.loads(_status(workdir, "--output", "json", "--batches", "1").stdout)
    log = _lake(workdir, "audit/batch_log").row(0, named=True)
    assert found["running"] is False and found["lock_holder"] == ""
    assert found["backlog"] == {
        "files": 1, "bytes": extra.stat().st_size, "pending_batch": None,
        "source_records": None, "source_error": "", "source_wal_bytes": None,
        "folder_missing": False, "ignored_files": 0,
    }  # fmt: skip
    recent = found["recent"]
    assert recent["batches"] == 1 and recent["records"] == log["records_received"]
    assert recent["events"] == log["accepted"] - log["duplicates"]
    assert recent["records_per_s"] == pytest.approx(
        log["records_received"] / (log["duration_ms"] / 1000), rel=0.01
    )
    reasons = _lake(workdir, "quarantine/customer_events")["failure_reason"].value_counts()
    assert found["quarantine"]["customers"] == dict(reasons.iter_rows())
    assert sum(found["quarantine"]["customers"].values()) == log["quarantined"] > 0
    (lag,) = found["lag"]
    outcomes = _lake(workdir, "audit/event_outcomes").filter(pl.col("outcome") != "DUPLICATE")
    assert lag["table"] == "customers" and lag["events"] == outcomes.height
    # end-to-end = event time → Silver commit: at least the lag to the batch's start
    assert lag["max"] >= outcomes["lag_s"].max() and lag["p50"] <= lag["p95"] <= lag["max"]

    # windows end at `now`: a day later nothing is in the last hour or the last 24 hours
    monkeypatch.chdir(workdir)  # the config's paths are relative to the working folder
    later = pipeline_status(
        load_config(workdir / "cdcflow.yaml"), now=datetime.now(UTC) + timedelta(hours=25)
    )
    assert later.quarantine == {"customers": {}}
    assert [(x.events, x.p95) for x in later.lag] == [(0, None)]

    text = _status(workdir)
    assert text.returncode == 0, text.stderr  # without --check: exit 0 even when stopped
    assert "stopped" in text.stdout and "MALFORMED_JSON" in text.stdout
    assert "backlog: 1 landing file " in text.stdout
    for pii in ("@example.com", "Sharma"):
        assert pii not in text.stdout + text.stderr
    check = _status(workdir, "--check")
    assert check.returncode == 1
    assert check.stderr.strip() == "unhealthy: stopped: no run holds the checkpoint's lock"
    # a replay's batch_log row is no micro-batch: neither counted nor in the throughput
    replay = cdcflow("replay", "--config", "cdcflow.yaml", "--apply", cwd=workdir)
    assert replay.returncode == 0, replay.stderr
    assert _lake(workdir, "audit/batch_log")["kind"].to_list().count("replay") == 1
    after = json.loads(_status(workdir, "--output", "json").stdout)
    assert after["batches"] == 1 and after["recent"]["records"] == log["records_received"]


def test_check_while_running_and_after_a_kill(workdir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    command = [sys.executable, "-m", "cdcflow", "run", "--config", "cdcflow.yaml"]
    proc = subprocess.Popen(
        [*command, "--trigger", "processing-time=1s"],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        commits = workdir / "lakehouse" / "_checkpoints" / "customers" / "commits"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (commits / "1.json").exists():
            time.sleep(0.2)
        assert (commits / "1.json").exists()
        healthy = _status(workdir, "--check", "--max-lag", "1000d", "--output", "json")
        assert healthy.returncode == 0, healthy.stderr
        found = json.loads(healthy.stdout)
        assert found["running"] and found["lock_holder"].startswith(f"pid {proc.pid} on ")
        assert found["problems"] == [] and found["backlog"]["files"] == 0
        # the generator's events are hours old: a 1-minute threshold is exceeded
        behind = _status(workdir, "--check", "--max-lag", "1m")
        assert behind.returncode == 1
        assert behind.stderr.startswith("unhealthy: lag: customers p95 ")
        assert "above 60 s" in behind.stderr and "stopped" not in behind.stderr
        # the threshold from the config (status.max_lag); the flag overrides it
        (workdir / "strict.yaml").write_text(CONFIG + "status: {max_lag: 1m}\n")
        strict = cdcflow("status", "--config", "strict.yaml", "--check", cwd=workdir)
        assert strict.returncode == 1
        assert strict.stderr.startswith("unhealthy: lag: customers p95 ")
        assert "above 60 s" in strict.stderr
        relaxed = cdcflow(
            "status", "--config", "strict.yaml", "--check", "--max-lag", "1000d", cwd=workdir
        )
        assert relaxed.returncode == 0, relaxed.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # killed: its line stays in the lock file, but its process is gone
    assert (workdir / "lakehouse" / "_checkpoints" / "customers" / "lock").read_text().strip()
    after = _status(workdir, "--check", "--max-lag", "1000d")
    assert after.returncode == 1
    assert after.stderr.strip() == "unhealthy: stopped: no run holds the checkpoint's lock"


def test_bad_max_lag_is_a_usage_error(workdir: Path) -> None:
    bad = _status(workdir, "--max-lag", "soon")
    assert bad.returncode == 2
    assert "--max-lag" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_declared_tables_contracts_lag_and_reasons_per_table(tmp_path: Path) -> None:
    import shutil

    from tests.conftest import REPO

    shutil.copytree(REPO / "config", tmp_path / "config")
    config = "config/shop-generated.yaml"
    gen = cdcflow(
        "generate", "--config", config, "--events", "200", "--keys", "20",
        "--expected", "expected-shop", cwd=tmp_path,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    assert cdcflow("run", "--config", config, cwd=tmp_path).returncode == 0
    shown = cdcflow("status", "--config", config, "--output", "json", cwd=tmp_path)
    found = json.loads(shown.stdout)
    names = [t["table"] for t in found["tables"]]
    assert names and [s["table"] for s in found["schema"]] == names
    for state in found["schema"]:
        assert state["declared_version"] == state["recorded_version"] == 1
        assert state["change"] == "created"
    assert [x["table"] for x in found["lag"]] == names
    per_table = {t["table"]: t for t in found["tables"]}
    for table, reasons in found["quarantine"].items():
        assert sum(reasons.values()) == per_table[table]["quarantined"]


def test_a_missing_landing_folder_and_ignored_files_are_said(workdir: Path) -> None:
    """status names what a scheduled run would never report: a landing folder that does not
    exist (a wrong source.path) and files in it that are never read (another extension)."""
    (workdir / "landing" / "b.json").write_text("{}\n")
    (workdir / "landing" / "d.JSONL").write_text("{}\n")
    (workdir / "landing" / ".part").write_text("")  # hidden: a producer's temporary file
    found = json.loads(_status(workdir, "--output", "json").stdout)["backlog"]
    assert (found["files"], found["folder_missing"], found["ignored_files"]) == (4, False, 2)
    text = _status(workdir).stdout
    assert "2 other files in the landing folder ignored (only *.jsonl and *.jsonl.gz" in text
    (workdir / "landing").rename(workdir / "landin")
    gone = _status(workdir)
    assert json.loads(_status(workdir, "--output", "json").stdout)["backlog"]["folder_missing"]
    assert "the landing folder (source.path) does not exist" in gone.stdout
