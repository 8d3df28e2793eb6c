"""The Snowflake sync from Spark: the rows computed by Spark and written as Parquet files by its
executors, the sync process only staging (``PUT``) and loading (``COPY INTO``) those files
(:mod:`cdcflow.engines.spark.snowflake`), against the fakesnow emulator.

Every sync here runs with the reads of the local route forbidden (:func:`no_driver_reads`): a
sync that read Silver or Gold through delta-rs in the driver would fail the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdcflow.config import SnowflakeSection
from cdcflow.engines.spark.snowflake import SparkSyncFiles
from cdcflow.sinks.snowflake import sync as sync_module
from cdcflow.sinks.snowflake.faults import BULK_POINTS, SYNC_POINTS, InjectedSyncFailure
from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
from cdcflow.sinks.snowflake.sync import sync_snowflake
from tests.conftest import Lake
from tests.test_snowflake import _db_numbers, dim_rows, first_batch, second_batch, state_version

pytestmark = pytest.mark.spark

#: What the local route reads or loads in the process running the sync
DRIVER_READS = (
    "read_changes",
    "read_snapshot",
    "snapshot_chunks",
    "read_arrow",
    "_load_stage",
    "_bulk_load_stage",
)


def refuse_driver_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every read of Silver/Gold rows by the sync module itself fail."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the Spark sync read table rows in the driver")

    for name in DRIVER_READS:
        monkeypatch.setattr(sync_module, name, refuse)


@pytest.fixture
def no_driver_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`refuse_driver_reads` for the whole test."""
    refuse_driver_reads(monkeypatch)


def sf(lake: Lake, **settings: Any) -> Lake:
    lake.config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:", **settings
    )
    return lake


def sync_log(lake: Lake) -> list[tuple[Any, ...]]:
    log = lake.table("audit/snowflake_sync").sort("batch_id", "target_table")
    return [
        (r["batch_id"], r["target_table"], r["kind"], r["inserted"], r["updated"], r["deleted"])
        for r in log.to_dicts()
    ]


def test_inline_sync_of_the_spark_engine_equals_the_local_engines(
    spark: Any, emulator: dict[str, Any], tmp_path: Path
) -> None:
    """``snowflake.mode: inline`` on the Spark engine: after each micro-batch DIM and every
    AGG table equal Silver and Gold; the syncs (full, then CDF increments) insert, update and
    delete the same rows as the local engine's syncs of the same stream (soft deletes here;
    hard deletes: the change-set test)."""
    local = sf(Lake(tmp_path / "local"), mode="inline")
    other = sf(Lake(tmp_path / "spark"), mode="inline")
    other.config.pipeline.engine = "spark"
    for lake in (local, other):
        with pytest.MonkeyPatch.context() as patch:
            if lake is other:  # the Spark engine's syncs: no row read by the driver
                refuse_driver_reads(patch)
            first_batch(lake)
            if lake is other:
                assert reconcile_snowflake(lake.config).equal
            second_batch(lake)
        result = reconcile_snowflake(lake.config)
        assert result.equal, result.log_fields()
    assert sync_log(other) == sync_log(local)
    assert [r[2] for r in sync_log(other) if r[1] == "DIM_CUSTOMER_CURRENT"] == [
        "full",
        "incremental",
    ]
    assert dim_rows(other).keys() == dim_rows(local).keys()
    logged = other.table("audit/snowflake_sync").to_dicts()
    incremental = [r for r in logged if r["kind"] == "incremental"]
    assert incremental and all(r["event_lag_p50_s"] is not None for r in incremental)


def test_the_change_set_is_one_row_per_key_of_the_latest_version(
    spark: Any, emulator: dict[str, Any], tmp_path: Path, no_driver_reads: None
) -> None:
    """The CDF of several Silver versions reduced by Spark: one stage row per changed key, the
    last version's (a key inserted, updated, then deleted across versions: one DELETE)."""
    lake = sf(Lake(tmp_path / "hard", mode="hard"), load_method="bulk")
    writer = SparkSyncFiles(spark, lake.config)
    first_batch(lake)
    v1 = sync_snowflake(lake.config, writer=writer).dim.to_version
    second_batch(lake)  # C-2 updated, C-4 deleted, C-6 inserted: one Silver version each run
    from tests.conftest import ev, full

    lake.write([ev("e10", "C-6", "UPDATE", 30, city="Goa"), ev("e11", "C-6", "DELETE", 31)])
    lake.run()
    lake.write([ev("e12", "C-2", "UPDATE", 40, city="Agra")])
    lake.run()
    lake.write([ev("e13", "C-7", "INSERT", 50, **full())])
    lake.run()
    report = sync_snowflake(lake.config, writer=writer).dim
    assert report.kind == "incremental" and report.from_version == v1
    assert report.to_version >= v1 + 4
    assert report.staged == 4  # C-2, C-4, C-6, C-7 — each once
    assert (report.inserted, report.updated, report.deleted) == (1, 1, 1)  # C-6 never synced
    assert report.load_method == "bulk"
    assert reconcile_snowflake(lake.config).equal
    assert sorted(dim_rows(lake)) == ["C-1", "C-2", "C-3", "C-5", "C-7"]


