"""Replay: Silver rebuilt from Bronze alone reconciles 100% with the streamed Silver."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from cdcflow.cli.app import app
from cdcflow.engines.local import replay
from cdcflow.engines.local.delta import read_arrow, version_after_batch
from cdcflow.errors import TableError
from cdcflow.generator import GeneratorConfig, expected_outcome, generate
from cdcflow.layers.tables import SILVER
from cdcflow.plan.reference import SILVER_COLUMNS
from cdcflow.plan.replay import bucket_count, revalidate
from cdcflow.reconcile import frame_from_reference, reconcile_state
from tests.conftest import NOW, Lake, ev, full
from tests.test_reconcile import write_config

runner = CliRunner()


def streamed_lake(root, mode: str) -> tuple[Lake, list[str]]:
    lake = Lake(root, mode=mode, max_files=2)
    summary = generate(lake.landing, GeneratorConfig(events=2500, customers=200, files=8, seed=11))
    reports = lake.run()
    assert len(reports) == 4
    return lake, summary.lines


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_full_replay_reconciles_with_streamed_silver(tmp_path, mode: str) -> None:
    lake, lines = streamed_lake(tmp_path, mode)
    # several buckets: each folded alone, the union equals one fold
    result = replay.rebuild_shadow(lake.config, bucket_rows=600)
    assert result.buckets == bucket_count(result.bronze_rows - result.duplicates, 600) > 1
    assert result.rejected == {} and result.sequence_mismatches == 0
    replay.verify(lake.config, result)
    assert result.silver_report is not None and result.silver_report.ok, result.to_json()
    assert result.verified is True
    if mode == "hard":
        assert result.tombstone_report is not None and result.tombstone_report.ok
        assert result.tombstone_rows > 0
    # the shadow is also the reference fold of the generated stream
    shadow = pl.scan_delta(lake.config.table_uri("_shadow/silver/customers")).collect()
    expected = expected_outcome(lines, mode)  # type: ignore[arg-type]
    assert reconcile_state(shadow, frame_from_reference(expected.state)).ok
    assert result.silver_rows == len(expected.state.rows)


def test_apply_replaces_silver_in_one_commit_and_logs_it(tmp_path) -> None:
    lake, _ = streamed_lake(tmp_path, "soft")
    silver_uri = lake.config.table_uri(SILVER.name)
    before = DeltaTable(silver_uri)
    old_version = before.version()
    # damage Silver: a wrong city for one customer
    victim = lake.silver().popitem()[0]
    before.update(updates={"city": "'Atlantis'"}, predicate=f"customer_id = '{victim}'")
    damaged_version = old_version + 1
    result = replay.verify(lake.config, replay.rebuild_shadow(lake.config))
    assert result.verified is False
    assert result.silver_report is not None
    assert result.silver_report.field_differences == {"city": 1}

    replay.apply(lake.config, result)
    assert result.applied_version == damaged_version + 1
    assert DeltaTable(silver_uri).version() == damaged_version + 1  # exactly one commit
    assert replay.verify(lake.config, replay.rebuild_shadow(lake.config)).verified is True
    # the damaged state is still reachable by time travel
    old = pl.from_arrow(read_arrow(DeltaTable(silver_uri, version=damaged_version)))
    assert isinstance(old, pl.DataFrame)
    assert old.filter(pl.col("customer_id") == victim)["city"].item() == "Atlantis"
    log = lake.table("audit/batch_log").filter(pl.col("kind") == "replay")
    assert log.height == 1
    assert log["silver_version"].item() == damaged_version + 1
    assert log["accepted"].item() == result.events
    # the stream continues on top of the replayed Silver
    lake.write([ev("E-NEW", victim, "UPDATE", "FFFF/0", minutes_ago=1, city="Lyon")])
    lake.run()
    assert lake.silver()[victim]["city"] == "Lyon"


def test_to_version_reads_bronze_by_time_travel(tmp_path) -> None:
    lake = Lake(tmp_path)
    lake.write([ev("E-1", "C-1", "INSERT", "0/10", **full(city="Rennes"))])
    lake.run()
    lake.write([ev("E-2", "C-1", "UPDATE", "0/20", city="Nantes")])
    lake.run()
    bronze = DeltaTable(lake.config.table_uri("bronze/customer_events"))
    first = bronze.version() - 1
    result = replay.rebuild_shadow(lake.config, to_version=first)
    assert (result.bronze_version, result.bronze_rows, result.events) == (first, 1, 1)
    shadow = pl.scan_delta(lake.config.table_uri("_shadow/silver/customers")).collect()
    assert shadow["city"].to_list() == ["Rennes"]
    # --verify compares it with Silver as that micro-batch left it, not with today's Silver
    replay.verify(lake.config, result)
    assert result.verified is True, result.to_json()
    assert result.silver_report is not None
    assert result.silver_report.actual_label.endswith("(after micro-batch 0)")
    latest = replay.verify(lake.config, replay.rebuild_shadow(lake.config))
    assert latest.verified is True and latest.silver_report is not None
    assert "after micro-batch" not in latest.silver_report.actual_label
    # the version micro-batch 0 left Silver at, and the latest for the last micro-batch
    silver = DeltaTable(lake.config.table_uri(SILVER.name))
    app_id = f"cdcflow-{lake.config.pipeline.name}"
    batch_zero = version_after_batch(silver.table_uri, None, app_id, 0)
    assert pl.from_arrow(read_arrow(DeltaTable(silver.table_uri, version=batch_zero)))[
        "city"
    ].to_list() == ["Rennes"]
    assert version_after_batch(silver.table_uri, None, app_id, 1) == silver.version()
    # --apply only from the latest Bronze: it would otherwise drop later batches
    with pytest.raises(replay.ReplayError):
        replay.apply(lake.config, result)


def test_revalidation_uses_ingestion_time_and_current_rules(tmp_path) -> None:
    lake = Lake(tmp_path)
    lake.write([ev("E-1", "C-1", "INSERT", "0/10", minutes_ago=1, **full())])
    lake.run()
    bronze = lake.table("bronze/customer_events")
    row = (bronze["raw_payload"][0], bronze["ingested_at"][0], bronze["sequence"][0])
    from datetime import timedelta

    checked = revalidate([row], r"^C-[0-9]+$", timedelta(minutes=5))
    assert checked.accepted == 1 and checked.sequence_mismatches == 0
    # the processing time is the row's ingestion time, not now: a rule on time stays the same.
    # An ingestion an hour before the event time (taken from the event's own clock, NOW, not
    # from the ingestion: a long test session ingests well after NOW)
    event_time = NOW - timedelta(minutes=1)
    earlier = (row[0], event_time.astimezone(row[1].tzinfo) - timedelta(hours=1), row[2])
    assert revalidate([earlier], r"^C-[0-9]+$", timedelta(minutes=5)).rejected == {
        "FUTURE_EVENT_TIMESTAMP": 1
    }
    assert revalidate([row], r"^X-[0-9]+$", timedelta(minutes=5)).rejected == {
        "INVALID_CUSTOMER_ID_FORMAT": 1
    }


def test_replay_cli_verify(tmp_path) -> None:
    lake, _ = streamed_lake(tmp_path, "hard")
    config = write_config(lake)
    result = runner.invoke(app, ["replay", "--config", str(config), "--verify", "--output", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verified"] is True
    assert data["silver_report"]["columns"][: len(SILVER_COLUMNS) - 1] == list(SILVER_COLUMNS[1:])
    # break one tombstone: verify fails with exit code 1
    DeltaTable(lake.config.table_uri("silver/customer_tombstones")).delete(
        f"customer_id = '{lake.table('silver/customer_tombstones')['customer_id'][0]}'"
    )
    result = runner.invoke(app, ["replay", "--config", str(config), "--verify"])
    assert result.exit_code == 1
    assert "MISMATCH" in result.stdout


def test_a_lost_silver_is_refused_then_rebuilt_by_replay(tmp_path) -> None:
    """A run after committed micro-batches never recreates a lost Silver empty (it would hold
    only the next batches' keys while the checkpoint skips the files already taken); replay
    --apply rebuilds it from Bronze and the pipeline continues to the fold of every event."""
    lake = Lake(tmp_path, max_files=2)
    summary = generate(lake.landing, GeneratorConfig(events=600, customers=60, files=4, seed=5))
    later = tmp_path / "later"
    later.mkdir()
    for path in sorted(lake.landing.iterdir())[2:]:  # the last two files arrive later
        path.rename(later / path.name)
    assert len(lake.run()) == 1
    silver_uri = lake.config.table_uri(SILVER.name)
    shutil.rmtree(silver_uri)
    for path in sorted(later.iterdir()):
        path.rename(lake.landing / path.name)
    with pytest.raises(TableError, match=r"silver/customers: missing .* replay --apply"):
        lake.run()
    assert not DeltaTable.is_deltatable(silver_uri)  # refused before anything was created
    result = replay.rebuild_shadow(lake.config)
    replay.verify(lake.config, result)  # the lost Silver holds none of the replayed keys
    assert result.silver_report is not None and result.silver_rows > 0
    assert result.silver_report.missing_keys == result.silver_rows
    replay.apply(lake.config, result)
    assert len(lake.run()) == 1  # the two later files
    expected = expected_outcome(summary.lines, "soft")
    streamed = pl.from_arrow(read_arrow(DeltaTable(silver_uri)))
    assert reconcile_state(streamed, frame_from_reference(expected.state)).ok
