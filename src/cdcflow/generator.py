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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from cdcflow.model.lsn import format_mssql_lsn, format_pg_lsn

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
    """

    files: list[str] = field(default_factory=list)
    valid_events: int = 0
    duplicates: int = 0
    invalid: int = 0
    records: int = 0


def _lsn_text(number: int, notation: LsnNotation, rng: random.Random) -> Any:
    if notation == "mixed":
        notation = rng.choice(["postgres", "sqlserver", "decimal"])
    if notation == "postgres":
        return format_pg_lsn(number)
    if notation == "sqlserver":
        return format_mssql_lsn(number)
    return number if rng.random() < 0.5 else str(number)


def _source_changes(cfg: GeneratorConfig, rng: random.Random, now: datetime) -> list[dict[str, Any]]:
    """Simulate the source table in commit order; one event per change."""
    start = now - timedelta(hours=cfg.span_hours)
    step = timedelta(hours=cfg.span_hours) / max(cfg.events, 1)
    lsn = 0xFFF000 if cfg.lsn_notation != "sqlserver" else (0x28 << 48) | (0x1BC << 16)
    alive: dict[str, dict[str, Any]] = {}
    deleted: list[str] = []
    next_id = 1000
    changes = []
    for i in range(cfg.events):
        lsn += rng.randint(1, 4096)
        ts = start + step * i + timedelta(microseconds=rng.randint(0, 999_999))
        roll = rng.random()
        can_grow = len(alive) + len(deleted) < cfg.customers
        if not alive or (can_grow and roll < 0.35) or (deleted and roll > 0.97):
            if deleted and roll > 0.97:
                cid = deleted.pop(rng.randrange(len(deleted)))
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
            alive[cid] = row
            payload: dict[str, Any] = dict(row)
            op = "INSERT"
        elif rng.random() < cfg.delete_rate:
            cid = rng.choice(list(alive))
            alive.pop(cid)
            deleted.append(cid)
            payload = dict.fromkeys(("customer_name", "email", "phone", "city", "country"))
            payload["status"] = "DELETED"
            op = "DELETE"
        else:
            cid = rng.choice(list(alive))
            row = alive[cid]
            change: dict[str, Any] = {}
            kind = rng.random()
            if kind < 0.4:
                city, country = rng.choice(_PLACES)
                change.update(city=city, country=country)
            elif kind < 0.7:
                change["email"] = f"user{rng.randint(1, 10**6)}@newdomain.com"
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
        changes.append(event)
    return changes


def _invalid_record(i: int, rng: random.Random, now: datetime, valid: list[dict[str, Any]]) -> Any:
    base = {
        "event_id": f"BAD-{i:06d}",
        "customer_id": f"C-{rng.randint(1, 999)}",
        "operation": "UPDATE",
        "event_timestamp": now.isoformat(),
        "city": "Nowhere",
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
        conflict = dict(rng.choice(valid))
        conflict["city"] = "Conflicting City"
        return conflict
    return base


def generate(out_dir: str | Path, cfg: GeneratorConfig) -> GenerationSummary:
    """Write landing files of CDC events.

    Args:
        out_dir: landing folder (created if missing).
        cfg: generation parameters.

    Returns:
        A summary of what was written. Files are named ``events-<n>.jsonl[.gz]`` and their
        modification times follow their names, so landing order is name order.
    """
    rng = random.Random(cfg.seed)
    now = (cfg.now or datetime.now(UTC)) - timedelta(minutes=1)
    changes = _source_changes(cfg, rng, now)
    delivery: list[Any] = list(changes)
    n = len(delivery)
    # out of order: swap neighbours within a short window
    for _ in range(int(n * cfg.out_of_order_rate)):
        i = rng.randrange(n)
        j = min(n - 1, i + rng.randint(1, 25))
        delivery[i], delivery[j] = delivery[j], delivery[i]
    # late: move some events towards the end of the stream
    for _ in range(int(n * cfg.late_rate)):
        i = rng.randrange(len(delivery))
        event = delivery.pop(i)
        delivery.insert(rng.randint(max(i, len(delivery) - n // 5), len(delivery)), event)
    summary = GenerationSummary(valid_events=n)
    for _ in range(int(n * cfg.duplicate_rate)):
        i = rng.randrange(len(delivery))
        delivery.insert(rng.randint(i, len(delivery)), delivery[i])
        summary.duplicates += 1
    for k in range(int(n * cfg.invalid_rate)):
        delivery.insert(rng.randrange(len(delivery) + 1), _invalid_record(k, rng, now, changes))
        summary.invalid += 1
    summary.records = len(delivery)

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    existing = len(list(folder.glob("events-*.jsonl*")))
    per_file = max(1, -(-len(delivery) // max(cfg.files, 1)))
    base_mtime = datetime.now(UTC).timestamp() - 3600
    for f, start in enumerate(range(0, len(delivery), per_file)):
        chunk = delivery[start : start + per_file]
        lines = [r if isinstance(r, str) else json.dumps(r) for r in chunk]
        number = existing + f + 1
        gz = cfg.gzip_every > 0 and number % cfg.gzip_every == 0
        path = folder / f"events-{number:05d}.jsonl{'.gz' if gz else ''}"
        data = ("\n".join(lines) + "\n").encode("utf-8")
        tmp = path.with_name("." + path.name + ".tmp")
        if gz:
            with gzip.open(tmp, "wb") as handle:
                handle.write(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
        stamp = base_mtime + number
        os.utime(path, (stamp, stamp))
        summary.files.append(str(path))
    return summary
