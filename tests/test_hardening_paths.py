"""A storage root with a space or a non-ASCII character (issue 11, item 3).

delta-rs reports the files of a table under such a root as percent-encoded URIs
(``/data/sp%20ace/...``); Polars' native Delta scan opened them literally and every run failed
from batch 0 with ``FileNotFoundError``. Each test runs under three kinds of names and compares
with a twin lakehouse under a plain root fed the same landing files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from deltalake import DeltaTable
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.config import SnowflakeSection
from cdcflow.engines.local import replay
from cdcflow.engines.local.delta import _scan_via_delta_rs, arrow_dataset, read_arrow, scan_table
from cdcflow.engines.local.gold import refresh_gold
from cdcflow.generator import GeneratorConfig, expected_outcome, generate
from cdcflow.layers.asof import customer_state_as_of, silver_at_version
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.plan.reference import SILVER_COLUMNS
from tests.conftest import Lake

ODD_NAMES = {"space": "sp ace", "umlaut": "ü", "cjk": "文件"}


@pytest.fixture(params=list(ODD_NAMES.values()), ids=list(ODD_NAMES))
def odd_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A folder whose name has a space, a non-ASCII letter or CJK characters."""
    folder = tmp_path / "data" / request.param
    folder.mkdir(parents=True)
    return folder


#: One folder name with every kind above (a space, a non-ASCII letter, CJK characters), for the
#: tests that run whole pipelines: a pipeline under it meets each kind of escaping at once, for
#: a third of the runs (the cheap scan test still takes each kind alone).
MIXED_NAME = " ".join(("sp", "ace", *list(ODD_NAMES.values())[1:]))


@pytest.fixture
def mixed_dir(tmp_path: Path) -> Path:
    """A folder whose name has a space, a non-ASCII letter and CJK characters."""
    folder = tmp_path / "data" / MIXED_NAME
    folder.mkdir(parents=True)
    return folder


def _twins(odd_dir: Path, plain_dir: Path, mode: str) -> tuple[Lake, Lake, list[str]]:
    """The same generated landing files run through a lake under ``odd_dir`` and a plain one."""
    odd = Lake(odd_dir, mode=mode, max_files=2)
    plain = Lake(plain_dir, mode=mode, max_files=2)
    cfg = GeneratorConfig(events=600, customers=60, files=5, seed=5)
    summary = generate(odd.landing, cfg)
    for path in odd.landing.iterdir():
        shutil.copy2(path, plain.landing / path.name)  # same names, same modification times
    assert len(odd.run()) == 3  # batches 1 and 2 read the Silver / Bronze written before them
    assert len(plain.run()) == 3
    return odd, plain, summary.lines


def _content(lake: Lake, name: str) -> pl.DataFrame:
    frame = lake.table(name)
    frame = frame.drop([c for c in frame.columns if c in ("source_file", "ingested_at")])
    frame = frame.drop([c for c in frame.columns if c.startswith("_cdc_") and "at" in c])
    return frame.sort(frame.columns, nulls_last=True)


