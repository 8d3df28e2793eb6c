"""wal2json (format-version 2) change rows → canonical flat events of the ``customers`` contract.

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
  to Silver (see docs/postgres.md for the policy).
"""

from __future__ import annotations

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


def _tuple(columns: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {c["name"]: c.get("value") for c in columns or []}


def _event(
    *,
    op: str,
    key: Any,
    values: dict[str, Any],
    ts: str,
    change_lsn: int,
    commit_lsn: int,
    position: int,
    xid: Any,
    table: str,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "event_id": event_id(commit_lsn, position),
        "customer_id": key,
        "operation": op,
        "event_timestamp": ts,
    }
    if op in ("INSERT", "UPDATE"):
        for name in ATTRIBUTES:
            if name in values:
                record[name] = values[name]
    record["metadata"] = {
        "source_table": table,
        "lsn": format_pg_lsn(change_lsn),
        "commit_lsn": format_pg_lsn(commit_lsn),
        "tx_id": None if xid is None else str(xid),
    }
    return record


def decode_rows(rows: Iterable[tuple[str, str]], key_column: str = "customer_id") -> DecodedRange:
    """Turn peeked wal2json v2 rows into canonical events, keeping only complete transactions.

    Args:
        rows: ``(lsn, data)`` pairs as returned by ``pg_logical_slot_peek_changes`` (``lsn`` in
            ``X/Y`` notation; for a commit row it is the end of the commit record).
        key_column: the primary-key column that holds the customer_id.

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
            change = json.loads(data)
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
        ts = commit_timestamp(change["timestamp"])
        change_lsn = parse_lsn(change["lsn"])
        xid = change.get("xid")
        common = {
            "ts": ts,
            "change_lsn": change_lsn,
            "commit_lsn": 0,  # filled in at the commit row
            "xid": xid,
            "table": table,
        }
        if action == "T":
            record = _event(op="TRUNCATE", key=None, values={}, position=0, **common)
            record["metadata"]["note"] = TRUNCATE_NOTE
            pending.append(record)
            pending_truncates += 1
            continue
        if action not in _ACTIONS:
            raise DecodeError(f"unknown wal2json action {action!r} at {lsn_text}")
        new = _tuple(change.get("columns"))
        old = _tuple(change.get("identity"))
        if action == "D":
            if key_column not in old:
                raise DecodeError(f"DELETE without the key column {key_column!r} at {lsn_text}")
            pending.append(
                _event(op="DELETE", key=old[key_column], values={}, position=0, **common)
            )
            continue
        if key_column not in new:
            raise DecodeError(f"{_ACTIONS[action]} without the key column at {lsn_text}")
        if action == "U" and key_column in old and old[key_column] != new[key_column]:
            pending.append(
                _event(op="DELETE", key=old[key_column], values={}, position=0, **common)
            )
            pending.append(
                _event(op="INSERT", key=new[key_column], values=new, position=0, **common)
            )
            continue
        pending.append(
            _event(op=_ACTIONS[action], key=new[key_column], values=new, position=0, **common)
        )
    return result
