"""``cdcflow optimize`` rewrites files (compaction, Z-order, vacuum) but no table's content."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
import yaml
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.maintenance import optimize, optimize_between_runs
from cdcflow.errors import CheckpointError, ConfigError, TableError
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.layers.tables import ALL_TABLES
from tests import forkrun
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
    # a version the log still lists but whose files were vacuumed: one line that says so (was
    # Polars' own "No such file or directory" error with the file's path)
    from cdcflow.errors import TableError
    from cdcflow.layers.asof import silver_at_version

    with pytest.raises(TableError, match="version 3 can no longer be read: its data files"):
        silver_at_version(lake.config, 3)
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


# ------------------------------------------------ issue 11, item 8: optimize under a running run
def _config_file(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    data = json.loads(lake.config.model_dump_json(include={"storage", "source", "checkpoint"}))
    path.write_text(yaml.safe_dump({**data, "logging": {"level": "WARNING"}}))
    return path


def _hold_lock(location: str, seconds: float) -> subprocess.Popen[str]:
    """Another process holding the checkpoint lock for ``seconds`` (as a running pipeline does)."""
    code = (
        "import sys, time\n"
        "from cdcflow.state.checkpoint import Checkpoint\n"
        "with Checkpoint(sys.argv[1]).lock():\n"
        "    print('held', flush=True)\n"
        "    time.sleep(float(sys.argv[2]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, location, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    return forkrun.run(list(args), env, cwd, timeout=300)  # tests/forkrun.py: a warm fork


def test_optimize_takes_the_checkpoint_lock(tmp_path: Path) -> None:
    lake = Lake(tmp_path, max_files=1)
    _many_small_files(lake)
    before = _contents(lake)
    path = _config_file(lake)
    location = lake.config.checkpoint.location
    holder = _hold_lock(location, 60)
    try:
        with pytest.raises(CheckpointError, match="holds this checkpoint's lock"):
            optimize_between_runs(lake.config)
        refused = _cli("optimize", "--config", str(path), cwd=tmp_path)
        assert refused.returncode == 1
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert refused.stderr.startswith("error: ") and location in refused.stderr
        assert "--wait" in refused.stderr
        waited = _cli("optimize", "--config", str(path), "--wait", "300ms", cwd=tmp_path)
        assert waited.returncode == 1 and len(waited.stderr.splitlines()) == 1, waited.stderr
        assert "after waiting" in waited.stderr
    finally:
        holder.kill()
        holder.wait()
    # nothing was rewritten while the lock was held
    assert len(DeltaTable(lake.config.table_uri("silver/customers")).file_uris()) > 1
    # --wait: optimize waits for the run to end, then runs
    holder = _hold_lock(location, 1.5)
    try:
        ok = _cli("optimize", "--config", str(path), "--wait", "2m", cwd=tmp_path)
    finally:
        holder.wait()
    assert ok.returncode == 0, ok.stderr
    assert len(DeltaTable(lake.config.table_uri("silver/customers")).file_uris()) == 1
    after = _contents(lake)
    for name, frame in before.items():
        assert after[name].equals(frame), name


def test_conflicting_commit_is_retried_from_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer without the lock commits between optimize's read and its commit: retried."""
    import cdcflow.engines.local.maintenance as maintenance

    lake = Lake(tmp_path, max_files=1)
    _many_small_files(lake)
    before = _contents(lake)
    silver_uri = lake.config.table_uri("silver/customers")
    opened: list[int] = []

    def racing_open(uri: str, **kwargs: object) -> DeltaTable:
        table = DeltaTable(uri, **kwargs)  # type: ignore[arg-type]
        if uri == silver_uri:
            opened.append(table.version())
            if len(opened) == 1:  # a concurrent commit removes data this handle read
                DeltaTable(uri).delete("customer_id = 'C-5'")
        return table

    monkeypatch.setattr(maintenance, "DeltaTable", racing_open)
    done = {entry.table: entry for entry in optimize(lake.config, vacuum=False)}
    assert len(opened) == 2 and opened[1] == opened[0] + 1  # re-opened at the new version
    assert done["silver/customers"].action == "zorder"
    assert done["silver/customers"].version == opened[1] + 1
    after = _contents(lake)
    before["silver/customers"] = before["silver/customers"].filter(pl.col("customer_id") != "C-5")
    for name, frame in before.items():
        assert after[name].equals(frame), name


def test_conflict_that_persists_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cdcflow.engines.local.maintenance as maintenance
    from cdcflow.cli.app import main

    lake = Lake(tmp_path, max_files=1)
    _many_small_files(lake)
    path = _config_file(lake)
    message = (
        "Failed to commit transaction: Commit failed: a concurrent transaction deleted data this "
        "operation read.\nHelp: This transaction's query must be rerun to exclude the removed "
        "data.\nAlso, if you don't care to require this check to pass in the future, the "
        "isolation level\ncan be set to Snapshot Isolation.\n"
    )

    class Conflicting:
        def __init__(self, uri: str, **kwargs: object) -> None:
            self.table = DeltaTable(uri, **kwargs)  # type: ignore[arg-type]
            self.optimize = self

        def z_order(self, columns: list[str]) -> dict[str, object]:
            raise CommitFailedError(message)

        def compact(self) -> dict[str, object]:
            return self.table.optimize.compact()

        def __getattr__(self, name: str) -> object:
            return getattr(self.table, name)

    monkeypatch.setattr(maintenance, "DeltaTable", Conflicting)
    monkeypatch.setattr(maintenance.time, "sleep", lambda _: None)
    with pytest.raises(TableError, match=r"conflicted with a concurrent commit 4 times"):
        optimize(lake.config)
    monkeypatch.setattr(sys, "argv", ["cdcflow", "optimize", "--config", str(path)])
    capsys.readouterr()  # only what the command prints (its load() sets logging up on stderr)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("{")]  # JSON log lines
    assert len(lines) == 1, err
    assert lines[0].startswith("error: silver/customers: optimize (zorder) conflicted")
    assert "run optimize again" in lines[0]


def test_automatic_optimize_inside_a_run_needs_no_second_lock(tmp_path: Path) -> None:
    """``maintenance.optimize_every_batches`` optimizes from the run, which holds the lock."""
    lake = Lake(tmp_path, max_files=1)
    lake.config.maintenance.optimize_every_batches = 2
    for i in range(4):
        operation = "INSERT" if i < 2 else "UPDATE"
        lake.write([ev(f"E{i}", f"C-{i % 2}", operation, 10 + i, 5, **full())])
    assert len(lake.run()) == 4
    history = DeltaTable(lake.config.table_uri("silver/customers")).history()
    assert sum(entry.get("operation") == "OPTIMIZE" for entry in history) == 2
    assert lake.silver() == lake.expected().rows
