"""Multi-table sample data: CDC landing files for every declared table, and their expected state.

``cdcflow generate --config F`` with a ``tables:`` section calls :func:`generate_tables`. Values
are drawn from each contract (:mod:`cdcflow.model.contracts`): a column's type, its
``allowed_values``, ``pattern`` (strings matching the RE2 pattern, drawn with ``rstr``),
``minimum`` / ``maximum`` and ``references`` (a foreign key draws a key of the referenced
table); every drawn value passes the column's constraints. Keys: integers count up; strings
follow the table's ``key_patterns`` when it has one; a composite key numbers the lines of a
parent (``O-1``: 1, 2, 3). Records use the contract's envelope fields (``lsn_field``,
``operation_field``, ``event_id_field``, ``timestamp_field``, a column's ``source``) and name
their table in ``metadata.source_table`` as ``public.<table>``.

The source is simulated in commit order (one LSN sequence across tables, as one database's log:
INSERT, partial or full UPDATE, DELETE, re-INSERT after a DELETE), then the *delivery* is
perturbed as for customers (:func:`cdcflow.generator.arrange`: out of order, late, duplicated)
and a few invalid records are mixed in: a value of the wrong type, a broken constraint, a missing
key, a record of an undeclared table, a line that is not JSON.

:func:`expected_tables` computes, from the delivered lines alone, what the pipeline must
produce: the rules the engine uses (routing, :class:`~cdcflow.plan.contract_rules.
ContractValidator`, first copy wins, the reference fold :func:`~cdcflow.plan.reference.
fold_changes`), never the generator's own bookkeeping.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from cdcflow.errors import ConfigError, UsageError
from cdcflow.generator import KeyPool, arrange, write_landing
from cdcflow.model.contracts import (
    ColumnSpec,
    TableContract,
    TypeMismatch,
    check_constraints,
    coerce,
    compile_re2,
    normalise,
    parse_type,
)
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator, TruncateEvent, route_name
from cdcflow.plan.dedup import classify
from cdcflow.plan.reference import ContractState, fold_changes
from cdcflow.plan.rules import Rejection, parse_record

_NAMES = ["Aarav Sharma", "Maya Martin", "Liam Okafor", "Sofia Rossi", "Yuki Tanaka", "Omar Silva"]
#: Longest run a ``+`` or ``*`` of a pattern repeats (rstr's default, 100, makes unreadable keys).
_REPEAT_LIMIT = 6
#: Attempts at drawing a value that passes the column's constraints before giving up.
_ATTEMPTS = 50
#: The table a record of no declared table names.
UNDECLARED_TABLE = "audit_trail"


@dataclass(frozen=True)
class TablesWorkload:
    """Parameters of a multi-table workload.

    Attributes:
        events: source changes, across all tables.
        keys: distinct keys per table (at most; a narrow key pattern may allow fewer).
        files: landing files to split the delivery into.
        seed: random seed (same seed and contracts: same records, but for timestamps relative
            to ``now``).
        duplicate_rate / out_of_order_rate / late_rate / invalid_rate: shares of ``events``.
        partial_rate: share of UPDATEs that carry only some columns.
        delete_rate: share of changes to a live key that delete it.
        null_rate: share of values of a nullable column drawn as null.
        span_hours: the time the changes span, ending one minute before ``now``.
        gzip_every: gzip every n-th landing file (0: none).
        first_event / first_lsn: the number of the first event id (``EVT-<n>``) and the LSN
            the first change follows; a second workload for the same lakehouse continues the
            first one's (:attr:`TablesSummary.last_event`, :attr:`TablesSummary.last_lsn`).
        now: the end of the timeline (default: the current time).
    """

    events: int = 2000
    keys: int = 100
    files: int = 10
    seed: int = 42
    duplicate_rate: float = 0.05
    out_of_order_rate: float = 0.15
    late_rate: float = 0.02
    invalid_rate: float = 0.02
    partial_rate: float = 0.5
    delete_rate: float = 0.08
    null_rate: float = 0.05
    span_hours: float = 6.0
    gzip_every: int = 0
    first_event: int = 1
    first_lsn: int = 10_000
    now: datetime | None = None


@dataclass
class SourceState:
    """The simulated source database at the end of a workload, to continue it in another one.

    Attributes:
        keys: table → the keys it draws from.
        live: table → its live keys.
        held: (table, key) → live rows referencing it (a foreign key).
        holds: (table, key) → its column → the (table, key) it references.
    """

    keys: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    live: dict[str, KeyPool[tuple[Any, ...]]] = field(default_factory=dict)
    held: Counter[tuple[str, tuple[Any, ...]]] = field(default_factory=Counter)
    holds: dict[tuple[str, tuple[Any, ...]], dict[str, tuple[str, tuple[Any, ...]]]] = field(
        default_factory=dict
    )


#: The generator's state file in a landing folder (``generate --config F --continue``): the
#: simulated source at the end of the last workload written there, its last event id and LSN,
#: and the end of its timeline. Not a landing file (its name does not end in ``.jsonl``).
STATE_FILE = ".cdcflow-generate.json"


def _encode(value: Any) -> Any:
    """A key value as JSON: strings, integers and booleans as they are, other types tagged."""
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, datetime):
        return {"timestamp": value.isoformat()}
    if isinstance(value, date):
        return {"date": value.isoformat()}
    return value


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, text),) = value.items()
    if tag == "decimal":
        return Decimal(text)
    if tag == "timestamp":
        return datetime.fromisoformat(text)
    return date.fromisoformat(text)


def _key(values: list[Any]) -> tuple[Any, ...]:
    return tuple(_decode(v) for v in values)


def save_state(out_dir: str | Path, summary: TablesSummary, until: datetime) -> Path:
    """Write :data:`STATE_FILE` into the landing folder after a workload.

    Args:
        out_dir: the landing folder the workload was written to.
        summary: what :func:`generate_tables` wrote (its ``source``, ``last_event``,
            ``last_lsn``).
        until: the end of its timeline (its ``now``).

    Returns:
        The state file's path.
    """
    source = summary.source
    data = {
        "last_event": summary.last_event,
        "last_lsn": summary.last_lsn,
        "until": until.isoformat(),
        "keys": {t: [[_encode(v) for v in k] for k in keys] for t, keys in source.keys.items()},
        "live": {
            t: [[_encode(v) for v in k] for k in pool.items] for t, pool in source.live.items()
        },
        "held": [[t, [_encode(v) for v in k], n] for (t, k), n in source.held.items()],
        "holds": [
            [t, [_encode(v) for v in k], {c: [rt, [_encode(v) for v in rk]] for c, (rt, rk) in r}]
            for (t, k), r in ((key, refs.items()) for key, refs in source.holds.items())
        ],
    }
    path = Path(out_dir) / STATE_FILE
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temporary, path)  # whole or not at all
    return path


def load_state(out_dir: str | Path) -> tuple[SourceState, int, int, datetime]:
    """Read :data:`STATE_FILE` of a landing folder.

    Returns:
        (the simulated source, the last event id number, the last LSN, the end of the
        timeline) of the last workload written there.

    Raises:
        UsageError: the folder holds no state file, or an unreadable one.
    """
    path = Path(out_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        source = SourceState()
        source.keys = {t: [_key(k) for k in keys] for t, keys in data["keys"].items()}
        for table, keys in data["live"].items():
            pool: KeyPool[tuple[Any, ...]] = KeyPool()
            for k in keys:
                pool.add(_key(k))
            source.live[table] = pool
        source.held = Counter({(t, _key(k)): n for t, k, n in data["held"]})
        source.holds = {
            (t, _key(k)): {c: (rt, _key(rk)) for c, (rt, rk) in refs.items()}
            for t, k, refs in data["holds"]
        }
        return source, data["last_event"], data["last_lsn"], datetime.fromisoformat(data["until"])
    except FileNotFoundError:
        raise UsageError(
            f"--continue: {path.parent} holds no workload of `cdcflow generate --config` to "
            f"continue (no {STATE_FILE})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--continue: {path}: unreadable generator state ({exc})") from None


@dataclass
class TablesSummary:
    """What :func:`generate_tables` wrote.

    Attributes:
        files: landing files, in landing order.
        changes: table → source changes generated for it.
        records: records written (changes, duplicates and invalid records).
        duplicates: re-deliveries added.
        invalid: invalid records added.
        lines: every record, in arrival order (JSON lines).
        last_event / last_lsn: the number of the last event id and the last LSN generated.
        source: the simulated source at the end (``resume`` of a next workload).
    """

    files: list[str] = field(default_factory=list)
    changes: dict[str, int] = field(default_factory=dict)
    records: int = 0
    duplicates: int = 0
    invalid: int = 0
    lines: list[str] = field(default_factory=list, repr=False)
    last_event: int = 0
    last_lsn: int = 0
    source: SourceState = field(default_factory=SourceState, repr=False)


def _set(record: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted field (``metadata.lsn``) of a record, creating the objects on the way."""
    *parents, leaf = dotted.split(".")
    node = record
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _json_value(value: Any) -> Any:
    """A stored value as the JSON a source would send (decimals as text, dates ISO)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return value


class _Draw:
    """Draws values of one workload's columns (seeded; every value passes its constraints)."""

    def __init__(self, rng: random.Random, now: datetime) -> None:
        import importlib

        import rstr  # a library for strings matching a pattern, not a hand-written one

        # the package's ``xeger`` attribute is a function; the module holds the repeat limit
        setattr(importlib.import_module("rstr.xeger"), "STAR_PLUS_LIMIT", _REPEAT_LIMIT)  # noqa: B010
        self.rng = rng
        self.now = now
        self.xeger = rstr.Rstr(rng)
        self.keys: dict[str, list[tuple[Any, ...]]] = {}
        self.live: dict[str, KeyPool[tuple[Any, ...]]] = {}
        self.contracts: dict[str, TableContract] = {}

    def tracks(self, spec: ColumnSpec) -> bool:
        """Whether a foreign-key value of ``spec`` names one row: the referenced column is its
        table's only key column (a reference to part of a composite key is not tracked)."""
        if spec.references is None:
            return False
        table, column = spec.references.split(".", 1)
        parent = self.contracts.get(table)
        return parent is not None and parent.keys == (column,)

    def _referenced(self, spec: ColumnSpec) -> Any:
        """A foreign-key value: a key of a *live* row of the referenced table (as a source
        database enforcing the constraint would have), else any of its keys."""
        table, column = (spec.references or ".").split(".", 1)
        parent = self.contracts.get(table)
        if parent is None or column not in parent.keys:
            return None
        position = parent.keys.index(column)
        pool = self.live.get(table)
        if pool:
            return pool.choice(self.rng)[position]
        keys = self.keys.get(table)
        return self.rng.choice(keys)[position] if keys else None

    def pattern(self, pattern: str, where: str) -> str:
        """A string fully matching an RE2 pattern.

        Raises:
            ConfigError: none found in :data:`_ATTEMPTS` draws (the pattern uses a construct
                rstr cannot invert).
        """
        compiled = compile_re2(pattern)
        for _ in range(_ATTEMPTS):
            text = self.xeger.xeger(pattern)
            if compiled.fullmatch(text) is not None:
                return text
        raise ConfigError(f"{where}: cannot generate a value matching the pattern {pattern!r}")

    def _bounds(self, spec: ColumnSpec, low: Any, high: Any) -> tuple[Any, Any]:
        lo = coerce(spec.minimum, spec.type) if spec.minimum is not None else low
        hi = coerce(spec.maximum, spec.type) if spec.maximum is not None else max(lo, high)
        return lo, max(lo, hi)

    def _raw(self, spec: ColumnSpec, where: str) -> Any:
        rng = self.rng
        if spec.allowed_values:
            return rng.choice(spec.allowed_values)
        if spec.references:
            referenced = self._referenced(spec)
            if referenced is not None:
                return referenced
        if spec.pattern is not None:
            return self.pattern(spec.pattern, where)
        kind, precision, scale = parse_type(spec.type)
        if kind == "string":
            if spec.pii:
                return rng.choice(_NAMES)
            return f"{spec.name} {rng.randint(1, 500)}"
        if kind == "integer":
            lo, hi = self._bounds(spec, 0, 100)
            return rng.randint(lo, hi)
        if kind == "decimal":
            unit = Decimal(1).scaleb(-scale)
            largest = Decimal(10) ** (precision - scale) - unit
            lo, hi = self._bounds(spec, Decimal(0), min(largest, Decimal(100_000)))
            steps = int((hi - lo) / unit)
            return str(lo + unit * rng.randint(0, steps))
        if kind == "double":
            lo, hi = self._bounds(spec, 0.0, 1000.0)
            return round(rng.uniform(lo, hi), 4)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "date":
            low = self.now.date() - timedelta(days=3 * 365)
            lo, hi = self._bounds(spec, low, self.now.date())
            return (lo + timedelta(days=rng.randint(0, (hi - lo).days))).isoformat()
        if kind == "timestamp":
            low = self.now - timedelta(days=3 * 365)
            lo, hi = self._bounds(spec, low, self.now)
            seconds = int((hi - lo).total_seconds())
            return _json_value(lo + timedelta(seconds=rng.randint(0, seconds)))
        return {"tags": rng.sample(["new", "gift", "bulk", "promo"], 2), "n": rng.randint(1, 9)}

    def value(self, spec: ColumnSpec, table: str, nullable: bool = True) -> Any:
        """A JSON value for ``spec`` that coerces to its type and passes its constraints.

        Raises:
            ConfigError: no such value found (names the table and the column).
        """
        where = f"table {table}: column {spec.name}"
        if nullable and spec.nullable and self.rng.random() < 0.05:
            return None
        for _ in range(_ATTEMPTS):
            raw = self._raw(spec, where)
            try:
                stored = normalise(spec, coerce(raw, spec.type))
            except TypeMismatch:
                continue
            if stored is not None and check_constraints(spec, stored) is None:
                return raw
        raise ConfigError(f"{where}: cannot generate a value that passes its constraints")

    def key_values(self, contract: TableContract, count: int) -> list[tuple[Any, ...]]:
        """Up to ``count`` distinct keys (in JSON form) of ``contract``, in creation order."""
        specs = [contract.column(k) for k in contract.keys]
        found: dict[tuple[Any, ...], None] = {}
        for serial in range(count * 3):
            if len(found) >= count:
                break
            parts: list[Any] = []
            for position, spec in enumerate(specs):
                # a composite key: the first column numbers a parent, the next ones its lines
                number = serial // 3 + 1 if len(specs) > 1 and position == 0 else serial + 1
                if len(specs) > 1 and position > 0:
                    number = serial % 3 + 1
                parts.append(self._key_part(contract, spec, number))
            found.setdefault(tuple(parts), None)
        return list(found)

    def _key_part(self, contract: TableContract, spec: ColumnSpec, number: int) -> Any:
        """A key column's value: ``number`` (an integer key) or ``<T>-<number>`` (a string key)
        when that passes the key pattern and the column's constraints, else a drawn one."""
        where = f"table {contract.name}: key {spec.name}"
        pattern = contract.key_patterns.get(spec.name)
        kind = parse_type(spec.type)[0]
        candidate: Any = None
        if kind == "integer":
            candidate = number
        elif kind == "string":
            candidate = f"{contract.name[:1].upper()}-{number}"
        if candidate is not None and self._key_ok(spec, pattern, candidate):
            return candidate
        for _ in range(_ATTEMPTS):
            if pattern is not None:
                drawn: Any = self.pattern(pattern, where)
            else:
                drawn = self.value(spec, contract.name, nullable=False)
            if self._key_ok(spec, pattern, drawn):
                return drawn
        raise ConfigError(f"{where}: cannot generate a value that passes its pattern and rules")

    @staticmethod
    def _key_ok(spec: ColumnSpec, pattern: str | None, raw: Any) -> bool:
        try:
            stored = coerce(raw, spec.type)
        except TypeMismatch:
            return False
        if pattern is not None and compile_re2(pattern).fullmatch(str(stored)) is None:
            return False
        return check_constraints(spec, stored) is None


