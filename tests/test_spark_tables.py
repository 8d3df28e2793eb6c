"""Declared tables on the Spark engine: the conformance of both engines over three contracts.

The three contracts: the shipped customers contract declared as a table, ``accounts`` (an
integer key; decimal, date, timestamp, boolean and double columns) and ``order_lines`` (a
composite key of a string and an integer). The same landing files — shuffled, re-delivered,
late, invalid and unroutable records, cut into several micro-batches — run through the local
and the Spark engine (``accounts`` evolving an undeclared field into a column on the way) — in
soft mode the Spark engine alone, in hard mode the engines taking
turns over one lakehouse (local, Spark, local): every table (Bronze, quarantine, Silver,
tombstones, history, the unrouted quarantine and the per-table batch log) must equal the local
engine's alone, and each Silver and history the contract's reference fold and timeline.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.model.contracts import CUSTOMERS
from cdcflow.pipeline import Pipeline, Trigger
from tests.test_tables_pipeline import (
    TABLES,
    assert_silver_is_the_fold,
    comparable,
    contract_of,
    rec,
    rows,
    silver,
    write_files,
)

pytestmark = pytest.mark.spark

CUSTOMERS_TABLE = CUSTOMERS.model_dump(mode="json", exclude_defaults=True)


def three_tables(
    root: Path, mode: str, engine: str, max_files: int = 2, spark_conf: dict[str, str] | None = None
) -> CdcflowConfig:
    """A config declaring customers, accounts and order_lines in ``mode`` on ``engine``;
    accounts evolves unknown event fields into columns (``unknown_fields: evolve``) and applies
    source truncates (``truncate: apply``), order_lines skips them (``ignore``), customers
    quarantines them (the default)."""
    tables = [{**t, "delete_mode": mode} for t in (CUSTOMERS_TABLE, *TABLES)]
    tables[1]["unknown_fields"] = "evolve"
    tables[1]["truncate"] = "apply"
    tables[2]["truncate"] = "ignore"
    raw = {
        "pipeline": {"name": "shop", "engine": engine},
        "storage": {"root": str(root / "lake")},
        "source": {"path": str(root / "landing"), "max_files_per_trigger": max_files},
        "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "shop")},
        "tables": tables,
    }
    if spark_conf:
        raw["spark"] = {"conf": spark_conf}
    root.mkdir(parents=True, exist_ok=True)
    (root / "landing").mkdir(exist_ok=True)
    path = root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path)


def workload(seed: int) -> list[list[str]]:
    """Changes of the three tables, shuffled within a window, partly re-delivered, with bad and
    unroutable records, cut into five landing files."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    lsn = 100
    for i in range(36):
        lsn += 1
        op = rng.choice(["INSERT", "UPDATE", "UPDATE", "DELETE"])
        kind = i % 3
        if kind == 0:
            fields: dict[str, Any] = {"customer_id": f"C-{rng.randint(1, 3)}"}
            if op != "DELETE":
                fields["status"] = rng.choice(["active", "INACTIVE", "ACTIVE", "bogus"])
                fields["city"] = rng.choice(["Lyon", "Oslo", None, 12.5])
                if rng.random() < 0.5:
                    fields["email"] = f"u{i}@x.com"
            records.append(rec("customers", f"C{i}", op, lsn, minutes_ago=30 - i % 7, **fields))
        elif kind == 1 and i in (19, 31):  # a source truncate of accounts: every key deleted
            records.append(rec("accounts", f"A{i}", "TRUNCATE", lsn, minutes_ago=30 - i % 5))
        elif kind == 1:
            fields = {"account_id": rng.choice([1, 2, "3", "x"])}
            if op != "DELETE":
                fields["balance"] = rng.choice(["10.50", 7, -1, None])
                fields["opened_on"] = rng.choice(["2024-02-29", None, "2024-02-30"])
                fields["closed_at"] = rng.choice(["2025-05-12T10:00:00+02:00", None])
                fields["vip"] = rng.choice([True, "false", None])
                fields["rate"] = rng.choice([0.5, "1e3"])
                if i > 12:  # a field the contract does not declare (from the middle on)
                    fields["nickname"] = rng.choice(["Bo", None, 7])
            records.append(rec("accounts", f"A{i}", op, lsn, minutes_ago=30 - i % 5, **fields))
        else:
            fields = {"order_id": rng.choice(["O-1", "O-2"]), "line_no": rng.choice([1, 2])}
            if op != "DELETE":
                fields["sku"] = rng.choice(["ABC-1", "XYZ-22", "abc"])
                fields["quantity"] = rng.choice([1, "002", 0])
                fields["attributes"] = rng.choice([{"k": [1, 2]}, None, [], "x"])
            table = rng.choice(["order_lines", "public.order_lines"])
            records.append(rec(table, f"L{i}", op, lsn, minutes_ago=30 - i % 3, **fields))
        if i in (23, 27):  # a flat truncate of order_lines (skipped), of customers (quarantined)
            table = records[-1]["metadata"]["source_table"]  # (the same draws as a change)
            records[-1] = rec(table, f"T{i}", "TRUNCATE", lsn, minutes_ago=30 - i % 5)
    lines = [json.dumps(r) for r in records]
    lines += [json.dumps(rec("invoices", "I1", "INSERT", 1, invoice_id=1)), "{not json"]
    lines += rng.sample(lines[:36], 8)  # re-deliveries
    conflict = {**records[3], "event_timestamp": records[4]["event_timestamp"]}
    lines.append(json.dumps(conflict))  # an id seen before with other content
    # arrival: shuffled within a sliding window (late events), then cut into files
    order = sorted(range(len(lines)), key=lambda n: n + rng.uniform(0, 12))
    arrived = [lines[n] for n in order]
    cuts = sorted(rng.sample(range(1, len(arrived)), 4))
    return [arrived[a:b] for a, b in zip([0, *cuts], [*cuts, len(arrived)], strict=True)]


