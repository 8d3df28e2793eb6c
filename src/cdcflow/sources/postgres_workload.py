"""A realistic transactional workload on a PostgreSQL ``customers`` table.

The table matches the event contract (``customer_id`` text primary key and the ``ATTRIBUTES``
columns). :func:`run_workload` first registers ``customers`` customers (in transactions of up
to :data:`REGISTRATION_BATCH`), then runs ``transactions`` mixed transactions, chosen by a seeded
random generator (same seed and same starting table → same statements):

``register`` (a new customer), ``address`` (city and country), ``email``, ``phone``, ``status``,
``multi_change`` (2–4 changes to one customer in one transaction), ``multi_customer``
(changes to 2–3 customers in one transaction), ``gdpr_delete`` (DELETE), ``reregister_same_tx``
(DELETE and re-INSERT of one customer in one transaction), ``reregister`` (INSERT of a customer
deleted earlier) and ``rollback`` (a transaction that changes rows and is rolled back: it must
leave no trace downstream).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdcflow.model.events import ATTRIBUTES
from cdcflow.sources.postgres import require_psycopg

REGISTRATION_BATCH = 25
KINDS: dict[str, int] = {
    "register": 12,
    "address": 14,
    "email": 12,
    "phone": 8,
    "status": 12,
    "multi_change": 12,
    "multi_customer": 8,
    "gdpr_delete": 8,
    "reregister_same_tx": 6,
    "reregister": 4,
    "rollback": 4,
}
_FIRST = ("Ana", "Bruno", "Chloé", "Dmitri", "Emma", "Farid", "Greta", "Hugo", "Ines", "Jonas")
_LAST = ("Martin", "Okafor", "Rossi", "Schmidt", "Nguyen", "Silva", "Dubois", "Kowalski", "Sato")
_PLACES = (
    ("Paris", "FR"),
    ("Lyon", "FR"),
    ("Rennes", "FR"),
    ("Berlin", "DE"),
    ("Munich", "DE"),
    ("Madrid", "ES"),
    ("Lisbon", "PT"),
    ("Milan", "IT"),
    ("Warsaw", "PL"),
    ("Osaka", "JP"),
)
_STATUSES = ("ACTIVE", "INACTIVE", "SUSPENDED")

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    customer_id   text PRIMARY KEY,
    customer_name text NOT NULL,
    email         text,
    phone         text,
    city          text,
    country       text,
    status        text NOT NULL CHECK (status IN ('ACTIVE', 'INACTIVE', 'SUSPENDED'))
)
"""


@dataclass
class WorkloadSummary:
    """What a workload run did.

    Attributes:
        transactions: committed transactions (registrations included).
        rolled_back: transactions rolled back on purpose.
        kinds: number of transactions per kind.
        statements: row-changing statements committed.
        live_customers: rows in the table at the end.
    """

    transactions: int = 0
    rolled_back: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    statements: int = 0
    live_customers: int = 0


def create_table(conn: Any, table: str = "customers", replica_identity: str = "default") -> None:
    """Create the ``customers`` table if missing and set its replica identity.

    Args:
        conn: an autocommit psycopg connection.
        table: table name (optionally ``schema.table``).
        replica_identity: ``default`` (old key only) or ``full`` (whole old row).
    """
    conn.execute(CREATE_TABLE.format(table=table))
    identity = "FULL" if replica_identity == "full" else "DEFAULT"
    conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY {identity}")


class _Model:
    """The workload's own view of the table (live rows, deleted ids, next id)."""

    def __init__(self, rng: random.Random, live: dict[str, dict[str, str]]) -> None:
        self.rng = rng
        self.live = live
        self.deleted: list[str] = []
        numbers = [int(k.split("-", 1)[1]) for k in live if k.split("-", 1)[-1].isdigit()]
        self.next_id = max(numbers, default=0) + 1

    def new_row(self) -> dict[str, str]:
        first, last = self.rng.choice(_FIRST), self.rng.choice(_LAST)
        city, country = self.rng.choice(_PLACES)
        return {
            "customer_name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{self.rng.randint(1, 999)}@example.com",
            "phone": f"+{self.rng.randint(1, 99)}-{self.rng.randint(10**8, 10**9 - 1)}",
            "city": city,
            "country": country,
            "status": "ACTIVE",
        }

    def change(self, kind: str) -> dict[str, str]:
        if kind == "address":
            city, country = self.rng.choice(_PLACES)
            return {"city": city, "country": country}
        if kind == "email":
            return {"email": f"user{self.rng.randint(1, 10**6)}@example.org"}
        if kind == "phone":
            return {"phone": f"+{self.rng.randint(1, 99)}-{self.rng.randint(10**8, 10**9 - 1)}"}
        return {"status": self.rng.choice(_STATUSES)}

    def pick(self) -> str | None:
        return self.rng.choice(sorted(self.live)) if self.live else None


