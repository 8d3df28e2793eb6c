"""wal2json (format-version 2) change rows → canonical flat events of the ``customers`` contract,
or (``tables``) of every declared table.

Pure functions, no database: :func:`decode_rows` takes the rows returned by
``pg_logical_slot_peek_changes(slot, NULL, n, 'format-version', '2', 'include-xids', '1',
'include-timestamp', '1', 'include-lsn', '1', 'add-tables', <table>)`` — ``(lsn, data)`` pairs
where ``data`` is one JSON object per row: ``B`` (begin), ``I``/``U``/``D`` (row changes), ``T``
(TRUNCATE), ``M`` (message), ``C`` (commit) — and returns the events, one JSON object each.

Mapping (one row change → one event, except a key-changing UPDATE → two):

* ``operation``: ``I`` → INSERT, ``U`` → UPDATE, ``D`` → DELETE. An UPDATE whose old identity
  carries another key (the primary key was changed) becomes a DELETE of the old key followed by
  an INSERT of the new key.
* ``customer_id``: the key column's value (new tuple; for a DELETE the old identity, which holds
  the key under both ``REPLICA IDENTITY DEFAULT`` and ``FULL``).
* attributes (``ATTRIBUTES``): from the new tuple (INSERT/UPDATE); a DELETE carries none.
* ``event_timestamp``: the transaction's commit timestamp (UTC, ISO-8601).
* ``metadata.lsn``: the change's own LSN in ``X/Y`` notation (row changes of one key are
  ordered by it: PostgreSQL's row locks make a later change of a row have a higher LSN, also
  across transactions); ``metadata.tx_id``: the xid; ``metadata.source_table``: ``schema.table``;
  ``metadata.commit_lsn``: the transaction's commit LSN.
* ``event_id``: ``pg-<commit LSN>-<position>`` with the 0-based position of the event in its
  transaction, 6 digits. A re-read of the same WAL gives the same ids and the same content.
* TRUNCATE: one event with ``operation`` ``TRUNCATE`` and a null ``customer_id`` — the pipeline
  quarantines it (``NULL_CUSTOMER_ID``; the raw payload says ``TRUNCATE`` and why), so a
  truncation is visible in the quarantine table instead of silently ignored. It is not applied
  to Silver (see docs/postgres.md for the policy) — except for a declared table whose contract
  says ``truncate: apply`` (:mod:`cdcflow.plan.truncates`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdcflow.model.events import ATTRIBUTES
from cdcflow.model.lsn import format_pg_lsn, parse_lsn

EVENT_ID_PREFIX = "pg"
_ACTIONS = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}
TRUNCATE_NOTE = (
    "source TRUNCATE: every row of the table was removed at the source; not applied to Silver "
    "(policy: quarantine, then re-snapshot or reconcile)"
)
#: The note of a declared table's TRUNCATE: its contract's ``truncate`` policy decides.
TABLE_TRUNCATE_NOTE = (
    "source TRUNCATE: every row of the table was removed at the source; applied to Silver under "
    "the table's truncate: apply policy, else quarantined (then re-snapshot or reconcile)"
)


class DecodeError(ValueError):
    """A wal2json row could not be understood (unexpected format or missing fields)."""


@dataclass
class DecodedRange:
    """The events decoded from a run of whole transactions.

    Attributes:
        events: canonical flat events (JSON-ready dicts), in WAL order.
        start_lsn: LSN of the first row (numeric), or None when there were no rows.
        end_lsn: end of the last commit record (numeric): the slot can be advanced here once the
            events are committed; None when no transaction was complete.
        transactions: number of committed transactions seen.
        truncates: number of TRUNCATE events among ``events``.
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    start_lsn: int | None = None
    end_lsn: int | None = None
    transactions: int = 0
    truncates: int = 0


def event_id(commit_lsn: int, position: int) -> str:
    """Deterministic event id: ``pg-<commit LSN X/Y>-<position, 6 digits>``."""
    return f"{EVENT_ID_PREFIX}-{format_pg_lsn(commit_lsn)}-{position:06d}"


