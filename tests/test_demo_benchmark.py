"""The 10,000-event benchmark reconciles 100%, through the demo; generator properties."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.cli.demo import STEPS
from cdcflow.generator import GeneratorConfig, delivery_order, generate

runner = CliRunner()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDCFLOW", "SNOWFLAKE"))}
    return subprocess.run(
        [sys.executable, "-m", "cdcflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_demo_10000_events_reconciles_100_percent(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    # a real process, as a user runs it (the Snowflake emulator lives for the process)
    result = _cli("demo", "--dir", str(folder), "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = json.loads(result.stdout[result.stdout.index("[\n") :])
    assert [s["step"] for s in steps] == [name for name, _ in STEPS]
    assert all(s["ok"] for s in steps)
    # the benchmark's promise, checked on the tables themselves
    counts = json.loads((folder / "expected" / "silver.counts.json").read_text())
    silver = pl.scan_delta(str(folder / "lakehouse" / "silver" / "customers")).collect()
    expected = pl.read_parquet(folder / "expected" / "silver.parquet")
    assert silver.height == counts["silver"]["rows"] == expected.height
    assert int(silver["is_active"].sum()) == counts["silver"]["active"]
    assert int(silver["is_deleted"].sum()) == counts["silver"]["deleted"]
    assert silver.select(expected.columns).sort("customer_id").equals(expected)
    bronze = pl.scan_delta(str(folder / "lakehouse" / "bronze" / "customer_events"))
    assert bronze.select(pl.len()).collect().item() == counts["accepted"]
    assert counts["records"] == 10_000 + 500 + 100
    # the declared tables' step: accounts evolved to v2 mid-stream (its v2 changes carry tier)
    accounts = pl.read_delta(str(folder / "shop" / "lakehouse" / "silver" / "accounts"))
    tiers = accounts["tier"]
    assert tiers.null_count() < accounts.height
    assert set(tiers.drop_nulls()) <= {"BRONZE", "SILVER", "GOLD"}
    # a second demo run starts from a fresh folder
    again = _cli("demo", "--dir", str(folder), "--events", "300")
    assert again.returncode == 0, again.stdout + again.stderr
    # its closing hint: commands that are none of its steps, each working as pasted
    lines = again.stdout.splitlines()
    hints = [line.strip() for line in lines[lines.index("next, from this folder:") + 1 :]]
    assert len(hints) == 6 and all(" -m cdcflow " in h for h in hints), hints
    assert [h.split(" -m cdcflow ")[1].split()[0] for h in hints] == [
        "status",
        "report",
        "as-of",
        "as-of",
        "optimize",
        "validate",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDCFLOW", "SNOWFLAKE"))}
    for hint in hints:
        pasted = subprocess.run(
            hint, shell=True, env=env, capture_output=True, text=True, timeout=300
        )
        assert pasted.returncode == 0, (hint, pasted.stdout, pasted.stderr)
        if "as-of" in hint:
            assert "customer_id" in pasted.stdout and "(1 row)" in pasted.stdout
        if " status " in hint:
            assert "stopped" in pasted.stdout and "micro-batch" in pasted.stdout
        if " report " in hint:  # the report beside the demo's config, with its plots
            assert "(7 plots, " in pasted.stdout and (folder / "report.html").stat().st_size
        if "validate" in hint:  # the declared tables' step: both tables, no violation
            assert "accounts" in pasted.stdout and "order_lines" in pasted.stdout


def test_demo_refuses_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = runner.invoke(app, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code != 0
    assert (tmp_path / "precious.txt").exists()


def test_generator_is_deterministic_and_delivers_copies_after_originals(tmp_path: Path) -> None:
    now = datetime(2025, 5, 12, 12, 0, tzinfo=UTC)
    cfg = GeneratorConfig(events=3000, customers=200, seed=3, now=now)
    first = delivery_order(cfg, random.Random(cfg.seed), now)
    assert first == delivery_order(cfg, random.Random(cfg.seed), now)
    assert len(first) == 3000 + int(3000 * cfg.duplicate_rate) + int(3000 * cfg.invalid_rate)
    # a copy is a later delivery of a valid change: the change's own slot comes first, so the
    # first occurrence of a repeated line is where the change sits among its neighbours
    positions: dict[str, list[int]] = {}
    for index, line in enumerate(first):
        positions.setdefault(line, []).append(index)
    repeated = {line: where for line, where in positions.items() if len(where) > 1}
    assert sum(len(w) - 1 for w in repeated.values()) == int(3000 * cfg.duplicate_rate)
    assert all(json.loads(line)["event_id"].startswith("EVT") for line in repeated)
    gaps = [later - where[0] for where in repeated.values() for later in where[1:]]
    assert min(gaps) >= 1 and sorted(gaps)[len(gaps) // 2] > 25  # mostly far, not adjacent
    # the originals (first occurrences of changes) follow commit order except out-of-order and
    # late ones: mostly ascending event ids, not all
    ids = [
        json.loads(line)["event_id"] for line in positions if line.startswith('{"event_id": "EVT')
    ]
    ascending = sum(a < b for a, b in itertools.pairwise(ids))
    assert len(ids) // 2 < ascending < len(ids) - 1


def test_generate_cli_writes_expected_state_and_counts(tmp_path: Path) -> None:
    landing, expected = tmp_path / "landing", tmp_path / "out" / "expected.jsonl"
    args = ["generate", "--out", str(landing), "--events", "500", "--customers", "50"]
    result = runner.invoke(app, [*args, "--expected", str(expected), "--delete-mode", "hard"])
    assert result.exit_code == 0, result.output
    counts = json.loads((tmp_path / "out" / "expected.counts.json").read_text())
    assert counts["delete_mode"] == "hard"
    assert counts["records"] == 500 + 25 + 5
    assert counts["quarantined"] == sum(counts["quarantine"].values()) > 0
    assert counts["records"] == counts["accepted"] + counts["quarantined"]
    rows = expected.read_text().splitlines()
    assert len(rows) == counts["silver"]["rows"]
    assert counts["silver"]["deleted"] == 0  # hard mode: deleted customers are absent
    more = generate(tmp_path / "more", GeneratorConfig(events=50, files=4))
    assert len(more.files) == 4
    assert sum(len(Path(f).read_text().splitlines()) for f in more.files) == more.records