class _Tx:
    """Statements of one transaction, applied to the database and the model together."""

    def __init__(self, conn: Any, model: _Model, table: str) -> None:
        self.conn, self.model, self.table = conn, model, table
        self.statements = 0

    def insert(self, cid: str, row: dict[str, str]) -> None:
        cols = ", ".join(["customer_id", *ATTRIBUTES])
        marks = ", ".join(["%s"] * (1 + len(ATTRIBUTES)))
        self.conn.execute(
            f"INSERT INTO {self.table} ({cols}) VALUES ({marks})",
            (cid, *[row[a] for a in ATTRIBUTES]),
        )
        self.model.live[cid] = dict(row)
        self.statements += 1

    def update(self, cid: str, change: dict[str, str]) -> None:
        sets = ", ".join(f"{k} = %s" for k in change)
        self.conn.execute(
            f"UPDATE {self.table} SET {sets} WHERE customer_id = %s", (*change.values(), cid)
        )
        self.model.live[cid].update(change)
        self.statements += 1

    def delete(self, cid: str) -> None:
        self.conn.execute(f"DELETE FROM {self.table} WHERE customer_id = %s", (cid,))
        del self.model.live[cid]
        self.model.deleted.append(cid)
        self.statements += 1


def _one(kind: str, tx: _Tx, model: _Model) -> None:
    rng = model.rng
    if kind == "register" or not model.live:
        new_id = f"C-{model.next_id}"
        model.next_id += 1
        tx.insert(new_id, model.new_row())
        return
    cid = model.pick()
    assert cid is not None
    if kind in ("address", "email", "phone", "status"):
        tx.update(cid, model.change(kind))
    elif kind == "multi_change":
        for _ in range(rng.randint(2, 4)):
            tx.update(cid, model.change(rng.choice(("address", "email", "phone", "status"))))
    elif kind == "multi_customer":
        others = rng.sample(sorted(model.live), min(len(model.live), rng.randint(2, 3)))
        for other in others:
            tx.update(other, model.change(rng.choice(("address", "email", "status"))))
    elif kind == "gdpr_delete":
        tx.delete(cid)
    elif kind == "reregister_same_tx":
        tx.delete(cid)
        tx.insert(cid, model.new_row())
        model.deleted.remove(cid)
    elif kind == "reregister":
        revivable = [d for d in model.deleted if d not in model.live]
        if not revivable:
            tx.update(cid, model.change("status"))
            return
        again = rng.choice(revivable)
        model.deleted.remove(again)
        tx.insert(again, model.new_row())


def run_workload(
    conn: Any,
    customers: int,
    transactions: int,
    seed: int = 7,
    table: str = "customers",
    replica_identity: str = "default",
    progress: Callable[[int], None] | None = None,
) -> WorkloadSummary:
    """Register ``customers`` customers, then run ``transactions`` mixed transactions.

    Args:
        conn: a psycopg connection (autocommit; each transaction is an explicit block).
        customers: customers registered first (in transactions of up to 25).
        transactions: mixed transactions after the registrations.
        seed: random seed.
        table: the table (created when missing).
        replica_identity: ``default`` or ``full``.
        progress: called with the number of transactions just finished (for progress bars).

    Returns:
        The summary.
    """
    psycopg = require_psycopg()
    create_table(conn, table, replica_identity)
    rows = conn.execute(f"SELECT customer_id, {', '.join(ATTRIBUTES)} FROM {table}").fetchall()
    live = {r[0]: dict(zip(ATTRIBUTES, r[1:], strict=True)) for r in rows}
    rng = random.Random(seed)
    model = _Model(rng, live)
    summary = WorkloadSummary()
    kinds, weights = list(KINDS), list(KINDS.values())

    def run_tx(kind: str, body: Callable[[_Tx], None]) -> None:
        snapshot = {k: dict(v) for k, v in model.live.items()}, list(model.deleted), model.next_id
        tx = _Tx(conn, model, table)
        with conn.transaction():
            body(tx)
            if kind == "rollback":
                model.live, model.deleted, model.next_id = snapshot
                raise psycopg.Rollback()  # caught by the block: nothing of it is committed
        if kind == "rollback":
            summary.rolled_back += 1
        else:
            summary.transactions += 1
            summary.statements += tx.statements
        summary.kinds[kind] += 1
        if progress:
            progress(1)

    left = customers
    while left > 0:
        n = min(REGISTRATION_BATCH, left)
        left -= n

        def register_many(tx: _Tx, n: int = n) -> None:
            for _ in range(n):
                _one("register", tx, model)

        run_tx("registration_batch", register_many)
    for _ in range(transactions):
        kind = rng.choices(kinds, weights)[0]
        inner = rng.choice(("email", "gdpr_delete")) if kind == "rollback" else kind

        def body(tx: _Tx, inner: str = inner) -> None:
            _one(inner, tx, model)

        run_tx(kind, body)
    summary.live_customers = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return summary
