"""PostgreSQL logical replication source, against a real PostgreSQL started by the test set-up.

The session fixture ``pg_server`` (tests/conftest.py) runs ``scripts/postgres/start.sh`` (data
folder ``$CDCFLOW_PG_DATA``, default ``<repo>/.pgdata``; port ``$CDCFLOW_PG_PORT``, default 55432).
If PostgreSQL cannot be started, these tests fail — they never skip. Each test gets its own
database and replication slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pytest
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow
from cdcflow.model.lsn import parse_lsn
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.reference import SILVER_COLUMNS
from cdcflow.sources.postgres import STATE_FILE, PostgresSource, confirmed_lsn, connection
from cdcflow.sources.postgres_reconcile import SourceAheadError, reconcile_postgres
from cdcflow.sources.postgres_workload import create_table, run_workload
from cdcflow.state.faults import CRASH_EXIT_CODE
from tests.crashkit import assert_same_tables, snapshot

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[1]
PORT = int(os.environ.get("CDCFLOW_PG_PORT", "55432"))


def read_silver(config: CdcflowConfig) -> pl.DataFrame:
    """Silver's public columns (one row per customer_id)."""
    table = DeltaTable(config.table_uri("silver/customers"))
    return pl.scan_delta(table).select(list(SILVER_COLUMNS)).collect()


class PgLake:
    """One test database with a ``customers`` table, plus a pipeline streaming it."""

    def __init__(self, root: Path, dbname: str, max_changes: int = 10_000) -> None:
        self.root = root
        self.dbname = dbname
        self.slot = f"s_{dbname}"
        self.config = self.make_config(max_changes)

    def make_config(self, max_changes: int) -> CdcflowConfig:
        return CdcflowConfig(
            storage={"root": str(self.root / "lake")},
            source={
                "type": "postgres",
                "path": str(self.root / "landing"),
                "postgres": {
                    "host": "127.0.0.1",
                    "port": PORT,
                    "dbname": self.dbname,
                    "user": "postgres",
                    "slot_name": self.slot,
                    "table": "public.customers",
                    "max_changes_per_batch": max_changes,
                },
            },
            checkpoint={"location": str(self.root / "lake" / "_checkpoints" / "customers")},
        )

    def sql(self, *statements: str) -> None:
        """Run statements as ONE transaction."""
        with psycopg.connect(self.dsn) as conn:
            for statement in statements:
                conn.execute(statement)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{PORT}/{self.dbname}"

    def run(self, trigger: str = "available-now") -> list[Any]:
        return Pipeline(self.config).run(Trigger.parse(trigger))

    def table(self, name: str) -> pl.DataFrame:
        frame = pl.from_arrow(read_arrow(DeltaTable(self.config.table_uri(name))))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def source_rows(self) -> dict[str, tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT customer_id, customer_name, email, phone, city, country, status "
                "FROM customers"
            ).fetchall()
        return {r[0]: r[1:] for r in rows}

    def confirmed(self) -> int:
        with connection(self.config.source.postgres) as conn:
            return confirmed_lsn(conn, self.slot)


