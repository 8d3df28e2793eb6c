"""Pure-Python reference fold: the semantics every engine is tested against.

For every customer_id, Silver equals the result of applying all accepted, de-duplicated events
in ascending sequence (numeric LSN, event_timestamp, event_id), starting from no row:

* INSERT / UPDATE: set every attribute present in the payload (explicit null sets null, absent
  is unchanged); set status when present; ``is_deleted = False``; ``deleted_at = None``. An
  UPDATE for an unknown key creates it; an INSERT for an existing key acts as an update.
* DELETE, soft mode: ``is_deleted = True``, ``status = 'DELETED'``, ``deleted_at`` = the event
  timestamp; attributes are kept. A DELETE for an unknown key creates a deleted row.
* DELETE, hard mode: the row is removed and a tombstone (customer_id, sequence) remains; events
  with a lower sequence are blocked by it; a later INSERT/UPDATE starts a fresh, empty row.
* ``created_at`` = timestamp of the row's lowest-sequence applied event; ``last_*`` and
  ``last_updated_at`` come from the highest. ``is_active`` = not deleted and status ACTIVE.

See ``shared/SEMANTICS.md`` for the clarifications this follows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from cdcflow.model.contracts import TableContract
from cdcflow.model.events import ATTRIBUTES, CdcEvent, Operation

if TYPE_CHECKING:
    from cdcflow.plan.contract_rules import ChangeEvent, TruncateEvent

DeleteMode = Literal["soft", "hard"]

#: Public Silver columns, in table order.
SILVER_COLUMNS = (
    "customer_id",
    *ATTRIBUTES,
    "is_deleted",
    "is_active",
    "created_at",
    "last_updated_at",
    "deleted_at",
    "last_event_id",
    "last_operation",
    "last_lsn",
)


@dataclass
class ReferenceState:
    """Result of the reference fold.

    Attributes:
        rows: customer_id → public Silver row (``SILVER_COLUMNS``); one entry per customer_id
            present in Silver (hard-deleted customers are absent).
        tombstones: customer_id → sequence of the latest DELETE (hard mode only).
    """

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    tombstones: dict[str, str] = field(default_factory=dict)


def _empty_row(customer_id: str, created_at: datetime) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SILVER_COLUMNS)
    row["customer_id"] = customer_id
    row["created_at"] = created_at
    row["is_deleted"] = False
    return row


def apply_event(state: ReferenceState, event: CdcEvent, mode: DeleteMode) -> None:
    """Apply one event to the state (events must be applied in ascending sequence)."""
    key = event.customer_id
    row = state.rows.get(key)
    if event.operation is Operation.DELETE and mode == "hard":
        state.rows.pop(key, None)
        state.tombstones[key] = event.sequence
        return
    if row is None:
        row = _empty_row(key, event.event_timestamp)
        state.rows[key] = row
    if event.operation is Operation.DELETE:
        row["is_deleted"] = True
        row["status"] = "DELETED"
        row["deleted_at"] = event.event_timestamp
    else:
        row.update(event.values)
        row["is_deleted"] = False
        row["deleted_at"] = None
    row["is_active"] = (not row["is_deleted"]) and row["status"] == "ACTIVE"
    row["last_updated_at"] = event.event_timestamp
    row["last_event_id"] = event.event_id
    row["last_operation"] = event.operation.value
    row["last_lsn"] = event.lsn


def dedupe(events: Iterable[CdcEvent]) -> list[CdcEvent]:
    """Keep the first copy of every event_id (input in arrival order)."""
    seen: set[str] = set()
    out = []
    for event in events:
        if event.event_id not in seen:
            seen.add(event.event_id)
            out.append(event)
    return out


def fold(events: Iterable[CdcEvent], mode: DeleteMode = "soft") -> ReferenceState:
    """Fold de-duplicated events (any order) into the expected Silver state.

    Args:
        events: accepted events, one copy per event_id, in any order.
        mode: ``soft`` or ``hard`` delete mode.

    Returns:
        The expected state: one row per customer_id present in Silver, plus hard-mode tombstones.
    """
    state = ReferenceState()
    for event in sorted(events, key=lambda e: e.sequence):
        apply_event(state, event, mode)
    return state


@dataclass
class ContractState:
    """Result of :func:`fold_changes` for one contract's table.

    Attributes:
        rows: key tuple → public Silver row (the contract's columns, ``is_deleted``,
            ``is_active`` when derived, timestamps and ``last_*``); one entry per key present.
        tombstones: key tuple → sequence of the latest DELETE (hard mode only).
    """

    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    tombstones: dict[tuple[Any, ...], str] = field(default_factory=dict)


def apply_change(
    state: ContractState, event: ChangeEvent, contract: TableContract, mode: DeleteMode = "soft"
) -> None:
    """Apply one accepted change to a contract's state (the rules of :func:`apply_event`).

    Args:
        state: updated in place.
        event: a first copy, applied in ascending sequence after those already applied.
        contract: the table's contract.
        mode: ``soft`` or ``hard``.
    """
    key = event.key
    if event.operation is Operation.DELETE and mode == "hard":
        state.rows.pop(key, None)
        state.tombstones[key] = event.sequence
        return
    row = state.rows.get(key)
    if row is None:
        row = dict(zip(contract.keys, key, strict=True))
        row.update(dict.fromkeys(c.name for c in contract.attributes))
        row.update(is_deleted=False, created_at=event.event_timestamp)
        state.rows[key] = row
    if event.operation is Operation.DELETE:
        row.update(contract.soft_delete_values)
        row.update(is_deleted=True, deleted_at=event.event_timestamp)
    else:
        row.update(event.values)
        row.update(is_deleted=False, deleted_at=None)
    if contract.derived_active is not None:
        column, value = contract.derived_active
        row["is_active"] = not row["is_deleted"] and row[column] == value
    row.update(
        last_updated_at=event.event_timestamp,
        last_event_id=event.event_id,
        last_operation=event.operation.value,
        last_lsn=event.lsn,
    )


def fold_changes(
    events: Iterable[ChangeEvent | TruncateEvent],
    contract: TableContract,
    mode: DeleteMode = "soft",
) -> ContractState:
    """The reference fold of any contract: the same rules as :func:`fold`, keyed by the key
    tuple, over the contract's non-key columns.

    Args:
        events: accepted first copies (one per event_id) of the contract's table, any order;
            truncates (``truncate: apply``) among them delete, at their sequence, every key
            with an event before it (:mod:`cdcflow.plan.truncates`).
        contract: the table's contract (keys, columns, soft-delete values, derived is_active).
        mode: ``soft`` or ``hard``.

    Returns:
        The expected Silver rows and hard-mode tombstones.
    """
    from cdcflow.plan.truncates import with_truncates_applied

    state = ContractState()
    for change in sorted(with_truncates_applied(events), key=lambda e: e.sequence):
        apply_change(state, change, contract, mode)
    return state
