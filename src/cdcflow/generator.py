"""Sample-data generator: realistic JSON-lines CDC event files for demos, tests and benchmarks.

It simulates the source ``customers`` table (registrations, profile changes, status changes,
GDPR deletions, re-registrations) in commit order, then perturbs the *delivery*: events arrive
out of order, some are delivered twice, some arrive very late, a few records are invalid. The
event timeline ends one minute before ``now`` and spans ``span_hours`` (events older than
``processing.late_event_threshold`` at ingestion are late events).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from cdcflow.model.events import CdcEvent
from cdcflow.model.lsn import format_mssql_lsn, format_pg_lsn
from cdcflow.plan.dedup import classify
from cdcflow.plan.reference import DeleteMode, ReferenceState, fold
from cdcflow.plan.rules import Rejection, RuleSet, validate_record

T = TypeVar("T")
LsnNotation = Literal["postgres", "sqlserver", "decimal", "mixed"]

_FIRST = ["Aarav", "Maya", "Liam", "Sofia", "Noah", "Yuki", "Omar", "Elena", "Kofi", "Ines"]
_LAST = ["Sharma", "Martin", "Okafor", "Rossi", "Tanaka", "Silva", "Novak", "Haddad", "Kim"]
_PLACES = [
    ("Bengaluru", "India"),
    ("Mumbai", "India"),
    ("Paris", "France"),
    ("Lyon", "France"),
    ("Berlin", "Germany"),
    ("Lagos", "Nigeria"),
    ("Tokyo", "Japan"),
    ("Sao Paulo", "Brazil"),
    ("Toronto", "Canada"),
    ("Austin", "United States"),
]
_STATUSES = ["ACTIVE"] * 6 + ["INACTIVE", "SUSPENDED"]
#: Domains reserved for documentation (RFC 2606): realistic addresses that reach nobody.
_DOMAINS = ["example.com", "example.net", "example.org"]


def _email(name: str, number: int) -> str:
    """A new e-mail address of the customer named ``name`` (``first.last<n>@example.*``)."""
    local = ".".join(name.lower().split())
    return f"{local}{number % 100}@{_DOMAINS[number % len(_DOMAINS)]}"


def _other_place(city: Any) -> tuple[str, str]:
    """A real (city, country) other than ``city`` (the next one of the list; the first for an
    unknown or missing city)."""
    cities = [c for c, _ in _PLACES]
    nxt = (cities.index(city) + 1) % len(_PLACES) if city in cities else 0
    return _PLACES[nxt]


@dataclass
class GeneratorConfig:
    """Parameters of :func:`generate` (rates are fractions of ``events``)."""

    events: int = 2000
    customers: int = 300
    files: int = 10
    seed: int = 42
    duplicate_rate: float = 0.05
    out_of_order_rate: float = 0.15
    late_rate: float = 0.02
    invalid_rate: float = 0.01
    partial_rate: float = 0.5
    delete_rate: float = 0.08
    lsn_notation: LsnNotation = "postgres"
    span_hours: float = 26.0
    gzip_every: int = 0
    now: datetime | None = None


@dataclass
class GenerationSummary:
    """What :func:`generate` wrote.

    Attributes:
        files: paths written, in landing order.
        valid_events: distinct valid events (source changes).
        duplicates: exact re-deliveries added.
        invalid: invalid records added.
        records: total records written.
        lines: every record written, in arrival order (JSON lines).
    """

    files: list[str] = field(default_factory=list)
    valid_events: int = 0
    duplicates: int = 0
    invalid: int = 0
    records: int = 0
    lines: list[str] = field(default_factory=list, repr=False)


def _lsn_text(number: int, notation: LsnNotation, rng: random.Random) -> Any:
    if notation == "mixed":
        notation = rng.choice(["postgres", "sqlserver", "decimal"])
    if notation == "postgres":
        return format_pg_lsn(number)
    if notation == "sqlserver":
        return format_mssql_lsn(number)
    return number if rng.random() < 0.5 else str(number)


class KeyPool(Generic[T]):
    """A set of keys with O(1) add, remove and a uniform random choice that depends only on the
    order of the calls (never on hashing: the same seed draws the same keys)."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self.index: dict[T, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: object) -> bool:
        return item in self.index

    def add(self, item: T) -> None:
        self.index[item] = len(self.items)
        self.items.append(item)

    def remove(self, item: T) -> None:
        i = self.index.pop(item)
        last = self.items.pop()
        if last != item:
            self.items[i] = last
            self.index[last] = i

    def choice(self, rng: random.Random) -> T:
        return self.items[rng.randrange(len(self.items))]