def _order(contracts: list[TableContract]) -> list[TableContract]:
    """Referenced tables first, so a foreign key can draw from their keys."""
    done: list[TableContract] = []
    pending = list(contracts)
    while pending:
        names = {c.name for c in pending}
        ready = [
            c
            for c in pending
            if not any(
                s.references and s.references.split(".")[0] in names - {c.name} for s in c.columns
            )
        ] or pending[:1]  # a cycle: take them in declared order
        done += ready
        pending = [c for c in pending if c not in ready]
    return done


def _source_changes(
    contracts: list[TableContract],
    cfg: TablesWorkload,
    draw: _Draw,
    now: datetime,
    source: SourceState,
) -> tuple[list[str], Counter[str], int]:
    """Simulate the source database in commit order from ``source`` (updated in place): one
    JSON line per change."""
    rng = draw.rng
    ordered = _order(contracts)
    draw.contracts = {c.name: c for c in ordered}
    draw.keys = source.keys
    draw.live = live = source.live
    for contract in ordered:
        if contract.name not in draw.keys:
            draw.keys[contract.name] = draw.key_values(contract, cfg.keys)
            live[contract.name] = KeyPool[tuple[Any, ...]]()
    # referential integrity, as a source enforcing its foreign keys keeps it: a row referenced
    # by a live row is not deleted (ON DELETE RESTRICT), and references point at live rows
    held, holds = source.held, source.holds
    tracked = {c.name: [s for s in c.attributes if draw.tracks(s)] for c in ordered}
    start = now - timedelta(hours=cfg.span_hours)
    step = timedelta(hours=cfg.span_hours) / max(cfg.events, 1)
    lsn = cfg.first_lsn
    changes: list[str] = []
    per_table: Counter[str] = Counter()
    for i in range(cfg.events):
        contract = rng.choice(ordered)
        for spec in tracked[contract.name]:  # nothing to refer to yet: change the parent first
            parent = (spec.references or ".").split(".", 1)[0]
            if not live[parent]:
                contract = draw.contracts[parent]
                break
        name = contract.name
        key = rng.choice(draw.keys[name])
        lsn += rng.randint(1, 64)
        stamp = start + step * i + timedelta(microseconds=rng.randint(0, 999_999))
        record: dict[str, Any] = {}
        _set(record, contract.event_id_field, f"EVT-{cfg.first_event + i:08d}")
        for spec, part in zip((contract.column(k) for k in contract.keys), key, strict=True):
            _set(record, spec.field, part)
        attributes = contract.attributes
        if key not in live[name]:
            operation, chosen = "INSERT", list(attributes)
            live[name].add(key)
        elif rng.random() < cfg.delete_rate and held[(name, key)] == 0:
            operation, chosen = "DELETE", []
            live[name].remove(key)
            for ref in holds.pop((name, key), {}).values():
                held[ref] -= 1
        elif rng.random() < cfg.partial_rate and len(attributes) > 1:
            operation = "UPDATE"
            chosen = rng.sample(list(attributes), rng.randint(1, len(attributes) - 1))
        else:
            operation, chosen = "UPDATE", list(attributes)
        for spec in chosen:
            value = draw.value(spec, name)
            _set(record, spec.field, value)
            if spec.name in {t.name for t in tracked[name]}:
                mine = holds.setdefault((name, key), {})
                old = mine.pop(spec.name, None)
                if old is not None:
                    held[old] -= 1
                if value is not None:
                    ref = ((spec.references or ".").split(".", 1)[0], (value,))
                    mine[spec.name] = ref
                    held[ref] += 1
        _set(record, contract.operation_field, operation)
        _set(record, contract.timestamp_field, _json_value(stamp))
        _set(record, contract.lsn_field, lsn)
        _set(record, "metadata.source_table", f"public.{name}")
        _set(record, "metadata.tx_id", f"TX-{lsn}")
        changes.append(json.dumps(record))
        per_table[name] += 1
    return changes, per_table, lsn


