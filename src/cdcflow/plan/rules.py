"""Validation of one raw record of the ``flat`` event contract.

A record that fails a check is quarantined with the FIRST failing reason, in this order
(``REASONS``):

1. ``MALFORMED_JSON`` — not valid UTF-8, not valid JSON, not a JSON object, or nested deeper
   than ``MAX_NESTING`` (500) levels. A UTF-8 byte order mark (U+FEFF) at the start of a record
   (the first line of a file written with a BOM) is not part of it and is ignored.
2. ``NULL_CUSTOMER_ID`` — customer_id missing, null, empty or blank.
3. ``INVALID_CUSTOMER_ID_FORMAT`` — not a string fully matching
   ``processing.customer_id_pattern`` after trimming. The pattern is matched by RE2 (the
   ``google-re2`` binding), in time linear in the customer_id's length whatever the pattern:
   RE2 syntax, ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII, ``\\p{..}`` for Unicode classes.
4. ``NULL_EVENT_ID`` — event_id missing, null or blank.
5. ``INVALID_OPERATION`` — after trimming and upper-casing, not INSERT/UPDATE/DELETE nor an alias
   (C, R, I → INSERT; U → UPDATE; D → DELETE).
6. ``NULL_EVENT_TIMESTAMP`` — event_timestamp missing, null or blank.
7. ``INVALID_EVENT_TIMESTAMP`` — neither an ISO-8601 string (offsets and ``Z`` or ``z``
   allowed, no offset means UTC, any number of fractional digits) nor integer epoch
   milliseconds, or an instant before 0001-01-01T00:00:00Z. See
   :func:`parse_event_timestamp` for leap seconds.
8. ``FUTURE_EVENT_TIMESTAMP`` — later than processing time + ``processing.max_clock_skew``,
   including instants beyond 9999-12-31 (epoch milliseconds above 253402300799999), which no
   timestamp column can hold but which are unambiguously in the future.
9. ``NULL_LSN`` — ``metadata`` or ``metadata.lsn`` missing, null or blank.
10. ``INVALID_LSN`` — not a notation of :mod:`cdcflow.model.lsn`.
11. ``INVALID_STATUS`` — an INSERT without a valid status, or an INSERT/UPDATE whose status is
    present but not ACTIVE, INACTIVE, SUSPENDED or DELETED (trimmed, case-insensitive). An
    UPDATE may omit status; a DELETE's status is ignored.
12. ``SCHEMA_MISMATCH`` — an attribute of an INSERT/UPDATE (or event_id, metadata.source_table,
    metadata.tx_id) is a JSON object or array. Numbers and booleans are kept as their JSON text.
    A DELETE's attribute values are ignored, whatever their shape.
13. ``DUPLICATE_EVENT_CONFLICT`` — decided later, by :mod:`cdcflow.plan.dedup`.

A rejection's ``detail`` names the field and the kind of problem, never a field's value (values
may be personal data; the raw line is kept in quarantine's ``raw_line``, the one place for it).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import re2

from cdcflow.errors import ConfigError
from cdcflow.model.events import (
    ATTRIBUTES,
    OPERATION_ALIASES,
    STATUS_REASON,
    STATUSES,
    CdcEvent,
    Operation,
)
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
#: Deepest nesting of arrays/objects a record may have (deeper: ``MALFORMED_JSON``). Every walk
#: of a record is iterative or bounded by this, so the interpreter's recursion limit never
#: decides a record's fate.
MAX_NESTING = 500
_BOM = "\ufeff"

#: The characters ``str.strip()`` removes (``str.isspace``): "trimming" in these rules means
#: removing exactly these, in every engine.
WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())

#: The detail of a status outside the contract's allowed values ("status is not ACTIVE,
#: INACTIVE, SUSPENDED or DELETED").
_STATUS_NOT_ALLOWED = f"status is not {', '.join(STATUSES[:-1])} or {STATUSES[-1]}"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record that failed validation.

    Attributes:
        reason: one of ``REASONS``.
        detail: human-readable explanation: the field and the kind of problem, never a field's
            value (values may be personal data; quarantine keeps the raw line).
        event_id: the event id when it could be read, else None.
        customer_id: the customer id when it could be read, else None.
    """

    reason: str
    detail: str
    event_id: str | None = None
    customer_id: str | None = None


