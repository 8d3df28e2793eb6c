"""Spark engine conformance: the same workloads through both engines give the same tables.

One SparkSession (session-scoped) is shared by every test. Compared: Silver's public columns,
quarantine (file name, line, reason) and outcomes (event_id → outcomes in arrival order).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SPARK_MASTER, Lake, ev, fresh_prefix, full
from tests.crashkit import checkpoint_state, versions
from tests.test_gold import _random_days
from tests.test_property import check_against_oracle, streams

pytestmark = pytest.mark.spark


def spark_lake(root: Path, mode: str = "soft") -> Lake:
    lake = Lake(root, mode=mode)
    lake.config.pipeline.engine = "spark"
    return lake


def quarantine(lake: Lake) -> list[tuple[str, int, str]]:
    rows = lake.table("quarantine/customer_events").to_dicts()
    return sorted(
        (Path(r["source_file"]).name, r["source_line"], r["failure_reason"]) for r in rows
    )


def history(lake: Lake) -> list[dict[str, Any]]:
    return lake.table("silver/customer_history").sort("customer_id", "sequence").to_dicts()


GOLD = (
    "gold/active_customers",
    "gold/active_customers_by_geo",
    "gold/status_distribution",
    "gold/daily_customer_metrics",
)


def gold_rows(lake: Lake) -> dict[str, list[dict[str, Any]]]:
    """Every Gold table's rows, in one order (row order is not part of a table)."""
    tables = {name: lake.table(name) for name in GOLD}
    return {
        name: frame.sort(frame.columns, nulls_last=True).to_dicts()
        for name, frame in tables.items()
    }


def same_tables(local: Lake, other: Lake) -> None:
    assert other.silver() == local.silver()
    assert quarantine(other) == quarantine(local)
    assert other.outcomes() == local.outcomes()
    assert history(other) == history(local)
    assert gold_rows(other) == gold_rows(local)


def workload(mode: str) -> list[list[Any]]:
    """Runs of landing files of records: the core scenarios, interleaved over customers."""
    first = [
        [
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full()),
            ev("E2", "C-1", "UPDATE", "0/20", minutes_ago=30, email="new@x.com", city="Mumbai"),
            ev("E10", "C-2", "INSERT", 100, minutes_ago=40, **full(city="Rennes")),
            ev("E11", "C-2", "UPDATE", 200, minutes_ago=30, city="Nantes"),
            ev("E12", "C-2", "DELETE", 300, minutes_ago=10),
            "{not json",
            "",
            ev("E20", "C-3", "INVALID_OP", "0/10", **full()),
            ev("E21", "C-4", " u ", "0/11", city="Lyon"),
            {**ev("E22", "C-5", "INSERT", "0/10", **full()), "customer_id": None},
        ],
        [
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full()),  # duplicate
            ev("E30", "C-6", "INSERT", "0/10", minutes_ago=24 * 60 + 5, **full()),  # late
            ev("E40", "C-7", "INSERT", "0/40", minutes_ago=20, **full()),
            ev("E41", "C-7", "DELETE", "0/50", minutes_ago=10),
        ],
    ]
    second = [
        [
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full(city="Elsewhere")),  # conflict
            ev("E3", "C-1", "UPDATE", "0/15", minutes_ago=45, city="Lyon", phone="+1-555"),  # stale
            ev("E13", "C-2", "UPDATE", 250, minutes_ago=20, city="Lyon"),  # late, under the DELETE
            ev("E42", "C-7", "UPDATE", "0/45", minutes_ago=15, city="Oslo"),  # below tombstone
            ev("E43", "C-7", "INSERT", "0/60", minutes_ago=5, status="ACTIVE", city="Bergen"),
            ev("E44", "C-8", "DELETE", "0/70", minutes_ago=5),  # DELETE of an unknown key
            # left by the column rules to the shared Python rules: a number with a fraction,
            # duplicate keys; and a CRLF line ending
            ev("E45", "C-9", "INSERT", "0/71", minutes_ago=5, **full(phone=12.50)),
            json.dumps(ev("E46", "C-9", "UPDATE", "0/72", minutes_ago=4))[:-1] + ', "city": "A"'
            ', "city": "B"}',
            json.dumps(ev("E47", "C-9", "UPDATE", "0/73", minutes_ago=3, country="PT")) + "\r",
        ],
        # whole files for the Python step: gzip, and a file that is not valid UTF-8
        ("gz", [ev("E60", "C-10", "INSERT", "0/80", minutes_ago=3, **full())]),
        [b"\xff\xfe{}", ev("E61", "C-10", "UPDATE", "0/81", minutes_ago=2, city="Porto")],
    ]
    return [first, second]


