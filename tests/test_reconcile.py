"""Reconciliation: Silver vs an expected state / a source snapshot, via the CLI (exit codes)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.generator import GeneratorConfig, expected_outcome, generate
from cdcflow.plan.reference import SILVER_COLUMNS
from cdcflow.reconcile import (
    ReconcileError,
    frame_from_reference,
    read_state_file,
    reconcile_snapshot,
    reconcile_state,
    write_state_file,
)
from tests.conftest import Lake

runner = CliRunner()


def write_config(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    config = {
        "storage": {"root": lake.config.storage.root},
        "source": {"path": lake.config.source.path, "max_files_per_trigger": 2},
        "checkpoint": {"location": lake.config.checkpoint.location},
        "processing": {"delete_mode": lake.mode},
        "logging": {"level": "WARNING"},
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Lake, pl.DataFrame, Path]:
    """A lake that ran 1,500 generated events, with the expected state as a frame."""
    lake = Lake(tmp_path_factory.mktemp("reconcile"), max_files=2)
    summary = generate(lake.landing, GeneratorConfig(events=1500, customers=150, files=6, seed=7))
    expected = frame_from_reference(expected_outcome(summary.lines).state)
    lake.run()
    return lake, expected, write_config(lake)


def invoke(config: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["reconcile", "--config", str(config), *args, "--output", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_streamed_silver_matches_expected_file(streamed, tmp_path: Path, suffix: str) -> None:
    _, expected, config = streamed
    path = write_state_file(expected, tmp_path / f"expected{suffix}")
    code, report = invoke(config, "--expected", str(path))
    assert code == 0
    assert report["ok"] is True
    assert report["expected_counts"] == report["actual_counts"]
    assert report["expected_counts"]["rows"] == expected.height
    assert report["matched_rows"] == expected.height
    assert report["columns"] == list(SILVER_COLUMNS[1:])


def test_corrupted_row_and_missing_key_exit_1(streamed, tmp_path: Path) -> None:
    _, expected, config = streamed
    keys = expected["customer_id"].to_list()
    corrupted_key, missing_key = keys[3], keys[7]
    # the expected side says something else for one row, and has one key Silver lacks
    bad = expected.with_columns(
        pl.when(pl.col("customer_id") == corrupted_key)
        .then(pl.lit("Atlantis"))
        .otherwise(pl.col("city"))
        .alias("city")
    )
    ghost = bad.filter(pl.col("customer_id") == missing_key).with_columns(
        pl.lit("C-999999999").alias("customer_id")
    )
    path = write_state_file(pl.concat([bad, ghost]), tmp_path / "expected.parquet")
    code, report = invoke(config, "--expected", str(path))
    assert code == 1
    assert report["ok"] is False
    assert report["missing_keys"] == 1
    assert report["missing_sample"] == ["C-999999999"]
    assert report["extra_keys"] == 0
    assert report["field_differences"] == {"city": 1}
    assert report["rows_with_differences"] == 1
    assert report["hash_mismatches"] == 1
    assert report["difference_sample"][0]["customer_id"] == corrupted_key
    assert report["difference_sample"][0]["expected"] == "Atlantis"


def test_extra_key_and_masked_pii(streamed) -> None:
    _, expected, _ = streamed
    actual = expected.with_columns(
        pl.when(pl.col("customer_id") == expected["customer_id"][0])
        .then(pl.lit("someone@else.example"))
        .otherwise(pl.col("email"))
        .alias("email")
    )
    report = reconcile_state(actual, expected.slice(1))
    assert not report.ok
    assert report.extra_keys == 1
    assert report.missing_keys == 0
    assert report.rows_with_differences == 0  # the changed row is the extra one
    report = reconcile_state(actual, expected)
    assert report.field_differences == {"email": 1}
    assert report.difference_sample[0].actual == "<masked>"


def test_source_snapshot(streamed, tmp_path: Path) -> None:
    _, expected, config = streamed
    live = expected.filter(~pl.col("is_deleted")).select("customer_id", "city", "status")
    path = tmp_path / "snapshot.csv"
    live.write_csv(path)
    code, report = invoke(config, "--source-snapshot", str(path))
    assert code == 0, report
    assert report["expected_counts"]["rows"] == live.height
    # a customer the source deleted but Silver still shows is an extra key
    dropped = live.slice(1)
    dropped.write_csv(path)
    code, report = invoke(config, "--source-snapshot", str(path))
    assert code == 1
    assert report["extra_keys"] == 1
    assert report["extra_sample"] == [live["customer_id"][0]]


def test_snapshot_counts_and_state_file_roundtrip(streamed, tmp_path: Path) -> None:
    _, expected, _ = streamed
    for suffix in (".csv", ".jsonl", ".parquet"):
        back = read_state_file(write_state_file(expected, tmp_path / f"s{suffix}"))
        assert back.select(SILVER_COLUMNS).equals(expected)
    snapshot = expected.filter(~pl.col("is_deleted")).select("customer_id", "status")
    report = reconcile_snapshot(expected, snapshot)
    assert report.ok
    assert report.actual_counts.active == report.expected_counts.active


def test_usage_errors(streamed, tmp_path: Path) -> None:
    _, _, config = streamed
    result = runner.invoke(app, ["reconcile", "--config", str(config)])
    assert result.exit_code != 0
    assert "exactly one of" in str(result.exception)
    missing = runner.invoke(
        app, ["reconcile", "--config", str(config), "--expected", str(tmp_path / "nope.parquet")]
    )
    assert missing.exit_code != 0
    assert "file not found" in str(missing.exception)


def test_an_expected_state_of_text_dates_is_read_or_named() -> None:
    """A declared table's expected state written from CSV (dates as text): ISO dates are read
    as dates; a value that is not one is a one-line error naming the file and the column,
    never the value (a trial got Polars' own "casting from string to date" error)."""
    from cdcflow.model.contracts import ColumnSpec, TableContract
    from cdcflow.reconcile import reconcile_table

    contract = TableContract(
        name="p",
        keys=("id",),
        columns=(ColumnSpec(name="id", type="integer"), ColumnSpec(name="launched", type="date")),
    )
    actual = pl.DataFrame({"id": [1, 2], "launched": [date(2024, 1, 2), date(2024, 3, 4)]})
    same = pl.DataFrame({"id": [1, 2], "launched": ["2024-01-02", "2024-03-04"]})
    assert reconcile_table(actual, same, contract, expected_label="exp/p.parquet").ok
    moved = pl.DataFrame({"id": [1, 2], "launched": ["2024-01-02", "2024-03-05"]})
    report = reconcile_table(actual, moved, contract, expected_label="exp/p.parquet")
    assert not report.ok and report.field_differences == {"launched": 1}
    wrong = pl.DataFrame({"id": [1, 2], "launched": ["2024-01-02", "Jan 3"]})
    with pytest.raises(ReconcileError) as caught:
        reconcile_table(actual, wrong, contract, expected_label="exp/p.parquet")
    assert str(caught.value) == (
        "exp/p.parquet: column 'launched' is String and does not convert to the table's type "
        "Date (write it as that type)"
    )
