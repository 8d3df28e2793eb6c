"""Validation of one raw record of the ``flat`` event contract.

A record that fails a check is quarantined with the FIRST failing reason, in this order
(``REASONS``):

1. ``MALFORMED_JSON`` — not valid UTF-8, not valid JSON, or not a JSON object.
2. ``NULL_CUSTOMER_ID`` — customer_id missing, null, empty or blank.
3. ``INVALID_CUSTOMER_ID_FORMAT`` — not a string fully matching
   ``processing.customer_id_pattern`` after trimming.
4. ``NULL_EVENT_ID`` — event_id missing, null or blank.
5. ``INVALID_OPERATION`` — after trimming and upper-casing, not INSERT/UPDATE/DELETE nor an alias
   (C, R, I → INSERT; U → UPDATE; D → DELETE).
6. ``NULL_EVENT_TIMESTAMP`` — event_timestamp missing, null or blank.
7. ``INVALID_EVENT_TIMESTAMP`` — neither an ISO-8601 string (offsets and ``Z`` allowed, no
   offset means UTC, any number of fractional digits) nor integer epoch milliseconds.
8. ``FUTURE_EVENT_TIMESTAMP`` — later than processing time + ``processing.max_clock_skew``.
9. ``NULL_LSN`` — ``metadata`` or ``metadata.lsn`` missing, null or blank.
10. ``INVALID_LSN`` — not a notation of :mod:`cdcflow.model.lsn`.
11. ``INVALID_STATUS`` — an INSERT without a valid status, or an INSERT/UPDATE whose status is
    present but not ACTIVE, INACTIVE, SUSPENDED or DELETED (trimmed, case-insensitive). An
    UPDATE may omit status; a DELETE's status is ignored.
12. ``SCHEMA_MISMATCH`` — an attribute of an INSERT/UPDATE (or event_id, metadata.source_table,
    metadata.tx_id) is a JSON object or array. Numbers and booleans are kept as their JSON text.
    A DELETE's attribute values are ignored, whatever their shape.
13. ``DUPLICATE_EVENT_CONFLICT`` — decided later, by :mod:`cdcflow.plan.dedup`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from cdcflow.model.events import ATTRIBUTES, OPERATION_ALIASES, STATUSES, CdcEvent, Operation
from cdcflow.model.lsn import LsnError, parse_lsn

REASONS = (
    "MALFORMED_JSON",
    "NULL_CUSTOMER_ID",
    "INVALID_CUSTOMER_ID_FORMAT",
    "NULL_EVENT_ID",
    "INVALID_OPERATION",
    "NULL_EVENT_TIMESTAMP",
    "INVALID_EVENT_TIMESTAMP",
    "FUTURE_EVENT_TIMESTAMP",
    "NULL_LSN",
    "INVALID_LSN",
    "INVALID_STATUS",
    "SCHEMA_MISMATCH",
    "DUPLICATE_EVENT_CONFLICT",
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The characters ``str.strip()`` removes (``str.isspace``): "trimming" in these rules means
#: removing exactly these, in every engine.
WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record that failed validation.

    Attributes:
        reason: one of ``REASONS``.
        detail: human-readable explanation (never contains attribute values).
        event_id: the event id when it could be read, else None.
        customer_id: the customer id when it could be read, else None.
    """

    reason: str
    detail: str
    event_id: str | None = None
    customer_id: str | None = None


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Parameters of the validation rules (from the ``processing`` config section).

    Attributes:
        customer_id_pattern: compiled regular expression a trimmed customer_id must match.
        processing_time: the micro-batch's processing time (UTC); fixed per batch so a re-run of
            the batch validates identically.
        max_clock_skew: tolerance for event timestamps in the future.
    """

    customer_id_pattern: re.Pattern[str]
    processing_time: datetime
    max_clock_skew: timedelta


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _json_text(value: Any) -> str | None:
    """Scalar JSON value → stored text (strings as-is, numbers/booleans as JSON text)."""
    if value is None:
        return None
    if isinstance(value, str):
        return str(value)  # a JsonNumber becomes its plain JSON text
    return json.dumps(value)


def parse_event_timestamp(value: Any) -> datetime:
    """Parse an event timestamp into an aware UTC datetime (microsecond precision).

    Args:
        value: an ISO-8601 string (``Z`` or offsets allowed, no offset = UTC, any number of
            fractional digits, truncated to microseconds) or an integer of epoch milliseconds
            (a JSON integer, or a string of at least 10 digits).

    Raises:
        ValueError: any other value.
    """
    if isinstance(value, bool):
        raise ValueError("boolean is not a timestamp")
    if isinstance(value, int):
        try:
            return _EPOCH + timedelta(milliseconds=value)
        except OverflowError as exc:
            raise ValueError("epoch milliseconds out of range") from exc
    if isinstance(value, str):
        text = value.strip()
        if len(text) >= 10 and text.lstrip("-").isdigit():  # epoch milliseconds as a string
            return parse_event_timestamp(int(text))
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    raise ValueError(f"{type(value).__name__} is not a timestamp")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_FRACTION = re.compile(r"\d{2}:\d{2}:\d{2}[.,](\d+)")


def sub_microsecond_nanos(value: Any) -> int:
    """Nanoseconds below the microsecond in an ISO-8601 text (digits 7-9 of the fraction)."""
    if not isinstance(value, str):
        return 0
    match = _FRACTION.search(value)
    if not match or len(match.group(1)) <= 6:
        return 0
    return int(match.group(1)[6:9].ljust(3, "0"))


def content_hash(record: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a record (key order and whitespace do not matter)."""
    try:
        canonical = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers above 64 bits
        canonical = json.dumps(
            record, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()


class JsonNumber(str):
    """A JSON number with a fraction or exponent, kept as its exact JSON text (``1e2``)."""

    __slots__ = ()


def parse_record(raw: bytes | str) -> dict[str, Any] | Rejection:
    """Parse one raw record into a JSON object, or reject it as ``MALFORMED_JSON``.

    Integers are exact (any size); numbers with a fraction or exponent are kept as their JSON
    text (:class:`JsonNumber`), so attributes store "their JSON text". Invalid UTF-8, lone
    surrogate escapes, ``NaN``/``Infinity`` literals and non-object JSON are rejected.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejection("MALFORMED_JSON", f"not valid UTF-8 at byte {exc.start}")
    else:
        text = raw
    try:
        record = orjson.loads(text)
        exact = not (isinstance(record, dict) and _has_float(record))
    except orjson.JSONDecodeError:
        exact = False  # orjson refuses some valid JSON (integers above 64 bits): the stdlib decides
    if not exact:
        try:
            record = json.loads(text, parse_constant=_reject_constant, parse_float=JsonNumber)
            json.dumps(record, ensure_ascii=False).encode("utf-8")  # lone surrogates
        except (ValueError, RecursionError) as exc:
            detail = str(exc)[:120] if isinstance(exc, ValueError) else "nested too deeply"
            return Rejection("MALFORMED_JSON", f"not valid JSON: {detail}")
    if not isinstance(record, dict):
        return Rejection("MALFORMED_JSON", f"JSON {type(record).__name__} is not an object")
    return record


def validate_record(raw: bytes | str, rules: RuleSet) -> CdcEvent | Rejection:
    """Validate one raw record (one non-blank line) against the ``flat`` contract.

    Never raises: a record that cannot be processed at all is a ``MALFORMED_JSON`` rejection,
    so one bad line never stops the stream.

    Args:
        raw: the line, as bytes (checked for UTF-8) or text.
        rules: the batch's rule parameters.

    Returns:
        The normalised :class:`CdcEvent`, or a :class:`Rejection` with the first failing reason.
    """
    try:
        record = parse_record(raw)
        if isinstance(record, Rejection):
            return record
        return validate_object(record, rules)
    except Exception as exc:  # defensive: a record is data, never a stream-stopping error
        return Rejection("MALFORMED_JSON", f"unprocessable record ({type(exc).__name__})")


def _has_float(value: Any) -> bool:
    """True when orjson produced a float anywhere in the value (a fraction/exponent, or an
    integer above 64 bits, which orjson turns into a float)."""
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def validate_object(record: dict[str, Any], rules: RuleSet) -> CdcEvent | Rejection:
    """Validate an already-parsed JSON object; see :func:`validate_record`."""
    raw_cid = record.get("customer_id")
    if _blank(raw_cid):
        return Rejection("NULL_CUSTOMER_ID", "customer_id is missing, null or blank")
    if not isinstance(raw_cid, str) or not rules.customer_id_pattern.fullmatch(raw_cid.strip()):
        return Rejection(
            "INVALID_CUSTOMER_ID_FORMAT",
            f"customer_id does not match {rules.customer_id_pattern.pattern!r}",
        )
    customer_id = raw_cid.strip()

    raw_eid = record.get("event_id")
    if _blank(raw_eid):
        return Rejection("NULL_EVENT_ID", "event_id is missing, null or blank", None, customer_id)
    event_id = raw_eid.strip() if isinstance(raw_eid, str) else None

    def reject(reason: str, detail: str) -> Rejection:
        return Rejection(reason, detail, event_id, customer_id)

    raw_op = record.get("operation")
    operation = OPERATION_ALIASES.get(raw_op.strip().upper()) if isinstance(raw_op, str) else None
    if operation is None:
        shown = raw_op if isinstance(raw_op, str | None) else type(raw_op).__name__
        return reject("INVALID_OPERATION", f"unknown operation {str(shown)[:40]!r}")

    raw_ts = record.get("event_timestamp")
    if _blank(raw_ts):
        return reject("NULL_EVENT_TIMESTAMP", "event_timestamp is missing, null or blank")
    try:
        event_timestamp = parse_event_timestamp(raw_ts)
    except (ValueError, OverflowError) as exc:
        return reject("INVALID_EVENT_TIMESTAMP", f"event_timestamp not ISO-8601 or epoch ms: {exc}")
    if event_timestamp > rules.processing_time + rules.max_clock_skew:
        return reject(
            "FUTURE_EVENT_TIMESTAMP",
            f"event_timestamp {event_timestamp.isoformat()} is later than processing time "
            f"{rules.processing_time.isoformat()} + max_clock_skew",
        )

    metadata = record.get("metadata")
    raw_lsn = metadata.get("lsn") if isinstance(metadata, dict) else None
    if _blank(raw_lsn):
        return reject("NULL_LSN", "metadata.lsn is missing, null or blank")
    try:
        lsn_number = parse_lsn(raw_lsn)
    except LsnError as exc:
        return reject("INVALID_LSN", str(exc))

    values: dict[str, str | None] = {}
    if operation is not Operation.DELETE:
        if "status" in record:
            status = record["status"]
            norm = status.strip().upper() if isinstance(status, str) else None
            if norm not in STATUSES:
                return reject(
                    "INVALID_STATUS", "status is not ACTIVE, INACTIVE, SUSPENDED or DELETED"
                )
            values["status"] = norm
        elif operation is Operation.INSERT:
            return reject("INVALID_STATUS", "an INSERT must carry a status")

    checked = ("event_id",) if operation is Operation.DELETE else (*ATTRIBUTES, "event_id")
    structured = [name for name in checked if isinstance(record.get(name), dict | list)]
    structured += [
        f"metadata.{name}"
        for name in ("source_table", "tx_id")
        if isinstance(metadata, dict) and isinstance(metadata.get(name), dict | list)
    ]
    if structured:
        return reject(
            "SCHEMA_MISMATCH", f"object or array where a scalar is expected: {structured}"
        )

    if event_id is None:
        event_id = _json_text(raw_eid) or ""
    if operation is not Operation.DELETE:
        for name in ATTRIBUTES[:-1]:
            if name in record:
                values[name] = _json_text(record[name])
        # keep ATTRIBUTES order for a stable mask/iteration order
        values = {name: values[name] for name in ATTRIBUTES if name in values}

    return CdcEvent(
        event_id=event_id,
        customer_id=customer_id,
        operation=operation,
        event_timestamp=event_timestamp,
        values=values,
        lsn=raw_lsn.strip() if isinstance(raw_lsn, str) else json.dumps(raw_lsn),
        lsn_number=lsn_number,
        tx_id=_json_text(metadata.get("tx_id")) if isinstance(metadata, dict) else None,
        source_table=_json_text(metadata.get("source_table"))
        if isinstance(metadata, dict)
        else None,
        content_hash=content_hash(record),
        timestamp_nanos=sub_microsecond_nanos(raw_ts),
    )
