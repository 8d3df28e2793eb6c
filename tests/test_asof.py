"""Point-in-time reads: state as of an instant (history) and Silver time travel by version."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.errors import CdcflowError, TableError
from cdcflow.layers.asof import customer_state_as_of, silver_at_version
from tests.conftest import NOW, Lake, ev, full


def ago(minutes: float):
    return NOW - timedelta(minutes=minutes)


def _stream(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", 100, 50, **full(city="Rennes"))])
    lake.run()
    lake.write(
        [
            ev("E2", "C-1", "UPDATE", 200, 40, city="Nantes"),
            ev("E9", "C-2", "INSERT", 150, 45, **full()),
        ]
    )
    lake.run()
    lake.write([ev("E3", "C-1", "DELETE", 300, 30)])
    lake.run()


def test_state_before_and_after_update_and_delete(lake: Lake) -> None:
    _stream(lake)
    assert customer_state_as_of(lake.config, ago(55)).height == 0  # before the first INSERT
    at = {
        m: {r["customer_id"]: r for r in customer_state_as_of(lake.config, ago(m)).to_dicts()}
        for m in (50, 41, 40, 35, 30, 0)
    }
    assert at[50]["C-1"]["city"] == "Rennes" and "C-2" not in at[50]  # valid_from is inclusive
    assert at[41]["C-1"]["city"] == "Rennes" and at[41]["C-2"]["status"] == "ACTIVE"
    assert at[40]["C-1"]["city"] == "Nantes" and not at[40]["C-1"]["is_deleted"]
    assert at[35]["C-1"]["last_event_id"] == "E2"
    assert at[30]["C-1"]["is_deleted"] and at[30]["C-1"]["status"] == "DELETED"
    assert at[0] == lake.silver()  # now = Silver
    one = customer_state_as_of(lake.config, ago(41), customer_id="C-2")
    assert one["customer_id"].to_list() == ["C-2"]


def test_hard_mode_deleted_customer_has_no_state(hard_lake: Lake) -> None:
    _stream(hard_lake)
    before = customer_state_as_of(hard_lake.config, ago(31), "C-1")
    assert before["city"].to_list() == ["Nantes"]
    assert customer_state_as_of(hard_lake.config, ago(30), "C-1").height == 0
    assert customer_state_as_of(hard_lake.config, NOW)["customer_id"].to_list() == ["C-2"]


def test_silver_time_travel(lake: Lake) -> None:
    _stream(lake)
    versions = lake.table("audit/batch_log").sort("batch_id")["silver_version"].to_list()
    first = silver_at_version(lake.config, versions[0])
    assert first["customer_id"].to_list() == ["C-1"] and first["city"].to_list() == ["Rennes"]
    second = silver_at_version(lake.config, versions[1], customer_id="C-1")
    assert second["city"].to_list() == ["Nantes"] and not second["is_deleted"][0]
    with pytest.raises(TableError):
        silver_at_version(lake.config, versions[-1] + 50)


def _config_file(lake: Lake, tmp_path: Path) -> Path:
    path = tmp_path / "cdcflow.yaml"
    data = json.loads(lake.config.model_dump_json(include={"storage", "source", "checkpoint"}))
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_as_of(lake: Lake, tmp_path: Path) -> None:
    _stream(lake)
    config = _config_file(lake, tmp_path)
    runner = CliRunner()
    ts = ago(41).isoformat().replace("+00:00", "Z")
    result = runner.invoke(
        app,
        [
            "as-of",
            "--config",
            str(config),
            "--timestamp",
            ts,
            "--customer",
            "C-1",
            "--output",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["customer_id"], r["city"]) for r in rows] == [("C-1", "Rennes")]

    version = lake.table("audit/batch_log").sort("batch_id")["silver_version"][1]
    result = runner.invoke(app, ["as-of", "-c", str(config), "--version", str(version)])
    assert result.exit_code == 0, result.output
    assert "Nantes" in result.output and "C-2" in result.output

    result = runner.invoke(app, ["as-of", "-c", str(config)])  # neither --timestamp nor --version
    assert result.exit_code != 0 and isinstance(result.exception, CdcflowError)


def test_a_declared_key_is_found_in_any_form_a_record_gives_it(tmp_path: Path) -> None:
    """``as-of --key``: a date key as ISO text or as epoch days, a timestamp key as ISO text or
    epoch milliseconds — the forms a record's key may take (found by an attack: only the text
    forms were accepted)."""
    from cdcflow.config import load_config
    from cdcflow.pipeline import Pipeline, Trigger

    table = {
        "name": "rates",
        "keys": ["day", "at"],
        "columns": [
            {"name": "day", "type": "date"},
            {"name": "at", "type": "timestamp"},
            {"name": "rate", "type": "integer"},
        ],
    }
    raw = {
        "storage": {"root": str(tmp_path / "lake")},
        "source": {"path": str(tmp_path / "landing")},
        "checkpoint": {"location": str(tmp_path / "lake" / "_checkpoints" / "rates")},
        "tables": [table],
    }
    config = tmp_path / "cdcflow.yaml"
    config.write_text(yaml.safe_dump(raw))
    (tmp_path / "landing").mkdir()
    record = {
        "event_id": "r1",
        "operation": "INSERT",
        "event_timestamp": (NOW - timedelta(minutes=5)).isoformat(),
        "metadata": {"lsn": 1, "source_table": "rates"},
        "day": 19000,  # epoch days: 2022-01-08
        "at": 1_641_600_000_000,  # epoch milliseconds: 2022-01-08T00:00:00Z
        "rate": 7,
    }
    (tmp_path / "landing" / "0001.jsonl").write_text(json.dumps(record) + "\n")
    assert len(Pipeline(load_config(config)).run(Trigger.parse("available-now"))) == 1
    runner = CliRunner()
    for day, at in (
        ("19000", "1641600000000"),
        ("2022-01-08", "2022-01-08T00:00:00Z"),
        ("2022-01-08", "1641600000000"),
    ):
        result = runner.invoke(
            app,
            ["as-of", "-c", str(config), "--version", "1", "--table", "rates", "--key",
             f"day={day}", "--key", f"at={at}", "--output", "json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert [r["rate"] for r in json.loads(result.output)] == [7], (day, at)
    twice = runner.invoke(
        app, ["as-of", "-c", str(config), "--version", "1", "--table", "rates", "--key", "day=1",
              "--key", "day=2"],
    )  # fmt: skip
    assert twice.exit_code != 0 and "day given twice" in str(twice.exception)
    wrong = runner.invoke(
        app, ["as-of", "-c", str(config), "--version", "1", "--table", "rates", "--key", "day=x"]
    )
    assert wrong.exit_code != 0 and "day is not a value of type date" in str(wrong.exception)
