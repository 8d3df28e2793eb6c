"""A source TRUNCATE applied to Silver (``truncate: apply``): the rule, engine-neutral.

A TRUNCATE removes every row of the source table at one point of the change stream. In the
terms of the core promise — Silver equals the accepted events applied in sequence order — a
truncate at sequence ``T`` is a DELETE at ``T`` of every key that exists at ``T``, i.e. of
**every key with at least one event whose sequence is below ``T``** (soft or hard per the
contract's ``delete_mode``). Keys whose every event is above ``T`` are untouched. The DELETE
takes the truncate's event id, timestamp, LSN and sequence; it carries no column values.

Because the rule is stated per key over sequences, it holds whatever the arrival order:

* **The truncate arrives** (a new first copy): every key of the table whose first event in
  Bronze is below ``T`` gets its DELETE at ``T``.
* **Events arrive after it** (late or not): wherever events of a key are folded — the
  micro-batch, the hard-mode refold of a key's whole history, the SCD2 history, replay — the
  DELETEs of every known truncate above the lowest sequence among them are added
  (:func:`expand_changes`, and the engines' columnar twins), so a late event below ``T`` ends
  deleted at ``T`` and an event above ``T`` revives the key by the ordinary revival rules
  (``shared/SEMANTICS.md`` point 2).

The sequence guards of the Silver MERGE make both idempotent: a DELETE at ``T`` already applied
is not newer than the row, so a re-run or a redelivered truncate changes nothing.

The accepted truncates of every table are kept in ``audit/source_truncates`` (one row per
delivery, like Bronze), which each micro-batch reads before folding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cdcflow.model.events import Operation

if TYPE_CHECKING:
    from cdcflow.plan.contract_rules import ChangeEvent, TruncateEvent

#: The columns of a truncate the expansions read (``audit/source_truncates``).
TRUNCATE_COLUMNS = ("event_id", "event_timestamp", "lsn", "sequence")


def truncate_delete(key: tuple[Any, ...], truncate: TruncateEvent) -> ChangeEvent:
    """The DELETE a truncate applies to one key (no values; the truncate's id and sequence).

    Args:
        key: the key tuple.
        truncate: the accepted truncate.
    """
    from cdcflow.plan.contract_rules import ChangeEvent

    return ChangeEvent(
        table=truncate.table,
        key=key,
        event_id=truncate.event_id,
        operation=Operation.DELETE,
        event_timestamp=truncate.event_timestamp,
        values={},
        lsn=truncate.lsn,
        lsn_number=truncate.lsn_number,
        content_hash=truncate.content_hash,
        timestamp_nanos=truncate.timestamp_nanos,
    )


def expand_changes(
    events: Iterable[ChangeEvent], truncates: Sequence[TruncateEvent]
) -> list[ChangeEvent]:
    """The events plus the DELETE of every truncate above each key's lowest sequence.

    Args:
        events: first copies of one table's changes (any order); a key's events here must be
            all of its events at or after the lowest one given (a whole history, or a batch
            merged onto a Silver that already holds the earlier truncates).
        truncates: the table's accepted truncates (first copies).

    Returns:
        ``events`` followed by the truncates' DELETEs (one per key and truncate).
    """
    out = list(events)
    if not truncates:
        return out
    lowest: dict[tuple[Any, ...], str] = {}
    for event in out:
        seen = lowest.get(event.key)
        if seen is None or event.sequence < seen:
            lowest[event.key] = event.sequence
    ordered = sorted(truncates, key=lambda t: t.sequence)
    for key, first in lowest.items():
        out.extend(truncate_delete(key, t) for t in ordered if t.sequence > first)
    return out


def with_truncates_applied(events: Iterable[ChangeEvent | TruncateEvent]) -> list[ChangeEvent]:
    """Accepted first copies of one table, truncates among them → the changes the reference
    folds (:func:`expand_changes` of the changes by the truncates)."""
    from cdcflow.plan.contract_rules import TruncateEvent

    changes: list[ChangeEvent] = []
    truncates: list[TruncateEvent] = []
    for event in events:
        if isinstance(event, TruncateEvent):
            truncates.append(event)
        else:
            changes.append(event)
    return expand_changes(changes, truncates)


__all__ = ["TRUNCATE_COLUMNS", "expand_changes", "truncate_delete", "with_truncates_applied"]