def _source_changes(cfg: GeneratorConfig, rng: random.Random, now: datetime) -> list[str]:
    """Simulate the source table in commit order; one JSON line per change (O(events))."""
    start = now - timedelta(hours=cfg.span_hours)
    step = timedelta(hours=cfg.span_hours) / max(cfg.events, 1)
    lsn = 0xFFF000 if cfg.lsn_notation != "sqlserver" else (0x28 << 48) | (0x1BC << 16)
    rows: dict[str, dict[str, Any]] = {}
    alive = KeyPool[str]()
    deleted = KeyPool[str]()
    next_id = 1000
    changes: list[str] = []
    for i in range(cfg.events):
        lsn += rng.randint(1, 4096)
        ts = start + step * i + timedelta(microseconds=rng.randint(0, 999_999))
        roll = rng.random()
        can_grow = len(alive) + len(deleted) < cfg.customers
        revive = len(deleted) > 0 and roll > 0.97
        if not alive or (can_grow and roll < 0.35) or revive:
            if revive:
                cid = deleted.choice(rng)
                deleted.remove(cid)
            else:
                cid = f"C-{next_id}"
                next_id += 1
            first, last = rng.choice(_FIRST), rng.choice(_LAST)
            city, country = rng.choice(_PLACES)
            row = {
                "customer_name": f"{first} {last}",
                "email": f"{first}.{last}{rng.randint(1, 99)}@example.com".lower(),
                "phone": f"+{rng.randint(1, 99)}-{rng.randint(10**8, 10**9 - 1)}",
                "city": city,
                "country": country,
                "status": "ACTIVE",
            }
            rows[cid] = row
            alive.add(cid)
            payload: dict[str, Any] = dict(row)
            op = "INSERT"
        elif rng.random() < cfg.delete_rate:
            cid = alive.choice(rng)
            alive.remove(cid)
            rows.pop(cid)
            deleted.add(cid)
            payload = dict.fromkeys(("customer_name", "email", "phone", "city", "country"))
            payload["status"] = "DELETED"
            op = "DELETE"
        else:
            cid = alive.choice(rng)
            row = rows[cid]
            change: dict[str, Any] = {}
            kind = rng.random()
            if kind < 0.4:
                city, country = rng.choice(_PLACES)
                change.update(city=city, country=country)
            elif kind < 0.7:
                change["email"] = _email(row["customer_name"], rng.randint(1, 10**6))
            elif kind < 0.85:
                change["status"] = rng.choice(_STATUSES)
            else:
                change["phone"] = f"+{rng.randint(1, 99)}-{rng.randint(10**8, 10**9 - 1)}"
            row.update(change)
            payload = change if rng.random() < cfg.partial_rate else dict(row)
            op = "UPDATE"
        event = {
            "event_id": f"EVT-{i + 1:08d}",
            "customer_id": cid,
            "operation": op,
            "event_timestamp": ts.isoformat().replace("+00:00", "Z"),
            **payload,
            "metadata": {
                "source_table": "customers",
                "lsn": _lsn_text(lsn, cfg.lsn_notation, rng),
                "tx_id": f"TX-{40000 + i}",
            },
        }
        changes.append(json.dumps(event))
    return changes


def _invalid_record(i: int, rng: random.Random, now: datetime, valid: list[str]) -> str:
    """One invalid record as a JSON line (one of nine kinds, in turn)."""
    base: dict[str, Any] = {
        "event_id": f"BAD-{i:06d}",
        "customer_id": f"C-{rng.randint(1, 999)}",
        "operation": "UPDATE",
        "event_timestamp": now.isoformat(),
        "city": _PLACES[i % len(_PLACES)][0],
        "country": _PLACES[i % len(_PLACES)][1],
        "metadata": {"lsn": "0/10", "source_table": "customers", "tx_id": "TX-0"},
    }
    kind = i % 9
    if kind == 0:
        return '{"event_id": "BAD-' + str(i) + '", "customer_id": '  # truncated JSON
    if kind == 1:
        base["customer_id"] = None
    elif kind == 2:
        base["customer_id"] = "customer-42"
    elif kind == 3:
        base["operation"] = "MERGE"
    elif kind == 4:
        base["event_timestamp"] = "yesterday at noon"
    elif kind == 5:
        base["event_timestamp"] = (now + timedelta(days=2)).isoformat()
    elif kind == 6:
        base["metadata"] = {"lsn": "not-an-lsn"}
    elif kind == 7:
        base["status"] = "ARCHIVED"
    elif valid:
        # same event_id as a real change, other content (another real place, as a source
        # re-sending a corrected row would): whichever copy arrives second is quarantined as
        # DUPLICATE_EVENT_CONFLICT
        conflict = json.loads(valid[rng.randrange(len(valid))])
        conflict["city"], conflict["country"] = _other_place(conflict.get("city"))
        return json.dumps(conflict)
    return json.dumps(base)