def commit_timestamp(text: str) -> str:
    """wal2json's ``2025-05-12 10:00:00.123456+00`` → ISO-8601 UTC with ``Z``.

    Raises:
        DecodeError: not a timestamp with an offset.
    """
    value = text.strip()
    if value.endswith(("+00", "-00")) or (len(value) > 3 and value[-3] in "+-"):
        value += ":00"  # Python < 3.12 wants +HH:MM
    try:
        parsed = datetime.fromisoformat(value.replace(" ", "T", 1))
    except ValueError as exc:
        raise DecodeError(f"unreadable commit timestamp {text!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _tuple(columns: list[dict[str, Any]] | None, typed: bool = False) -> dict[str, Any]:
    """Column name → value of a wal2json tuple; ``typed`` (declared tables): a ``json`` /
    ``jsonb`` column's text (wal2json sends it as a string) parsed into its JSON value."""
    out = {c["name"]: c.get("value") for c in columns or []}
    if typed:
        for c in columns or []:
            value = out[c["name"]]
            if c.get("type") in ("json", "jsonb") and isinstance(value, str):
                with contextlib.suppress(ValueError):  # not JSON after all: kept as text
                    out[c["name"]] = json.loads(value)
    return out


def _event(
    *,
    op: str,
    key: dict[str, Any],
    values: dict[str, Any],
    ts: str,
    change_lsn: int,
    commit_lsn: int,
    position: int,
    xid: Any,
    table: str,
    columns: tuple[str, ...] | None = ATTRIBUTES,
) -> dict[str, Any]:
    """One event: the key fields, then (INSERT/UPDATE) ``values`` of ``columns`` (None: every
    column of the row that is not a key field; a key column is never repeated)."""
    record: dict[str, Any] = {"event_id": event_id(commit_lsn, position), **key}
    record["operation"] = op
    record["event_timestamp"] = ts
    if op in ("INSERT", "UPDATE"):
        names = [n for n in values if n not in key] if columns is None else columns
        for name in names:
            if name in values:
                record[name] = values[name]
    record["metadata"] = {
        "source_table": table,
        "lsn": format_pg_lsn(change_lsn),
        "commit_lsn": format_pg_lsn(commit_lsn),
        "tx_id": None if xid is None else str(xid),
    }
    return record


def decode_rows(
    rows: Iterable[tuple[str, str]],
    key_column: str = "customer_id",
    tables: dict[str, tuple[str, ...]] | None = None,
) -> DecodedRange:
    """Turn peeked wal2json v2 rows into canonical events, keeping only complete transactions.

    Args:
        rows: ``(lsn, data)`` pairs as returned by ``pg_logical_slot_peek_changes`` (``lsn`` in
            ``X/Y`` notation; for a commit row it is the end of the commit record).
        key_column: the primary-key column that holds the customer_id (customers).
        tables: declared tables (a ``tables:`` section): PostgreSQL table name → its key
            columns. An event then carries the key columns and every column of the new row
            under their PostgreSQL names (a number with a fraction as its exact text, a
            ``json``/``jsonb`` value parsed), and a TRUNCATE names the truncated table (no key).

    Returns:
        The decoded range. Rows after the last commit row (an incomplete transaction, which a
        peek never returns in practice) are left out and not covered by ``end_lsn``.

    Raises:
        DecodeError: a row is not wal2json format-version 2 JSON, or a change lacks its key.
    """
    result = DecodedRange()
    pending: list[dict[str, Any]] = []
    pending_truncates = 0
    for lsn_text, data in rows:
        row_lsn = parse_lsn(lsn_text)
        if result.start_lsn is None:
            result.start_lsn = row_lsn
        try:
            # declared tables: a number's exact text (numeric(p,s) beyond a float's digits)
            change = json.loads(data) if tables is None else json.loads(data, parse_float=str)
            action = change["action"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a wal2json format-version 2 row at {lsn_text}") from exc
        if action == "B":
            pending, pending_truncates = [], 0
            continue
        if action == "C":
            commit_lsn = parse_lsn(change["lsn"])
            for position, record in enumerate(pending):
                record["event_id"] = event_id(commit_lsn, position)
                record["metadata"]["commit_lsn"] = format_pg_lsn(commit_lsn)
            result.events.extend(pending)
            result.truncates += pending_truncates
            result.transactions += 1
            result.end_lsn = row_lsn
            pending, pending_truncates = [], 0
            continue
        if action == "M":
            continue
        table = f"{change.get('schema', '')}.{change.get('table', '')}"
        keys: tuple[str, ...] = (key_column,)  # the key's columns in the row
        fields: tuple[str, ...] = ("customer_id",)  # their names in the event
        columns: tuple[str, ...] | None = ATTRIBUTES
        if tables is not None:
            keys = fields = tables.get(str(change.get("table", "")), ())
            columns = None
        ts = commit_timestamp(change["timestamp"])
        change_lsn = parse_lsn(change["lsn"])
        xid = change.get("xid")
        common = {
            "ts": ts,
            "change_lsn": change_lsn,
            "commit_lsn": 0,  # filled in at the commit row
            "xid": xid,
            "table": table,
            "columns": columns,
        }
        if action == "T":
            no_key = {} if tables is not None else {"customer_id": None}
            record = _event(op="TRUNCATE", key=no_key, values={}, position=0, **common)
            record["metadata"]["note"] = TRUNCATE_NOTE if tables is None else TABLE_TRUNCATE_NOTE
            pending.append(record)
            pending_truncates += 1
            continue
        if action not in _ACTIONS:
            raise DecodeError(f"unknown wal2json action {action!r} at {lsn_text}")
        new = _tuple(change.get("columns"), typed=tables is not None)
        old = _tuple(change.get("identity"), typed=tables is not None)
        if action == "D":
            if any(k not in old for k in keys):
                raise DecodeError(f"DELETE without the key column {_names(keys)} at {lsn_text}")
            old_key = {f: old[k] for f, k in zip(fields, keys, strict=True)}
            pending.append(_event(op="DELETE", key=old_key, values={}, position=0, **common))
            continue
        if any(k not in new for k in keys):
            raise DecodeError(f"{_ACTIONS[action]} without the key column at {lsn_text}")
        new_key = {f: new[k] for f, k in zip(fields, keys, strict=True)}
        if action == "U" and all(k in old for k in keys) and any(old[k] != new[k] for k in keys):
            old_key = {f: old[k] for f, k in zip(fields, keys, strict=True)}
            pending.append(_event(op="DELETE", key=old_key, values={}, position=0, **common))
            row = new
            if tables is not None:  # an unchanged TOASTed value is only in the old row (FULL)
                row = {**{k: v for k, v in old.items() if k not in keys}, **new}
            pending.append(_event(op="INSERT", key=new_key, values=row, position=0, **common))
            continue
        pending.append(_event(op=_ACTIONS[action], key=new_key, values=new, position=0, **common))
    return result


def _names(keys: tuple[str, ...]) -> str:
    return ", ".join(repr(k) for k in keys) if len(keys) != 1 else repr(keys[0])