class CustomerIdPattern:
    """``processing.customer_id_pattern`` compiled by RE2: full matches in linear time.

    RE2 (the ``google-re2`` binding) never backtracks, so no pattern can make a record take
    longer than a pass over its customer_id (``^(a+)+$`` against ``"a" * 40 + "!"`` answers at
    once). Syntax: RE2's, which is Python ``re`` without backreferences and lookaround;
    ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (``\\p{L}``, ``\\p{Nd}`` for Unicode classes).

    Attributes:
        pattern: the pattern text, as configured.
    """

    __slots__ = ("_cache", "_regexp", "pattern")

    #: Results kept per customer_id (the same ids recur in a batch); the cache starts over
    #: when full.
    CACHE_SIZE = 1 << 18

    def __init__(self, pattern: str) -> None:
        """Compile ``pattern``.

        Raises:
            ConfigError: RE2 cannot compile it (e.g. a backreference or lookaround); names the
                key.
        """
        options = re2.Options()
        options.log_errors = False  # the error is raised, not printed by RE2 as well
        try:
            self._regexp = re2.compile(pattern, options)
        except re2.error as exc:
            raise ConfigError(
                f"processing.customer_id_pattern: {unsupported_by_re2(exc)}"
            ) from None
        self.pattern = pattern
        self._cache: dict[str, bool] = {}

    def fullmatch(self, text: str) -> bool:
        """True when ``text`` as a whole matches the pattern."""
        found = self._cache.get(text)
        if found is None:
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            found = self._cache[text] = self._regexp.fullmatch(text.encode("utf-8")) is not None
        return found

    def __repr__(self) -> str:
        return f"CustomerIdPattern({self.pattern!r})"