def _invalid(
    k: int, first: int, rng: random.Random, changes: list[str], contracts: list[TableContract]
) -> str:
    """The k-th invalid record (id ``BAD-<first + k>``): a change of some table made invalid in
    one of five ways."""
    record = json.loads(changes[rng.randrange(len(changes))])
    name = route_name(record) or ""
    contract = next(c for c in contracts if c.name == name)
    _set(record, contract.event_id_field, f"BAD-{first + k:06d}")
    kind = k % 5
    typed = [c for c in contract.attributes if parse_type(c.type)[0] not in ("string", "json")]
    bounded = [
        c
        for c in contract.attributes
        if c.minimum is not None and parse_type(c.type)[0] in ("integer", "decimal", "double")
    ]
    if kind == 0 and typed:  # a value of the wrong type
        spec = rng.choice(typed)
        _set(record, spec.field, f"not a {parse_type(spec.type)[0]}")
        _set(record, contract.operation_field, "UPDATE")
    elif kind == 1 and bounded:  # below its minimum
        spec = rng.choice(bounded)
        low = coerce(spec.minimum, spec.type)
        _set(record, spec.field, _json_value(low - (Decimal(1) if isinstance(low, Decimal) else 1)))
        _set(record, contract.operation_field, "UPDATE")
    elif kind == 2:  # no key
        _set(record, contract.column(contract.keys[0]).field, None)
    elif kind == 3:  # a table nobody declared
        record["metadata"]["source_table"] = f"public.{UNDECLARED_TABLE}"
    else:  # not JSON at all
        return json.dumps(record)[: rng.randint(5, 30)]
    return json.dumps(record)


