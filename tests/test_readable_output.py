"""Readable results (issue 12): Gold percentages, `gold` / `as-of` at 100 columns and as JSON,
the `generate` summary and where it writes, realistic demo data, the demo's next commands,
`--debug` as a flag."""

from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.cli.tables import rows_table, wrap_header
from cdcflow.generator import GeneratorConfig, delivery_order, expected_outcome
from tests.conftest import NOW, Lake, ev, full

runner = CliRunner()
NARROW = {"COLUMNS": "100"}


def _config_file(lake: Lake, tmp_path: Path) -> Path:
    path = tmp_path / "cdcflow.yaml"
    data = json.loads(
        lake.config.model_dump_json(include={"storage", "source", "checkpoint", "processing"})
    )
    path.write_text(yaml.safe_dump(data))
    return path


def _widest(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _people(lake: Lake, n: int) -> None:
    """n customers with long names and e-mails, some deleted or suspended."""
    records: list[dict[str, Any]] = []
    for i in range(n):
        cid = f"C-{100 + i}"
        name = f"Alexandra Konstantinopoulou-{i}"
        attrs = full(customer_name=name, email=f"alexandra.konstantinopoulou{i}@example.org")
        records.append(ev(f"E{i}", cid, "INSERT", 100 + i, 90, **attrs))
        if i % 4 == 1:
            records.append(ev(f"D{i}", cid, "DELETE", 1000 + i, 30))
        if i % 4 == 2:
            records.append(ev(f"S{i}", cid, "UPDATE", 1000 + i, 30, status="SUSPENDED"))
    lake.write(records)
    lake.run()


# ---------------------------------------------------------------- as-of
def test_as_of_one_customer_is_vertical_within_100_columns(lake: Lake, tmp_path: Path) -> None:
    _people(lake, 12)
    config = _config_file(lake, tmp_path)
    ts = (NOW - timedelta(minutes=60)).isoformat().replace("+00:00", "Z")
    args = ["as-of", "-c", str(config), "--timestamp", ts, "--customer", "C-101"]
    result = runner.invoke(app, args, env=NARROW)
    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 100
    lines = result.stdout.splitlines()
    assert any("field" in line and "value" in line for line in lines)
    for name, value in (("customer_id", "C-101"), ("email", "alexandra.")):
        assert any(name in line and value in line for line in lines), (name, result.stdout)
    assert any("is_deleted" in line and "false" in line for line in lines)  # 60 min ago: alive

    result = runner.invoke(app, [*args, "--output", "json"], env=NARROW)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["customer_id"] == "C-101" and row["is_deleted"] is False
    assert datetime.fromisoformat(row["created_at"]).tzinfo is not None


def test_as_of_many_customers_fit_and_name_what_is_left_out(lake: Lake, tmp_path: Path) -> None:
    _people(lake, 12)
    config = _config_file(lake, tmp_path)
    result = runner.invoke(app, ["as-of", "-c", str(config), "--timestamp", "now"], env=NARROW)
    assert result.exit_code != 0  # not an instant: one-line error
    ts = NOW.isoformat()
    result = runner.invoke(app, ["as-of", "-c", str(config), "--timestamp", ts], env=NARROW)
    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 100
    text = " ".join(result.stdout.split())
    assert "(12 rows)" in text and "not shown at 100 columns:" in text
    assert "--output json shows every column" in text
    for cid in (f"C-{100 + i}" for i in range(12)):
        assert cid in result.stdout
    assert "SUSPENDED" in result.stdout  # status is among the first columns shown
    rows = json.loads(
        runner.invoke(
            app, ["as-of", "-c", str(config), "--timestamp", ts, "--output", "json"]
        ).output
    )
    assert len(rows) == 12 and len(rows[0]) == 15


def test_help_mentions_json_output() -> None:
    for command in ("as-of", "gold"):
        result = runner.invoke(app, [command, "--help"], env=NARROW)
        assert result.exit_code == 0
        assert "--output" in result.stdout and "json" in result.stdout, result.stdout


# ---------------------------------------------------------------- gold
def _two_days(lake: Lake) -> None:
    day0 = NOW - timedelta(days=1)

    def at(minutes: int) -> str:
        return (day0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")

    records = []
    for i, city in enumerate(["Paris", "Lyon", "Paris", "Tokyo", "Lagos", "Austin", "Paris"]):
        record = ev(f"E{i}", f"C-{i}", "INSERT", 10 + i, **full(city=city))
        record["event_timestamp"] = at(i)
        records.append(record)
    for i, (op, attrs) in enumerate([("DELETE", {}), ("UPDATE", {"status": "INACTIVE"})]):
        record = ev(f"L{i}", f"C-{i}", op, 100 + i, 0, **attrs)
        records.append(record)
    lake.write(records)
    lake.run()


def test_gold_command_percentages_fit_100_columns_and_json(lake: Lake, tmp_path: Path) -> None:
    _two_days(lake)
    config = _config_file(lake, tmp_path)
    result = runner.invoke(app, ["gold", "-c", str(config)], env=NARROW)
    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 100, result.stdout
    assert "share_pct" in result.stdout and "71.43" in result.stdout  # 5 of 7 active
    assert "not shown" not in result.stdout  # every Gold column fits at 100
    assert "gold/active_customers: 5 rows" in result.stdout

    result = runner.invoke(app, ["gold", "-c", str(config), "--output", "json"], env=NARROW)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["gold/active_customers"] == {"rows": 5}
    status = {r["status"]: r for r in doc["gold/status_distribution"]["data"]}
    assert status["ACTIVE"]["share_pct"] == 71.43 and status["DELETED"]["share_pct"] == 14.29
    daily = doc["gold/daily_customer_metrics"]["data"]
    assert [d["churn_pct"] for d in daily] == [None, 28.57]  # 2 of the 7 active at the start
    percents = [r["share_pct"] for r in status.values()] + [d["churn_pct"] for d in daily]
    assert all(p is None or (0 <= p <= 100 and round(p, 2) == p) for p in percents)
    assert all("churn_rate" not in d and "share" not in status["ACTIVE"] for d in daily)
    result = runner.invoke(app, ["gold", "-c", str(config), "--output", "yaml"])
    assert result.exit_code != 0


def test_rows_table_breaks_headers_then_leaves_out_columns() -> None:
    console = Console(width=200, file=open(os.devnull, "w"))  # noqa: SIM115
    rows = [
        {
            "date": "2025-01-01",
            "new_registrations": 1000,
            "deletions": 547,
            "deactivations": 245,
            "reactivations": 72,
            "active_at_end_of_day": 596,
            "churn_pct": 21.14,
        }
    ] * 2
    table = rows_table(console, "daily", rows, 100)
    headers = [str(c.header) for c in table.columns]
    assert headers[1] == "new_\nregistrations" and headers[5].startswith("active_")
    assert table.caption is None
    narrow = rows_table(console, "daily", rows, 60)
    assert narrow.caption is not None and "churn_pct" in str(narrow.caption)
    assert len(narrow.columns) < 7
    one = rows_table(console, "one", rows[:1], 60)
    assert [c.header for c in one.columns] == ["field", "value"] and one.row_count == 7
    assert wrap_header("active_at_end_of_day", 10) == "active_at_\nend_of_day"
    assert wrap_header("date", 2) == "date"


# ---------------------------------------------------------------- generate
def test_generate_writes_only_where_asked_and_prints_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    landing, expected = tmp_path / "landing", tmp_path / "out" / "state.parquet"
    args = ["generate", "--out", str(landing), "--events", "400", "--customers", "40"]
    result = runner.invoke(app, [*args, "--expected", str(expected)], env=NARROW)
    assert result.exit_code == 0, result.output
    assert list(cwd.iterdir()) == []  # nothing in the current folder
    assert sorted(p.name for p in expected.parent.iterdir()) == [
        "state.counts.json",
        "state.parquet",
    ]
    assert _widest(result.stdout) <= 100
    assert "{" not in result.stdout and "'rows'" not in result.stdout  # no Python dict
    text = " ".join(result.stdout.split())
    # the value column, its folded lines joined: both files written are named in full
    values = "".join(
        line.split("│")[2].strip() for line in result.stdout.splitlines() if line.count("│") == 3
    )
    assert str(expected) in values and str(expected.with_name("state.counts.json")) in values
    counts = json.loads(expected.with_name("state.counts.json").read_text())
    assert f"{counts['silver']['rows']} ({counts['silver']['active']} active" in text
    assert "expected quarantined" in text

    counts_file = tmp_path / "elsewhere" / "counts.json"
    more = ["--expected", str(tmp_path / "b.csv"), "--expected-counts", str(counts_file)]
    result = runner.invoke(app, [*args[:2], str(tmp_path / "landing2"), *args[3:], *more])
    assert result.exit_code == 0, result.output
    assert counts_file.exists() and not (tmp_path / "b.counts.json").exists()
    assert list(cwd.iterdir()) == []


# ---------------------------------------------------------------- generated data
PLACEHOLDERS = ("conflicting", "nowhere", "newdomain", "placeholder", "dummy", "lorem", "xxx")


def test_generated_data_has_realistic_values_and_the_same_statistics() -> None:
    from cdcflow.generator import _PLACES

    now = datetime(2025, 5, 12, 12, tzinfo=UTC)
    cfg = GeneratorConfig(events=10_000, customers=1000, seed=42, now=now)
    lines = delivery_order(cfg, random.Random(cfg.seed), now)
    lowered = "\n".join(lines).lower()
    assert not [word for word in PLACEHOLDERS if word in lowered]
    places = set(_PLACES)
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the truncated-JSON invalid records
    for record in records:
        if record.get("city") is not None:
            assert (record["city"], record.get("country")) in places or "country" not in record
        if record.get("email"):
            assert record["email"].rsplit("@", 1)[1] in (
                "example.com",
                "example.net",
                "example.org",
            )
    # conflicting copies still exist and are quarantined as such
    outcome = expected_outcome(lines, processing_time=now)
    assert outcome.quarantine["DUPLICATE_EVENT_CONFLICT"] > 0
    assert outcome.records == 10_000 + 500 + 100
    geo = Counter((r["city"], r["country"]) for r in outcome.state.rows.values() if r["is_active"])
    assert set(geo) <= places


# ---------------------------------------------------------------- demo hint, --debug
def test_program_is_pasteable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdcflow.cli import demo

    script = tmp_path / "venv dir" / "bin" / "cdcflow"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    assert demo.program() == "'venv dir/bin/cdcflow'"
    monkeypatch.chdir(script.parent)
    assert demo.program() == "./cdcflow"
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "x" / "__main__.py"), "demo"])
    assert demo.program().endswith(" -m cdcflow")


