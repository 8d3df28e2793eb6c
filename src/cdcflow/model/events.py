"""Canonical CDC event: operations, attribute columns and the total-order sequence.

The **sequence** of an event is the tuple (numeric LSN, event_timestamp as a UTC instant,
event_id), compared in that order. It is encoded as one string whose plain (byte / code point)
order equals the tuple order, so every engine can compare sequences with ``<`` on strings::

    <LSN as 32 hex digits> "." <UTC timestamp as YYYYMMDDHHMMSSfffffffff> "." <event_id>

The two first fields have fixed width, so comparing the strings compares LSN, then time, then
event_id in plain string order. The sequence orders timestamps to the nanosecond (digits beyond
the ninth are ignored); the stored timestamp columns keep microseconds (Delta's precision).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from cdcflow.model.contracts import CUSTOMERS


class Operation(StrEnum):
    """Normalised CDC operation."""

    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


#: Accepted spellings (after trimming and upper-casing) → operation. C/R/I are Debezium's
#: create/read (snapshot) and a common insert code; U and D are update and delete.
OPERATION_ALIASES: dict[str, Operation] = {
    "INSERT": Operation.INSERT,
    "UPDATE": Operation.UPDATE,
    "DELETE": Operation.DELETE,
    "C": Operation.INSERT,
    "R": Operation.INSERT,
    "I": Operation.INSERT,
    "U": Operation.UPDATE,
    "D": Operation.DELETE,
}

#: The customers rules below are read from the shipped customers contract
#: (:data:`cdcflow.model.contracts.CUSTOMERS`), not restated here.
_STATUS = CUSTOMERS.column("status")

#: Customer lifecycle statuses (the contract's ``status`` allowed values: ACTIVE, INACTIVE,
#: SUSPENDED, DELETED).
STATUSES: tuple[str, ...] = tuple(str(v) for v in _STATUS.allowed_values or ())
#: The reason of a status the contract does not allow (``INVALID_STATUS``).
STATUS_REASON = _STATUS.reason

#: Customer columns carried by INSERT/UPDATE payloads (the contract's non-key columns:
#: customer_name, email, phone, city, country, status), each with its own sequence register in
#: Silver. ``status`` is last. The bit ``1 << index`` marks the column present in a payload.
ATTRIBUTES: tuple[str, ...] = tuple(c.name for c in CUSTOMERS.attributes)
ATTRIBUTE_BIT = {name: 1 << i for i, name in enumerate(ATTRIBUTES)}
#: Attributes that may hold personal data and must never be logged (the contract's ``pii``).
PII_ATTRIBUTES: tuple[str, ...] = tuple(c.name for c in CUSTOMERS.attributes if c.pii)


def sequence_of(
    lsn_number: int, event_timestamp: datetime, event_id: str, nanoseconds: int = 0
) -> str:
    """Encode (LSN, timestamp, event_id) as an order-preserving string (see module doc).

    Args:
        lsn_number: numeric LSN (below 2**128).
        event_timestamp: aware timestamp (microsecond precision).
        event_id: the event id.
        nanoseconds: sub-microsecond part of the timestamp (0..999), from the source text.
    """
    ts = event_timestamp if event_timestamp.tzinfo is UTC else event_timestamp.astimezone(UTC)
    return (
        f"{lsn_number:032x}.{ts.year:04d}{ts.month:02d}{ts.day:02d}{ts.hour:02d}"
        f"{ts.minute:02d}{ts.second:02d}{ts.microsecond:06d}{nanoseconds:03d}.{event_id}"
    )


@dataclass(frozen=True, slots=True)
class CdcEvent:
    """One accepted change event, normalised.

    Attributes:
        event_id: trimmed event id.
        customer_id: trimmed business key.
        operation: normalised operation.
        event_timestamp: UTC instant of the source change.
        values: attribute name → value (string or None) for the attributes present in the payload
            (``status`` upper-cased). Absent attributes are not in the mapping.
        lsn: the raw LSN text as received (JSON numbers as their text).
        lsn_number: the numeric LSN.
        tx_id: source transaction id or None.
        source_table: source table name or None.
        content_hash: SHA-256 of the canonical JSON of the whole record (duplicate detection).
        timestamp_nanos: sub-microsecond nanoseconds (0..999) of event_timestamp's source text.
        sequence: derived: the event's total-order sequence string (see module doc).
        present_mask: derived: bit mask of the attributes present (``ATTRIBUTE_BIT``).
    """

    event_id: str
    customer_id: str
    operation: Operation
    event_timestamp: datetime
    values: dict[str, str | None]
    lsn: str
    lsn_number: int
    tx_id: str | None
    source_table: str | None
    content_hash: str
    timestamp_nanos: int = 0

    sequence: str = field(init=False, compare=False)
    present_mask: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # derived once: the sequence string and the present-attributes bit mask
        object.__setattr__(
            self,
            "sequence",
            sequence_of(self.lsn_number, self.event_timestamp, self.event_id, self.timestamp_nanos),
        )
        mask = 0
        for name in self.values:
            mask |= ATTRIBUTE_BIT[name]
        object.__setattr__(self, "present_mask", mask)