def generate_tables(
    out_dir: str | Path,
    contracts: list[TableContract],
    cfg: TablesWorkload,
    resume: SourceState | None = None,
) -> TablesSummary:
    """Write landing files of CDC events of every declared table.

    Args:
        out_dir: landing folder (created if missing; files ``events-<n>.jsonl`` after those
            already there).
        contracts: the declared tables (``config.contracts()``).
        cfg: generation parameters.
        resume: the source state a previous workload ended with (its ``summary.source``): this
            one continues it (same keys, live rows and references), e.g. after a contract
            change; set ``cfg.first_event`` and ``cfg.first_lsn`` after the previous ones.

    Returns:
        What was written, with every record in arrival order.

    Raises:
        UsageError: the config declares no table.
        ConfigError: a column whose constraints no drawn value passes.
    """
    if not contracts:
        raise UsageError("generate: the config declares no table")
    rng = random.Random(cfg.seed)
    now = (cfg.now or datetime.now(UTC)) - timedelta(minutes=1)
    draw = _Draw(rng, now)
    source = resume if resume is not None else SourceState()
    changes, per_table, last_lsn = _source_changes(contracts, cfg, draw, now, source)
    invalid = int(cfg.events * cfg.invalid_rate)
    delivery = arrange(
        changes,
        rng,
        cfg.out_of_order_rate,
        cfg.late_rate,
        cfg.duplicate_rate,
        invalid,
        lambda k: _invalid(k, cfg.first_event, rng, changes, contracts),
    )
    return TablesSummary(
        files=write_landing(out_dir, delivery, cfg.files, cfg.gzip_every),
        changes=dict(per_table),
        records=len(delivery),
        duplicates=int(cfg.events * cfg.duplicate_rate),
        invalid=invalid,
        lines=delivery,
        last_event=cfg.first_event + cfg.events - 1,
        last_lsn=last_lsn,
        source=source,
    )


