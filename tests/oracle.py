"""An independent oracle for the customers stream: validation, duplicates and the fold.

Written from the issue texts and ``shared/SEMANTICS.md``, not from the product's code, and
importing nothing from ``cdcflow``: a bug in the product's LSN parsing, timestamp parsing,
validation order, duplicate classification or fold cannot also be in the expectation. It is
deliberately simple and slow (plain loops, one pass per rule); it handles the record shapes the
tests write, and says so (``OracleGap``) rather than guess when it meets one it was not written
for.

What it answers, for a list of raw lines in arrival order (files in order, lines in order):

* :meth:`Oracle.judge` — per non-blank line, ``("ACCEPTED", event)``, ``("DUPLICATE", event)``
  or ``("QUARANTINED", reason)``;
* :meth:`Oracle.silver` — the Silver rows (one row per key present) and, in hard mode, the
  tombstones (key → sequence text), by folding the first copies in sequence order.

The rules, in the order a record is judged (first failure wins):

1. MALFORMED_JSON: not UTF-8, not JSON (``NaN``/``Infinity`` are not JSON), not an object,
   nested deeper than 500 levels. A leading byte order mark is not part of the record.
2. NULL_CUSTOMER_ID: missing, null, or a string of whitespace only.
3. INVALID_CUSTOMER_ID_FORMAT: not a string, or its trimmed text does not fully match the
   pattern.
4. NULL_EVENT_ID: missing, null or blank.
5. INVALID_OPERATION: trimmed, upper-cased, not INSERT/UPDATE/DELETE/C/R/I/U/D.
6. NULL_EVENT_TIMESTAMP / 7. INVALID_EVENT_TIMESTAMP / 8. FUTURE_EVENT_TIMESTAMP (later than
   processing time + skew).
9. NULL_LSN: metadata not an object, or metadata.lsn missing, null or blank.
10. INVALID_LSN: PostgreSQL ``X/Y`` (hex, value X·2³² + Y), SQL Server ``a:b:c`` (8, 8, 4 hex
    digits at most, value a·2⁴⁸ + b·2¹⁶ + c), or decimal digits / a non-negative JSON integer;
    below 2¹²⁸; surrounding whitespace ignored.
11. INVALID_STATUS: INSERT without status; INSERT/UPDATE with a status other than ACTIVE,
    INACTIVE, SUSPENDED, DELETED (trimmed, any case). A DELETE's status is ignored.
12. SCHEMA_MISMATCH: an object or array in an attribute (INSERT/UPDATE), event_id,
    metadata.source_table or metadata.tx_id.
13. DUPLICATE_EVENT_CONFLICT: an event_id accepted before (first copy wins, by arrival) with a
    different parsed JSON object; the same object is a DUPLICATE (accepted, no effect).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

ATTRIBUTES = ("customer_name", "email", "phone", "city", "country", "status")
STATUSES = {"ACTIVE", "INACTIVE", "SUSPENDED", "DELETED"}
OPERATIONS = {
    "INSERT": "INSERT",
    "UPDATE": "UPDATE",
    "DELETE": "DELETE",
    "C": "INSERT",
    "R": "INSERT",
    "I": "INSERT",
    "U": "UPDATE",
    "D": "DELETE",
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?"
    r"(Z|z|[+-]\d{2}:\d{2})?"
)


class OracleGap(Exception):
    """The oracle meets a record shape it was not written for (extend it, do not guess)."""


class Number:
    """A JSON number with a fraction or exponent, kept as its text (attributes store JSON text)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Number) and other.text == self.text

    def __hash__(self) -> int:
        return hash(("number", self.text))


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _canonical(value: Any) -> Any:
    """A value in a form where equality is JSON equality (``true`` is not ``1``)."""
    if isinstance(value, dict):
        return ("object", tuple(sorted((k, _canonical(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return (type(value).__name__, value)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _text(value: Any) -> str | None:
    """The stored text of a scalar JSON value."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Number):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise OracleGap(f"no stored text for {type(value).__name__}")


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def parse_lsn(value: Any) -> int | None:
    """The numeric LSN, or None when the value is not an LSN."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        hexdigits = set("0123456789abcdefABCDEF")
        if text.count("/") == 1:
            high, low = text.split("/")
            if not high or not low or not set(high + low) <= hexdigits:
                return None
            number = int(high, 16) * 2**32 + int(low, 16)
        elif text.count(":") == 2:
            a, b, c = text.split(":")
            sizes_ok = 1 <= len(a) <= 8 and 1 <= len(b) <= 8 and 1 <= len(c) <= 4
            if not sizes_ok or not set(a + b + c) <= hexdigits:
                return None
            number = int(a, 16) * 2**48 + int(b, 16) * 2**16 + int(c, 16)
        elif text and all(ch in "0123456789" for ch in text):
            number = int(text)
        else:
            return None
    else:
        return None
    return number if 0 <= number < 2**128 else None


def parse_timestamp(value: Any) -> tuple[datetime, int] | str:
    """(UTC instant to the microsecond, nanoseconds below the microsecond), or a reason.

    The reason is ``INVALID_EVENT_TIMESTAMP`` or ``FUTURE`` (after year 9999).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        return "INVALID_EVENT_TIMESTAMP"
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        if len(text) >= 10 and digits and all(ch in "0123456789" for ch in digits):
            value = int(text)
        else:
            return _parse_iso(text)
    if value > 253402300799999:
        return "FUTURE"
    if value < -62135596800000:
        return "INVALID_EVENT_TIMESTAMP"
    return EPOCH + timedelta(milliseconds=value), 0


def _parse_iso(text: str) -> tuple[datetime, int] | str:
    match = ISO.fullmatch(text)
    if not match:
        if re.match(r"\d{4}-?\d{2}", text):  # another ISO-8601 form (date only, +HHMM, ...)
            raise OracleGap("an ISO-8601 form the oracle does not parse")
        return "INVALID_EVENT_TIMESTAMP"
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction = (match.group(7) or "").ljust(9, "0")[:9]
    nanos_total = int(fraction)
    if second == 60:
        raise OracleGap("leap seconds")
    try:
        local = datetime(year, month, day, hour, minute, second, nanos_total // 1000)
    except ValueError:
        return "INVALID_EVENT_TIMESTAMP"
    zone = match.group(8)
    offset = timedelta(0)
    if zone and zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    try:
        instant = (local - offset).replace(tzinfo=UTC)
    except OverflowError:
        return "FUTURE" if offset < timedelta(0) else "INVALID_EVENT_TIMESTAMP"
    return instant, nanos_total % 1000


@dataclass(frozen=True)
class Event:
    """An accepted record: what the fold needs, and its parsed object for duplicate checks."""

    event_id: str
    customer_id: str
    operation: str
    timestamp: datetime
    nanos: int
    lsn_number: int
    lsn_text: str
    values: dict[str, str | None]
    record: Any = field(compare=False, repr=False)

    @property
    def order(self) -> tuple[int, datetime, int, str]:
        """The total order: numeric LSN, then time (to the ns), then event_id."""
        return (self.lsn_number, self.timestamp, self.nanos, self.event_id)

    @property
    def sequence(self) -> str:
        """The order as text, in the format the product documents for ``_cdc_seq`` columns."""
        ts = self.timestamp
        return (
            f"{self.lsn_number:032x}."
            f"{ts:%Y%m%d%H%M%S}{ts.microsecond:06d}{self.nanos:03d}.{self.event_id}"
        )


@dataclass
class Expected:
    """The oracle's Silver: one row per key present; hard-mode tombstones (key → sequence)."""

    rows: dict[str, dict[str, Any]]
    tombstones: dict[str, str]


class Oracle:
    """The independent judge of one customers stream.

    Args:
        pattern: the customer_id pattern (Python ``re`` syntax; must fully match the trimmed id).
        processing_time: the processing time records are judged at (UTC).
        max_clock_skew: allowed lead of event timestamps over processing time.
    """

    def __init__(
        self,
        pattern: str = r"C-[0-9]+",
        processing_time: datetime | None = None,
        max_clock_skew: timedelta = timedelta(minutes=5),
    ) -> None:
        self.pattern = re.compile(pattern)
        self.processing_time = processing_time or datetime.now(UTC)
        self.max_clock_skew = max_clock_skew

    # ---------------------------------------------------------------- one record
    def validate(self, line: bytes | str) -> Event | str:
        """One non-blank line → the accepted event, or the first failing reason code."""
        raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
        if raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
            record = json.loads(text, parse_float=Number, parse_constant=_no_constant)
            # a lone surrogate escape (\\ud800) is no text
            json.dumps(record, default=lambda n: n.text, ensure_ascii=False).encode("utf-8")
        except (UnicodeError, ValueError):
            return "MALFORMED_JSON"
        if not isinstance(record, dict) or _depth(record) > 500:
            return "MALFORMED_JSON"

        cid = record.get("customer_id")
        if _blank(cid):
            return "NULL_CUSTOMER_ID"
        if not isinstance(cid, str) or not self.pattern.fullmatch(cid.strip()):
            return "INVALID_CUSTOMER_ID_FORMAT"
        eid = record.get("event_id")
        if _blank(eid):
            return "NULL_EVENT_ID"
        op = record.get("operation")
        operation = OPERATIONS.get(op.strip().upper()) if isinstance(op, str) else None
        if operation is None:
            return "INVALID_OPERATION"
        ts = record.get("event_timestamp")
        if _blank(ts):
            return "NULL_EVENT_TIMESTAMP"
        parsed = parse_timestamp(ts)
        if parsed == "FUTURE":
            return "FUTURE_EVENT_TIMESTAMP"
        if isinstance(parsed, str):
            return parsed
        timestamp, nanos = parsed
        if timestamp > self.processing_time + self.max_clock_skew:
            return "FUTURE_EVENT_TIMESTAMP"
        metadata = record.get("metadata")
        lsn = metadata.get("lsn") if isinstance(metadata, dict) else None
        if _blank(lsn):
            return "NULL_LSN"
        number = parse_lsn(lsn)
        if number is None:
            return "INVALID_LSN"
        values: dict[str, str | None] = {}
        if operation != "DELETE":
            if "status" in record:
                status = record["status"]
                if not isinstance(status, str) or status.strip().upper() not in STATUSES:
                    return "INVALID_STATUS"
            elif operation == "INSERT":
                return "INVALID_STATUS"
        structured = [eid]
        if operation != "DELETE":
            structured += [record.get(name) for name in ATTRIBUTES]
        if isinstance(metadata, dict):
            structured += [metadata.get("source_table"), metadata.get("tx_id")]
        if any(isinstance(v, dict | list) for v in structured):
            return "SCHEMA_MISMATCH"
        if operation != "DELETE":
            for name in ATTRIBUTES:
                if name in record:
                    values[name] = _text(record[name])
            if "status" in values:
                values["status"] = values["status"].strip().upper()  # type: ignore[union-attr]
        return Event(
            event_id=eid.strip() if isinstance(eid, str) else str(_text(eid)),
            customer_id=cid.strip(),
            operation=operation,
            timestamp=timestamp,
            nanos=nanos,
            lsn_number=number,
            lsn_text=lsn.strip() if isinstance(lsn, str) else str(lsn),
            values=values,
            record=_canonical(record),
        )

    # ---------------------------------------------------------------- the stream
    def judge(self, lines: list[bytes | str]) -> list[tuple[int, str, Any]]:
        """Judge lines in arrival order.

        Returns:
            One (index in ``lines``, verdict, detail) per non-blank line: verdict
            ``ACCEPTED`` / ``DUPLICATE`` (detail: the :class:`Event`) or ``QUARANTINED``
            (detail: the reason code).
        """
        first: dict[str, Event] = {}
        out: list[tuple[int, str, Any]] = []
        for index, line in enumerate(lines):
            text = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
            if not text.strip(b" \t\r\n\x0b\x0c"):
                continue  # a blank line is no record
            verdict = self.validate(line)
            if isinstance(verdict, str):
                out.append((index, "QUARANTINED", verdict))
            elif verdict.event_id not in first:
                first[verdict.event_id] = verdict
                out.append((index, "ACCEPTED", verdict))
            elif first[verdict.event_id].record == verdict.record:
                out.append((index, "DUPLICATE", verdict))
            else:
                out.append((index, "QUARANTINED", "DUPLICATE_EVENT_CONFLICT"))
        return out

    def timeline(self, lines: list[bytes | str], mode: str = "soft") -> dict[str, list[dict]]:
        """The expected SCD2 history: key → one version per accepted first copy, in order.

        Each key's events are applied in ascending order, from no row: INSERT/UPDATE set the
        attributes present (absent = unchanged) and undelete; a soft DELETE marks the row
        deleted (status DELETED, deleted_at) keeping attributes, creating a deleted row for an
        unknown key; a hard DELETE removes the row, after which the key starts over from an
        empty row. A version is the row image after its event (a hard DELETE's version: status
        DELETED, is_deleted, deleted_at, every attribute and created_at null) with the event's
        id, operation, LSN text and sequence, ``valid_from`` = its time and ``valid_to`` = the
        next version's (None for the last, the only ``is_current`` one).
        """
        events = [e for _, verdict, e in self.judge(lines) if verdict == "ACCEPTED"]
        out: dict[str, list[dict]] = {}
        for key in sorted({e.customer_id for e in events}):
            row: dict[str, Any] | None = None
            versions: list[dict] = []
            for event in sorted((e for e in events if e.customer_id == key), key=_order):
                last = {
                    "last_updated_at": event.timestamp,
                    "last_event_id": event.event_id,
                    "last_operation": event.operation,
                    "last_lsn": event.lsn_text,
                }
                if event.operation == "DELETE" and mode == "hard":
                    row = None
                    image: dict[str, Any] = {name: None for name in ATTRIBUTES}
                    image.update(status="DELETED", is_deleted=True, created_at=None)
                    image.update(deleted_at=event.timestamp, **last)
                else:
                    if row is None:
                        row = {name: None for name in ATTRIBUTES}
                        row["created_at"] = event.timestamp
                    if event.operation == "DELETE":
                        row.update(status="DELETED", is_deleted=True, deleted_at=event.timestamp)
                    else:
                        row.update(event.values)
                        row.update(is_deleted=False, deleted_at=None)
                    row.update(last)
                    image = dict(row)
                image["customer_id"] = key
                image["is_active"] = image["status"] == "ACTIVE" and not image["is_deleted"]
                if versions:
                    versions[-1].update(valid_to=event.timestamp, is_current=False)
                image.update(
                    event_id=event.event_id,
                    operation=event.operation,
                    lsn=event.lsn_text,
                    sequence=event.sequence,
                    valid_from=event.timestamp,
                    valid_to=None,
                    is_current=True,
                )
                versions.append(image)
            out[key] = versions
        return out

    def silver(self, lines: list[bytes | str], mode: str = "soft") -> Expected:
        """The expected Silver: each key's last version (see :meth:`timeline`), and hard mode's
        tombstones (key → sequence of its latest DELETE, kept after a revival: it still blocks
        every event below it)."""
        rows: dict[str, dict[str, Any]] = {}
        tombstones: dict[str, str] = {}
        version_only = ("event_id", "operation", "lsn", "sequence", "valid_from", "valid_to")
        for key, versions in self.timeline(lines, mode).items():
            current = versions[-1]
            if mode == "hard":
                deletes = [v["sequence"] for v in versions if v["operation"] == "DELETE"]
                if deletes:
                    tombstones[key] = deletes[-1]
                if current["operation"] == "DELETE":
                    continue
            rows[key] = {k: v for k, v in current.items() if k not in (*version_only, "is_current")}
        return Expected(rows, tombstones)


def _order(event: Event) -> tuple[int, datetime, int, str]:
    return event.order
