"""Declared tables streamed from PostgreSQL: one replication slot, every declared table.

Against the real PostgreSQL of the test set-up (``pg_server``): two tables with typed columns
(``accounts``: a bigint key, numeric, date, timestamptz, boolean, double precision, jsonb;
``order_lines``: a composite key) and one table nobody declared, changed by transactions that
interleave the tables, update a row's key, delete, and re-insert. After each run each table's
Silver holds exactly the source table's live rows, typed; the undeclared table is never read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.pipeline import Pipeline, Trigger
from tests.test_tables_pipeline import contract_of, rows, silver

pytestmark = pytest.mark.postgres

TABLES = [
    {
        "name": "accounts",
        "keys": ["account_id"],
        "truncate": "apply",
        "columns": [
            {"name": "account_id", "type": "integer"},
            {"name": "owner", "type": "string", "pii": True},
            {"name": "balance", "type": "decimal(20,2)"},
            {"name": "opened_on", "type": "date"},
            {"name": "closed_at", "type": "timestamp"},
            {"name": "vip", "type": "boolean"},
            {"name": "rate", "type": "double"},
            {"name": "attributes", "type": "json"},
        ],
    },
    {
        "name": "order_lines",
        "keys": ["order_id", "line_no"],
        "delete_mode": "hard",
        "columns": [
            {"name": "order_id", "type": "string"},
            {"name": "line_no", "type": "integer"},
            {"name": "quantity", "type": "integer", "minimum": 1},
        ],
    },
]

DDL = [
    "CREATE TABLE accounts (account_id bigint PRIMARY KEY, owner text, balance numeric(20,2),"
    " opened_on date, closed_at timestamptz, vip boolean, rate double precision,"
    " attributes jsonb)",
    "CREATE TABLE order_lines (order_id text, line_no int, quantity int,"
    " PRIMARY KEY (order_id, line_no))",
    "CREATE TABLE audit_trail (id int PRIMARY KEY, note text)",  # not declared
]


class PgTables:
    """A fresh database with the tables and a pipeline of both declared tables streaming it."""

    def __init__(
        self,
        root: Path,
        server: str,
        tables: list[dict[str, Any]] = TABLES,
        ddl: list[str] = DDL,
    ) -> None:
        self.dbname = f"t_{uuid.uuid4().hex[:12]}"
        self.server = server
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.dbname}"')
        self.dsn = server.rsplit("/", 1)[0] + f"/{self.dbname}"
        self.sql(*ddl)
        raw = {
            "pipeline": {"name": "pgshop"},
            "storage": {"root": str(root / "lake")},
            "source": {
                "type": "postgres",
                "path": str(root / "landing"),
                "postgres": {"dsn": self.dsn, "slot_name": f"s_{self.dbname}"},
            },
            "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "pgshop")},
            "tables": tables,
        }
        root.mkdir(parents=True, exist_ok=True)
        (root / "cdcflow.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        self.config: CdcflowConfig = load_config(root / "cdcflow.yaml")

    def sql(self, *statements: str) -> None:
        """Run statements as ONE transaction."""
        with psycopg.connect(self.dsn) as conn:
            for statement in statements:
                conn.execute(statement)

    def live(self, query: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            found = conn.execute(query).fetchall()
        return {tuple(r[:-1]) if len(r) > 2 else (r[0],): tuple(r) for r in found}

    def run(self) -> list[Any]:
        return Pipeline(self.config).run(Trigger.parse("available-now"))

    def drop(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (self.config.source.postgres.slot_name,),
            )
            admin.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


@pytest.fixture
def pgt(pg_server: str, tmp_path: Path) -> Iterator[PgTables]:
    lake = PgTables(tmp_path, pg_server)
    assert lake.run() == []  # creates the slot; nothing to stream yet
    yield lake
    lake.drop()


def assert_silver_is_the_source(lake: PgTables) -> None:
    """Each declared table's live Silver rows are exactly the source table's rows, typed."""
    config = lake.config
    accounts = {
        key: row
        for key, row in silver(config, contract_of(config, "accounts")).items()
        if not row["is_deleted"]
    }
    with psycopg.connect(lake.dsn) as conn:
        source = conn.execute(
            "SELECT account_id, owner, balance, opened_on, closed_at, vip, rate, attributes::text"
            " FROM accounts"
        ).fetchall()
        lines = conn.execute("SELECT order_id, line_no, quantity FROM order_lines").fetchall()
    names = ["owner", "balance", "opened_on", "closed_at", "vip", "rate", "attributes"]
    got = {
        key[0]: tuple(
            row[n] if n != "attributes" or row[n] is None else yaml.safe_load(row[n]) for n in names
        )
        for key, row in accounts.items()
    }
    want = {r[0]: (*r[1:7], None if r[7] is None else yaml.safe_load(r[7])) for r in source}
    assert got == want
    order_lines = silver(config, contract_of(config, "order_lines"))
    assert {k: r["quantity"] for k, r in order_lines.items()} == {(r[0], r[1]): r[2] for r in lines}


def test_declared_tables_stream_from_one_slot(pgt: PgTables) -> None:
    pgt.sql(
        "INSERT INTO accounts VALUES (1, 'Ann', 12345678901234567.89, '2024-02-29',"
        ' \'2025-05-12 10:00:00+02\', true, 0.5, \'{"tags": ["a"], "n": 1}\')',
        "INSERT INTO order_lines VALUES ('O-1', 1, 2), ('O-1', 2, 1)",
        "INSERT INTO audit_trail VALUES (1, 'not declared')",
    )
    pgt.sql(
        "INSERT INTO accounts (account_id, owner) VALUES (2, 'Bo')",
        "UPDATE accounts SET balance = 10.50, vip = false WHERE account_id = 1",
        "UPDATE order_lines SET line_no = 3 WHERE order_id = 'O-1' AND line_no = 2",  # key change
        "DELETE FROM order_lines WHERE order_id = 'O-1' AND line_no = 1",
    )
    reports = pgt.run()
    assert reports and sum(r.quarantined for r in reports) == 0
    assert_silver_is_the_source(pgt)
    one = silver(pgt.config, contract_of(pgt.config, "accounts"))[(1,)]
    assert one["balance"] == Decimal("10.50") and one["opened_on"] == date(2024, 2, 29)
    assert one["closed_at"] == datetime(2025, 5, 12, 8, tzinfo=UTC)
    tombstones = rows(pgt.config, "silver/order_lines_tombstones")
    assert {(t["order_id"], t["line_no"]) for t in tombstones} == {("O-1", 1), ("O-1", 2)}
    # the undeclared table is not read at all (the slot filters it): nothing unrouted
    assert rows(pgt.config, "quarantine/unrouted_events") == []

    # later changes, one breaking the contract's constraint (quantity >= 1): quarantined
    pgt.sql(
        "DELETE FROM accounts WHERE account_id = 2",
        "INSERT INTO order_lines VALUES ('O-1', 1, 5)",  # re-insert after the hard delete
        "UPDATE order_lines SET quantity = 0 WHERE order_id = 'O-1' AND line_no = 3",
        "UPDATE accounts SET attributes = NULL WHERE account_id = 1",
    )
    pgt.run()
    accounts = silver(pgt.config, contract_of(pgt.config, "accounts"))
    assert accounts[(2,)]["is_deleted"] is True and accounts[(1,)]["attributes"] is None
    quarantined = rows(pgt.config, "quarantine/order_lines_events")
    assert [(r["failure_reason"], r["order_id"], r["line_no"]) for r in quarantined] == [
        ("SCHEMA_MISMATCH", "O-1", "3")
    ]
    lines = silver(pgt.config, contract_of(pgt.config, "order_lines"))
    assert {k: r["quantity"] for k, r in lines.items()} == {("O-1", 1): 5, ("O-1", 3): 1}
    # the whole history of both tables is in Bronze, once
    bronze = rows(pgt.config, "bronze/order_lines_events")
    assert sum(r["is_duplicate"] for r in bronze) == 0
    assert [r["operation"] for r in sorted(bronze, key=lambda r: r["sequence"])] == [
        "INSERT",
        "INSERT",
        "DELETE",
        "INSERT",
        "DELETE",
        "INSERT",
    ]
    # a TRUNCATE of a declared table is quarantined in that table, never applied
    pgt.sql("TRUNCATE order_lines")
    pgt.run()
    quarantined = rows(pgt.config, "quarantine/order_lines_events")
    truncated = [r for r in quarantined if '"TRUNCATE"' in r["raw_line"]]
    assert [r["failure_reason"] for r in truncated] == ["SOURCE_TRUNCATE"]
    assert silver(pgt.config, contract_of(pgt.config, "order_lines")) == lines
    # accounts applies its truncates (truncate: apply): every row is deleted at the TRUNCATE's
    # LSN, a row inserted after it in the same transaction stays
    pgt.sql("TRUNCATE accounts", "INSERT INTO accounts (account_id, owner) VALUES (9, 'Zoe')")
    pgt.run()
    accounts = silver(pgt.config, contract_of(pgt.config, "accounts"))
    deleted = {k: r["is_deleted"] for k, r in accounts.items()}
    assert deleted == {(1,): True, (2,): True, (9,): False}
    assert accounts[(9,)]["owner"] == "Zoe" and accounts[(1,)]["last_operation"] == "DELETE"
    [kept] = rows(pgt.config, "audit/source_truncates")
    assert kept["table_name"] == "accounts" and '"TRUNCATE"' in kept["raw_payload"]


def test_the_slot_streams_only_what_it_can_stream_exactly(pg_server: str, tmp_path: Path) -> None:
    """A declared table must exist in ``source.postgres.schema_name`` and carry its key in its
    replica identity, else the run refuses in one line; a table of the same name in another
    schema is not read; a key-changing UPDATE under REPLICA IDENTITY FULL keeps an unchanged
    TOASTed value (wal2json sends it only in the old row)."""
    from cdcflow.sources.postgres import PostgresSourceError

    big = {"name": "docs", "keys": ["id"], "columns": [
        {"name": "id", "type": "integer"}, {"name": "note", "type": "string"},
        {"name": "body", "type": "string"},
    ]}  # fmt: skip
    ddl = [
        *DDL,
        "CREATE TABLE docs (id int PRIMARY KEY, note text, body text)",
        "ALTER TABLE docs REPLICA IDENTITY FULL",
        "CREATE SCHEMA other",
        "CREATE TABLE other.order_lines (order_id text, line_no int, quantity int,"
        " PRIMARY KEY (order_id, line_no))",
    ]
    lake = PgTables(tmp_path / "ok", pg_server, [*TABLES, big], ddl)
    try:
        assert lake.run() == []
        lake.sql(
            "INSERT INTO docs SELECT 1, 'n', string_agg(md5(g::text), '')"
            " FROM generate_series(1, 400) g",
            "INSERT INTO other.order_lines VALUES ('X', 9, 555)",
            "INSERT INTO order_lines VALUES ('X', 9, 4)",
        )
        lake.run()
        lake.sql("UPDATE docs SET id = 2 WHERE id = 1")  # the TOASTed body is unchanged
        lake.run()
        docs = silver(lake.config, contract_of(lake.config, "docs"))
        live = {k: r for k, r in docs.items() if not r["is_deleted"]}
        assert list(live) == [(2,)] and len(live[(2,)]["body"]) == 12800
        lines = silver(lake.config, contract_of(lake.config, "order_lines"))
        assert {k: r["quantity"] for k, r in lines.items()} == {("X", 9): 4}  # public's only
    finally:
        lake.drop()

    nopk = {"name": "nopk", "keys": ["k"], "columns": [{"name": "k", "type": "integer"}]}
    for name, extra, message in (
        ("nopk", ["CREATE TABLE nopk (k int, v text)"], "has no replica identity for its key"),
        ("missing", [], "declared table nopk does not exist in schema public"),
    ):
        lake = PgTables(tmp_path / name, pg_server, [*TABLES, nopk], [*DDL, *extra])
        try:
            with pytest.raises(PostgresSourceError, match=message) as caught:
                lake.run()
            assert "\n" not in str(caught.value)
        finally:
            lake.drop()