def arrange(
    changes: list[str],
    rng: random.Random,
    out_of_order_rate: float,
    late_rate: float,
    duplicate_rate: float,
    invalid_count: int,
    make_invalid: Callable[[int], str],
) -> list[str]:
    """Source changes (commit order) → the records in delivery (arrival) order, in O(n log n).

    Source changes keep their commit-order slot except that a share of them swaps with a near
    neighbour (out of order) or moves towards the end of the stream (late); duplicates are
    placed after their original; invalid records (``make_invalid(k)``) anywhere. Every record
    gets a sort key and one stable sort builds the stream (no ``list.insert``).

    Args:
        changes: JSON lines in commit order.
        rng: the random source (consumed in a fixed order: same seed, same stream).
        out_of_order_rate / late_rate / duplicate_rate: shares of ``len(changes)``.
        invalid_count: invalid records to add.
        make_invalid: k → the k-th invalid record.

    Returns:
        The records in delivery order.
    """
    n = len(changes)
    order = list(range(n))
    # out of order: swap neighbours within a short window
    for _ in range(int(n * out_of_order_rate)):
        i = rng.randrange(n)
        j = min(n - 1, i + rng.randint(1, 25))
        order[i], order[j] = order[j], order[i]
    keys: list[float] = [float(slot) for slot in range(n)]
    # late: move some events towards the end of the stream (last fifth, after their own slot)
    for _ in range(int(n * late_rate)):
        slot = rng.randrange(n)
        keys[slot] = rng.uniform(max(keys[slot], n - n / 5), n)
    items: list[tuple[float, int, str]] = [
        (keys[slot], slot, changes[order[slot]]) for slot in range(n)
    ]
    serial = n
    for _ in range(int(n * duplicate_rate)):
        slot = rng.randrange(n)
        items.append((rng.uniform(keys[slot], n), serial, changes[order[slot]]))
        serial += 1
    for k in range(invalid_count):
        items.append((rng.uniform(0, n), serial, make_invalid(k)))
        serial += 1
    items.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in items]


def delivery_order(cfg: GeneratorConfig, rng: random.Random, now: datetime) -> list[str]:
    """The customers records in delivery (arrival) order, as JSON lines (:func:`arrange` of
    the simulated source changes)."""
    changes = _source_changes(cfg, rng, now)
    n = len(changes)
    return arrange(
        changes,
        rng,
        cfg.out_of_order_rate,
        cfg.late_rate,
        cfg.duplicate_rate,
        int(n * cfg.invalid_rate),
        lambda k: _invalid_record(k, rng, now, changes),
    )