@dataclass
class TableOutcome:
    """What the pipeline must produce for one table from a stream of records.

    Attributes:
        state: expected Silver rows (one per key) and hard-mode tombstones.
        quarantine: reason → records quarantined for it in the table's quarantine.
        accepted: records accepted into Bronze (duplicates included).
        duplicates: exact re-deliveries among ``accepted``.
    """

    state: ContractState
    quarantine: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    duplicates: int = 0

    def counts(self) -> dict[str, Any]:
        """JSON form: accepted, duplicates, quarantine per reason, Silver rows / deleted /
        tombstones."""
        rows = self.state.rows.values()
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "quarantined": sum(self.quarantine.values()),
            "quarantine": dict(sorted(self.quarantine.items())),
            "silver": {
                "rows": len(self.state.rows),
                "deleted": sum(1 for r in rows if r["is_deleted"]),
                "tombstones": len(self.state.tombstones),
            },
        }


def expected_tables(
    lines: list[str],
    contracts: list[TableContract],
    processing_time: datetime | None = None,
    max_clock_skew: timedelta = timedelta(minutes=5),
) -> tuple[dict[str, TableOutcome], Counter[str]]:
    """Route, validate, de-duplicate and fold records exactly as the engine does.

    Args:
        lines: the non-blank records in arrival order (file order, then line order).
        contracts: the declared tables (each with its own ``delete_mode``).
        processing_time: the time of the future-timestamp rule (default now).
        max_clock_skew: ``processing.max_clock_skew``.

    Returns:
        (table → its expected outcome, reason → records for ``quarantine/unrouted_events``).
    """
    when = processing_time or datetime.now(UTC)
    validators = {c.name: ContractValidator(c, when, max_clock_skew) for c in contracts}
    candidates: dict[str, list[tuple[int, ChangeEvent | TruncateEvent]]] = {
        c.name: [] for c in contracts
    }
    outcomes = {c.name: TableOutcome(ContractState()) for c in contracts}
    unrouted: Counter[str] = Counter()
    for position, line in enumerate(lines):
        parsed = parse_record(line)
        if isinstance(parsed, Rejection):
            unrouted[parsed.reason] += 1
            continue
        name = route_name(parsed)
        if name not in validators:
            unrouted["UNKNOWN_TABLE"] += 1
            continue
        result = validators[name].validate_object(parsed)
        if isinstance(result, Rejection):
            outcomes[name].quarantine[result.reason] += 1
        else:
            candidates[name].append((position, result))
    for contract in contracts:
        outcome = outcomes[contract.name]
        deliveries, conflicts = classify(candidates[contract.name], {})  # type: ignore[arg-type]
        for _, rejection in conflicts:
            outcome.quarantine[rejection.reason] += 1
        outcome.accepted = len(deliveries)
        outcome.duplicates = sum(d.is_duplicate for d in deliveries)
        firsts = [d.event for d in deliveries if not d.is_duplicate]
        outcome.state = fold_changes(firsts, contract, contract.delete_mode)  # type: ignore[arg-type]
    return outcomes, unrouted


__all__ = [
    "STATE_FILE",
    "UNDECLARED_TABLE",
    "SourceState",
    "TableOutcome",
    "TablesSummary",
    "TablesWorkload",
    "expected_tables",
    "generate_tables",
    "load_state",
    "save_state",
]
