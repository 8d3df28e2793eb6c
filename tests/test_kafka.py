"""The Kafka source against a real broker (``scripts/kafka/start.sh``: Apache Kafka, KRaft).

Debezium change-event values (the fixtures of :mod:`tests.test_formats`) are produced to topics
of several partitions; ``cdcflow run`` stages them through its write-ahead source state
(:mod:`cdcflow.sources.kafka`). Checked: each table's Silver equals the reference fold; every
Kafka record is in Bronze, a quarantine or ``audit/skipped_records`` exactly once — under
``kill -9`` at the source's crash points and at random moments, across a broker restart, with
partitions added while running, and when the records are delivered again (the source state
reset: every record an exact ``DUPLICATE``); a shuffled stream of the property test through
Kafka on a small size.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import given, settings

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.delta import read_arrow
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator
from cdcflow.plan.reference import fold_changes
from cdcflow.plan.routing import Router
from tests.conftest import BOOTSTRAP, REPO
from tests.ports import unused_port
from tests.test_formats import (
    ACCOUNT_FIELDS,
    NOW,
    ORDER_FIELDS,
    ORDERS,
    UNAVAILABLE,
    account_row,
    dbz,
    debezium_stream,
    decimal_b64,
)
from tests.test_formats import ACCOUNTS as ACCOUNTS_CONTRACT

pytestmark = pytest.mark.kafka


def create_topic(name: str, partitions: int, bootstrap: str = BOOTSTRAP) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=60)
    # the metadata of a new topic reaches the broker's cache a little later
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(timeout=10).topics.get(name)
        if topic is not None and len(topic.partitions) == partitions:
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} has not {partitions} partitions")


def add_partitions(name: str, total: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.create_partitions([NewPartitions(name, total)]).values():
        future.result(timeout=60)


def produce(
    records: list[tuple[str, int | None, bytes | None]], bootstrap: str = BOOTSTRAP
) -> None:
    """(topic, partition or None for the default partitioner, value) in order."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic, partition, value in records:
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=value, **kwargs)
    assert producer.flush(60) == 0


def write_config(
    root: Path, prefix: str, bootstrap: str = BOOTSTRAP, lake: str | None = None, **kafka: Any
) -> CdcflowConfig:
    """The Kafka pipeline's config file under ``root`` (landing there; the lakehouse and the
    checkpoint there too, or under the URI ``lake``)."""
    lake = lake or str(root / "lake")
    tables = [
        ACCOUNTS_CONTRACT.model_dump(mode="json", exclude_defaults=True),
        {**ORDERS.model_dump(mode="json", exclude_defaults=True), "truncate": "ignore"},
    ]
    raw = {
        "pipeline": {"name": "kafka"},
        "storage": {"root": lake},
        "source": {
            "type": "kafka",
            "format": "debezium",
            "path": str(root / "landing"),
            "max_records_per_trigger": kafka.pop("max_records", 25),
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topic_pattern": rf"{prefix}\.public\..*",
                "poll_timeout": "20s",
                **kafka,
            },
        },
        "checkpoint": {"location": f"{lake}/_checkpoints/kafka"},
        "tables": tables,
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path)


