"""Validation of one raw record against a table contract (:mod:`cdcflow.model.contracts`).

The same rules as :mod:`cdcflow.plan.rules` (the flat customers format), read from a contract
instead of constants. A record fails with the FIRST failing reason, in this order:

1. ``MALFORMED_JSON`` — as :func:`cdcflow.plan.rules.parse_record`.
2. per key column, in the contract's key order: ``NULL_<KEY>`` (missing, null or blank), then
   ``INVALID_<KEY>_FORMAT`` (a string key that is not a JSON string, a value that does not fit
   the key's type, or a trimmed text that does not fully match ``key_patterns``). For the
   customers contract: ``NULL_CUSTOMER_ID``, ``INVALID_CUSTOMER_ID_FORMAT``.
3. ``NULL_EVENT_ID``, ``INVALID_OPERATION``, ``NULL_EVENT_TIMESTAMP``,
   ``INVALID_EVENT_TIMESTAMP``, ``FUTURE_EVENT_TIMESTAMP``, ``NULL_LSN``, ``INVALID_LSN`` — as
   the flat rules, read from the contract's ``event_id_field``, ``operation_field``,
   ``timestamp_field`` and ``lsn_field``.
4. per column with its own ``reason`` (customers ``status``: ``INVALID_STATUS``), for an
   INSERT/UPDATE: an INSERT without a ``required_on_insert`` or ``nullable: false`` column
   (an UPDATE's absent column is unchanged), a value that does not fit the type, or a broken
   constraint (null where not nullable, not an allowed value, pattern, bounds).
5. ``SCHEMA_MISMATCH`` — for an INSERT/UPDATE, a column value that does not fit its type or
   breaks a constraint (the detail names the column and the type or constraint, never the
   value); an object or array in the event id or in ``metadata.source_table`` /
   ``metadata.tx_id``; with ``unknown_fields: quarantine``, a top-level field the contract does
   not know. A DELETE's column values are ignored.
6. ``DUPLICATE_EVENT_CONFLICT`` — decided later (:mod:`cdcflow.plan.dedup`).

Under ``truncate: apply`` a record whose operation is ``TRUNCATE`` is a
:class:`TruncateEvent` instead: no key, and only the rules of step 3 that are not about the
operation (event id, timestamp, LSN).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdcflow.model.contracts import (
    ColumnSpec,
    TableContract,
    TypeMismatch,
    check_constraints,
    coerce,
    compile_re2,
    normalise,
)
from cdcflow.model.events import OPERATION_ALIASES, Operation, sequence_of
from cdcflow.model.lsn import LsnError, parse_lsn
from cdcflow.plan.rules import (
    InvalidTimestamp,
    JsonNumber,
    Rejection,
    TimestampBeyondRange,
    content_hash,
    kind_of,
    parse_event_timestamp,
    parse_record,
    sub_microsecond_nanos,
)
from cdcflow.sources.formats import SOURCE_TRUNCATE

#: Fields of the flat envelope, never "unknown" to a contract.
ENVELOPE = ("event_id", "operation", "event_timestamp", "metadata")


def known_fields(contract: TableContract) -> set[str]:
    """The top-level record fields ``contract`` reads (the envelope's, its own envelope fields'
    — ``operation_field``, ``event_id_field``, ``timestamp_field``, ``lsn_field`` — and its
    columns'); any other field is unknown (``unknown_fields``)."""
    known = {*ENVELOPE, *(c.field for c in contract.columns)}
    for dotted in (
        contract.lsn_field,
        contract.operation_field,
        contract.event_id_field,
        contract.timestamp_field,
    ):
        known.add(dotted.split(".")[0])
    return known


def _set_sequence(event: ChangeEvent | TruncateEvent) -> None:
    """Derive a frozen event's ``sequence`` from its LSN, timestamp and id (:func:`sequence_of`)."""
    object.__setattr__(
        event,
        "sequence",
        sequence_of(event.lsn_number, event.event_timestamp, event.event_id, event.timestamp_nanos),
    )


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One accepted change of a contract's table, typed.

    Attributes:
        table: the contract's name.
        key: the key values, in the contract's key order, coerced to their types.
        event_id: trimmed event id.
        operation: normalised operation.
        event_timestamp: UTC instant of the change (microseconds).
        values: column → stored value for the non-key columns present in the record (absent =
            unchanged); empty for a DELETE.
        lsn: the raw LSN text (JSON numbers as their text).
        lsn_number: the numeric LSN.
        content_hash: SHA-256 of the canonical record (duplicate detection).
        timestamp_nanos: nanoseconds below the microsecond (0..999) of the timestamp's text.
        sequence: derived: the total-order sequence string (:func:`sequence_of`).
    """

    table: str
    key: tuple[Any, ...]
    event_id: str
    operation: Operation
    event_timestamp: datetime
    values: dict[str, Any]
    lsn: str
    lsn_number: int
    content_hash: str
    timestamp_nanos: int = 0
    sequence: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        _set_sequence(self)


@dataclass(frozen=True, slots=True)
class TruncateEvent:
    """One accepted source TRUNCATE of a contract's table (``truncate: apply``).

    It deletes, at its sequence, every key of the table with an event before it
    (:mod:`cdcflow.plan.truncates`); it has no key and no values.

    Attributes:
        table: the contract's name.
        event_id: trimmed event id.
        event_timestamp: UTC instant of the truncate.
        lsn: the raw LSN text.
        lsn_number: the numeric LSN.
        content_hash: SHA-256 of the canonical record (duplicate detection).
        timestamp_nanos: nanoseconds below the microsecond of the timestamp's text.
        sequence: derived: the total-order sequence string (:func:`sequence_of`).
    """

    table: str
    event_id: str
    event_timestamp: datetime
    lsn: str
    lsn_number: int
    content_hash: str
    timestamp_nanos: int = 0
    sequence: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        _set_sequence(self)


def is_truncate(raw_op: Any) -> bool:
    """True for an operation field that says ``TRUNCATE`` (trimmed, any case)."""
    return isinstance(raw_op, str) and raw_op.strip().upper() == "TRUNCATE"


def key_reasons(column: str) -> tuple[str, str]:
    """The (null, format) reason codes of a key column: ``NULL_<COL>``, ``INVALID_<COL>_FORMAT``."""
    upper = column.upper()
    return f"NULL_{upper}", f"INVALID_{upper}_FORMAT"


def field_at(record: dict[str, Any], dotted: str) -> Any:
    """``record[a][b]…`` for the dotted path ``a.b…``, or None where the path ends early."""
    node: Any = record
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def route_name(record: dict[str, Any]) -> str | None:
    """The table a record names in ``metadata.source_table`` (the part after the last dot), or
    None when it names none."""
    metadata = record.get("metadata")
    name = metadata.get("source_table") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None
    return name.strip().rsplit(".", 1)[-1]


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


class ContractValidator:
    """Validates records of one contract; compiled once per micro-batch.

    Args:
        contract: the table's contract.
        processing_time: the micro-batch's processing time (UTC).
        max_clock_skew: tolerance for event timestamps in the future.
    """

    def __init__(
        self, contract: TableContract, processing_time: datetime, max_clock_skew: Any
    ) -> None:
        self.contract = contract
        self.latest = processing_time + max_clock_skew
        self._later = (
            f"later than processing time {processing_time.isoformat()} + "
            f"processing.max_clock_skew ({max_clock_skew})"
        )
        self._key_patterns = {
            name: compile_re2(pattern) for name, pattern in contract.key_patterns.items()
        }
        self._keys = [contract.column(name) for name in contract.keys]
        attributes = contract.attributes
        self._special = [c for c in attributes if c.reason != "SCHEMA_MISMATCH"]
        self._plain = [c for c in attributes if c.reason == "SCHEMA_MISMATCH"]
        self._known = known_fields(contract)

    def validate(self, raw: bytes | str) -> ChangeEvent | TruncateEvent | Rejection:
        """One raw record (a non-blank line) → the typed event or the first failing reason.

        Never raises: an unexpected failure is a ``MALFORMED_JSON`` rejection.
        """
        try:
            record = parse_record(raw)
            if isinstance(record, Rejection):
                return record
            return self.validate_object(record)
        except Exception as exc:  # a record is data, never a stream-stopping error
            return Rejection("MALFORMED_JSON", f"unprocessable record ({type(exc).__name__})")

    def _key(self, record: dict[str, Any]) -> tuple[Any, ...] | Rejection:
        key: list[Any] = []
        for spec in self._keys:
            null_reason, format_reason = key_reasons(spec.name)
            value = record.get(spec.field)
            if _blank(value):
                return Rejection(null_reason, f"{spec.name} is missing, null or blank")
            if spec.type == "string" and (
                not isinstance(value, str) or isinstance(value, JsonNumber)
            ):
                return Rejection(format_reason, f"{spec.name} is {kind_of(value)}, not a string")
            try:
                typed = coerce(value.strip() if isinstance(value, str) else value, spec.type)
            except TypeMismatch:
                return Rejection(format_reason, f"{spec.name} is not a value of type {spec.type}")
            pattern = self._key_patterns.get(spec.name)
            if pattern is not None and pattern.fullmatch(str(typed).encode("utf-8")) is None:
                return Rejection(
                    format_reason,
                    f"{spec.name} does not match its key pattern {pattern.pattern!r}",
                )
            broken = check_constraints(spec, typed)  # the key column's own constraints
            if broken is not None:
                return Rejection(format_reason, broken)
            key.append(typed)
        return tuple(key)

    def validate_object(self, record: dict[str, Any]) -> ChangeEvent | TruncateEvent | Rejection:
        """Validate a parsed JSON object; see :meth:`validate`.

        Never raises: a record that cannot be processed (e.g. a value nested too deep for its
        canonical JSON) is a ``MALFORMED_JSON`` rejection.
        """
        try:
            return self._validate_object(record)
        except Exception as exc:  # a record is data, never a stream-stopping error
            return Rejection("MALFORMED_JSON", f"unprocessable record ({type(exc).__name__})")

    def _validate_object(self, record: dict[str, Any]) -> ChangeEvent | TruncateEvent | Rejection:
        contract = self.contract
        if is_truncate(field_at(record, contract.operation_field)):
            if contract.truncate == "apply":
                return self._truncate(record)
            # ``ignore``: skipped before validation (the flat decoder, sources/formats); a
            # truncate reaching the rules is quarantined under its own reason, never as a
            # record without a key
            raw_eid = field_at(record, contract.event_id_field)
            return Rejection(
                SOURCE_TRUNCATE,
                f"a source TRUNCATE removed every row of the table (truncate: "
                f"{contract.truncate}); not applied to Silver",
                raw_eid.strip() if isinstance(raw_eid, str) and raw_eid.strip() else None,
            )
        key = self._key(record)
        if isinstance(key, Rejection):
            return key
        display_key = key[0] if len(key) == 1 and isinstance(key[0], str) else None

        raw_eid = field_at(record, contract.event_id_field)
        if _blank(raw_eid):
            return Rejection(
                "NULL_EVENT_ID", "event_id is missing, null or blank", None, display_key
            )
        event_id = raw_eid.strip() if isinstance(raw_eid, str) else None

        def reject(reason: str, detail: str) -> Rejection:
            return Rejection(reason, detail, event_id, display_key)

        raw_op = field_at(record, contract.operation_field)
        operation = (
            OPERATION_ALIASES.get(raw_op.strip().upper()) if isinstance(raw_op, str) else None
        )
        if operation is None:
            return reject(
                "INVALID_OPERATION", "operation is not INSERT, UPDATE, DELETE or an alias"
            )

        timing = self._timing(record, reject)
        if isinstance(timing, Rejection):
            return timing
        raw_ts, event_timestamp, raw_lsn, lsn_number = timing

        values: dict[str, Any] = {}
        if operation is not Operation.DELETE:
            for spec in self._special:
                problem = self._column(record, spec, operation, values)
                if problem is not None:
                    return reject(spec.reason, problem)
        metadata = record.get("metadata")
        structured = [contract.event_id_field] if isinstance(raw_eid, dict | list) else []
        structured += [
            f"metadata.{name}"
            for name in ("source_table", "tx_id")
            if isinstance(metadata, dict) and isinstance(metadata.get(name), dict | list)
        ]
        if operation is not Operation.DELETE:
            for spec in self._plain:
                problem = self._column(record, spec, operation, values)
                if problem is not None:
                    return reject("SCHEMA_MISMATCH", problem)
        if structured:
            return reject(
                "SCHEMA_MISMATCH", f"object or array where a scalar is expected: {structured}"
            )
        if contract.unknown_fields == "quarantine":
            unknown = sorted(name for name in record if name not in self._known)
            if unknown:
                return reject("SCHEMA_MISMATCH", f"fields the contract does not declare: {unknown}")
        if event_id is None:  # a number or boolean: its JSON text
            event_id = str(raw_eid) if isinstance(raw_eid, str) else json.dumps(raw_eid)
        order = {spec.name: i for i, spec in enumerate(contract.attributes)}
        return ChangeEvent(
            table=contract.name,
            key=key,
            event_id=event_id,
            operation=operation,
            event_timestamp=event_timestamp,
            values=dict(sorted(values.items(), key=lambda item: order[item[0]])),
            lsn=raw_lsn.strip() if isinstance(raw_lsn, str) else json.dumps(raw_lsn),
            lsn_number=lsn_number,
            content_hash=content_hash(record),
            timestamp_nanos=sub_microsecond_nanos(raw_ts),
        )

    def _timing(
        self, record: dict[str, Any], reject: Callable[[str, str], Rejection]
    ) -> tuple[Any, datetime, Any, int] | Rejection:
        """The record's (raw timestamp, UTC timestamp, raw LSN, numeric LSN), or the first of
        ``NULL_EVENT_TIMESTAMP``, ``INVALID_EVENT_TIMESTAMP``, ``FUTURE_EVENT_TIMESTAMP``,
        ``NULL_LSN``, ``INVALID_LSN`` that applies."""
        contract = self.contract
        raw_ts = field_at(record, contract.timestamp_field)
        if _blank(raw_ts):
            return reject("NULL_EVENT_TIMESTAMP", "event_timestamp is missing, null or blank")
        try:
            event_timestamp = parse_event_timestamp(raw_ts)
        except TimestampBeyondRange:
            return reject(
                "FUTURE_EVENT_TIMESTAMP", f"event_timestamp is after year 9999, {self._later}"
            )
        except InvalidTimestamp as exc:
            return reject("INVALID_EVENT_TIMESTAMP", str(exc))
        if event_timestamp > self.latest:
            return reject("FUTURE_EVENT_TIMESTAMP", f"event_timestamp is {self._later}")

        raw_lsn = field_at(record, contract.lsn_field)
        if _blank(raw_lsn):
            return reject("NULL_LSN", f"{contract.lsn_field} is missing, null or blank")
        try:
            lsn_number = parse_lsn(raw_lsn)
        except LsnError as exc:
            return reject("INVALID_LSN", f"{contract.lsn_field}: {exc}")
        return raw_ts, event_timestamp, raw_lsn, lsn_number

    def _truncate(self, record: dict[str, Any]) -> TruncateEvent | Rejection:
        """A truncate record (``truncate: apply``): the envelope rules only — event id,
        timestamp, LSN — since a truncate has no key and no column values."""
        contract = self.contract
        raw_eid = field_at(record, contract.event_id_field)
        if _blank(raw_eid) or isinstance(raw_eid, dict | list):
            return Rejection("NULL_EVENT_ID", "event_id is missing, null or blank")
        event_id = raw_eid.strip() if isinstance(raw_eid, str) else json.dumps(raw_eid)

        def reject(reason: str, detail: str) -> Rejection:
            return Rejection(reason, detail, event_id)

        timing = self._timing(record, reject)
        if isinstance(timing, Rejection):
            return timing
        raw_ts, event_timestamp, raw_lsn, lsn_number = timing
        return TruncateEvent(
            table=contract.name,
            event_id=event_id,
            event_timestamp=event_timestamp,
            lsn=raw_lsn.strip() if isinstance(raw_lsn, str) else json.dumps(raw_lsn),
            lsn_number=lsn_number,
            content_hash=content_hash(record),
            timestamp_nanos=sub_microsecond_nanos(raw_ts),
        )

    @staticmethod
    def _column(
        record: dict[str, Any], spec: ColumnSpec, operation: Operation, values: dict[str, Any]
    ) -> str | None:
        """Check one non-key column of an INSERT/UPDATE; store its value in ``values``.

        Returns:
            The problem (names the column, never the value), or None.
        """
        if spec.field not in record:  # an UPDATE's absent column is unchanged
            if operation is Operation.INSERT and (spec.required_on_insert or not spec.nullable):
                return f"an INSERT must carry {spec.name}"
            return None
        value = record[spec.field]
        if spec.normalize == "upper" and value is not None and not isinstance(value, str):
            return f"{spec.name} is {kind_of(value)}, not a string"
        try:
            stored = normalise(spec, coerce(value, spec.type))
        except TypeMismatch:
            return f"{spec.name} is not a value of type {spec.type}"
        problem = check_constraints(spec, stored)
        if problem is not None:
            return problem
        values[spec.name] = stored
        return None


__all__ = [
    "ENVELOPE",
    "ChangeEvent",
    "ContractValidator",
    "field_at",
    "is_truncate",
    "key_reasons",
]