def write_config(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    config = {
        "storage": {"root": lake.config.storage.root},
        "source": {"path": lake.config.source.path, "max_files_per_trigger": 2},
        "checkpoint": {"location": lake.config.checkpoint.location},
        "processing": {"delete_mode": lake.mode},
        "logging": {"level": "WARNING"},
    }
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def test_arrow_reads_of_a_local_table_use_the_native_file_system(odd_dir: Path) -> None:
    """PyArrow reads of a local table, even under an escaped root and with partition values
    that need escaping, go through Arrow's own local file system, not delta-rs' Python one (a
    scan over the Python one can abort the process at exit: apache/arrow#34314), and still read
    every row with its partition value."""
    import pyarrow as pa
    import pyarrow.fs as pa_fs
    from deltalake import write_deltalake

    uri = str(odd_dir / "t")
    data = pa.table({"k": ["a", "b", "c", "d"], "p": ["x y/z%", "q=r", "é", "x y/z%"]})
    write_deltalake(uri, data, partition_by=["p"])
    table = DeltaTable(uri)
    assert not isinstance(arrow_dataset(table).filesystem, pa_fs.PyFileSystem)
    rows = sorted(read_arrow(table).to_pylist(), key=lambda row: row["k"])
    assert rows == sorted(data.to_pylist(), key=lambda row: row["k"])


def test_scan_table_reads_files_under_an_escaped_root(odd_dir: Path) -> None:
    """The helper itself: the native scan of Polars fails on these URIs, the helper does not."""
    import pyarrow as pa
    from deltalake import write_deltalake

    uri = str(odd_dir / "t")
    data = pa.table({"k": ["a", "b", "c"], "day": ["2024-01-01", "2024-01-01", "2024-01-02"]})
    write_deltalake(uri, data, partition_by=["day"])
    table = DeltaTable(uri)
    assert "%" in table.file_uris()[0]  # what delta-rs reports
    assert scan_table(table).select("k").sort("k").collect()["k"].to_list() == ["a", "b", "c"]
    assert read_arrow(table, ["k"]).num_rows == 3
    # the object-store route (delta-rs resolves the URIs): projection, predicate, limit
    streamed = _scan_via_delta_rs(table)
    assert streamed.filter(pl.col("day") >= "2024-01-02").select("k").collect()["k"].to_list() == [
        "c"
    ]
    assert streamed.select(pl.len()).collect().item() == 3
    assert streamed.head(2).collect().height == 2
    # a plain root keeps Polars' native scan (no escape in the URI)
    plain = odd_dir.parent.parent / "plain" / "t"
    write_deltalake(str(plain), data, partition_by=["day"])
    assert scan_table(DeltaTable(str(plain))).collect().height == 3


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_pipeline_history_gold_replay_and_as_of(mixed_dir: Path, tmp_path: Path, mode: str) -> None:
    odd, plain, lines = _twins(mixed_dir, tmp_path / "plain", mode)
    # the whole pipeline: Silver equals the reference fold of the generated stream
    expected = expected_outcome(lines, mode)  # type: ignore[arg-type]
    assert odd.silver() == plain.silver()
    assert {k: {c: v[c] for c in ("city", "status")} for k, v in odd.silver().items()} == {
        k: {"city": v["city"], "status": v["status"]} for k, v in expected.state.rows.items()
    }
    # history and Gold (refreshed after every batch) equal the plain twin's
    for name in ("silver/customer_history", *(spec.name for spec in GOLD_TABLES)):
        assert _content(odd, name).equals(_content(plain, name)), name
    # a manual Gold refresh reads history through the helper too
    assert refresh_gold(odd.config)
    # replay --verify rebuilds the same Silver from Bronze
    result = replay.verify(odd.config, replay.rebuild_shadow(odd.config, bucket_rows=200))
    assert result.verified is True, result.to_json()
    # as-of: by instant (from history) and by Silver version (time travel)
    now = customer_state_as_of(odd.config, datetime.now(UTC))
    silver = odd.table("silver/customers").select(SILVER_COLUMNS).sort("customer_id")
    if mode == "hard":
        silver = silver.filter(~pl.col("is_deleted"))
    assert now.equals(silver)
    version = DeltaTable(odd.config.table_uri("silver/customers")).version()
    assert silver_at_version(odd.config, version).height == odd.table("silver/customers").height
    assert silver_at_version(odd.config, 1).height < silver.height or mode == "hard"


def test_cli_run_as_of_replay_gold_optimize(mixed_dir: Path) -> None:
    """The commands a user runs, with a config file under the odd folder."""
    lake = Lake(mixed_dir, max_files=2)
    generate(lake.landing, GeneratorConfig(events=300, customers=40, files=3, seed=3))
    config = str(write_config(lake))
    runner = CliRunner()

    def ok(*args: str) -> Any:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, (args, result.output, result.exception)
        return result

    ok("run", "--config", config)
    ok("run", "--config", config)  # nothing new: reads the checkpoint only
    version = str(DeltaTable(lake.config.table_uri("silver/customers")).version())
    out = ok("as-of", "--config", config, "--version", version, "--output", "json").output
    assert '"customer_id"' in out
    ok("as-of", "--config", config, "--timestamp", datetime.now(UTC).isoformat())
    ok("replay", "--config", config, "--verify")  # exit 1 when the states differ
    ok("gold", "--config", config)
    ok("optimize", "--config", config)
    ok("run", "--config", config)


# ----------------------------------------------------------------------------- Snowflake sync
@pytest.fixture(scope="module")
def emulator() -> Iterator[dict[str, Any]]:
    from cdcflow.sinks.snowflake.connection import start_emulator, stop_emulator

    kwargs = start_emulator(":memory:")
    yield kwargs
    stop_emulator()


def test_snowflake_sync_under_an_escaped_root(
    mixed_dir: Path, tmp_path: Path, emulator: dict[str, Any]
) -> None:
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    lake = Lake(mixed_dir, max_files=2)
    lake.config.snowflake = SnowflakeSection(
        database=f"PATHS_{abs(hash(str(mixed_dir))) % 10**8}",
        emulator="on",
        emulator_path=":memory:",
    )
    summary = generate(lake.landing, GeneratorConfig(events=300, customers=40, files=4, seed=9))
    first = sorted(lake.landing.iterdir())
    for path in first[2:]:  # two runs: the second sync is incremental (Change Data Feed)
        path.rename(tmp_path / path.name)
    lake.run()
    assert sync_snowflake(lake.config).dim.kind == "full"
    for path in first[2:]:
        (tmp_path / path.name).rename(path)
    lake.run()
    report = sync_snowflake(lake.config)
    assert report.dim.kind == "incremental"
    result = reconcile_snowflake(lake.config)
    assert result.equal, result.log_fields()
    assert result.dim.target_rows == len(expected_outcome(summary.lines).state.rows)


# The Spark engine under an escaped root: tests/test_spark_conformance.py
# test_interop_engines_take_turns (its mixed lakehouse lives under such a root).