def write_landing(
    out_dir: str | Path, delivery: list[str], files: int, gzip_every: int = 0
) -> list[str]:
    """Write records in delivery order into ``files`` landing files (atomically, each).

    Files are named ``events-<n>.jsonl[.gz]`` after those already in the folder, and their
    modification times follow their names, so landing order is name order.

    Returns:
        The paths written, in landing order.
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    existing = len(list(folder.glob("events-*.jsonl*")))
    per_file = max(1, -(-len(delivery) // max(files, 1)))
    base_mtime = datetime.now(UTC).timestamp() - 3600
    written: list[str] = []
    for f, start in enumerate(range(0, len(delivery), per_file)):
        chunk = delivery[start : start + per_file]
        number = existing + f + 1
        gz = gzip_every > 0 and number % gzip_every == 0
        path = folder / f"events-{number:05d}.jsonl{'.gz' if gz else ''}"
        data = ("\n".join(chunk) + "\n").encode("utf-8")
        tmp = path.with_name("." + path.name + ".tmp")
        if gz:
            with gzip.open(tmp, "wb") as handle:
                handle.write(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
        stamp = base_mtime + number
        os.utime(path, (stamp, stamp))
        written.append(str(path))
    return written


def generate(out_dir: str | Path, cfg: GeneratorConfig) -> GenerationSummary:
    """Write landing files of CDC events.

    Args:
        out_dir: landing folder (created if missing).
        cfg: generation parameters.

    Returns:
        A summary of what was written (with ``lines``: every record in arrival order). Files
        are named ``events-<n>.jsonl[.gz]`` and their modification times follow their names,
        so landing order is name order.
    """
    rng = random.Random(cfg.seed)
    now = (cfg.now or datetime.now(UTC)) - timedelta(minutes=1)
    delivery = delivery_order(cfg, rng, now)
    summary = GenerationSummary(
        valid_events=cfg.events,
        duplicates=int(cfg.events * cfg.duplicate_rate),
        invalid=int(cfg.events * cfg.invalid_rate),
        records=len(delivery),
        lines=delivery,
    )
    summary.files = write_landing(out_dir, delivery, cfg.files, cfg.gzip_every)
    return summary


@dataclass
class ExpectedOutcome:
    """What the pipeline must produce from a stream of records (the reference fold).

    Attributes:
        state: expected Silver rows (one per customer_id) and hard-mode tombstones.
        quarantine: failure reason → number of records quarantined for it.
        records: non-blank records in the stream.
        accepted: records accepted into Bronze (duplicates included).
        duplicates: exact re-deliveries among ``accepted``.
    """

    state: ReferenceState
    quarantine: dict[str, int]
    records: int
    accepted: int
    duplicates: int

    def counts(self) -> dict[str, Any]:
        """JSON form of the counts: records, accepted, duplicates, quarantine per reason and
        the expected Silver counts (rows, active, deleted, tombstones)."""
        rows = self.state.rows.values()
        return {
            "records": self.records,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "quarantined": sum(self.quarantine.values()),
            "quarantine": dict(sorted(self.quarantine.items())),
            "silver": {
                "rows": len(self.state.rows),
                "active": sum(1 for r in rows if r["is_active"]),
                "deleted": sum(1 for r in rows if r["is_deleted"]),
                "tombstones": len(self.state.tombstones),
            },
        }


def expected_outcome(
    lines: list[str],
    delete_mode: DeleteMode = "soft",
    customer_id_pattern: str = r"^C-[0-9]+$",
    max_clock_skew: timedelta = timedelta(minutes=5),
    processing_time: datetime | None = None,
) -> ExpectedOutcome:
    """Validate, de-duplicate and fold records exactly as the engine does, in arrival order.

    Uses :mod:`cdcflow.plan.rules` (validation), :mod:`cdcflow.plan.dedup` (first copy wins,
    conflicting copies quarantined) and :func:`cdcflow.plan.reference.fold`.

    Args:
        lines: the non-blank records in arrival order (file order, then line order).
        delete_mode: ``soft`` or ``hard``.
        customer_id_pattern: ``processing.customer_id_pattern``.
        max_clock_skew: ``processing.max_clock_skew``.
        processing_time: the processing time used by the future-timestamp rule (default now).

    Returns:
        The expected Silver state, quarantine counts per reason and delivery counts.
    """
    rules = RuleSet(
        customer_id_pattern=re.compile(customer_id_pattern),
        processing_time=processing_time or datetime.now(UTC),
        max_clock_skew=max_clock_skew,
    )
    quarantine: Counter[str] = Counter()
    candidates: list[tuple[int, CdcEvent]] = []
    for position, line in enumerate(lines):
        result = validate_record(line.encode("utf-8"), rules)
        if isinstance(result, Rejection):
            quarantine[result.reason] += 1
        else:
            candidates.append((position, result))
    deliveries, conflicts = classify(candidates, {})
    for _, rejection in conflicts:
        quarantine[rejection.reason] += 1
    state = fold([d.event for d in deliveries if not d.is_duplicate], delete_mode)
    return ExpectedOutcome(
        state=state,
        quarantine=dict(quarantine),
        records=len(lines),
        accepted=len(deliveries),
        duplicates=sum(d.is_duplicate for d in deliveries),
    )