#: one failure point per phase: the files staged, inside the transaction, after its commit
#: (tests/test_snowflake.py runs every point on the local route, which shares the code after
#: the files)
POINTS = ("after_put", "after_merge", "after_commit")
assert set(POINTS) <= {*BULK_POINTS, *SYNC_POINTS}


@pytest.mark.parametrize("point", POINTS)
def test_a_failed_spark_sync_leaves_snowflake_as_it_was_and_the_next_one_catches_up(
    spark: Any, emulator: dict[str, Any], tmp_path: Path, point: str, no_driver_reads: None
) -> None:
    lake = sf(Lake(tmp_path / "soft"))
    writer = SparkSyncFiles(spark, lake.config)
    first_batch(lake)
    v1 = sync_snowflake(lake.config, writer=writer).dim.to_version
    before = dim_rows(lake)
    second_batch(lake)
    with pytest.raises(InjectedSyncFailure):
        sync_snowflake(lake.config, fail_at=point, writer=writer)
    if point == "after_commit":
        assert state_version(lake) == v1 + 1
    else:
        assert state_version(lake) == v1
        assert dim_rows(lake) == before
    retry = sync_snowflake(lake.config, writer=writer).dim
    assert retry.kind == ("noop" if point == "after_commit" else "incremental")
    assert reconcile_snowflake(lake.config).equal
    files = Path(lake.config.storage.root) / "_snowflake_files"
    assert not files.exists() or not any(files.iterdir())  # every attempt's files removed


def test_declared_tables_sync_from_spark_with_their_types(
    spark: Any, emulator: dict[str, Any], tmp_path: Path, no_driver_reads: None
) -> None:
    """The Spark contracts engine's inline sync: decimal, date, boolean, JSON and composite keys
    through Spark-written Parquet files; each table equal to its Silver after each batch."""
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.sinks.snowflake.connection import connect
    from cdcflow.sinks.snowflake.reconcile import reconcile_target
    from cdcflow.sinks.snowflake.tables import contract_target
    from tests.test_tables_pipeline import rec, write_config, write_files

    config = write_config(tmp_path, mode="hard")
    config.pipeline.engine = "spark"
    config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:", mode="inline"
    )
    targets = [contract_target(c) for c in config.contracts()]
    row = {"owner": "Ann", "balance": "12.50", "opened_on": "2024-02-29", "vip": True}
    line = {"sku": "ABC-1", "quantity": 2, "attributes": {"gift": True, "tags": ["a"]}}
    batches = [
        [
            rec("accounts", "A1", "INSERT", 10, account_id=1, **row),
            rec("order_lines", "L1", "INSERT", 12, order_id="O", line_no=1, **line),
            rec("order_lines", "L2", "INSERT", 13, order_id="O", line_no=2, **line),
        ],
        [
            rec("accounts", "A3", "UPDATE", 20, account_id=1, balance="99.99"),
            rec("order_lines", "L3", "DELETE", 21, order_id="O", line_no=1),
        ],
    ]
    for batch in batches:
        write_files(config, [[json.dumps(r) for r in batch]])
        assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 1
        assert all(reconcile_target(config, t).equal for t in targets)
    with connect(config) as conn:
        cur = conn.cursor()
        cur.execute("SELECT BALANCE, OPENED_ON, VIP FROM ACCOUNTS_CURRENT WHERE ACCOUNT_ID = 1")
        from datetime import date
        from decimal import Decimal

        assert cur.fetchone() == (Decimal("99.99"), date(2024, 2, 29), True)
        cur.execute("SELECT ATTRIBUTES:gift, LINE_NO FROM ORDER_LINES_CURRENT")
        rows = cur.fetchall()
        assert len(rows) == 1 and json.loads(str(rows[0][0])) is True and rows[0][1] == 2


def test_an_object_store_root_is_refused_with_the_key(tmp_path: Path) -> None:
    from cdcflow.errors import ConfigError
    from cdcflow.sinks.snowflake.sync import files_folder

    lake = Lake(tmp_path)
    lake.config.storage.root = "s3://bucket/lake"
    with pytest.raises(ConfigError, match=r"storage\.root.*s3://"):
        files_folder(lake.config, "x")