#: Every table a declared-tables run writes, compared engine against engine.
def written_tables(config: CdcflowConfig) -> list[str]:
    names = ["quarantine/unrouted_events", "audit/table_batch_log"]
    if any(contract.truncate == "apply" for contract in config.contracts()):
        names.append("audit/source_truncates")
    if any(contract.truncate == "ignore" for contract in config.contracts()):
        names.append("audit/skipped_records")
    for contract in config.contracts():
        t = contract.table_names
        names += [t.bronze, t.quarantine, t.silver, t.history, contract.outcomes_table]
        if contract.delete_mode == "hard":
            names.append(t.tombstones)
    return names


def comparable_log(config: CdcflowConfig) -> dict[str, dict[str, int]]:
    """``audit/table_batch_log`` summed per table: the engines' runs may cut the files into
    other micro-batches (and a Spark MERGE of a source filtered to nothing still commits, so
    Silver versions are not compared, nor the Silver files rewritten, which follow each
    engine's file layout)."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows(config, "audit/table_batch_log"):
        counts = totals.setdefault(row["table_name"], {})
        for name, value in row.items():
            # Silver versions and files: an engine's own layout (Spark writes a file per task)
            if name not in ("batch_id", "table_name", "silver_version", "silver_files_rewritten"):
                counts[name] = counts.get(name, 0) + value
    return totals


def run_stages(
    root: Path, mode: str, stages: list[tuple[str, list[list[str]]]], max_files: int
) -> CdcflowConfig:
    """Runs over one lakehouse: each stage's files landed, then a run of its engine."""
    for engine, files in stages:
        config = three_tables(root, mode, engine, max_files=max_files)
        write_files(config, files)
        reports = Pipeline(config).run(Trigger.parse("available-now"))
        assert len(reports) == -(-len(files) // max_files), engine
    return config


def assert_same_tables(config: CdcflowConfig, other: CdcflowConfig, lines: list[str]) -> None:
    """Every table of ``config`` equals ``other``'s, and each Silver and history is the
    reference fold and timeline of ``lines``."""
    assert_silver_is_the_fold(config, lines, ("customers", "accounts", "order_lines"))
    for name in written_tables(config):
        if name == "audit/table_batch_log":
            assert comparable_log(config) == comparable_log(other)
        else:
            assert comparable(config, name) == comparable(other, name), name
    customers = silver(config, contract_of(config, "customers"))
    assert customers, "the workload leaves some customers"
    assert all(row["is_active"] == (row["status"] == "ACTIVE") for row in customers.values())


def test_spark_runs_every_contract_as_the_local_engine(spark: Any, tmp_path: Path) -> None:
    """Soft mode: the Spark engine alone (two micro-batches) against the local engine alone."""
    files = workload(seed=7)
    local = run_stages(tmp_path / "local", "soft", [("local", files)], max_files=3)
    other = three_tables(tmp_path / "spark", "soft", "spark", max_files=3)
    write_files(other, files)
    reports = Pipeline(other).run(Trigger.parse("available-now"))
    assert [(r.batch_id, r.files) for r in reports] == [(0, 3), (1, 2)]
    everything = [line for lines in files for line in lines]
    assert sum(r.records_received for r in reports) == len(everything)
    assert sum(r.duplicates for r in reports) > 0 and sum(r.quarantined for r in reports) > 0
    assert_same_tables(other, local, everything)
    evolved = {row["change"] for row in rows(other, "audit/schema_log")}
    assert "evolved column nickname (string) from an event field" in evolved
    assert any(
        row["nickname"] is not None
        for row in silver(other, contract_of(other, "accounts")).values()
    )


def test_engines_take_turns_over_declared_tables(spark: Any, tmp_path: Path) -> None:
    """Hard mode: local → Spark (two micro-batches, with the tombstones and history the local
    engine left) → local over one lakehouse, against the local engine alone cut the same way."""
    files = workload(seed=11)
    turns = [("local", files[:1]), ("spark", files[1:4]), ("local", files[4:])]
    config = run_stages(tmp_path / "turns", "hard", turns, 2)
    # Spark's file source lists the file the local run took too (and skips it): its first
    # trigger takes files[0:2], so its micro-batches hold files[1] and files[2:4]
    cut = [files[:1], files[1:2], files[2:4], files[4:]]
    alone = run_stages(tmp_path / "alone", "hard", [("local", f) for f in cut], 2)
    assert_same_tables(config, alone, [line for lines in files for line in lines])


@pytest.mark.slow
def test_spark_killed_inside_a_batch_of_declared_tables_recovers(tmp_path: Path) -> None:
    """A real SIGKILL of a child ``cdcflow run`` (engine spark) in the middle micro-batch: after
    the first table's Silver MERGE, then (restarted) after the first table's outcomes — the
    other tables' commits of the batch not written yet — then a restart to the end: every
    table equals an uninterrupted local run of the same files (Spark re-runs the micro-batch
    from its own checkpoint; each table's commits already written are skipped by their app
    transaction)."""
    from cdcflow.state.faults import CRASH_EXIT_CODE
    from tests.crashkit import run_cli
    from tests.test_crash_spark import CHILD_SPARK_CONF

    files = workload(seed=5)[:3]
    alone = run_stages(tmp_path / "alone", "hard", [("local", files)], 1)
    config = three_tables(tmp_path / "killed", "hard", "spark", 1, CHILD_SPARK_CONF)
    write_files(config, files)
    for point in ("after_silver_merge", "after_outcomes"):
        crashed = run_cli(Path(config.file), crash=f"{point}@1", timeout=900)
        assert crashed.returncode == CRASH_EXIT_CODE, (point, crashed.stderr[-3000:])
    done = run_cli(Path(config.file), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_tables(config, alone, [line for lines in files for line in lines])
    batches = sorted(r["batch_id"] for r in rows(config, "audit/batch_log"))
    assert batches == [0, 1, 2]  # each micro-batch logged once


def test_spark_decodes_debezium_records_as_the_local_engine(spark: Any, tmp_path: Path) -> None:
    """``source.format: debezium``: the same shuffled Debezium files (both converter flavours,
    tombstones, truncates — applied to accounts — TOAST placeholders, re-deliveries) through
    both engines give the same tables, ``audit/skipped_records`` and ``audit/source_truncates``
    included, and each Silver the reference fold."""
    from tests.test_formats import dbz_files, expected_state
    from tests.test_formats import write_config as debezium_config

    files = dbz_files(seed=5)
    configs = []
    for engine in ("local", "spark"):
        config = debezium_config(tmp_path / engine, truncate="apply")
        raw = yaml.safe_load(Path(config.file).read_text())
        raw["pipeline"]["engine"] = engine
        raw["source"]["max_files_per_trigger"] = 2
        Path(config.file).write_text(yaml.safe_dump(raw, sort_keys=False))
        config = load_config(config.file)
        write_files(config, files)
        Pipeline(config).run(Trigger.parse("available-now"))
        configs.append(config)
    local, other = configs
    lines = [line for chunk in files for line in chunk]
    for contract in other.contracts():
        want = expected_state(other, lines, contract)
        got = silver(other, contract)
        assert set(got) == set(want) and want, contract.name
        t = contract.table_names
        for name in (t.bronze, t.quarantine, t.silver, t.history, contract.outcomes_table):
            assert comparable(other, name) == comparable(local, name), name
    for name in ("quarantine/unrouted_events", "audit/source_truncates"):
        assert comparable(other, name) == comparable(local, name), name
    assert rows(other, "audit/source_truncates"), "the workload truncates accounts"
    skipped = [
        sorted((Path(r["source_file"]).name, r["source_line"], r["kind"]) for r in rows(c, name))
        for c in (other, local)
        for name in ["audit/skipped_records"]
    ]
    assert skipped[0] == skipped[1] and skipped[0]


@pytest.mark.kafka
def test_spark_consumes_kafka_topics_as_the_local_engine(
    spark: Any, kafka_broker: str, tmp_path: Path
) -> None:
    """``source.type: kafka`` on both engines: the local engine's staged files and the Spark
    engine's Structured Streaming Kafka source (spark-sql-kafka) over the same topics (three
    partitions, tombstones, a value that is not JSON, a topic of no declared table) give the
    same Bronze payloads, quarantine, skipped records, Silver, history and outcomes."""
    import uuid

    from tests.test_kafka import expected, produce, topics, workload
    from tests.test_kafka import write_config as kafka_config

    prefix = f"s{uuid.uuid4().hex[:8]}"
    topics(prefix)
    values = workload(prefix, seed=11, count=50)
    produce(values)
    configs = []
    for engine in ("local", "spark"):
        config = kafka_config(tmp_path / engine, prefix, max_records=40)
        raw = yaml.safe_load(Path(config.file).read_text())
        raw["pipeline"]["engine"] = engine
        Path(config.file).write_text(yaml.safe_dump(raw, sort_keys=False))
        config = load_config(config.file)
        reports = Pipeline(config).run(Trigger.parse("available-now"))
        assert len(reports) >= 2, engine  # max_records_per_trigger: several micro-batches
        configs.append(config)
    local, other = configs
    want = expected(other, values)
    # the engines cut the records into other micro-batches: positions and batch ids differ
    position = {"source_file", "source_line", "file_mtime_ms", "batch_id"}

    def table(config: CdcflowConfig, name: str) -> list[str]:
        kept = [
            {k: v for k, v in json.loads(row).items() if k not in position}
            for row in comparable(config, name)
        ]
        return sorted(json.dumps(row, sort_keys=True) for row in kept)

    for contract in other.contracts():
        got = silver(other, contract)
        assert set(got) == set(want[contract.name]) and got, contract.name
        t = contract.table_names
        for name in (t.bronze, t.quarantine, t.silver, t.history):
            assert table(other, name) == table(local, name), name
        # an outcome depends on the micro-batch cut (SUPERSEDED_IN_BATCH or APPLIED): the same
        # deliveries have one each
        outcomes = [
            sorted((r["event_id"], r["sequence"]) for r in rows(c, contract.outcomes_table))
            for c in (other, local)
        ]
        assert outcomes[0] == outcomes[1] and outcomes[0]
    assert table(other, "quarantine/unrouted_events") == table(local, "quarantine/unrouted_events")
    kinds = [
        sorted((r["table_name"], r["kind"]) for r in rows(c, "audit/skipped_records"))
        for c in (other, local)
    ]
    assert kinds[0] == kinds[1] and kinds[0]
