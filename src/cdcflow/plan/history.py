"""Pure-Python reference of ``silver/customer_history`` (SCD Type 2) and of point-in-time state.

The history of a customer is its timeline: the accepted, de-duplicated events of the key applied
in ascending sequence (numeric LSN, event_timestamp, event_id) with
:func:`cdcflow.plan.reference.apply_event`, one **version** per event, holding:

* the public Silver columns (``SILVER_COLUMNS``) of the row image *after* the event;
* ``event_id``, ``operation``, ``lsn``, ``sequence`` of the event;
* ``valid_from`` = the event's ``event_timestamp``; ``valid_to`` = the next version's
  ``valid_from`` (None for the current version); ``is_current`` = it is the key's last version.

Every event is a version (applying an event always changes the row image: at least the
``last_*`` columns), so a late event is slotted into the middle of the timeline, every later
image is recomputed and both neighbours' windows close around it.

DELETE versions:

* soft mode: the image is the deleted row, exactly as Silver holds it (``is_deleted`` true,
  status ``DELETED``, attributes kept).
* hard mode: Silver has no row after a DELETE; the version records the deletion itself:
  ``is_deleted`` true, status ``DELETED``, every other attribute null, ``created_at`` null,
  ``deleted_at`` = the event timestamp. A later INSERT/UPDATE starts a fresh row (new
  ``created_at``). A hard-deleted customer is absent from point-in-time state.

Point-in-time: the state of a customer as of instant T is its version with the highest sequence
among those with ``valid_from <= T`` (equal to "the version whose window [valid_from, valid_to)
contains T" even when source clocks are not monotonic along LSNs; a version whose window is empty
was never visible). In hard mode a customer whose state is a DELETE version has no state.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from cdcflow.model.contracts import TableContract
from cdcflow.model.events import CdcEvent, Operation
from cdcflow.plan.contract_rules import ChangeEvent, TruncateEvent
from cdcflow.plan.reference import (
    SILVER_COLUMNS,
    ContractState,
    DeleteMode,
    ReferenceState,
    apply_change,
    apply_event,
)
from cdcflow.plan.truncates import with_truncates_applied

#: Columns of ``silver/customer_history``, in table order.
HISTORY_COLUMNS = (
    *SILVER_COLUMNS,
    "event_id",
    "operation",
    "lsn",
    "sequence",
    "valid_from",
    "valid_to",
    "is_current",
)


def _deletion_image(event: CdcEvent) -> dict[str, Any]:
    """Hard mode: the version recorded for a DELETE (Silver holds no row)."""
    row: dict[str, Any] = dict.fromkeys(SILVER_COLUMNS)
    row.update(
        customer_id=event.customer_id,
        status="DELETED",
        is_deleted=True,
        is_active=False,
        last_updated_at=event.event_timestamp,
        deleted_at=event.event_timestamp,
        last_event_id=event.event_id,
        last_operation=event.operation.value,
        last_lsn=event.lsn,
    )
    return row


def timeline(events: Iterable[CdcEvent], mode: DeleteMode = "soft") -> dict[str, list[dict]]:
    """Expected history: customer_id → its versions in ascending sequence.

    Args:
        events: accepted first-copy events (one per event_id), any order, any customers.
        mode: ``soft`` or ``hard`` delete mode.

    Returns:
        One list per customer_id with at least one event; each version is a dict with the
        ``HISTORY_COLUMNS`` keys.
    """
    state = ReferenceState()
    out: dict[str, list[dict]] = {}
    for event in sorted(events, key=lambda e: e.sequence):
        apply_event(state, event, mode)
        if mode == "hard" and event.operation is Operation.DELETE:
            image = _deletion_image(event)
        else:
            image = dict(state.rows[event.customer_id])
        image.update(
            event_id=event.event_id,
            operation=event.operation.value,
            lsn=event.lsn,
            sequence=event.sequence,
            valid_from=event.event_timestamp,
            valid_to=None,
            is_current=True,
        )
        versions = out.setdefault(event.customer_id, [])
        if versions:
            versions[-1]["valid_to"] = event.event_timestamp
            versions[-1]["is_current"] = False
        versions.append(image)
    return out


def state_as_of(
    history: dict[str, list[dict]], instant: datetime, mode: DeleteMode = "soft"
) -> dict[str, dict[str, Any]]:
    """Point-in-time state from a timeline (see module doc).

    Args:
        history: output of :func:`timeline` (versions in ascending sequence).
        instant: timezone-aware instant T.
        mode: delete mode (hard mode drops customers whose state is a deletion).

    Returns:
        customer_id → public Silver row (``SILVER_COLUMNS``) as of T; customers without a version
        at or before T are absent.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, versions in history.items():
        seen = [v for v in versions if v["valid_from"] <= instant]
        if not seen:
            continue
        version = seen[-1]
        if mode == "hard" and version["is_deleted"]:
            continue
        out[key] = {name: version[name] for name in SILVER_COLUMNS}
    return out


def contract_timeline(
    events: Iterable[ChangeEvent | TruncateEvent],
    contract: TableContract,
    mode: DeleteMode = "soft",
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Expected history of a declared table: the rules of :func:`timeline`, keyed by the key
    tuple, over the contract's columns (:func:`cdcflow.plan.reference.apply_change`).

    A hard-mode DELETE version holds the key, the contract's ``soft_delete_values`` (every
    other non-key column null), ``is_deleted`` true, ``is_active`` false (when derived), no
    ``created_at``, and the event's timestamps and ``last_*``.

    Args:
        events: accepted first copies (one per event_id), any order, any keys; a truncate
            among them is a DELETE version of every key it deletes (:mod:`cdcflow.plan.
            truncates`).
        contract: the table's contract.
        mode: ``soft`` or ``hard``.

    Returns:
        key tuple → its versions in ascending sequence (public Silver columns, ``event_id``,
        ``operation``, ``lsn``, ``sequence``, ``valid_from``, ``valid_to``, ``is_current``).
    """
    state = ContractState()
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for event in sorted(with_truncates_applied(events), key=lambda e: e.sequence):
        apply_change(state, event, contract, mode)
        if mode == "hard" and event.operation is Operation.DELETE:
            image: dict[str, Any] = dict(zip(contract.keys, event.key, strict=True))
            image.update(dict.fromkeys(c.name for c in contract.attributes))
            image.update(contract.soft_delete_values)
            image.update(is_deleted=True, created_at=None, deleted_at=event.event_timestamp)
            if contract.derived_active is not None:
                image["is_active"] = False
            image.update(
                last_updated_at=event.event_timestamp,
                last_event_id=event.event_id,
                last_operation=event.operation.value,
                last_lsn=event.lsn,
            )
        else:
            image = dict(state.rows[event.key])
        image.update(
            event_id=event.event_id,
            operation=event.operation.value,
            lsn=event.lsn,
            sequence=event.sequence,
            valid_from=event.event_timestamp,
            valid_to=None,
            is_current=True,
        )
        versions = out.setdefault(event.key, [])
        if versions:
            versions[-1]["valid_to"] = event.event_timestamp
            versions[-1]["is_current"] = False
        versions.append(image)
    return out


__all__ = ["HISTORY_COLUMNS", "contract_timeline", "state_as_of", "timeline"]
