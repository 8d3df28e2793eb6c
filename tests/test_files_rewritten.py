"""``audit/batch_log.silver_files_rewritten``: the Silver data files a micro-batch's MERGE
rewrote (Delta MERGE is copy-on-write), read from the MERGE commit's metrics.

The workload lays Silver out in known files: each of the first micro-batches inserts new keys
only (an insert-only MERGE adds one file and rewrites none), so every later update hits the
files holding its keys and no other.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable, write_deltalake

from cdcflow.engines.local.delta import merge_files_rewritten
from tests.conftest import Lake, ev, full


def keys(first: int, count: int) -> list[str]:
    return [f"C-{n}" for n in range(first, first + count)]


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_a_merge_rewrites_only_the_silver_files_its_keys_are_in(tmp_path: Path, mode: str) -> None:
    lake = Lake(tmp_path, mode=mode, max_files=1)
    # batch 0 and 1: new keys only, one Silver file each
    lake.write(ev(f"I{k}", k, "INSERT", 10, **full()) for k in keys(1000, 5))
    lake.write(ev(f"I{k}", k, "INSERT", 10, **full()) for k in keys(2000, 5))
    # batch 2: one key of batch 1's file
    lake.write([ev("U1", "C-2001", "UPDATE", 20, city="Pune")])
    # batch 3: a key of each file (a delete in one of them)
    lake.write([ev("U2", "C-1001", "UPDATE", 30, city="Goa"), ev("D1", "C-2002", "DELETE", 30)])
    # batch 4: nothing reaches the MERGE (a re-delivery, a bad line): no Silver commit
    lake.write([ev("U1", "C-2001", "UPDATE", 20, city="Pune"), "{not json"])
    # batch 5: an event older than its row: the MERGE matches the row and its guard keeps the
    # row as it is, yet copy-on-write rewrites the row's file (delta-rs has no deletion vectors)
    lake.write([ev("S1", "C-1003", "UPDATE", 5, city="Old")])
    reports = lake.run()
    assert [r.batch_id for r in reports] == [0, 1, 2, 3, 4, 5]
    log = lake.table("audit/batch_log").sort("batch_id")
    rewritten = log["silver_files_rewritten"].to_list()
    assert rewritten == [0, 0, 1, 2, 0, 1], rewritten
    versions = log["silver_version"].to_list()
    assert versions[4] == versions[3]  # batch 4 committed nothing to Silver
    assert [r.silver_files_rewritten for r in reports] == rewritten
    assert lake.silver() == lake.expected().rows


def test_the_count_is_read_from_the_batchs_commit(tmp_path: Path) -> None:
    """A re-run of a micro-batch whose MERGE is committed (after a crash) finds the same count:
    it comes from the commit, not from the MERGE call; a batch that never wrote Silver has 0."""
    lake = Lake(tmp_path, max_files=1)
    lake.write(ev(f"I{k}", k, "INSERT", 10, **full()) for k in keys(1000, 3))
    lake.write([ev("U1", "C-1001", "UPDATE", 20, city="Pune")])
    lake.run()
    silver = DeltaTable(lake.config.table_uri("silver/customers"))
    pipeline_app = f"cdcflow-{lake.config.pipeline.name}"  # the micro-batches' app transaction
    assert silver.history(1)[0]["operation"] == "MERGE"
    assert merge_files_rewritten(silver, pipeline_app, 1) == 1
    assert merge_files_rewritten(silver, pipeline_app, 2) == 0  # no commit of batch 2
    assert merge_files_rewritten(silver, "another-app", 1) == 0
    log = lake.table("audit/batch_log").sort("batch_id")
    assert log.filter(pl.col("batch_id") == 1)["silver_files_rewritten"].item() == 1


def test_a_batch_log_written_before_the_column_gets_it(tmp_path: Path) -> None:
    """A lakehouse of an earlier cdcflow (no ``silver_files_rewritten``): the next run adds the
    column (null in the earlier rows) and fills it for its micro-batches."""
    lake = Lake(tmp_path, max_files=1)
    lake.write(ev(f"I{k}", k, "INSERT", 10, **full()) for k in keys(1000, 3))
    lake.run()
    uri = lake.config.table_uri("audit/batch_log")
    earlier = lake.table("audit/batch_log").drop("silver_files_rewritten")
    write_deltalake(uri, earlier.to_arrow(), mode="overwrite", schema_mode="overwrite")
    assert "silver_files_rewritten" not in lake.table("audit/batch_log").columns
    lake.write([ev("U1", "C-1001", "UPDATE", 20, city="Pune")])
    lake.run()
    log = lake.table("audit/batch_log").sort("batch_id")
    assert log["silver_files_rewritten"].to_list() == [None, 1]
    assert lake.silver() == lake.expected().rows