def unsupported_by_re2(exc: Exception) -> str:
    """The message for a pattern RE2 cannot compile (``exc``: the ``re2.error``)."""
    reason = exc.args[0] if exc.args else exc
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", errors="replace")
    return (
        "not a pattern RE2, the linear-time regular expression engine, can compile "
        f"(no backreferences or lookaround): {reason}"
    )


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Parameters of the validation rules (from the ``processing`` config section).

    Attributes:
        customer_id_pattern: the pattern a trimmed customer_id must fully match: a
            :class:`CustomerIdPattern`; a pattern text or a compiled ``re`` pattern is converted
            to one (so matching is always RE2's, linear-time).
        processing_time: the micro-batch's processing time (UTC); fixed per batch so a re-run of
            the batch validates identically.
        max_clock_skew: tolerance for event timestamps in the future.

    Raises:
        ConfigError: RE2 cannot compile the pattern.
        ValueError: a compiled ``re`` pattern with flags (write them inline: ``(?i)``).
    """

    customer_id_pattern: CustomerIdPattern | re.Pattern[str] | str
    processing_time: datetime
    max_clock_skew: timedelta

    def __post_init__(self) -> None:
        pattern = self.customer_id_pattern
        if isinstance(pattern, re.Pattern):
            if pattern.flags & ~re.UNICODE:
                raise ValueError("customer_id_pattern: write flags inline, e.g. (?i)")
            pattern = pattern.pattern
        if isinstance(pattern, str):
            object.__setattr__(self, "customer_id_pattern", CustomerIdPattern(pattern))

    def customer_id_matches(self, customer_id: str) -> bool:
        """True when the (trimmed) customer_id fully matches ``customer_id_pattern``."""
        pattern = self.customer_id_pattern
        assert isinstance(pattern, CustomerIdPattern)  # see __post_init__
        return pattern.fullmatch(customer_id)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _json_text(value: Any) -> str | None:
    """Scalar JSON value → stored text (strings as-is, numbers/booleans as JSON text)."""
    if value is None:
        return None
    if isinstance(value, str):
        return str(value)  # a JsonNumber becomes its plain JSON text
    return json.dumps(value)


def kind_of(value: Any) -> str:
    """The JSON kind of a value, for rejection details (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, JsonNumber | float):
        return "a number with a fraction or exponent"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


class InvalidTimestamp(ValueError):
    """Not an event timestamp; the message names the field and the problem, never the value."""


class TimestampBeyondRange(InvalidTimestamp):
    """The timestamp is a valid instant after 9999-12-31T23:59:59.999999Z: it cannot be stored,
    and it is in the future (reason ``FUTURE_EVENT_TIMESTAMP``, not ``INVALID_...``)."""


_NOT_A_TIMESTAMP = "is not an ISO-8601 date-time or integer epoch milliseconds"
#: A leap second: second 60 (any fraction), followed by the end or an offset.
_LEAP_SECOND = re.compile(r"(\d{2}:\d{2}):60(?:[.,]\d+)?(?=$|[Zz+-])")
_LEAP_NANOS = 999


def parse_event_timestamp(value: Any) -> datetime:
    """Parse an event timestamp into an aware UTC datetime (microsecond precision).

    Decided edge cases:

    * a lowercase ``z`` suffix means UTC, like ``Z`` (RFC 3339 allows both);
    * a leap second (second ``60``, e.g. ``2016-12-31T23:59:60Z``, any fraction) is accepted
      and stored as the last microsecond of that minute (``23:59:59.999999``, and the highest
      sub-microsecond digits in the sequence): it sorts after every instant of second 59 and
      before the next minute; events within one leap second tie on time (then event_id);
    * integer epoch milliseconds (a JSON integer, or a string of at least 10 digits) before
      year 1900 are valid instants (back to 0001-01-01); before 0001-01-01 they are invalid;
    * an instant after 9999-12-31 (epoch milliseconds, or an ISO text whose offset pushes it
      past year 9999) raises :class:`TimestampBeyondRange`: a future timestamp.

    Args:
        value: an ISO-8601 string (``Z``/``z`` or offsets allowed, no offset = UTC, any number
            of fractional digits, truncated to microseconds) or an integer of epoch milliseconds.

    Raises:
        TimestampBeyondRange: after year 9999.
        InvalidTimestamp: any other value (both are ``ValueError``); the message names the field
            and the kind of problem, never the value.
    """
    if isinstance(value, bool | JsonNumber) or not isinstance(value, int | str):
        raise InvalidTimestamp(f"event_timestamp is {kind_of(value)}, not a timestamp")
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        if len(text) >= 10 and digits.isdigit():  # epoch milliseconds as a string
            if len(digits) > 19:  # beyond 64 bits: far outside the datetime range either way
                value = -(10**19) if text.startswith("-") else 10**19
            else:
                try:
                    value = int(text)
                except ValueError:  # digits int() does not take (e.g. superscripts)
                    raise InvalidTimestamp(f"event_timestamp {_NOT_A_TIMESTAMP}") from None
        else:
            return _parse_iso(text)
    try:
        return _EPOCH + timedelta(milliseconds=value)
    except OverflowError:
        if value > 0:
            raise TimestampBeyondRange("event_timestamp is after year 9999") from None
        raise InvalidTimestamp("event_timestamp is before year 1 (epoch milliseconds)") from None


def _last_microsecond(match: re.Match[str]) -> str:
    return f"{match.group(1)}:59.999999"


def _parse_iso(text: str) -> datetime:
    if text.endswith("z"):
        text = text[:-1] + "Z"
    if ":60" in text:
        text = _LEAP_SECOND.sub(_last_microsecond, text, count=1)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidTimestamp(f"event_timestamp {_NOT_A_TIMESTAMP}") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        offset = parsed.utcoffset()
        if offset is not None and offset < timedelta(0):
            raise TimestampBeyondRange("event_timestamp is after year 9999") from None
        raise InvalidTimestamp("event_timestamp is before year 1") from None


class _ConstantError(ValueError):
    """``NaN``/``Infinity``/``-Infinity``: not JSON."""


def _reject_constant(name: str) -> Any:
    raise _ConstantError(f"{name} is not valid JSON")


_FRACTION = re.compile(r"\d{2}:\d{2}:\d{2}[.,](\d+)")


def sub_microsecond_nanos(value: Any) -> int:
    """Nanoseconds below the microsecond in an ISO-8601 text (digits 7-9 of the fraction).

    A leap second (see :func:`parse_event_timestamp`) counts as 999.
    """
    if not isinstance(value, str):
        return 0
    if ":60" in value and _LEAP_SECOND.search(value.strip()):
        return _LEAP_NANOS
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
    surrogate escapes, ``NaN``/``Infinity`` literals, non-object JSON and nesting deeper than
    ``MAX_NESTING`` are rejected; a leading UTF-8 byte order mark is ignored. Details never
    quote the record.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejection("MALFORMED_JSON", f"not valid UTF-8 at byte {exc.start}")
    else:
        text = raw
    if text.startswith(_BOM):
        text = text[1:]
    try:
        record = orjson.loads(text)
        floats, depth = _shape(record)
        if depth > MAX_NESTING:
            return _too_deep()
        exact = not floats
    except orjson.JSONDecodeError:
        exact = False  # orjson refuses some valid JSON (integers above 64 bits): the stdlib decides
    if not exact:
        try:
            record = json.loads(text, parse_constant=_reject_constant, parse_float=JsonNumber)
            if _shape(record)[1] > MAX_NESTING:
                return _too_deep()
            json.dumps(record, ensure_ascii=False).encode("utf-8")  # lone surrogates
        except json.JSONDecodeError as exc:
            return Rejection("MALFORMED_JSON", f"not valid JSON: {exc.msg} at character {exc.pos}")
        except UnicodeEncodeError:
            return Rejection("MALFORMED_JSON", "not valid JSON: a lone surrogate escape")
        except _ConstantError as exc:
            return Rejection("MALFORMED_JSON", f"not valid JSON: {exc}")
        except ValueError:  # e.g. an integer above the interpreter's digit limit
            return Rejection("MALFORMED_JSON", "not valid JSON: a number out of range")
        except RecursionError:
            return _too_deep()
    if not isinstance(record, dict):
        return Rejection("MALFORMED_JSON", f"JSON {type(record).__name__} is not an object")
    return record


def _too_deep() -> Rejection:
    return Rejection("MALFORMED_JSON", f"not valid JSON: nested deeper than {MAX_NESTING} levels")


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


def _shape(value: Any) -> tuple[bool, int]:
    """(a float anywhere in the value, nesting depth), by an iterative walk (no recursion).

    A float is what orjson makes of a fraction/exponent or an integer above 64 bits. The depth
    of a scalar is 0, of ``[]`` or ``{}`` 1. The walk stops once deeper than ``MAX_NESTING``.
    """
    kind = type(value)
    if kind is float:
        return True, 0
    if kind is not dict and kind is not list:
        return False, 0
    floats, deepest = False, 1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_NESTING:
                break
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is float:
                floats = True
            elif kind is dict or kind is list:
                stack.append((child, depth + 1))
    return floats, deepest


def _later_than(rules: RuleSet) -> str:
    return (
        f"later than processing time {rules.processing_time.isoformat()} + "
        f"processing.max_clock_skew ({rules.max_clock_skew})"
    )


def _pattern_text(rules: RuleSet) -> str:
    pattern = rules.customer_id_pattern
    return pattern if isinstance(pattern, str) else pattern.pattern


def validate_object(record: dict[str, Any], rules: RuleSet) -> CdcEvent | Rejection:
    """Validate an already-parsed JSON object; see :func:`validate_record`."""
    raw_cid = record.get("customer_id")
    if _blank(raw_cid):
        return Rejection("NULL_CUSTOMER_ID", "customer_id is missing, null or blank")
    if not isinstance(raw_cid, str):
        return Rejection(
            "INVALID_CUSTOMER_ID_FORMAT", f"customer_id is {kind_of(raw_cid)}, not a string"
        )
    if not rules.customer_id_matches(raw_cid.strip()):
        return Rejection(
            "INVALID_CUSTOMER_ID_FORMAT",
            f"customer_id does not match processing.customer_id_pattern {_pattern_text(rules)!r}",
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
        if isinstance(raw_op, str):
            detail = "operation is not INSERT, UPDATE, DELETE or an alias (C, R, I, U, D)"
        elif "operation" not in record:
            detail = "operation is missing"
        else:
            detail = f"operation is {kind_of(raw_op)}, not a string"
        return reject("INVALID_OPERATION", detail)

    raw_ts = record.get("event_timestamp")
    if _blank(raw_ts):
        return reject("NULL_EVENT_TIMESTAMP", "event_timestamp is missing, null or blank")
    try:
        event_timestamp = parse_event_timestamp(raw_ts)
    except TimestampBeyondRange:
        return reject(
            "FUTURE_EVENT_TIMESTAMP", f"event_timestamp is after year 9999, {_later_than(rules)}"
        )
    except InvalidTimestamp as exc:  # its messages never quote the value
        return reject("INVALID_EVENT_TIMESTAMP", str(exc))
    except (ValueError, OverflowError):
        return reject("INVALID_EVENT_TIMESTAMP", f"event_timestamp {_NOT_A_TIMESTAMP}")
    if event_timestamp > rules.processing_time + rules.max_clock_skew:
        return reject("FUTURE_EVENT_TIMESTAMP", f"event_timestamp is {_later_than(rules)}")

    metadata = record.get("metadata")
    raw_lsn = metadata.get("lsn") if isinstance(metadata, dict) else None
    if _blank(raw_lsn):
        return reject("NULL_LSN", "metadata.lsn is missing, null or blank")
    try:
        lsn_number = parse_lsn(raw_lsn)
    except LsnError as exc:  # its messages never quote the value
        return reject("INVALID_LSN", f"metadata.lsn: {exc}")

    values: dict[str, str | None] = {}
    if operation is not Operation.DELETE:
        if "status" in record:
            status = record["status"]
            norm = status.strip().upper() if isinstance(status, str) else None
            if norm not in STATUSES:
                return reject(STATUS_REASON, _STATUS_NOT_ALLOWED)
            values["status"] = norm
        elif operation is Operation.INSERT:
            return reject(STATUS_REASON, "an INSERT must carry a status")

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