def crash_after_bronze(point: str, batch_id: int) -> None:
    """A ``crash_point`` stand-in: the micro-batch fails right after its Bronze write."""
    if point == "after_bronze":
        raise RuntimeError("simulated crash after the Bronze write")


def run_workload(lake: Lake, runs: list[list[Any]]) -> None:
    for files in runs:
        for records in files:
            if isinstance(records, tuple):
                lake.write(records[1], gz=True)
            else:
                lake.write(records)
        lake.run()


def test_the_session_runs_on_the_configured_master(spark: Any) -> None:
    """The tests' SparkSession is on :data:`tests.conftest.SPARK_MASTER`; on the standalone
    cluster, with its two executors registered (JVMs of their own, not the driver's): the
    run of this suite there is not a ``local[N]`` run in disguise."""
    import os
    import time

    context = spark.sparkContext
    assert context.master == SPARK_MASTER
    wanted = 1 if SPARK_MASTER.startswith("local") else 3  # the driver (+ two executors)
    deadline = time.monotonic() + 120
    while context._jsc.sc().getExecutorMemoryStatus().size() < wanted:
        assert time.monotonic() < deadline, "the executors did not register"
        time.sleep(0.5)
    assert context._jsc.sc().getExecutorMemoryStatus().size() == wanted
    # a job's tasks run where the executors are: Python workers of their own
    pids = set(context.parallelize(range(4), 4).map(lambda _: os.getpid()).collect())
    assert os.getpid() not in pids


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_scenarios_match_local_engine(
    spark: Any, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both delete modes against the local engine; ``soft`` with the small micro-batches'
    interpreted expressions (the default below ``spark.codegen_min_bytes``), ``hard`` with
    Spark's generated code (``codegen_min_bytes: 0``), as a large micro-batch runs."""
    from cdcflow.engines.spark.engine import INTERPRETED, SparkEngine

    local = Lake(tmp_path / "local", mode=mode)
    other = spark_lake(tmp_path / "spark", mode=mode)
    if mode == "hard":
        other.config.spark.codegen_min_bytes = 0
    run_workload(local, workload(mode))

    def on_the_driver(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the Spark engine refreshed Gold with the local engine's code")

    # Gold by Spark: the local refresh (delta-rs + Polars on the driver) is never called
    monkeypatch.setattr("cdcflow.engines.local.gold.refresh_gold", on_the_driver)
    # what each micro-batch ran with: the session's code-generation settings inside the batch
    seen: list[dict[str, str | None]] = []
    run_files = SparkEngine._run_files

    def watched(self: SparkEngine, *args: Any) -> Any:
        seen.append({key: self.spark.conf.get(key, None) for key in INTERPRETED})
        return run_files(self, *args)

    monkeypatch.setattr(SparkEngine, "_run_files", watched)
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    jobs_before = scheduler.nextJobId()  # Spark's job ids: one sequence per SparkContext
    run_workload(other, workload(mode))
    jobs_run = scheduler.nextJobId() - jobs_before
    monkeypatch.undo()
    assert len(seen) == 2, seen
    assert seen == [INTERPRETED] * 2 if mode == "soft" else INTERPRETED not in seen, seen
    # and the session's own settings are back after each micro-batch
    assert all(spark.conf.get(key, None) != value for key, value in INTERPRETED.items())
    same_tables(local, other)
    for lake in (local, other):  # each engine against the oracle, not only each other
        check_against_oracle(lake, len(lake.arrival))
    log = other.table("audit/batch_log").sort("batch_id")
    assert log["batch_id"].to_list() == [0, 1]
    # each micro-batch's Spark jobs: some, and no more than the runs started (the streaming
    # query's own jobs and the batch_log appends are not a micro-batch's); none for the local
    jobs = log["spark_jobs"].to_list()
    assert all(n > 0 for n in jobs) and sum(jobs) <= jobs_run, (jobs, jobs_run)
    assert local.table("audit/batch_log")["spark_jobs"].null_count() == 2
    # Silver files rewritten, from each engine's MERGE commits: none in batch 0 (empty Silver)
    for lake in (local, other):
        rewritten = lake.table("audit/batch_log").sort("batch_id")["silver_files_rewritten"]
        assert rewritten.null_count() == 0 and rewritten[0] == 0, rewritten.to_list()
    assert (
        log["quarantined"].to_list()
        == local.table("audit/batch_log").sort("batch_id")["quarantined"].to_list()
    )
    if mode == "hard":
        tombs = other.table("silver/customer_tombstones").sort("customer_id")
        expected = local.table("silver/customer_tombstones").sort("customer_id")
        assert (
            tombs.select("customer_id", "_cdc_seq").to_dicts()
            == expected.select("customer_id", "_cdc_seq").to_dicts()
        )
    for name in ("bronze/customer_events", "audit/event_outcomes", "silver/customers"):
        assert other.table(name).schema == local.table(name).schema
    # a run with nothing new is a no-op: not a commit more, not a checkpoint entry more
    before = (versions(other), checkpoint_state(other))
    assert other.run() == []
    assert (versions(other), checkpoint_state(other)) == before


def test_interop_engines_take_turns(spark: Any, tmp_path: Path) -> None:
    """local → Spark → local → Spark on one lakehouse and checkpoint equals local alone.

    In hard mode (tombstones pass between the engines too), under a root with a space and
    non-ASCII characters (each engine escapes the paths it writes and reads the other's).
    """
    runs = workload("hard")
    later = [
        [[ev("E50", "C-1", "UPDATE", "0/90", minutes_ago=1, city="X")]],
        [[ev("E51", "C-2", "UPDATE", 400, minutes_ago=1, city="Y")], ["{broken"]],
    ]
    reference = Lake(tmp_path / "reference", mode="hard")
    run_workload(reference, [*runs, *later])

    mixed = Lake(tmp_path / "sp ace" / "ü文件", mode="hard")
    run_workload(mixed, runs[:1])  # local engine starts the tables
    mixed.config.pipeline.engine = "spark"
    run_workload(mixed, runs[1:])  # Spark continues them
    mixed.config.pipeline.engine = "local"
    run_workload(mixed, later[:1])  # local continues after Spark
    mixed.config.pipeline.engine = "spark"
    run_workload(mixed, later[1:])  # and Spark again: new batch id, the local file skipped
    same_tables(reference, mixed)
    log = mixed.table("audit/batch_log").sort("batch_id")
    assert log["batch_id"].to_list() == [0, 1, 2, 3]
    assert (
        log["files"].to_list()
        == reference.table("audit/batch_log").sort("batch_id")["files"].to_list()
    )
    assert (
        mixed.table("bronze/customer_events").height
        == reference.table("bronze/customer_events").height
    )
    tombstones = "silver/customer_tombstones"
    assert (
        mixed.table(tombstones).select("customer_id", "_cdc_seq").sort("customer_id").to_dicts()
        == reference.table(tombstones)
        .select("customer_id", "_cdc_seq")
        .sort("customer_id")
        .to_dicts()
    )
    assert mixed.silver() == mixed.expected().rows


def test_interop_engines_take_turns_on_s3(spark: Any, s3_server: str, tmp_path: Path) -> None:
    """local → Spark → local → Spark with the lakehouse and the checkpoint on the local S3
    server (moto) equals the local engine alone on a local folder.

    Spark reads and writes the tables, its streaming checkpoint and its batch ids through the
    S3A connector (``s3://`` served by S3A; endpoint and keys from the ``AWS_*`` environment),
    the local engine through delta-rs and obstore; both keep the offsets and commit markers of
    one checkpoint, created put-if-absent under the run's lease."""
    import obstore
    from obstore.store import from_url

    runs = workload("hard")
    later = [
        [[ev("E50", "C-1", "UPDATE", "0/90", minutes_ago=1, city="X")]],
        [[ev("E51", "C-2", "UPDATE", 400, minutes_ago=1, city="Y")], ["{broken"]],
    ]
    reference = Lake(tmp_path / "reference", mode="hard")
    run_workload(reference, [*runs, *later])

    prefix = fresh_prefix("s3", "spark-interop")
    mixed = Lake(tmp_path / "mixed", mode="hard", store=prefix)
    run_workload(mixed, runs[:1])  # local engine starts the tables on S3
    mixed.config.pipeline.engine = "spark"
    run_workload(mixed, runs[1:])  # Spark continues them through S3A
    mixed.config.pipeline.engine = "local"
    run_workload(mixed, later[:1])
    mixed.config.pipeline.engine = "spark"
    run_workload(mixed, later[1:])
    same_tables(reference, mixed)
    assert mixed.table("audit/batch_log").sort("batch_id")["batch_id"].to_list() == [0, 1, 2, 3]
    assert mixed.silver() == mixed.expected().rows
    assert checkpoint_state(mixed)["committed"] == [True] * 4
    # everything is on S3: tables, offsets, commits, Spark's streaming checkpoint and batch ids
    assert not (tmp_path / "mixed" / "lake").exists()
    store = from_url(mixed.config.checkpoint.location, client_options={"allow_http": True})
    names = {item["path"] for batch in obstore.list(store) for item in batch}
    assert {"offsets/3.json", "commits/3.json", "spark/cdcflow_batch_ids.json"} <= names
    assert any(name.startswith("spark/stream/commits/") for name in names), sorted(names)


#: Hypothesis examples of the property tests: four on ``local[2]``; two on the standalone cluster
#: (tests/test_spark_cluster.py), whose run is about what crosses the driver/executor boundary,
#: and where every example costs twice as long.
EXAMPLES = 4 if SPARK_MASTER.startswith("local") else 2


@settings(max_examples=EXAMPLES)
@given(stream=streams(), mode=st.sampled_from(["soft", "hard"]))
def test_property_spark_matches_oracle(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, stream: Any, mode: str
) -> None:
    """The property streams of ``tests/test_property.py`` (every reason, conflicting copies,
    LSN widths, offsets), a few micro-batches each: Silver, tombstones and every line's fate
    equal the independent oracle's, on the Spark engine."""
    records, cuts, seed = stream
    lake = spark_lake(tmp_path_factory.mktemp("prop"), mode=mode)
    lake.config.source.max_files_per_trigger = 3
    lake.config.gold.refresh_every_batches = 0  # Silver and fates are checked, not Gold
    lake.write_stream(list(records), cuts, seed)
    lake.run("available-now")
    check_against_oracle(lake, len(records))


@settings(max_examples=EXAMPLES, deadline=None)
@given(stream=streams(), mode=st.sampled_from(["soft", "hard"]))
def test_spark_gold_equals_the_local_gold_of_one_history(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, stream: Any, mode: str
) -> None:
    """Gold computed by Spark from a history table equals the local engine's Gold of it, on
    the property streams spread over several days (registrations, deletions, reactivations,
    quiet-day gaps, statuses without a customer)."""
    from cdcflow.engines.local.gold import compute_gold as local_gold
    from cdcflow.engines.spark.gold import compute_gold as spark_gold

    records, cuts, seed = stream
    records = [
        dict(r) for r in records if isinstance(r, dict) and isinstance(r.get("event_id"), str)
    ]
    _random_days(records, seed)
    lake = Lake(tmp_path_factory.mktemp("gold"), mode=mode)
    lake.config.gold.refresh_every_batches = 0
    lake.write_stream(records, cuts, seed)
    lake.run()
    history_table = lake.table("silver/customer_history")
    expected = local_gold(history_table)
    uri = lake.config.table_uri("silver/customer_history")
    frames = spark_gold(spark.read.format("delta").load(uri))
    for name, frame in frames.items():
        import polars as pl

        got = pl.from_arrow(frame.toArrow())
        assert isinstance(got, pl.DataFrame)
        want = expected[name].select(got.columns)
        assert (
            got.sort(got.columns, nulls_last=True).to_dicts()
            == want.sort(want.columns, nulls_last=True).to_dicts()
        ), name


def test_spark_rerun_reads_only_recorded_bytes_of_a_grown_file(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A micro-batch that failed after its Bronze write is re-run from the Spark checkpoint
    (nothing written twice), on the bytes its offsets recorded, even when the file grew since;
    a recorded file that is gone stops the re-run, naming it."""
    import os

    import cdcflow.engines.spark.engine as spark_engine
    from cdcflow.errors import LandingFileChangedError

    runs = workload("soft")[:1]
    local = Lake(tmp_path / "local")
    run_workload(local, runs)
    other = spark_lake(tmp_path / "spark")
    monkeypatch.setattr(spark_engine, "crash_point", crash_after_bronze)
    with pytest.raises(Exception, match="simulated crash"):
        run_workload(other, runs)
    bronze = "bronze/customer_events"
    assert other.table(bronze).height == local.table(bronze).height
    assert other.table("audit/batch_log").height == 0
    monkeypatch.undo()
    # the producer appends to a file of the crashed batch before the restart
    first = sorted(other.landing.glob("*.jsonl"))[0]
    original = first.read_bytes()
    with open(first, "ab") as handle:
        handle.write(json.dumps(ev("E90", "C-90", "INSERT", "0/90", **full())).encode() + b"\n")
    os.utime(first, (1_700_000_500, 1_700_000_500))
    other.run()  # the Spark checkpoint re-runs the batch on the recorded bytes only
    same_tables(local, other)
    assert "C-90" not in other.silver()
    assert other.table(bronze).height == local.table(bronze).height  # nothing written twice
    assert other.table("audit/batch_log")["batch_id"].to_list() == [0]
    # a recorded file that is gone stops the re-run, naming it
    monkeypatch.setattr(spark_engine, "crash_point", crash_after_bronze)
    nxt = other.write([ev("E91", "C-91", "INSERT", "0/91", **full())])
    with pytest.raises(Exception, match="simulated crash"):
        other.run()
    monkeypatch.undo()
    content = nxt.read_bytes()
    nxt.unlink()
    with pytest.raises(LandingFileChangedError, match=str(nxt)):
        other.run()
    nxt.write_bytes(content)
    other.run()
    assert "C-91" in other.silver()
    assert first.read_bytes().startswith(original)


def test_spark_refuses_min_file_age(tmp_path: Path) -> None:
    from datetime import timedelta

    from cdcflow.engines.spark.engine import SparkEngine
    from cdcflow.errors import ConfigError

    lake = spark_lake(tmp_path)
    lake.config.source.min_file_age = timedelta(seconds=30)
    with pytest.raises(ConfigError, match=r"source\.min_file_age"):
        SparkEngine(lake.config)