@pytest.fixture
def pg(pg_server: str, tmp_path: Path) -> Iterator[PgLake]:
    """A fresh database with the customers table and the slot created (before any change)."""
    dbname = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    lake = PgLake(tmp_path, dbname)
    with psycopg.connect(lake.dsn, autocommit=True) as conn:
        create_table(conn)
        # an autovacuum ANALYZE after a workload is a transaction of this database: a slot
        # read after it ends its last range at a later commit than a slot read before it, so
        # the tests that compare two slots' ranges would depend on the autovacuum daemon's timing
        conn.execute("ALTER TABLE customers SET (autovacuum_enabled = false)")
    assert lake.run("once") == []  # creates the slot; nothing to stream yet
    yield lake
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (lake.slot,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _assert_reconciles(lake: PgLake) -> None:
    report = reconcile_postgres(lake.config, read_silver(lake.config))
    assert report.ok, report.to_json()
    live = lake.source_rows()
    assert report.matched_rows == len(live)
    silver = lake.table("silver/customers").filter(~pl.col("is_deleted"))
    assert set(silver["customer_id"].to_list()) == set(live)


# -- pure conversion ---------------------------------------------------------------------------


def _change(action: str, lsn: str, cid: str, xid: int = 9, **values: str) -> str:
    change: dict[str, Any] = {
        "action": action,
        "xid": xid,
        "timestamp": "2025-05-12 10:00:00.5+02",
        "lsn": lsn,
        "schema": "public",
        "table": "customers",
    }
    if action == "D":
        change["identity"] = [{"name": "customer_id", "type": "text", "value": cid}]
    else:
        cols = {"customer_id": cid, **values}
        change["columns"] = [{"name": k, "type": "text", "value": v} for k, v in cols.items()]
    return json.dumps(change)


# -- against PostgreSQL ------------------------------------------------------------------------


@pytest.mark.slow
def test_workload_streams_in_micro_batches_and_reconciles(pg: PgLake) -> None:
    pg.config = pg.make_config(max_changes=700)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        summary = run_workload(conn, customers=150, transactions=1200, seed=11)
    assert summary.transactions + summary.rolled_back == 6 + 1200  # 6 registration batches
    assert summary.kinds["reregister_same_tx"] > 0 and summary.rolled_back > 0
    with pytest.raises(SourceAheadError):
        reconcile_postgres(pg.config, read_silver(pg.config))
    reports = pg.run()
    assert len(reports) >= 3  # several micro-batches
    assert sum(r.quarantined for r in reports) == 0
    assert sum(r.duplicates for r in reports) == 0
    assert sum(r.deletes for r in reports) >= summary.kinds["gdpr_delete"]
    _assert_reconciles(pg)
    state = json.loads((Path(pg.config.checkpoint.location) / STATE_FILE).read_text())
    assert all(f["acknowledged"] for f in state["staged"])
    assert pg.confirmed() == parse_lsn(state["staged"][-1]["end_lsn"])
    # a second run finds nothing new
    assert pg.run() == []


def test_status_shows_the_slot_lag_and_an_unreachable_database(pg: PgLake) -> None:
    """``cdcflow status``'s backlog of a PostgreSQL source: the WAL the slot holds beyond its
    confirmed position, falling once a run commits; a database that cannot be reached is
    named, and makes ``status --check`` unhealthy (found by a new-user trial: status said
    nothing about a source that was down)."""
    from cdcflow.layers.status import pipeline_status

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        run_workload(conn, customers=20, transactions=60, seed=3)
    before = pipeline_status(pg.config).backlog
    assert before.source_error == "" and before.source_wal_bytes is not None
    assert before.source_wal_bytes > 0
    assert pg.run()
    after = pipeline_status(pg.config).backlog.source_wal_bytes
    assert after is not None and after < before.source_wal_bytes
    raw = pg.config.model_dump(mode="json", by_alias=True)
    raw["source"]["postgres"]["port"] = 9
    down = pipeline_status(CdcflowConfig.model_validate(raw))
    assert down.backlog.source_wal_bytes is None
    assert "cannot connect to PostgreSQL at 127.0.0.1:9" in down.backlog.source_error
    assert any(p.startswith("source: cannot connect to PostgreSQL") for p in down.problems)


def test_the_source_state_on_an_object_store_checkpoint(
    pg: PgLake, request: pytest.FixtureRequest
) -> None:
    """The lakehouse and the checkpoint on S3 (the staged files in the local landing folder):
    the source state is an object of the checkpoint, the slot advances past every committed
    staged file, Silver reconciles with the table, and a second run finds nothing new."""
    from cdcflow.state.storage import ObjectStorage
    from tests.conftest import fresh_prefix

    request.getfixturevalue("s3_server")
    lake = fresh_prefix("s3", "pg-state")
    raw = pg.make_config(max_changes=150).model_dump(mode="json", by_alias=True)
    raw["storage"]["root"] = lake
    raw["checkpoint"]["location"] = f"{lake}/_checkpoints/customers"
    pg.config = CdcflowConfig.model_validate(raw)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        run_workload(conn, customers=30, transactions=120, seed=5)
    reports = pg.run()
    assert len(reports) >= 2
    _assert_reconciles(pg)
    stored = ObjectStorage(pg.config.checkpoint.location).read(STATE_FILE)
    assert stored is not None
    staged = json.loads(stored)["staged"]
    assert staged and all(f["acknowledged"] for f in staged)
    assert pg.confirmed() == parse_lsn(staged[-1]["end_lsn"])
    assert pg.run() == []


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_offsets", "after_silver", "before_commit"])
def test_crash_between_staging_and_commit_recovers(pg: PgLake, point: str) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        run_workload(conn, customers=40, transactions=150, seed=3)
    config_file = pg.root / "cdcflow.yaml"  # JSON is YAML
    env = {**os.environ, "CDCFLOW_CRASH_AT": f"{point}@1"}
    pg.config = pg.make_config(max_changes=200)
    config_file.write_text(json.dumps(pg.config.model_dump(mode="json", by_alias=True)))
    crashed = subprocess.run(
        [sys.executable, "-m", "cdcflow", "run", "--config", str(config_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-2000:]
    before = pg.confirmed()
    state = json.loads((Path(pg.config.checkpoint.location) / STATE_FILE).read_text())
    # the slot never moves past a staged file whose batch is not committed
    assert [f["acknowledged"] for f in state["staged"]] == [True, False]
    assert before == parse_lsn(state["staged"][0]["end_lsn"])
    reports = pg.run()
    assert reports and reports[0].batch_id == 1  # the crashed batch is re-run first
    _assert_reconciles(pg)
    bronze = pg.table("bronze/customer_events")
    assert bronze["event_id"].n_unique() == bronze.height  # nothing delivered twice
    assert pg.confirmed() > before


def _staged(lake: PgLake) -> list[dict[str, Any]]:
    """The source state's staged files, each with its file name instead of its path."""
    state = json.loads((Path(lake.config.checkpoint.location) / STATE_FILE).read_text())
    return [{**f, "path": Path(f["path"]).name} for f in state["staged"]]


@pytest.mark.slow
def test_crash_after_commit_before_slot_advance(pg: PgLake) -> None:
    """A lost acknowledgement is made up by the next run; the range is not staged again.

    A child ``cdcflow run`` is killed (``SIGKILL``) at ``after_commit`` of its middle
    micro-batch: the batch's commit marker is written, the slot is not advanced past it. The
    restart acknowledges the committed range, stages the next ones, and ends with the tables of an
    uninterrupted run over the same changes (a second slot on the same database, created before
    the workload, read by a second pipeline).
    """
    reference = PgLake(pg.root / "reference", pg.dbname)
    reference.slot = f"r_{pg.dbname}"
    reference.config = reference.make_config(max_changes=100)
    assert reference.run("once") == []  # creates its slot, before the workload
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            run_workload(conn, customers=20, transactions=60, seed=9)
        assert len(reference.run()) == 3
        pg.config = pg.make_config(max_changes=100)
        config_file = pg.root / "cdcflow.yaml"  # JSON is YAML
        config_file.write_text(json.dumps(pg.config.model_dump(mode="json", by_alias=True)))
        crashed = subprocess.run(
            [sys.executable, "-m", "cdcflow", "run", "--config", str(config_file)],
            env={**os.environ, "CDCFLOW_CRASH_AT": "after_commit@1"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-2000:]
        state = json.loads((Path(pg.config.checkpoint.location) / STATE_FILE).read_text())
        assert [f["acknowledged"] for f in state["staged"]] == [True, False]
        # committed, but the slot was not advanced past the batch
        assert pg.confirmed() == parse_lsn(state["staged"][0]["end_lsn"])
        reports = pg.run()
        assert [r.batch_id for r in reports] == [2]  # batch 1 is acknowledged, not re-run
        staged = _staged(pg)
        assert staged == _staged(reference)  # the same ranges, all acknowledged
        # (a slot may move on past later transactions without a change of the table)
        assert pg.confirmed() >= parse_lsn(staged[-1]["end_lsn"])
        _assert_reconciles(pg)
        assert_same_tables(pg, snapshot(reference))  # same ranges, files, tables
        assert len(list(Path(pg.config.source.path).iterdir())) == 3  # nothing staged twice
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (reference.slot,))


def test_lost_state_restages_exact_duplicates(pg: PgLake) -> None:
    """Re-peeked changes under another range produce DUPLICATE outcomes, never double effects."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        run_workload(conn, customers=20, transactions=60, seed=5)
    pg.config = pg.make_config(max_changes=50)
    first = PostgresSource(pg.config).stage(Pipeline(pg.config).checkpoint)
    assert first is not None and first.events > 0
    (Path(pg.config.checkpoint.location) / STATE_FILE).unlink()  # lost before any commit
    pg.config = pg.make_config(max_changes=10_000)
    reports = pg.run()
    assert sum(r.duplicates for r in reports) == first.events
    assert sum(r.quarantined for r in reports) == 0
    _assert_reconciles(pg)


@pytest.mark.parametrize("identity", ["default", "full"])
def test_deletes_and_reinserts_in_one_transaction(pg: PgLake, identity: str) -> None:
    pg.sql(f"ALTER TABLE customers REPLICA IDENTITY {identity.upper()}")
    cols = "(customer_id, customer_name, email, phone, city, country, status)"
    pg.sql(
        f"INSERT INTO customers {cols} VALUES ('C-1','Ana','a@x','1','Paris','FR','ACTIVE')",
        f"INSERT INTO customers {cols} VALUES ('C-2','Bo','b@x','2','Lyon','FR','ACTIVE')",
        f"INSERT INTO customers {cols} VALUES ('C-3','Cy','c@x','3','Rome','IT','ACTIVE')",
    )
    pg.sql(
        "DELETE FROM customers WHERE customer_id = 'C-1'",
        f"INSERT INTO customers {cols} VALUES ('C-1','Ana B','ab@x',NULL,'Nice','FR','INACTIVE')",
        "UPDATE customers SET city = 'Nantes' WHERE customer_id = 'C-1'",
        "UPDATE customers SET email = 'b2@x' WHERE customer_id = 'C-2'",
        "DELETE FROM customers WHERE customer_id = 'C-2'",
        "UPDATE customers SET customer_id = 'C-4' WHERE customer_id = 'C-3'",
    )
    reports = pg.run()
    assert sum(r.quarantined for r in reports) == 0
    _assert_reconciles(pg)
    silver = {r["customer_id"]: r for r in pg.table("silver/customers").to_dicts()}
    assert silver["C-1"]["city"] == "Nantes" and silver["C-1"]["phone"] is None
    assert silver["C-1"]["status"] == "INACTIVE" and not silver["C-1"]["is_deleted"]
    assert silver["C-2"]["is_deleted"] and silver["C-3"]["is_deleted"]
    assert silver["C-4"]["city"] == "Rome"


def test_truncate_is_quarantined_not_ignored(pg: PgLake) -> None:
    cols = "(customer_id, customer_name, email, phone, city, country, status)"
    pg.sql(f"INSERT INTO customers {cols} VALUES ('C-1','Ana','a@x','1','Paris','FR','ACTIVE')")
    pg.sql("TRUNCATE customers")
    reports = pg.run()
    assert sum(r.quarantined for r in reports) == 1
    quarantine = pg.table("quarantine/customer_events").to_dicts()
    assert len(quarantine) == 1
    raw = json.loads(quarantine[0]["raw_line"])
    assert raw["operation"] == "TRUNCATE" and "TRUNCATE" in raw["metadata"]["note"]
    # by policy the truncation is not applied: Silver still has C-1, and reconciliation says so
    report = reconcile_postgres(pg.config, read_silver(pg.config))
    assert not report.ok and report.extra_keys == 1