def workload(prefix: str, seed: int, count: int) -> list[tuple[str, int | None, bytes | None]]:
    """Debezium values of both tables (tombstones after deletes, TOAST placeholders, a value
    that is not JSON, an event of a table nobody declared), partitioned by key."""
    rng = random.Random(seed)
    records: list[tuple[str, int | None, bytes | None]] = []
    for i in range(count):
        lsn = 5000 + 10 * i
        if rng.random() < 0.3:
            key: dict[str, Any] = {"order_id": rng.choice(["O-1", "O-2", "O-3"])}
            row = {**key, "amount": decimal_b64(rng.choice(["1.5", "-2.125"]), 3),
                   "placed_at": rng.choice(["2024-01-01T00:00:00Z", UNAVAILABLE])}  # fmt: skip
            table, fields, partition = "orders", ORDER_FIELDS, None
        else:
            key = {"account_id": rng.randint(1, 6)}
            row = account_row(key["account_id"], owner=rng.choice(["A", "B", UNAVAILABLE]))
            table, fields, partition = "accounts", ACCOUNT_FIELDS, key["account_id"] % 3
        op = rng.choice(["c", "u", "u", "d", "r"])
        value = dbz(op, None if op == "d" else row, key if op == "d" else None, lsn=lsn,
                    schema=rng.random() < 0.5, table=table, fields=fields)  # fmt: skip
        topic = f"{prefix}.public.{table}"
        records.append((topic, partition, json.dumps(value).encode()))
        if op == "d":
            records.append((topic, partition, None))  # the tombstone Debezium writes
    records.insert(count // 2, (f"{prefix}.public.accounts", 0, b"\x00not json"))
    records.insert(count // 3, (f"{prefix}.public.nobody", 0, b'{"op": "c"}'))
    return records


def topics(prefix: str, accounts_partitions: int = 3, bootstrap: str = BOOTSTRAP) -> None:
    create_topic(f"{prefix}.public.accounts", accounts_partitions, bootstrap)
    create_topic(f"{prefix}.public.orders", 1, bootstrap)
    create_topic(f"{prefix}.public.nobody", 1, bootstrap)


def rows(config: CdcflowConfig, name: str) -> list[dict[str, Any]]:
    return read_arrow(DeltaTable(config.table_uri(name))).to_pylist()


def delivered(config: CdcflowConfig) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every record in Bronze, a quarantine or skipped."""
    out = []
    for name in ("bronze/accounts_events", "bronze/orders_events"):
        out += [_position(r["raw_payload"]) for r in rows(config, name)]
    for name in ("quarantine/accounts_events", "quarantine/orders_events",
                 "quarantine/unrouted_events"):  # fmt: skip
        out += [_position(r["raw_line"]) for r in rows(config, name)]
    for r in rows(config, "audit/skipped_records"):
        line = Path(r["source_file"]).read_text().splitlines()[r["source_line"] - 1]
        out.append(_position(line))
    return sorted(out)


def _position(line: str) -> tuple[str, int, int]:
    head = json.loads(line)["_kafka"]
    return head["topic"], head["partition"], head["offset"]


def in_kafka(prefix: str, bootstrap: str = BOOTSTRAP) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every record of the prefix's topics."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}"})
    out = []
    try:
        for name, topic in consumer.list_topics(timeout=10).topics.items():
            if not name.startswith(prefix + "."):
                continue
            for p in topic.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                out += [(name, p, o) for o in range(low, high)]
    finally:
        consumer.close()
    return sorted(out)


def expected(config: CdcflowConfig, values: list[tuple[str, int | None, bytes | None]]) -> dict:
    """Each table's reference fold of the first valid copy of each produced event."""
    router = Router.of(config)
    out = {}
    for contract in config.contracts():
        validator = ContractValidator(contract, NOW + timedelta(hours=1), timedelta(minutes=5))
        first: dict[str, ChangeEvent] = {}
        for topic, _, value in values:
            if value is None or not topic.endswith("." + contract.name):
                continue
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            route = router.decode(contract.name, parsed)
            if route.record is None:
                continue
            event = validator.validate_object(route.record)
            if isinstance(event, ChangeEvent):
                first.setdefault(event.event_id, event)
        out[contract.name] = fold_changes(list(first.values()), contract, "soft").rows
    return out


def assert_silver(config: CdcflowConfig, want: dict) -> None:
    for contract in config.contracts():
        got = {
            tuple(r[k] for k in contract.keys): r for r in rows(config, contract.table_names.silver)
        }
        assert set(got) == set(want[contract.name]), contract.name
        for key, row in want[contract.name].items():
            assert {c: got[key][c] for c in row} == row, (contract.name, key)


def test_partitions_tombstones_new_partitions_and_redelivery(
    kafka_broker: str, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    topics(prefix)
    first = workload(prefix, seed=1, count=60)
    produce(first)
    config = write_config(tmp_path, prefix, group_id=f"cdcflow-{prefix}")
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert len(reports) >= 3  # max_records_per_trigger cut the records into micro-batches
    assert delivered(config) == in_kafka(prefix)  # each record exactly once
    skipped = rows(config, "audit/skipped_records")
    assert sum(r["kind"] == "tombstone" for r in skipped) == sum(v is None for *_, v in first)
    unrouted = {r["failure_reason"] for r in rows(config, "quarantine/unrouted_events")}
    assert unrouted == {"UNKNOWN_TABLE"}
    bad = [
        r for r in rows(config, "quarantine/accounts_events") if "not JSON" in r["failure_detail"]
    ]
    assert len(bad) == 1 and bad[0]["failure_reason"] == "MALFORMED_JSON"
    assert_silver(config, expected(config, first))

    # a partition added while running, and more records
    add_partitions(f"{prefix}.public.accounts", 4)
    second = [(t, 3 if p is not None else None, v) for t, p, v in workload(prefix, 2, 20)]
    produce(second)
    Pipeline(config).run(Trigger.parse("available-now"))
    assert delivered(config) == in_kafka(prefix)
    assert any(p == 3 for _, p, _ in delivered(config))
    assert_silver(config, expected(config, first + second))

    # the monitoring commits of the consumer group reached every partition's end
    from confluent_kafka import Consumer, TopicPartition

    watcher = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"cdcflow-{prefix}"})
    try:
        committed = watcher.committed(
            [TopicPartition(f"{prefix}.public.accounts", p) for p in range(4)], timeout=10
        )
        assert [tp.offset for tp in committed] == [
            watcher.get_watermark_offsets(TopicPartition(f"{prefix}.public.accounts", p))[1]
            for p in range(4)
        ]
    finally:
        watcher.close()

    # every record delivered again (the source state reset): exact duplicates, Silver unchanged
    before = {c.name: rows(config, c.table_names.silver) for c in config.contracts()}
    (Path(config.checkpoint.location) / "kafka_source.json").unlink()
    for file in Path(config.source.path).glob("kafka_*.jsonl"):
        file.unlink()
    Pipeline(config).run(Trigger.parse("available-now"))
    for name in ("bronze/accounts_events", "bronze/orders_events"):
        copies = rows(config, name)
        assert sum(r["is_duplicate"] for r in copies) == len(copies) // 2
    for contract in config.contracts():
        after = rows(config, contract.table_names.silver)
        names = contract.keys
        assert sorted(after, key=lambda r: [r[k] for k in names]) == sorted(
            before[contract.name], key=lambda r: [r[k] for k in names]
        )


def cli(config: CdcflowConfig, crash_at: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ}
    env.pop("CDCFLOW_CRASH_AT", None)
    if crash_at:
        env["CDCFLOW_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "cdcflow", "run", "--config", config.file],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kafka_script(name: str, env: dict[str, str]) -> str:
    """Run ``scripts/kafka/<name>``; its output, or a failure with its output."""
    done = subprocess.run(
        ["bash", f"scripts/kafka/{name}"], cwd=REPO, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def own_broker(kafka_broker: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A broker of this test's own (``scripts/kafka/start.sh`` with another home and ports, the
    jars of the shared one), for a test that stops it: the shared broker serves the tests of
    the other xdist workers meanwhile. Yields the scripts' environment; stopped afterwards."""
    home = tmp_path / "kafka"
    home.mkdir()
    shared = Path(os.environ.get("CDCFLOW_KAFKA_HOME", REPO / ".kafka"))
    (home / "lib").symlink_to(shared.resolve() / "lib")  # installed by kafka_broker's start
    env = {"CDCFLOW_KAFKA_HOME": str(home), "CDCFLOW_KAFKA_PORT": str(unused_port()),
           "CDCFLOW_KAFKA_CONTROLLER_PORT": str(unused_port())}  # fmt: skip
    kafka_script("start.sh", env)
    try:
        yield env
    finally:
        kafka_script("stop.sh", env)


@pytest.mark.slow
def test_kill_9_while_consuming_and_a_broker_restart(
    own_broker: dict[str, str], tmp_path: Path
) -> None:
    bootstrap = f"127.0.0.1:{own_broker['CDCFLOW_KAFKA_PORT']}"
    prefix = f"k{uuid.uuid4().hex[:8]}"
    topics(prefix, bootstrap=bootstrap)
    values = workload(prefix, seed=3, count=90)
    produce(values, bootstrap)
    config = write_config(tmp_path, prefix, bootstrap, max_records=20)
    # at the source's crash points, then at other points of a batch
    for point in ("after_source_plan@0", "after_source_staged@0", "after_offsets@1",
                  "after_source_plan@2", "after_silver_merge@2", "after_commit@3"):  # fmt: skip
        child = cli(config, point)
        _, err = child.communicate(timeout=300)
        assert child.returncode == -signal.SIGKILL, (point, err)
    # kill -9 at random moments
    rng = random.Random(7)
    for _ in range(3):
        child = cli(config)
        time.sleep(rng.uniform(2.0, 6.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    # the broker restarts mid-run: a run fails while it is down, and recovers after
    kafka_script("stop.sh", own_broker)
    try:
        child = cli(config)
        _, err = child.communicate(timeout=300)
        assert child.returncode == 1 and "Kafka" in err, err
        assert "Traceback" not in err
    finally:
        kafka_script("start.sh", own_broker)
    child = cli(config)
    _, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert delivered(config) == in_kafka(prefix, bootstrap)
    for name in ("bronze/accounts_events", "bronze/orders_events"):
        assert not any(r["is_duplicate"] for r in rows(config, name)), name
    assert_silver(config, expected(config, values))


@settings(max_examples=3, deadline=None)
@given(data=debezium_stream())
def test_shuffled_streams_through_kafka(
    kafka_broker: str, tmp_path_factory: pytest.TempPathFactory, data: tuple[list[str], list[int]]
) -> None:
    """The property test's shuffled Debezium streams, produced to Kafka (each table's topic)."""
    lines, _ = data
    prefix = f"p{uuid.uuid4().hex[:8]}"
    topics(prefix, accounts_partitions=2)
    records: list[tuple[str, int | None, bytes | None]] = []
    for line in lines:
        value = json.loads(line)
        payload = value.get("payload", value) if isinstance(value, dict) else None
        source = payload.get("source") if isinstance(payload, dict) else None
        table = source["table"] if isinstance(source, dict) else "accounts"
        records.append((f"{prefix}.public.{table}", None, None if value is None else line.encode()))
    produce(records)
    config = write_config(tmp_path_factory.mktemp("kafka"), prefix, max_records=7)
    Pipeline(config).run(Trigger.parse("available-now"))
    assert delivered(config) == in_kafka(prefix)
    assert_silver(config, expected(config, records))


def test_debezium_postgres_connector_end_to_end(
    pg_server: str, kafka_connect: str, tmp_path: Path
) -> None:
    """PostgreSQL → the real Debezium connector → Kafka → cdcflow → Silver of two tables: a
    snapshot, inserts, updates (an unchanged TOASTed value), deletes, and an ``ALTER TABLE …
    ADD COLUMN`` mid-stream (evolved into Silver); then ``reconcile --source-snapshot
    postgres`` equal, and the end-to-end lag read from the outcomes."""
    import psycopg

    from cdcflow.sources.postgres_reconcile import SourceAheadError, reconcile_postgres_tables

    tag = uuid.uuid4().hex[:8]
    acc, orders = f"acc_{tag}", f"ord_{tag}"
    pg_port = int(pg_server.rsplit(":", 1)[1].split("/")[0])
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {acc} (id integer PRIMARY KEY, owner text, balance numeric(12,2), "
            "opened date, updated_at timestamptz, bio text)"
        )
        conn.execute(f"CREATE TABLE {orders} (order_id integer PRIMARY KEY, account_id integer, "
                     "amount numeric(10,2))")  # fmt: skip
        big = "md5(random()::text) || repeat(md5(random()::text), 200)"  # TOASTed, uncompressible
        conn.execute(
            f"INSERT INTO {acc} SELECT g, 'owner ' || g, g * 10.25, DATE '2020-01-01' + g, "
            f"TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * INTERVAL '1 hour', {big} "
            "FROM generate_series(1, 30) g"
        )
    env = {
        **os.environ,
        "CDCFLOW_PG_PORT": str(pg_port),
        "CDCFLOW_PG_DB": pg_server.rsplit("/", 1)[1],
    }
    register = subprocess.run(
        ["bash", "scripts/kafka/connector.sh", "--name", f"dbz-{tag}", "--tables",
         f"public.{acc},public.{orders}", "--prefix", f"dbz{tag}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert register.returncode == 0, register.stdout + register.stderr
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            for i in range(1, 31, 3):
                conn.execute(f"UPDATE {acc} SET balance = balance + 1 WHERE id = %s", (i,))
            conn.execute(f"DELETE FROM {acc} WHERE id % 7 = 0")
            conn.execute(f"INSERT INTO {orders} SELECT g, g % 30 + 1, g * 1.5 "
                         "FROM generate_series(1, 40) g")  # fmt: skip
            conn.execute(f"ALTER TABLE {acc} ADD COLUMN tier text")  # a compatible change
            conn.execute(f"UPDATE {acc} SET tier = 'gold' WHERE id % 2 = 0")
            conn.execute(f"INSERT INTO {acc} (id, owner, tier) VALUES (100, 'new', 'silver')")
            with conn.transaction():
                conn.execute(f"UPDATE {orders} SET amount = amount * 2 WHERE order_id <= 10")
                conn.execute(f"DELETE FROM {orders} WHERE order_id > 35")
        accounts = {
            "name": acc,
            "keys": ["id"],
            "unknown_fields": "evolve",
            "columns": [
                {"name": "id", "type": "integer"},
                {"name": "owner", "type": "string", "pii": True},
                {"name": "balance", "type": "decimal(12,2)"},
                {"name": "opened", "type": "date"},
                {"name": "updated_at", "type": "timestamp"},
                {"name": "bio", "type": "string"},
            ],
        }
        order_table = {
            "name": orders,
            "keys": ["order_id"],
            "columns": [
                {"name": "order_id", "type": "integer"},
                {"name": "account_id", "type": "integer"},
                {"name": "amount", "type": "decimal(10,2)"},
            ],
        }
        raw = {
            "pipeline": {"name": "dbz"},
            "storage": {"root": str(tmp_path / "lake")},
            "source": {
                "type": "kafka", "format": "debezium", "path": str(tmp_path / "landing"),
                "kafka": {"bootstrap_servers": BOOTSTRAP, "topic_pattern": rf"dbz{tag}\..*",
                          "poll_timeout": "20s"},
                "postgres": {"port": pg_port, "dbname": pg_server.rsplit("/", 1)[1]},
            },
            "checkpoint": {"location": str(tmp_path / "lake" / "_checkpoints" / "dbz")},
            "tables": [accounts, order_table],
            "logging": {"level": "WARNING"},
        }  # fmt: skip
        (tmp_path / "cdcflow.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        config = load_config(tmp_path / "cdcflow.yaml")
        # Debezium ships the changes within a few seconds on an idle machine; on a loaded CI
        # machine (load 8-15 on 2 cores) its snapshot once took over 90 s: the loop ends as soon
        # as Silver equals the source, the deadline only bounds a connector that never ships
        deadline = time.monotonic() + 300
        while True:
            Pipeline(config).run(Trigger.parse("available-now"))
            try:
                reports = reconcile_postgres_tables(config)
            except SourceAheadError:  # more changes reached Kafka since the run: run again
                if time.monotonic() > deadline:
                    raise
                continue
            if all(r.ok for r in reports.values()) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert all(r.ok for r in reports.values()), {n: r.to_json() for n, r in reports.items()}
        silver = {r["id"]: r for r in rows(config, f"silver/{acc}")}
        assert silver[100]["tier"] == "silver" and silver[2]["tier"] == "gold"  # evolved column
        assert silver[7]["is_deleted"] and len(silver[4]["bio"]) > 6000  # TOAST kept
        operations = {r["operation"] for r in rows(config, f"bronze/{acc}_events")}
        assert operations == {"INSERT", "UPDATE", "DELETE"}
        assert rows(config, "audit/skipped_records")  # the tombstones after the deletes
        lags = sorted(r["lag_s"] for r in rows(config, f"audit/{acc}_event_outcomes"))
        assert lags and all(lag >= 0 for lag in lags)
        # the CLI says the same
        done = subprocess.run(
            [sys.executable, "-m", "cdcflow", "reconcile", "--config", config.file,
             "--source-snapshot", "postgres"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "MATCH" in done.stdout, done.stdout + done.stderr
    finally:
        subprocess.run(
            ["bash", "scripts/kafka/connector.sh", "--delete", f"dbz-{tag}", "--drop-slot"],
            cwd=REPO, env=env, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {acc}, {orders}")


def test_starting_offsets_latest_and_a_timestamp(kafka_broker: str, tmp_path: Path) -> None:
    """A partition seen for the first time starts at ``starting_offsets``: ``latest`` skips
    what the topic held before the first run; an instant starts at the first record at or
    after it."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    topics(prefix, accounts_partitions=1)
    topic = f"{prefix}.public.accounts"

    def batch(first: int) -> list[tuple[str, int | None, bytes | None]]:
        return [(topic, 0, json.dumps(dbz("c", account_row(i), lsn=100 + i)).encode())
                for i in range(first, first + 3)]  # fmt: skip

    produce(batch(1))
    latest = write_config(tmp_path / "latest", prefix, starting_offsets="latest")
    assert Pipeline(latest).run(Trigger.parse("available-now")) == []
    time.sleep(1.1)
    middle = datetime.now(UTC)
    time.sleep(1.1)
    produce(batch(4))
    Pipeline(latest).run(Trigger.parse("available-now"))
    assert sorted(r["account_id"] for r in rows(latest, "silver/accounts")) == [4, 5, 6]
    since = write_config(tmp_path / "since", prefix, starting_offsets=middle.isoformat())
    Pipeline(since).run(Trigger.parse("available-now"))
    assert sorted(r["account_id"] for r in rows(since, "silver/accounts")) == [4, 5, 6]
    # a partition added later is read from its beginning, whatever starting_offsets says
    add_partitions(topic, 2)
    produce([(topic, 1, json.dumps(dbz("c", account_row(9), lsn=900)).encode())])
    Pipeline(latest).run(Trigger.parse("available-now"))
    assert sorted(r["account_id"] for r in rows(latest, "silver/accounts")) == [4, 5, 6, 9]


def test_a_naive_instant_is_utc_and_applies_to_every_partition_of_the_first_trigger(
    kafka_broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``starting_offsets`` without an offset is UTC whatever the machine's time zone, and it
    places every partition of the first trigger, also those past the trigger's record budget
    (a later trigger does not start them at their beginning)."""
    prefix = f"n{uuid.uuid4().hex[:8]}"
    topics(prefix, accounts_partitions=3)
    topic = f"{prefix}.public.accounts"

    def batch(first: int) -> list[tuple[str, int | None, bytes | None]]:
        return [(topic, p, json.dumps(dbz("c", account_row(first + 10 * p + i),
                                          lsn=first + 10 * p + i)).encode())
                for p in range(3) for i in range(2)]  # fmt: skip

    produce(batch(100))
    time.sleep(1.1)
    middle = datetime.now(UTC).replace(tzinfo=None)  # naive: UTC
    time.sleep(1.1)
    produce(batch(200))
    monkeypatch.setenv("TZ", "America/Los_Angeles")  # 8 hours behind: a local reading skips all
    time.tzset()
    try:
        since = write_config(tmp_path, prefix, starting_offsets=middle.isoformat(), max_records=2)
        Pipeline(since).run(Trigger.parse("available-now"))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    want = sorted(200 + 10 * p + i for p in range(3) for i in range(2))
    assert sorted(r["account_id"] for r in rows(since, "silver/accounts")) == want


def test_a_recreated_or_compacted_topic_stops_the_run(kafka_broker: str, tmp_path: Path) -> None:
    """A topic deleted and created again (its topic id changed), even one that has grown past
    the position cdcflow kept, and a topic whose ``cleanup.policy`` compacts stop the run with
    an error that says what to do: no record of either is skipped silently."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from cdcflow.sources.kafka import KafkaSourceError

    prefix = f"r{uuid.uuid4().hex[:8]}"
    topics(prefix, accounts_partitions=1)
    topic = f"{prefix}.public.accounts"
    produce([(topic, 0, json.dumps(dbz("c", account_row(i), lsn=i)).encode()) for i in (1, 2)])
    config = write_config(tmp_path / "recreated", prefix)
    Pipeline(config).run(Trigger.parse("available-now"))
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(timeout=60)
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    create_topic(topic, 1)
    produce([(topic, 0, json.dumps(dbz("c", account_row(i), lsn=100 + i)).encode())
             for i in range(1, 6)])  # fmt: skip
    with pytest.raises(KafkaSourceError, match="deleted and created again"):
        Pipeline(config).run(Trigger.parse("available-now"))
    assert sorted(r["account_id"] for r in rows(config, "silver/accounts")) == [1, 2]

    compacted = f"c{uuid.uuid4().hex[:8]}"
    topics(compacted, accounts_partitions=1)
    name = f"{compacted}.public.accounts"
    futures = admin.create_topics(
        [NewTopic(f"{compacted}.public.ledger", 1, 1, config={"cleanup.policy": "compact"})]
    )
    for future in futures.values():
        future.result(timeout=60)
    produce([(name, 0, json.dumps(dbz("c", account_row(1), lsn=1)).encode())])
    with pytest.raises(KafkaSourceError, match=r"cleanup\.policy=compact"):
        Pipeline(write_config(tmp_path / "compacted", compacted)).run(
            Trigger.parse("available-now")
        )


def test_a_value_that_is_not_utf8_is_quarantined_and_a_bom_is_ignored() -> None:
    """A Kafka value whose bytes are not UTF-8 is ``MALFORMED_JSON`` (as such a landing line
    is), never accepted as altered text; a leading byte order mark is ignored."""
    from cdcflow.sources.kafka import envelope_line

    router = Router([ACCOUNTS_CONTRACT], "debezium", topic_tables={})
    good = json.dumps(dbz("c", account_row(1, owner="a"), lsn=1)).encode()
    bad = good.replace(b'"a"', b'"a\xff"')
    assert bad != good
    route = router.route(envelope_line("shop.public.accounts", 0, 4, None, bad).encode())
    assert route.rejection is not None and route.rejection.reason == "MALFORMED_JSON"
    assert route.rejection.detail.startswith("not valid UTF-8 at byte"), route.rejection
    bom = envelope_line("shop.public.accounts", 0, 5, None, b"\xef\xbb\xbf" + good)
    assert router.route(bom.encode()) == router.route(
        envelope_line("shop.public.accounts", 0, 5, None, good).encode()
    )
    assert router.route(bom.encode()).record is not None


def test_a_staged_file_cut_across_micro_batches_is_committed_with_its_last_part(
    tmp_path: Path,
) -> None:
    """A staged file split by the trigger's byte limit counts as committed (so its records
    are no longer pending, and its ranges go to the consumer group) only once the micro-batch
    holding its last part has committed."""
    from cdcflow.sources.files import LandingFile
    from cdcflow.sources.postgres import committed_paths
    from cdcflow.state.checkpoint import BatchOffsets, Checkpoint

    config = write_config(tmp_path, "x")
    checkpoint = Checkpoint.of(config)
    path = str(tmp_path / "landing" / "kafka_00000000.jsonl")
    first = LandingFile(path, 100, 1, cut=True)
    rest = LandingFile(path, 250, 1, start=100, change="continued")
    checkpoint.write_offsets(BatchOffsets(0, NOW, (first,)))
    checkpoint.write_commit(0, {"files": 1})
    assert path not in committed_paths(checkpoint)
    checkpoint.write_offsets(BatchOffsets(1, NOW, (rest,)))
    checkpoint.write_commit(1, {"files": 1})
    assert path in committed_paths(checkpoint)


def test_offsets_that_go_back_and_a_corrupt_state_stop_the_run(tmp_path: Path) -> None:
    """A partition whose offsets went back (the topic deleted and created again) and an
    unreadable write-ahead state are errors that name the cause, never records skipped."""
    from cdcflow.sources.kafka import KafkaSource, KafkaSourceError

    source = KafkaSource(write_config(tmp_path, "x"))
    source._partitions = lambda consumer: [("x.public.accounts", 0)]  # type: ignore[method-assign]
    source._watermarks = lambda consumer, t, p: (0, 5)  # type: ignore[method-assign]
    source._check_topics = lambda topics: None  # type: ignore[method-assign]
    with pytest.raises(KafkaSourceError, match="went back from 100 to 5"):
        source._plan(None, {"x.public.accounts:0": 100}, "kafka_00000001.jsonl")
    for corrupt in ('{"next": [], "plans": []}', '{"next": {"a:0": 1e400}, "plans": []}', "{"):
        source.state.replace("kafka_source.json", corrupt.encode())
        with pytest.raises(KafkaSourceError, match="unreadable source state"):
            source._load()


def test_the_source_state_on_an_object_store_checkpoint(
    kafka_broker: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The lakehouse and the checkpoint on S3 (the landing folder local): the write-ahead
    state is an object of the checkpoint, each record is delivered once, Silver is what a run
    with a local checkpoint makes of the same topics, and a second run finds nothing new."""
    from cdcflow.state.storage import ObjectStorage
    from tests.conftest import fresh_prefix

    request.getfixturevalue("s3_server")
    prefix = f"o{uuid.uuid4().hex[:8]}"
    topics(prefix)
    records = workload(prefix, seed=5, count=40)
    produce(records)
    local = write_config(tmp_path / "local", prefix, group_id=f"local-{prefix}")
    Pipeline(local).run(Trigger.parse("available-now"))
    remote = write_config(
        tmp_path / "remote", prefix, lake=fresh_prefix("s3", "kafka-state"),
        group_id=f"remote-{prefix}",
    )  # fmt: skip
    reports = Pipeline(remote).run(Trigger.parse("available-now"))
    assert len(reports) >= 2
    assert delivered(remote) == in_kafka(prefix)  # each record exactly once
    assert_silver(remote, expected(remote, records))
    for contract in remote.contracts():
        name = contract.table_names.silver
        by_key = sorted(rows(remote, name), key=lambda r: [r[k] for k in contract.keys])
        assert by_key == sorted(rows(local, name), key=lambda r: [r[k] for k in contract.keys])
    state = ObjectStorage(remote.checkpoint.location).read("kafka_source.json")
    assert state is not None and sum(json.loads(state)["next"].values()) == len(records)
    assert not (tmp_path / "remote" / "lake").exists()  # nothing local but the landing
    assert Pipeline(remote).run(Trigger.parse("available-now")) == []


def test_a_pattern_that_matches_no_topic_says_so(kafka_broker: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, f"none{uuid.uuid4().hex[:8]}")
    done = subprocess.run(
        [sys.executable, "-m", "cdcflow", "run", "--config", config.file],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no Kafka topic matches source.kafka" in done.stdout


def test_status_shows_the_consumer_lag(kafka_broker: str, tmp_path: Path) -> None:
    """``cdcflow status``'s backlog of a Kafka source: the records the topics hold beyond what
    the pipeline staged and committed (``KafkaSource.pending``), 0 once it has caught up."""
    from cdcflow.layers.status import pipeline_status

    prefix = f"s{uuid.uuid4().hex[:8]}"
    topics(prefix, accounts_partitions=2)
    topic = f"{prefix}.public.accounts"
    first = [(topic, i % 2, json.dumps(dbz("c", account_row(i), lsn=100 + i)).encode())
             for i in range(1, 8)]  # fmt: skip
    produce(first)
    config = write_config(tmp_path, prefix)
    assert pipeline_status(config).backlog.source_records == len(first)  # nothing staged yet
    Pipeline(config).run(Trigger.parse("available-now"))
    assert pipeline_status(config).backlog.source_records == 0
    produce(first[:3])  # three more deliveries
    backlog = pipeline_status(config).backlog
    assert (backlog.source_records, backlog.source_error) == (3, "")
    down = write_config(tmp_path / "down", prefix, bootstrap="127.0.0.1:9")
    unknown = pipeline_status(down).backlog
    assert unknown.source_records is None and "cannot reach Kafka" in unknown.source_error
