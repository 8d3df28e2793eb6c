"""``cdcflow optimize`` rewrites files (compaction, Z-order, vacuum) but no table's content."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
import yaml
from deltalake import DeltaTable
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.maintenance import optimize
from cdcflow.errors import ConfigError
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.layers.tables import ALL_TABLES
from tests.conftest import Lake, ev, full


def _contents(lake: Lake) -> dict[str, pl.DataFrame]:
    out = {}
    for spec in (*ALL_TABLES, *GOLD_TABLES):
        frame = lake.table(spec.name)
        out[spec.name] = frame.sort(frame.columns, nulls_last=True)
    return out


def _many_small_files(lake: Lake) -> None:
    for i in range(6):
        lake.write(
            [
                ev(f"E{i}a", f"C-{i}", "INSERT", 100 + i, 50 - i, **full(city=f"City{i % 3}")),
                ev(f"E{i}b", f"C-{i % 2}", "UPDATE", 200 + i, 40 - i, status="SUSPENDED"),
            ]
        )
    lake.run()


def test_optimize_keeps_every_table_content(tmp_path: Path) -> None:
    lake = Lake(tmp_path, max_files=1)
    lake.config.maintenance.time_travel_window = timedelta(0)
    lake.config.maintenance.vacuum_retention = timedelta(0)
    _many_small_files(lake)
    before = _contents(lake)
    silver_files = len(DeltaTable(lake.config.table_uri("silver/customers")).file_uris())
    assert silver_files > 1
    done = {entry.table: entry for entry in optimize(lake.config)}
    assert done["silver/customers"].action == "zorder"
    assert done["silver/customers"].files_removed == silver_files
    assert len(DeltaTable(lake.config.table_uri("silver/customers")).file_uris()) == 1
    assert done["bronze/customer_events"].files_removed > 1
    assert done["silver/customers"].files_vacuumed > 0  # retention 0: old files are gone
    after = _contents(lake)
    for name, frame in before.items():
        assert after[name].equals(frame), name
    # the pipeline goes on after maintenance
    lake.write([ev("E99", "C-0", "UPDATE", 999, 1, city="Lyon")])
    lake.run()
    assert lake.silver() == lake.expected().rows


def test_vacuum_retention_never_below_time_travel_window(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="time_travel_window"):
        CdcflowConfig(maintenance={"time_travel_window": "7d", "vacuum_retention": "1d"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"maintenance": {"vacuum_retention": "2h"}}))
    with pytest.raises(ConfigError, match=r"maintenance\.vacuum_retention"):
        load_config(path)


def test_cli_optimize_and_gold(tmp_path: Path) -> None:
    lake = Lake(tmp_path, max_files=1)
    _many_small_files(lake)
    before = _contents(lake)
    path = tmp_path / "cdcflow.yaml"
    data = json.loads(lake.config.model_dump_json(include={"storage", "source", "checkpoint"}))
    path.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    result = runner.invoke(app, ["optimize", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "zorder" in result.output
    result = runner.invoke(app, ["gold", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "gold/status_distribution" in result.output
    after = _contents(lake)
    for name, frame in before.items():
        assert after[name].equals(frame), name