def test_debug_is_a_flag_in_help() -> None:
    result = runner.invoke(app, ["--help"], env=NARROW)
    assert result.exit_code == 0
    (line,) = [line for line in result.stdout.splitlines() if "--debug" in line]
    assert "<bool>" not in line and "Show tracebacks" in line


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _commands(sub, (*path, name))
    return found


def test_every_help_shows_flags_as_flags_and_paragraphs_unbroken() -> None:
    import typer.main

    root = typer.main.get_command(app)
    paths = _commands(root)
    assert ("sync", "snowflake") in paths and ("replay",) in paths
    for path in paths:
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        # a docstring's line breaks are gone: each paragraph is one line, wrapped by the help
        assert all("\n" not in p for p in (command.help or "").split("\n\n")), path
        result = runner.invoke(app, [*path, "--help"], env=NARROW)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.stdout, (path, result.stdout)
        assert "--help" in result.stdout
    replay = runner.invoke(app, ["replay", "--help"], env=NARROW).stdout
    (verify,) = [line for line in replay.splitlines() if line.startswith("│    --verify")]
    assert "Compare the rebuilt state" in verify  # the flag's help still shown beside it


# ---------------------------------------------------------------- Snowflake
def test_agg_table_of_an_earlier_schema_is_recreated(tmp_path: Path) -> None:
    from cdcflow.config import SnowflakeSection
    from cdcflow.sinks.snowflake.connection import connect
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    lake = Lake(tmp_path / "lake")
    lake.config.snowflake = SnowflakeSection(
        database="TEST_READABLE", emulator="on", emulator_path=":memory:"
    )
    _two_days(lake)
    sync_snowflake(lake.config)
    with connect(lake.config) as conn:  # as an earlier release created it
        conn.cursor().execute(
            "CREATE OR REPLACE TABLE AGG_STATUS_DISTRIBUTION "
            "(STATUS VARCHAR, CUSTOMERS NUMBER(38,0), SHARE FLOAT)"
        )
    report = sync_snowflake(lake.config)
    kinds = {t.target: t.kind for t in report.tables}
    assert kinds["AGG_STATUS_DISTRIBUTION"] == "full" and kinds["AGG_CUSTOMER_METRICS"] == "noop"
    assert reconcile_snowflake(lake.config).equal
    with connect(lake.config) as conn:
        got = conn.cursor().execute(
            "SELECT SHARE_PCT FROM AGG_STATUS_DISTRIBUTION WHERE STATUS = 'ACTIVE'"
        )
        assert got.fetchone() == (71.43,)
