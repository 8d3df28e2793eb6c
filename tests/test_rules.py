"""Validation rules: reason codes, their order, coercion, timestamps and LSN notations."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from cdcflow.model.events import CdcEvent
from cdcflow.model.lsn import LsnError, parse_lsn
from cdcflow.plan.dedup import classify
from cdcflow.plan.rules import Rejection, RuleSet, content_hash, validate_record

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RULES = RuleSet(re.compile(r"^C-[0-9]+$"), NOW, timedelta(minutes=5))


def good(**changes: object) -> dict:
    record = {
        "event_id": "EVT-1",
        "customer_id": "C-9021",
        "operation": "INSERT",
        "event_timestamp": "2026-08-30T10:00:00Z",
        "customer_name": "Aarav Sharma",
        "email": "a@example.com",
        "phone": "+91-9876543210",
        "city": "Bengaluru",
        "country": "India",
        "status": "ACTIVE",
        "metadata": {"source_table": "customers", "lsn": "00000028:000001bc:0001", "tx_id": "T1"},
    }
    for key, value in changes.items():
        if value is ...:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def reason(record: object) -> str | None:
    raw = record if isinstance(record, bytes | str) else json.dumps(record)
    result = validate_record(raw, RULES)
    return result.reason if isinstance(result, Rejection) else None


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (b"\xff{}", "MALFORMED_JSON"),
        ("{oops", "MALFORMED_JSON"),
        ("[1,2]", "MALFORMED_JSON"),
        ('"text"', "MALFORMED_JSON"),
        (good(customer_id=...), "NULL_CUSTOMER_ID"),
        (good(customer_id=None), "NULL_CUSTOMER_ID"),
        (good(customer_id=" "), "NULL_CUSTOMER_ID"),
        (good(customer_id="customer-1"), "INVALID_CUSTOMER_ID_FORMAT"),
        (good(customer_id=9021), "INVALID_CUSTOMER_ID_FORMAT"),
        (good(event_id=None), "NULL_EVENT_ID"),
        (good(event_id="  "), "NULL_EVENT_ID"),
        (good(operation="MERGE"), "INVALID_OPERATION"),
        (good(operation=None), "INVALID_OPERATION"),
        (good(event_timestamp=...), "NULL_EVENT_TIMESTAMP"),
        (good(event_timestamp="yesterday"), "INVALID_EVENT_TIMESTAMP"),
        (good(event_timestamp=1.5), "INVALID_EVENT_TIMESTAMP"),
        (good(event_timestamp="2026-11-29T12:06:00Z"), "FUTURE_EVENT_TIMESTAMP"),
        (good(metadata=None), "NULL_LSN"),
        (good(metadata={"lsn": None}), "NULL_LSN"),
        (good(metadata={"lsn": "zz/1"}), "INVALID_LSN"),
        (good(metadata={"lsn": -5}), "INVALID_LSN"),
        (good(metadata={"lsn": 1.5}), "INVALID_LSN"),
        (good(status=...), "INVALID_STATUS"),
        (good(status="ARCHIVED"), "INVALID_STATUS"),
        (good(operation="UPDATE", status="gone"), "INVALID_STATUS"),
        (good(city={"name": "x"}), "SCHEMA_MISMATCH"),
        (good(phone=[1]), "SCHEMA_MISMATCH"),
        # the FIRST failing reason wins
        (good(customer_id=None, event_id=None, operation="X"), "NULL_CUSTOMER_ID"),
        (good(event_id=None, operation="X"), "NULL_EVENT_ID"),
        (good(operation="X", event_timestamp="bad"), "INVALID_OPERATION"),
        (good(metadata={"lsn": "bad"}, status="bad"), "INVALID_LSN"),
        (good(status="bad", city={}), "INVALID_STATUS"),
    ],
)
def test_reason_codes_in_order(record: object, expected: str) -> None:
    assert reason(record) == expected


@pytest.mark.parametrize(
    ("op", "expected"),
    [("c", "INSERT"), (" R ", "INSERT"), ("i", "INSERT"), ("u", "UPDATE"), ("d", "DELETE")],
)
def test_operation_aliases(op: str, expected: str) -> None:
    result = validate_record(json.dumps(good(operation=op)), RULES)
    assert isinstance(result, CdcEvent) and result.operation.value == expected


def test_update_may_omit_status_and_delete_ignores_it() -> None:
    update = validate_record(json.dumps(good(operation="UPDATE", status=...)), RULES)
    assert isinstance(update, CdcEvent) and "status" not in update.values
    delete = validate_record(json.dumps(good(operation="DELETE", status="whatever")), RULES)
    assert isinstance(delete, CdcEvent) and delete.values == {}


def test_coercion_and_partial_payload() -> None:
    result = validate_record(
        json.dumps(
            good(operation="UPDATE", phone=34555024900, city=None, status=" inactive ", email=...)
        ),
        RULES,
    )
    assert isinstance(result, CdcEvent)
    assert result.values == {
        "customer_name": "Aarav Sharma",
        "phone": "34555024900",
        "city": None,
        "country": "India",
        "status": "INACTIVE",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-05-12T10:00:00+05:30", datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
        ("2025-05-12T04:30:00Z", datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
        ("2025-05-12T04:30:00", datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
        ("2025-05-12T04:30:00.123456789Z", datetime(2025, 5, 12, 4, 30, 0, 123456, tzinfo=UTC)),
        (1747024200000, datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
    ],
)
def test_timestamps_are_utc_instants(text: object, expected: datetime) -> None:
    result = validate_record(json.dumps(good(event_timestamp=text)), RULES)
    assert isinstance(result, CdcEvent) and result.event_timestamp == expected


def test_lsn_notations_map_to_one_numeric_order() -> None:
    assert parse_lsn("0/FFFFFF") < parse_lsn("0/1000000")
    assert parse_lsn("9999999") < parse_lsn("24023128")
    assert parse_lsn("1/0") == 1 << 32 == parse_lsn(4294967296)
    assert parse_lsn("00000028:000001bc:0001") == (0x28 << 48) | (0x1BC << 16) | 1
    assert parse_lsn("00000028:000001BC:0001") == parse_lsn("00000028:000001bc:0001")
    assert parse_lsn("0000000A/0000FFFF") == (10 << 32) + 0xFFFF
    for bad in ("", "1/", "x", "1:2", True, 1.0, -1, "1" * 40):
        with pytest.raises(LsnError):
            parse_lsn(bad)


def test_sequences_order_by_lsn_then_time_then_event_id() -> None:
    def event(eid: str, lsn: object, ts: str) -> CdcEvent:
        result = validate_record(
            json.dumps(good(event_id=eid, event_timestamp=ts, metadata={"lsn": lsn})), RULES
        )
        assert isinstance(result, CdcEvent)
        return result

    a = event("B", "0/FFFFFF", "2026-01-01T00:00:09Z")
    b = event("A", "0/1000000", "2026-01-01T00:00:00Z")
    c = event("A", 16777216, "2026-01-01T00:00:01Z")
    d = event("B", "0/1000000", "2026-01-01T00:00:01Z")
    assert sorted([d, c, b, a], key=lambda e: e.sequence) == [a, b, c, d]


def test_duplicate_classification() -> None:
    first = validate_record(json.dumps(good()), RULES)
    same = validate_record(json.dumps(dict(reversed(list(good().items())))), RULES)
    other = validate_record(json.dumps(good(city="Elsewhere")), RULES)
    assert (
        isinstance(first, CdcEvent) and isinstance(same, CdcEvent) and isinstance(other, CdcEvent)
    )
    assert first.content_hash == same.content_hash == content_hash(good())
    deliveries, conflicts = classify([(0, first), (1, same), (2, other)], {})
    assert [(d.position, d.is_duplicate) for d in deliveries] == [(0, False), (1, True)]
    assert [(p, r.reason) for p, r in conflicts] == [(2, "DUPLICATE_EVENT_CONFLICT")]
    # against earlier batches
    deliveries, conflicts = classify([(0, same)], {"EVT-1": first.content_hash})
    assert deliveries[0].is_duplicate and not conflicts


def test_json_number_lsn_above_64_bits_is_valid() -> None:
    record = json.dumps(good(metadata={"lsn": 2**70}))
    result = validate_record(record, RULES)
    assert isinstance(result, CdcEvent) and result.lsn_number == 2**70
    assert reason('{"customer_id": NaN}') == "MALFORMED_JSON"


def test_records_that_would_crash_a_parser_are_quarantined() -> None:
    base = json.dumps(good())[:-1]
    assert reason(base + ', "city": "\\ud800"}') == "MALFORMED_JSON"  # lone surrogate
    assert reason(base + ', "x": ' + "[" * 3000 + "]" * 3000 + "}") == "MALFORMED_JSON"
    assert reason(good(metadata={"lsn": "1" * 5000})) == "INVALID_LSN"
    assert reason(base + ', "phone": 1e999}') is None  # a valid JSON number, kept as text


def test_numbers_keep_their_json_text() -> None:
    raw = json.dumps(good())[:-1] + ', "phone": 1e2, "city": 12.50, "country": 34555024900}'
    result = validate_record(raw, RULES)
    assert isinstance(result, CdcEvent)
    assert (result.values["phone"], result.values["city"], result.values["country"]) == (
        "1e2",
        "12.50",
        "34555024900",
    )
    assert type(result.values["phone"]) is str


def test_sub_microsecond_timestamps_order_the_sequence() -> None:
    def event(eid: str, ts: str) -> CdcEvent:
        result = validate_record(json.dumps(good(event_id=eid, event_timestamp=ts)), RULES)
        assert isinstance(result, CdcEvent)
        return result

    earlier = event("Z9", "2026-01-01T10:00:00.0000001Z")
    later = event("A1", "2026-01-01T10:00:00.0000009Z")
    assert earlier.event_timestamp == later.event_timestamp  # stored at microseconds
    assert earlier.sequence < later.sequence  # ordered at nanoseconds, not by event_id


def test_delete_attribute_values_are_ignored_whatever_their_shape() -> None:
    result = validate_record(json.dumps(good(operation="D", city={"a": 1}, status=[1])), RULES)
    assert isinstance(result, CdcEvent) and result.values == {}
    assert reason(good(operation="D", event_id={"a": 1})) == "SCHEMA_MISMATCH"
