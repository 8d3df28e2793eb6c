"""Unit tests of plan/, model/ and the local fold that kill the mutants worth killing (issue 21).

`make mutation` (docs/mutation.md) mutates these modules and runs the fast unit tests against
each mutant; a mutant that no test notices is a behaviour nothing pins. Every expectation here is
worked out from the rules (the module docs and shared/SEMANTICS.md), by hand, not copied from the
code's output. Pure Python, plus a few in-process delta-rs MERGEs in a temporary folder.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable

from cdcflow.engines.local.delta import read_arrow
from cdcflow.engines.local.fold import batch_tombstones, fold_events, to_source_table
from cdcflow.errors import ConfigError
from cdcflow.layers.tables import SILVER, register
from cdcflow.model.contracts import CUSTOMERS
from cdcflow.model.events import ATTRIBUTE_BIT, ATTRIBUTES, CdcEvent, Operation, sequence_of
from cdcflow.model.lsn import (
    MAX_LSN,
    LsnError,
    format_mssql_lsn,
    format_pg_lsn,
    lsn_key,
    parse_lsn,
)
from cdcflow.plan.dedup import Delivery, classify
from cdcflow.plan.history import HISTORY_COLUMNS, state_as_of, timeline
from cdcflow.plan.merge_spec import silver_merge_spec
from cdcflow.plan.reference import SILVER_COLUMNS, ReferenceState, apply_event, dedupe, fold
from cdcflow.plan.replay import bucket_count, revalidate
from cdcflow.plan.rules import (
    MAX_NESTING,
    CustomerIdPattern,
    InvalidTimestamp,
    JsonNumber,
    Rejection,
    RuleSet,
    TimestampBeyondRange,
    content_hash,
    kind_of,
    parse_event_timestamp,
    parse_record,
    sub_microsecond_nanos,
    unsupported_by_re2,
    validate_record,
)

T0 = datetime(2025, 5, 12, 10, 0, tzinfo=UTC)
FULL = {
    "customer_name": "Ana",
    "email": "ana@example.com",
    "phone": "+33-1",
    "city": "Rennes",
    "country": "France",
    "status": "ACTIVE",
}


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def event(eid: str, cid: str, op: str, lsn: int, minute: float, **values: str | None) -> CdcEvent:
    """An accepted event: LSN ``lsn`` (decimal), timestamp T0 + ``minute``."""
    record = {"event_id": eid, "customer_id": cid, "operation": op, "lsn": lsn, "m": minute}
    return CdcEvent(
        event_id=eid,
        customer_id=cid,
        operation=Operation(op),
        event_timestamp=at(minute),
        values={name: values[name] for name in ATTRIBUTES if name in values},
        lsn=str(lsn),
        lsn_number=lsn,
        tx_id=None,
        source_table=None,
        content_hash=content_hash({**record, **values}),
    )


# --- model/lsn.py ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0/16B3748", 0x16B3748),
        ("1/0", 1 << 32),
        ("0/1", 1),
        ("1/2", (1 << 32) + 2),
        ("2/1", (2 << 32) + 1),
        ("16/B374D848", (0x16 << 32) + 0xB374D848),
        ("ff/ff", (0xFF << 32) + 0xFF),  # any case
        ("  0/10\t", 0x10),  # surrounding spaces ignored
        ("00000028:000001bc:0001", (0x28 << 48) | (0x1BC << 16) | 1),
        ("00000028:000001BC:0001", (0x28 << 48) | (0x1BC << 16) | 1),
        ("1:0:0", 1 << 48),
        ("0:1:0", 1 << 16),
        ("0:0:1", 1),
        ("ffffffff:ffffffff:ffff", (1 << 80) - 1),
        (" 00000001:00000002:0003 ", (1 << 48) + (2 << 16) + 3),
        ("24023128", 24023128),
        ("\n42 ", 42),
        ("0", 0),
        ("000123", 123),
        ("0" * 60 + "7", 7),  # leading zeros do not count towards the range
        (str(MAX_LSN), MAX_LSN),
        ("0" + str(MAX_LSN), MAX_LSN),
    ],
)
def test_lsn_notations(text: str, number: int) -> None:
    assert parse_lsn(text) == number


def test_lsn_halves_and_fields_are_not_interchangeable() -> None:
    assert parse_lsn("1/2") != parse_lsn("2/1")
    assert parse_lsn("0/FFFFFFFF") < parse_lsn("1/0")  # X is the high half
    assert parse_lsn("0:1:0") < parse_lsn("1:0:0") and parse_lsn("0:0:ffff") < parse_lsn("0:1:0")


@pytest.mark.parametrize("number", [0, 1, 24023128, (1 << 64) + 5, MAX_LSN])
def test_lsn_json_integers(number: int) -> None:
    assert parse_lsn(number) == number


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "boolean"),
        (False, "boolean"),
        ({"lsn": 1}, "an object"),
        ([1], "an array"),
        (1.5, "a fraction"),
        (1.0, "a fraction"),
        (None, "NoneType"),
        (b"1", "bytes"),
    ],
)
def test_lsn_of_the_wrong_json_kind_names_the_kind(value: object, kind: str) -> None:
    with pytest.raises(LsnError, match=kind):
        parse_lsn(value)


@pytest.mark.parametrize(
    "value",
    [
        -1,
        MAX_LSN + 1,
        str(MAX_LSN + 1),
        "9" * 39,
        "1" + "0" * 39,
        "-5",
        "",
        "   ",
        "1.5",
        "0x10",
        "1/2/3",
        "G/1",
        "/1",
        "1/",
        "000000001:0:0",  # a field too wide
        "0:0:00001",
        "0:0",
        "1 2",
        "٣",  # a non-ASCII digit
    ],
)
def test_not_an_lsn(value: object) -> None:
    with pytest.raises(LsnError):
        parse_lsn(value)


def test_lsn_errors_never_quote_the_value() -> None:
    for value in ("secret-4711", "9" * 45, -4711, "4711/4711/4711"):
        with pytest.raises(LsnError) as info:
            parse_lsn(value)
        assert "4711" not in str(info.value) and "999" not in str(info.value)


def test_out_of_range_says_the_range() -> None:
    for value in (MAX_LSN + 1, str(MAX_LSN + 1), "1" + "0" * 45, -1):
        with pytest.raises(LsnError, match=r"out of range \(0 \.\. 2\*\*128-1\)"):
            parse_lsn(value)


def test_lsn_key_is_fixed_width_and_orders_numerically() -> None:
    assert lsn_key(0) == "0" * 32
    assert lsn_key(255) == "0" * 30 + "ff"
    assert lsn_key(MAX_LSN) == "f" * 32
    numbers = [0, 9, 10, 15, 16, 255, 256, 1 << 32, (1 << 32) + 1, 1 << 100, MAX_LSN]
    keys = [lsn_key(n) for n in numbers]
    assert all(len(k) == 32 for k in keys)
    assert sorted(keys) == keys  # text order = numeric order


@pytest.mark.parametrize(
    ("number", "text"),
    [(0x16B3748, "0/16B3748"), ((1 << 32) + 0xAB, "1/AB"), (0, "0/0"), ((0x16 << 32) + 1, "16/1")],
)
def test_format_pg_lsn(number: int, text: str) -> None:
    assert format_pg_lsn(number) == text
    assert parse_lsn(text) == number


@pytest.mark.parametrize(
    ("number", "text"),
    [
        ((0x28 << 48) | (0x1BC << 16) | 1, "00000028:000001bc:0001"),
        (0, "00000000:00000000:0000"),
        ((1 << 80) - 1, "ffffffff:ffffffff:ffff"),
        (1 << 16, "00000000:00000001:0000"),
    ],
)
def test_format_mssql_lsn(number: int, text: str) -> None:
    assert format_mssql_lsn(number) == text
    assert parse_lsn(text) == number


# --- model/events.py ------------------------------------------------------------------------


def test_sequence_encoding() -> None:
    ts = datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert sequence_of(255, ts, "E-1", 7) == "0" * 30 + "ff" + ".20250102030405000006007.E-1"
    assert sequence_of(0, ts, "x") == "0" * 32 + ".20250102030405000006000.x"


def test_sequence_compares_instants_in_utc() -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    local = datetime(2025, 5, 12, 10, 0, tzinfo=ist)
    utc = datetime(2025, 5, 12, 4, 30, tzinfo=UTC)
    assert sequence_of(1, local, "E") == sequence_of(1, utc, "E")
    assert ".20250512043000000000000." in sequence_of(1, local, "E")


def test_sequence_orders_lsn_then_time_then_event_id() -> None:
    early, late = T0, T0 + timedelta(microseconds=1)
    ordered = [
        sequence_of(9, late, "Z"),
        sequence_of(10, early, "A"),  # numeric LSN first: 10 > 9 (text "10" < "9")
        sequence_of(10, early, "B"),
        sequence_of(10, early, "B", 1),  # nanoseconds order within the microsecond
        sequence_of(10, early, "A", 999),
        sequence_of(10, late, "A"),
        sequence_of(1 << 100, early, "A"),
    ]
    assert sorted(ordered) == ordered  # nanoseconds belong to the time, before event_id
    # explicit pairs, as the promise states them
    assert sequence_of(9, late, "Z") < sequence_of(10, early, "A")
    assert sequence_of(10, early, "B") < sequence_of(10, late, "A")
    assert sequence_of(10, early, "A") < sequence_of(10, early, "B")
    assert sequence_of(10, early, "B", 0) < sequence_of(10, early, "A", 1)
    assert sequence_of(10, early, "A", 999) < sequence_of(10, late, "A", 0)
    assert sequence_of(10, late, "A") < sequence_of(1 << 100, early, "A")


def test_event_derives_sequence_and_present_mask() -> None:
    e = event("E-1", "C-1", "UPDATE", 16, 0, email="x@y", status="ACTIVE")
    assert e.present_mask == ATTRIBUTE_BIT["email"] | ATTRIBUTE_BIT["status"] == 0b100010
    assert e.sequence == sequence_of(16, T0, "E-1")
    assert e.sequence.startswith("0" * 30 + "10.")  # 16 as 32 hex digits
    assert event("E-2", "C-1", "DELETE", 1, 0).present_mask == 0
    every = event("E-3", "C-1", "INSERT", 1, 0, **FULL)
    assert every.present_mask == 0b111111
    nanos = CdcEvent("E", "C", Operation.INSERT, T0, {}, "1", 1, None, None, "h", 5)
    assert nanos.sequence.endswith("000005.E")


# --- plan/dedup.py --------------------------------------------------------------------------


def test_first_copy_wins_and_identical_copies_are_duplicates() -> None:
    a = event("E-1", "C-1", "INSERT", 100, 0, **FULL)
    a_again = event("E-1", "C-1", "INSERT", 100, 0, **FULL)
    a_changed = event("E-1", "C-2", "INSERT", 100, 0, **{**FULL, "city": "Lyon"})
    b = event("E-2", "C-1", "UPDATE", 200, 1, city="Nantes")
    deliveries, conflicts = classify([(0, a), (1, b), (2, a_again), (3, a_changed), (4, a)], {})
    assert deliveries == [
        Delivery(a, 0, False),
        Delivery(b, 1, False),
        Delivery(a_again, 2, True),
        Delivery(a, 4, True),
    ]
    assert len(conflicts) == 1
    position, rejection = conflicts[0]
    assert position == 3
    assert rejection.reason == "DUPLICATE_EVENT_CONFLICT"
    assert (rejection.event_id, rejection.customer_id) == ("E-1", "C-2")
    assert "Lyon" not in rejection.detail


def test_a_conflicting_copy_does_not_register_its_content() -> None:
    first = event("E-1", "C-1", "INSERT", 100, 0, **FULL)
    other = event("E-1", "C-1", "INSERT", 100, 0, **{**FULL, "city": "Lyon"})
    deliveries, conflicts = classify([(0, first), (1, other), (2, other)], {})
    assert deliveries == [Delivery(first, 0, False)]
    assert [p for p, _ in conflicts] == [1, 2]


def test_copies_accepted_by_earlier_batches_count() -> None:
    old = event("E-1", "C-1", "INSERT", 100, 0, **FULL)
    changed = event("E-1", "C-1", "INSERT", 100, 0, **{**FULL, "city": "Lyon"})
    new = event("E-2", "C-1", "UPDATE", 200, 1, city="Nantes")
    prior = {"E-1": old.content_hash, "E-9": "unrelated"}
    deliveries, conflicts = classify([(5, old), (6, changed), (7, new)], prior)
    assert deliveries == [Delivery(old, 5, True), Delivery(new, 7, False)]
    assert [(p, r.reason) for p, r in conflicts] == [(6, "DUPLICATE_EVENT_CONFLICT")]
    # against an earlier batch, a different copy is the conflict even if it arrives first here
    deliveries, conflicts = classify([(0, changed), (1, old)], prior)
    assert deliveries == [Delivery(old, 1, True)]
    assert [p for p, _ in conflicts] == [0]


def test_no_candidates() -> None:
    assert classify([], {"E-1": "h"}) == ([], [])


# --- plan/reference.py ----------------------------------------------------------------------


def row_of(state: ReferenceState, key: str) -> dict[str, Any]:
    row = state.rows[key]
    assert tuple(row) == SILVER_COLUMNS
    return row


def test_insert_then_partial_update() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 2, city="Nantes", phone=None),
    ]
    row = row_of(fold(reversed(events)), "C-1")  # any arrival order
    assert row == {
        "customer_id": "C-1",
        "customer_name": "Ana",
        "email": "ana@example.com",
        "phone": None,  # explicit null sets null
        "city": "Nantes",
        "country": "France",  # absent is unchanged
        "status": "ACTIVE",
        "is_deleted": False,
        "is_active": True,
        "created_at": at(1),
        "last_updated_at": at(2),
        "deleted_at": None,
        "last_event_id": "E-2",
        "last_operation": "UPDATE",
        "last_lsn": "200",
    }


def test_update_for_an_unknown_key_creates_it_without_status() -> None:
    row = row_of(fold([event("E-1", "C-1", "UPDATE", 5, 3, city="Paris")]), "C-1")
    assert row["city"] == "Paris" and row["customer_name"] is None
    assert row["status"] is None and row["is_active"] is False and row["is_deleted"] is False
    assert row["created_at"] == row["last_updated_at"] == at(3)


def test_insert_for_an_existing_key_acts_as_an_update() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "INSERT", 200, 2, status="suspended".upper(), city="Lyon"),
    ]
    row = row_of(fold(events), "C-1")
    assert row["customer_name"] == "Ana" and row["city"] == "Lyon"
    assert row["status"] == "SUSPENDED" and row["is_active"] is False
    assert row["created_at"] == at(1) and row["last_operation"] == "INSERT"


def test_semantics_example_9_soft() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 2, city="Nantes"),
        event("E-3", "C-1", "DELETE", 300, 3),
        event("E-4", "C-1", "UPDATE", 250, 4, city="Lyon"),  # late
    ]
    row = row_of(fold(events, "soft"), "C-1")
    assert row["city"] == "Lyon" and row["customer_name"] == "Ana"
    assert row["is_deleted"] is True and row["status"] == "DELETED" and row["is_active"] is False
    assert row["deleted_at"] == at(3) and row["last_updated_at"] == at(3)
    assert (row["last_lsn"], row["last_event_id"], row["last_operation"]) == (
        "300",
        "E-3",
        "DELETE",
    )
    assert fold(events).rows == fold(events, "soft").rows  # soft is the default
    assert fold(events).tombstones == {}


def test_semantics_example_9_hard() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 2, city="Nantes"),
        event("E-3", "C-1", "DELETE", 300, 3),
        event("E-4", "C-1", "UPDATE", 250, 4, city="Lyon"),
    ]
    state = fold(events, "hard")
    assert state.rows == {}
    assert state.tombstones == {"C-1": events[2].sequence}


def test_delete_for_an_unknown_key_soft_then_a_late_lower_insert() -> None:
    delete = event("E-2", "C-1", "DELETE", 100, 5)
    row = row_of(fold([delete]), "C-1")
    assert row["is_deleted"] is True and row["status"] == "DELETED"
    assert row["created_at"] == row["deleted_at"] == at(5)
    assert all(row[name] is None for name in ATTRIBUTES[:-1])
    late = event("E-1", "C-1", "INSERT", 50, 9, **FULL)  # lower sequence, arrives later
    row = row_of(fold([delete, late]), "C-1")
    assert row["is_deleted"] is True and row["status"] == "DELETED"  # cannot revive
    assert row["city"] == "Rennes"  # but fills the attributes
    assert row["created_at"] == at(9) and row["deleted_at"] == at(5)


def test_delete_for_an_unknown_key_hard_blocks_lower_events() -> None:
    delete = event("E-2", "C-1", "DELETE", 100, 5)
    late = event("E-1", "C-1", "INSERT", 50, 9, **FULL)
    state = fold([delete, late], "hard")
    assert state.rows == {} and state.tombstones == {"C-1": delete.sequence}


def test_revival_soft_keeps_attributes_and_created_at() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "DELETE", 200, 2),
        event("E-3", "C-1", "UPDATE", 300, 3, email="new@example.com", status="ACTIVE"),
    ]
    row = row_of(fold(events, "soft"), "C-1")
    assert row["is_deleted"] is False and row["deleted_at"] is None and row["is_active"] is True
    assert row["customer_name"] == "Ana" and row["email"] == "new@example.com"
    assert row["created_at"] == at(1)


def test_revival_hard_starts_an_empty_row() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "DELETE", 200, 2),
        event("E-3", "C-1", "UPDATE", 300, 3, email="new@example.com", status="ACTIVE"),
    ]
    state = fold(events, "hard")
    row = row_of(state, "C-1")
    assert row["customer_name"] is None and row["city"] is None
    assert row["email"] == "new@example.com" and row["is_active"] is True
    assert row["created_at"] == at(3) and row["is_deleted"] is False
    assert state.tombstones == {"C-1": events[1].sequence}  # kept: it blocks lower events


def test_latest_delete_is_the_tombstone() -> None:
    events = [event("E-1", "C-1", "DELETE", 100, 1), event("E-2", "C-1", "DELETE", 300, 0)]
    assert fold(events, "hard").tombstones == {"C-1": events[1].sequence}


def test_equal_lsns_order_by_time_then_event_id() -> None:
    events = [
        event("E-b", "C-1", "INSERT", 100, 5, **{**FULL, "city": "First"}),
        event("E-c", "C-1", "UPDATE", 100, 4, city="Earlier"),
        event("E-a", "C-1", "UPDATE", 100, 5, city="Tie"),
        event("E-d", "C-1", "UPDATE", 99, 50, city="Lower LSN"),
    ]
    row = row_of(fold(events), "C-1")
    # order: (99), (100, 4, E-c), (100, 5, E-a), (100, 5, E-b)
    assert row["city"] == "First" and row["last_event_id"] == "E-b"
    assert row["created_at"] == at(50) and row["last_updated_at"] == at(5)


def test_highest_sequence_wins_even_with_an_earlier_clock() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 30, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 10, status="INACTIVE"),
    ]
    row = row_of(fold(events), "C-1")
    assert row["created_at"] == at(30) and row["last_updated_at"] == at(10)
    assert row["status"] == "INACTIVE" and row["is_active"] is False


def test_keys_are_independent() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-2", "DELETE", 50, 1),
        event("E-3", "C-2", "INSERT", 10, 0, **FULL),
    ]
    soft = fold(events, "soft")
    assert set(soft.rows) == {"C-1", "C-2"} and soft.rows["C-1"]["is_active"] is True
    hard = fold(events, "hard")
    assert set(hard.rows) == {"C-1"} and set(hard.tombstones) == {"C-2"}


def test_apply_event_hard_delete_of_an_unknown_key() -> None:
    state = ReferenceState()
    e = event("E-1", "C-1", "DELETE", 1, 1)
    apply_event(state, e, "hard")
    assert state.rows == {} and state.tombstones == {"C-1": e.sequence}
    apply_event(state, e, "soft")
    assert state.rows["C-1"]["is_deleted"] is True


def test_dedupe_keeps_the_first_copy() -> None:
    a = event("E-1", "C-1", "INSERT", 100, 1, **FULL)
    a2 = event("E-1", "C-1", "INSERT", 100, 1, **{**FULL, "city": "Lyon"})
    b = event("E-2", "C-1", "UPDATE", 50, 1, city="X")
    assert dedupe([a, b, a2, b]) == [a, b]
    assert dedupe([a2, a]) == [a2]


# --- plan/history.py ------------------------------------------------------------------------


def test_timeline_versions_and_windows_soft() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-3", "C-1", "DELETE", 300, 3),
        event("E-2", "C-1", "UPDATE", 200, 2, city="Nantes"),
        event("E-9", "C-2", "UPDATE", 100, 7, city="Paris"),
    ]
    history = timeline(events)
    assert set(history) == {"C-1", "C-2"}
    versions = history["C-1"]
    assert [v["event_id"] for v in versions] == ["E-1", "E-2", "E-3"]
    assert all(tuple(v) == HISTORY_COLUMNS for v in versions)
    assert [v["valid_from"] for v in versions] == [at(1), at(2), at(3)]
    assert [v["valid_to"] for v in versions] == [at(2), at(3), None]
    assert [v["is_current"] for v in versions] == [False, False, True]
    assert [v["operation"] for v in versions] == ["INSERT", "UPDATE", "DELETE"]
    assert [v["lsn"] for v in versions] == ["100", "200", "300"]
    assert [v["sequence"] for v in versions] == [
        events[0].sequence,
        events[2].sequence,
        events[1].sequence,
    ]
    assert [v["city"] for v in versions] == ["Rennes", "Nantes", "Nantes"]  # images after
    deleted = versions[2]
    assert deleted["is_deleted"] is True and deleted["status"] == "DELETED"
    assert deleted["customer_name"] == "Ana" and deleted["created_at"] == at(1)
    # the current version is the Silver row
    assert {c: deleted[c] for c in SILVER_COLUMNS} == fold(events).rows["C-1"]
    assert history["C-2"][0]["is_current"] is True and history["C-2"][0]["valid_to"] is None


def test_timeline_hard_delete_version_and_revival() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 1, **FULL),
        event("E-2", "C-1", "DELETE", 200, 2),
        event("E-3", "C-1", "UPDATE", 300, 3, city="Lyon"),
    ]
    versions = timeline(events, "hard")["C-1"]
    deleted = versions[1]
    assert deleted["is_deleted"] is True and deleted["status"] == "DELETED"
    assert deleted["is_active"] is False
    assert all(deleted[name] is None for name in ATTRIBUTES[:-1])
    assert deleted["created_at"] is None
    assert deleted["deleted_at"] == deleted["last_updated_at"] == deleted["valid_from"] == at(2)
    assert (deleted["last_event_id"], deleted["last_operation"], deleted["last_lsn"]) == (
        "E-2",
        "DELETE",
        "200",
    )
    assert (deleted["event_id"], deleted["operation"], deleted["valid_to"]) == (
        "E-2",
        "DELETE",
        at(3),
    )
    assert deleted["customer_id"] == "C-1" and tuple(deleted) == HISTORY_COLUMNS
    revived = versions[2]
    assert revived["created_at"] == at(3) and revived["customer_name"] is None
    assert revived["city"] == "Lyon" and revived["is_deleted"] is False
    # soft mode: the DELETE version is the deleted Silver row, attributes kept
    soft = timeline(events)["C-1"][1]
    assert soft["customer_name"] == "Ana" and soft["created_at"] == at(1)


def test_state_as_of() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 10, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 20, city="Nantes"),
        event("E-3", "C-1", "DELETE", 300, 30),
        event("E-4", "C-2", "INSERT", 100, 25, **FULL),
    ]
    history = timeline(events, "soft")
    assert state_as_of(history, at(5)) == {}
    assert set(state_as_of(history, at(10))) == {"C-1"}  # valid_from <= T
    assert state_as_of(history, at(19))["C-1"]["city"] == "Rennes"
    as_of_20 = state_as_of(history, at(20))
    assert as_of_20["C-1"]["city"] == "Nantes" and tuple(as_of_20["C-1"]) == SILVER_COLUMNS
    late = state_as_of(history, at(31))
    assert set(late) == {"C-1", "C-2"} and late["C-1"]["is_deleted"] is True
    assert late == fold(events).rows
    hard = timeline(events, "hard")
    assert set(state_as_of(hard, at(31), "hard")) == {"C-2"}  # hard-deleted: no state
    assert state_as_of(hard, at(29), "hard")["C-1"]["city"] == "Nantes"
    assert set(state_as_of(hard, at(31))) == {"C-1", "C-2"}  # the mode is an argument


def test_state_as_of_skips_a_customer_without_a_version_yet() -> None:
    events = [
        event("E-1", "C-2", "INSERT", 50, 40, **FULL),  # first in the timeline, visible at 40
        event("E-2", "C-1", "INSERT", 100, 10, **FULL),
    ]
    history = timeline(events)
    assert list(history) == ["C-2", "C-1"]
    assert set(state_as_of(history, at(20))) == {"C-1"}


def test_state_as_of_with_clocks_against_lsns() -> None:
    events = [
        event("E-1", "C-1", "INSERT", 100, 30, **FULL),
        event("E-2", "C-1", "UPDATE", 200, 10, city="Nantes"),  # higher LSN, earlier clock
    ]
    history = timeline(events)
    assert [v["valid_to"] for v in history["C-1"]] == [at(10), None]
    assert state_as_of(history, at(20))["C-1"]["city"] == "Nantes"
    assert state_as_of(history, at(40))["C-1"]["city"] == "Nantes"
    assert state_as_of(history, at(5)) == {}


# --- the local fold (engines/local/fold.py) and the MERGE (plan/merge_spec.py) ---------------

_FRAME_SCHEMA: dict[str, Any] = {
    "customer_id": pl.String,
    "event_id": pl.String,
    "operation": pl.String,
    "event_timestamp": pl.Datetime("us", "UTC"),
    **{name: pl.String for name in ATTRIBUTES},
    "present_mask": pl.Int32,
    "lsn": pl.String,
    "sequence": pl.String,
}


def frame(events: Iterable[CdcEvent]) -> pl.DataFrame:
    """Fold input (the Bronze columns) of accepted first-copy events."""
    events = list(events)
    columns = {
        "customer_id": [e.customer_id for e in events],
        "event_id": [e.event_id for e in events],
        "operation": [e.operation.value for e in events],
        "event_timestamp": [e.event_timestamp for e in events],
        **{name: [e.values.get(name) for e in events] for name in ATTRIBUTES},
        "present_mask": [e.present_mask for e in events],
        "lsn": [e.lsn for e in events],
        "sequence": [e.sequence for e in events],
    }
    return pl.DataFrame(columns, schema=_FRAME_SCHEMA)


def tombstones_frame(tombstones: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"customer_id": list(tombstones), "_cdc_seq": list(tombstones.values())},
        schema={"customer_id": pl.String, "_cdc_seq": pl.String},
    )


#: Customers with the cases of the rules, arrival order scrambled.
SCENARIO = [
    # SEMANTICS 9
    event("A-3", "C-1", "DELETE", 300, 3),
    event("A-1", "C-1", "INSERT", 100, 1, **FULL),
    event("A-4", "C-1", "UPDATE", 250, 4, city="Lyon"),
    event("A-2", "C-1", "UPDATE", 200, 2, city="Nantes"),
    # SEMANTICS 3: a partial UPDATE without status
    event("B-1", "C-2", "UPDATE", 100, 1, city="Paris", phone=None),
    # SEMANTICS 1: DELETE first, a late lower INSERT
    event("D-2", "C-3", "DELETE", 100, 5),
    event("D-1", "C-3", "INSERT", 50, 9, **FULL),
    # SEMANTICS 2: revival
    event("R-3", "C-4", "UPDATE", 300, 3, email="new@example.com", status="ACTIVE"),
    event("R-1", "C-4", "INSERT", 100, 1, **FULL),
    event("R-2", "C-4", "DELETE", 200, 2),
    # SEMANTICS 4: equal LSNs
    event("T-b", "C-5", "INSERT", 100, 5, **{**FULL, "city": "First"}),
    event("T-c", "C-5", "UPDATE", 100, 4, city="Earlier"),
    event("T-a", "C-5", "UPDATE", 100, 5, city="Tie", email=None),
    # clocks against LSNs
    event("K-2", "C-6", "UPDATE", 200, 10, status="INACTIVE"),
    event("K-1", "C-6", "INSERT", 100, 30, **FULL),
    # two DELETEs, nothing after
    event("Z-1", "C-7", "INSERT", 10, 1, **FULL),
    event("Z-3", "C-7", "DELETE", 30, 3),
    event("Z-2", "C-7", "DELETE", 20, 2),
]


def public(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in SILVER_COLUMNS}


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_fold_of_one_batch_equals_the_reference(mode: str) -> None:
    expected = fold(SCENARIO, mode)  # type: ignore[arg-type]
    folded = fold_events(frame(SCENARIO), mode)  # type: ignore[arg-type]
    rows = {r["customer_id"]: r for r in folded.to_dicts()}
    assert set(rows) == {e.customer_id for e in SCENARIO}
    live = {k: public(r) for k, r in rows.items() if r["_cdc_seq"] is not None}
    assert live == expected.rows
    tombs = {k: r["_cdc_tomb"] for k, r in rows.items() if r["_cdc_tomb"]}
    assert tombs == expected.tombstones
    assert folded.columns == to_source_table(folded).schema.names


def test_fold_registers_and_row_sequences() -> None:
    soft = {r["customer_id"]: r for r in fold_events(frame(SCENARIO), "soft").to_dicts()}
    c1 = soft["C-1"]
    seq = {e.event_id: e.sequence for e in SCENARIO}
    assert c1["_cdc_seq"] == seq["A-3"] and c1["_cdc_min_seq"] == seq["A-1"]
    assert c1[register("city")] == seq["A-4"]  # the highest carrier of city
    assert c1[register("email")] == seq["A-1"]
    assert c1[register("status")] == seq["A-3"]  # a soft DELETE sets status
    assert c1["_cdc_tomb"] == ""
    assert soft["C-2"][register("phone")] == seq["B-1"] and soft["C-2"]["phone"] is None
    assert soft["C-2"][register("status")] is None and soft["C-2"][register("email")] is None
    hard = {r["customer_id"]: r for r in fold_events(frame(SCENARIO), "hard").to_dicts()}
    assert hard["C-1"]["_cdc_seq"] is None and hard["C-1"]["_cdc_tomb"] == seq["A-3"]
    c4 = hard["C-4"]  # only the events above the tombstone count
    assert c4["_cdc_tomb"] == seq["R-2"] and c4["_cdc_min_seq"] == c4["_cdc_seq"] == seq["R-3"]
    assert c4[register("city")] is None and c4[register("email")] == seq["R-3"]
    assert hard["C-7"]["_cdc_tomb"] == seq["Z-3"]


def test_fold_with_prior_tombstones() -> None:
    events = [
        event("E-1", "C-1", "UPDATE", 100, 1, city="Old"),
        event("E-2", "C-2", "UPDATE", 300, 3, city="New"),
        event("E-3", "C-3", "UPDATE", 300, 3, city="Free"),
    ]
    prior = tombstones_frame({"C-1": events[0].sequence, "C-2": sequence_of(200, at(2), "X")})
    rows = {r["customer_id"]: r for r in fold_events(frame(events), "hard", prior).to_dicts()}
    assert rows["C-1"]["_cdc_seq"] is None and rows["C-1"]["city"] is None  # not above it
    assert rows["C-1"]["_cdc_tomb"] == events[0].sequence
    assert rows["C-2"]["city"] == "New" and rows["C-2"]["_cdc_tomb"] == prior["_cdc_seq"][1]
    assert rows["C-3"]["city"] == "Free" and rows["C-3"]["_cdc_tomb"] == ""
    # a batch DELETE above the prior tombstone replaces it
    later = [*events, event("E-4", "C-2", "DELETE", 400, 4)]
    rows = {r["customer_id"]: r for r in fold_events(frame(later), "hard", prior).to_dicts()}
    assert rows["C-2"]["_cdc_tomb"] == later[3].sequence and rows["C-2"]["_cdc_seq"] is None
    # soft mode ignores tombstones altogether
    soft = {r["customer_id"]: r for r in fold_events(frame(events), "soft", prior).to_dicts()}
    assert soft["C-1"]["city"] == "Old" and soft["C-1"]["_cdc_tomb"] == ""
    # an empty prior frame is no tombstone
    rows = fold_events(frame(events), "hard", tombstones_frame({})).to_dicts()
    assert all(r["_cdc_tomb"] == "" and r["_cdc_seq"] is not None for r in rows)


def test_batch_tombstones_take_the_latest_delete() -> None:
    events = [
        event("Z-1", "C-7", "INSERT", 10, 1, **FULL),
        event("Z-3", "C-7", "DELETE", 30, 3),
        event("Z-2", "C-7", "DELETE", 20, 9),
        event("Y-1", "C-8", "UPDATE", 10, 1, city="X"),
    ]
    tombs = batch_tombstones(frame(events), carry=["operation"]).to_dicts()
    assert tombs == [
        {
            "customer_id": "C-7",
            "_cdc_seq": events[1].sequence,
            "deleted_at": at(3),
            "last_event_id": "Z-3",
            "last_lsn": "30",
            "operation": "DELETE",
        }
    ]


def merge_batches(root: Path, batches: list[list[CdcEvent]], mode: str) -> dict[str, dict]:
    """Fold and MERGE each batch into a Silver table as the local engine does; public rows."""
    uri = str(root / "silver")
    DeltaTable.create(uri, schema=SILVER.schema)
    spec = silver_merge_spec(SILVER.schema.names)
    tombstones: dict[str, str] = {}
    for batch in batches:
        table = DeltaTable(uri)
        targets = read_arrow(table, columns=["customer_id"]).column(0).to_pylist()
        prior = tombstones_frame(tombstones) if mode == "hard" else None
        source = fold_events(frame(batch), mode, prior)  # type: ignore[arg-type]
        source = source.filter(
            pl.col("_cdc_seq").is_not_null() | pl.col("customer_id").is_in(targets)
        )
        (
            table.merge(
                to_source_table(source), predicate=spec.on, source_alias="s", target_alias="t"
            )
            .when_matched_delete(predicate=spec.delete_when)
            .when_matched_update(updates=spec.update_set, predicate=spec.update_when)
            .when_not_matched_insert(updates=spec.insert_values, predicate=spec.insert_when)
            .execute()
        )
        for e in batch:
            if e.operation is Operation.DELETE and e.sequence > tombstones.get(e.customer_id, ""):
                tombstones[e.customer_id] = e.sequence
    rows = read_arrow(DeltaTable(uri)).to_pylist()
    return {r["customer_id"]: public(r) for r in rows}


#: (batch 1, batch 2) per customer: late and early events across a MERGE.
BATCHES = [
    [  # batch 1
        event("A-1", "C-1", "INSERT", 100, 1, **FULL),
        event("A-2", "C-1", "UPDATE", 200, 2, city="Nantes"),
        event("A-3", "C-1", "DELETE", 300, 3),
        event("B-2", "C-2", "UPDATE", 200, 2, city="Nantes", status="INACTIVE"),
        event("C-1", "C-3", "INSERT", 100, 1, **FULL),
        event("D-1", "C-4", "INSERT", 100, 1, **FULL),
        event("E-1", "C-5", "INSERT", 100, 1, **FULL),
        event("F-1", "C-6", "DELETE", 100, 1),
        event("G-1", "C-7", "INSERT", 100, 1, **FULL),
    ],
    [  # batch 2
        event("A-4", "C-1", "UPDATE", 250, 4, city="Lyon"),  # late, below the DELETE
        event("B-1", "C-2", "INSERT", 100, 1, **FULL),  # late first event
        event("C-2", "C-3", "DELETE", 200, 2),
        event("D-2", "C-4", "DELETE", 200, 2),
        event("D-3", "C-4", "UPDATE", 300, 3, city="Lyon", status="ACTIVE"),
        event("E-2", "C-5", "UPDATE", 50, 0, status="SUSPENDED", email="old@x"),  # stale
        event("E-3", "C-5", "UPDATE", 150, 2, phone="+33-2"),
        event("F-2", "C-6", "INSERT", 50, 0, **FULL),  # late, below the DELETE
        event("G-2", "C-7", "UPDATE", 200, 2, email=None),
        event("H-1", "C-8", "UPDATE", 100, 1, country="Peru"),
    ],
]


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_merge_across_batches_equals_the_reference(tmp_path: Path, mode: str) -> None:
    silver = merge_batches(tmp_path, BATCHES, mode)
    assert silver == fold([e for batch in BATCHES for e in batch], mode).rows  # type: ignore[arg-type]


def test_merge_soft_rules(tmp_path: Path) -> None:
    silver = merge_batches(tmp_path, BATCHES, "soft")
    c1 = silver["C-1"]  # SEMANTICS 9
    assert c1["city"] == "Lyon" and c1["is_deleted"] is True and c1["last_lsn"] == "300"
    c2 = silver["C-2"]  # the late INSERT fills what the UPDATE did not set
    assert c2["customer_name"] == "Ana" and c2["city"] == "Nantes" and c2["status"] == "INACTIVE"
    assert c2["created_at"] == at(1) and c2["last_event_id"] == "B-2"
    assert silver["C-3"]["is_deleted"] is True and silver["C-3"]["deleted_at"] == at(2)
    c4 = silver["C-4"]  # revival keeps the attributes and created_at
    assert c4["customer_name"] == "Ana" and c4["city"] == "Lyon" and c4["is_active"] is True
    assert c4["deleted_at"] is None and c4["created_at"] == at(1)
    c5 = silver["C-5"]  # a stale status does not win; is_active follows the kept one
    assert c5["status"] == "ACTIVE" and c5["is_active"] is True and c5["email"] == FULL["email"]
    assert c5["phone"] == "+33-2" and c5["created_at"] == at(0) and c5["last_event_id"] == "E-3"
    c6 = silver["C-6"]  # SEMANTICS 1: filled but not revived
    assert c6["is_deleted"] is True and c6["city"] == "Rennes" and c6["created_at"] == at(0)
    assert silver["C-7"]["email"] is None and silver["C-7"]["city"] == "Rennes"
    assert silver["C-8"]["status"] is None and silver["C-8"]["is_active"] is False


def test_merge_hard_rules(tmp_path: Path) -> None:
    silver = merge_batches(tmp_path, BATCHES, "hard")
    assert "C-1" not in silver and "C-3" not in silver and "C-6" not in silver
    c4 = silver["C-4"]  # revival starts empty
    assert c4["customer_name"] is None and c4["city"] == "Lyon" and c4["created_at"] == at(3)
    assert c4["is_active"] is True and c4["is_deleted"] is False
    assert silver["C-2"]["created_at"] == at(1) and silver["C-5"]["status"] == "ACTIVE"


# --- plan/rules.py --------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SKEW = timedelta(minutes=5)


def rules_now() -> RuleSet:
    return RuleSet(r"C-[0-9]+", NOW, SKEW)  # built in the test: a pattern text, compiled by RE2


def record(**changes: object) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": "E-1",
        "customer_id": "C-1",
        "operation": "INSERT",
        "event_timestamp": "2025-12-31T10:00:00Z",
        **FULL,
        "metadata": {"lsn": "0/10", "source_table": "customers", "tx_id": "T-1"},
    }
    for key, value in changes.items():
        if value is ...:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def check(raw: dict[str, Any] | str | bytes) -> CdcEvent | Rejection:
    text = raw if isinstance(raw, str | bytes) else json.dumps(raw)
    return validate_record(text, rules_now())


def rejected(raw: dict[str, Any] | str | bytes) -> Rejection:
    result = check(raw)
    assert isinstance(result, Rejection), result
    return result


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterable[None]:
    """The machine's local time zone is not UTC (conversions must not use it)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_conversions_to_utc_ignore_the_local_time_zone(kolkata: None) -> None:
    parsed = parse_event_timestamp("2025-05-12T10:00:00+05:30")
    assert (parsed.hour, parsed.minute, parsed.utcoffset()) == (4, 30, timedelta(0))
    ist = timezone(timedelta(hours=5, minutes=30))
    local = datetime(2025, 5, 12, 10, 0, tzinfo=ist)
    assert sequence_of(1, local, "E") == sequence_of(
        1, datetime(2025, 5, 12, 4, 30, tzinfo=UTC), "E"
    )


def test_rejections_carry_the_ids_read_so_far() -> None:
    r = rejected(record(event_id="  "))
    assert (r.reason, r.event_id, r.customer_id) == ("NULL_EVENT_ID", None, "C-1")
    r = rejected(record(customer_id=" C-2 ", event_id=" E-7 ", operation="MERGE"))
    assert (r.reason, r.event_id, r.customer_id) == ("INVALID_OPERATION", "E-7", "C-2")
    r = rejected(record(event_id=42, status="GONE"))
    assert (r.reason, r.event_id, r.customer_id) == ("INVALID_STATUS", None, "C-1")
    r = rejected(record(customer_id=None))
    assert (r.event_id, r.customer_id) == (None, None)


@pytest.mark.parametrize(
    ("changes", "reason", "words"),
    [
        ({"customer_id": ...}, "NULL_CUSTOMER_ID", ["customer_id", "missing"]),
        ({"customer_id": 7}, "INVALID_CUSTOMER_ID_FORMAT", ["customer_id", "an integer"]),
        ({"customer_id": "X-1"}, "INVALID_CUSTOMER_ID_FORMAT", ["customer_id", "C-[0-9]+"]),
        ({"event_id": None}, "NULL_EVENT_ID", ["event_id", "missing"]),
        ({"operation": "MERGE"}, "INVALID_OPERATION", ["operation", "alias"]),
        ({"operation": ...}, "INVALID_OPERATION", ["operation is missing"]),
        ({"operation": None}, "INVALID_OPERATION", ["operation", "null"]),
        ({"operation": ["INSERT"]}, "INVALID_OPERATION", ["operation", "an array"]),
        ({"event_timestamp": " "}, "NULL_EVENT_TIMESTAMP", ["event_timestamp", "blank"]),
        ({"event_timestamp": "yesterday"}, "INVALID_EVENT_TIMESTAMP", ["event_timestamp"]),
        ({"event_timestamp": True}, "INVALID_EVENT_TIMESTAMP", ["event_timestamp", "boolean"]),
        ({"event_timestamp": {}}, "INVALID_EVENT_TIMESTAMP", ["event_timestamp", "an object"]),
        (
            {"event_timestamp": "0001-01-01T00:00:00+01:00"},
            "INVALID_EVENT_TIMESTAMP",
            ["event_timestamp", "year 1"],
        ),
        (
            {"event_timestamp": "-99999999999999"},
            "INVALID_EVENT_TIMESTAMP",
            ["event_timestamp", "year 1"],
        ),
        (
            {"event_timestamp": "9999-12-31T23:00:00-05:00"},
            "FUTURE_EVENT_TIMESTAMP",
            ["event_timestamp", "9999", "processing.max_clock_skew"],
        ),
        ({"event_timestamp": 10**15}, "FUTURE_EVENT_TIMESTAMP", ["event_timestamp", "9999"]),
        (
            {"event_timestamp": "2026-01-01T12:05:01Z"},
            "FUTURE_EVENT_TIMESTAMP",
            ["event_timestamp", "processing.max_clock_skew"],
        ),
        ({"metadata": "0/10"}, "NULL_LSN", ["metadata.lsn", "missing"]),
        ({"metadata": {"lsn": "x/y"}}, "INVALID_LSN", ["metadata.lsn", "notation"]),
        ({"status": "GONE"}, "INVALID_STATUS", ["status", "ACTIVE"]),
        ({"status": 1}, "INVALID_STATUS", ["status", "ACTIVE"]),
        ({"status": ...}, "INVALID_STATUS", ["INSERT", "status"]),
        (
            {"metadata": {"lsn": "1", "source_table": {"a": 1}}},
            "SCHEMA_MISMATCH",
            ["metadata.source_table"],
        ),
        ({"metadata": {"lsn": "1", "tx_id": [1]}}, "SCHEMA_MISMATCH", ["metadata.tx_id"]),
        ({"city": {"a": 1}}, "SCHEMA_MISMATCH", ["city"]),
    ],
)
def test_rejection_details_name_the_field_and_the_problem(
    changes: dict[str, object], reason: str, words: list[str]
) -> None:
    r = rejected(record(**changes))
    assert r.reason == reason
    for word in words:
        assert word in r.detail


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"a": "\xff"}', ["UTF-8", "byte 7"]),
        ("[1, 2]", ["list", "not an object"]),
        ("42", ["JSON int is not an object"]),
        ('{"a": NaN}', ["NaN"]),
        ('{"a": 1,}', ["not valid JSON", "character"]),
        ('{"a": "\\ud800"}', ["lone surrogate"]),
        ('{"a": 1' + "0" * 5000 + "}", ["out of range"]),
        ('{"a": ' + "[" * 501 + "]" * 501 + "}", ["nested deeper than 500"]),
        ('{"big": ' + "9" * 30 + ', "a": ' + "[" * 501 + "]" * 501 + "}", ["deeper than 500"]),
        ('{"big": 1.5, "a": ' + "[" * 501 + "]" * 501 + "}", ["deeper than 500"]),
        ('{"big": 1' + "0" * 400 + ', "a": ' + "[" * 501 + "]" * 501 + "}", ["deeper than 500"]),
    ],
)
def test_malformed_json_details(raw: str | bytes, words: list[str]) -> None:
    r = rejected(raw)
    assert r.reason == "MALFORMED_JSON"
    for word in words:
        assert word in r.detail
    assert "unprocessable" not in r.detail


def test_nesting_limit_boundary() -> None:
    def nested(depth: int, leaf: str) -> str:  # depth levels of arrays/objects in all
        return '{"x": ' + "[" * (depth - 1) + leaf + "]" * (depth - 1) + "}"

    for leaf in ("1", "1.5", "9" * 30):
        assert isinstance(parse_record(nested(MAX_NESTING, leaf)), dict)
        too_deep = parse_record(nested(MAX_NESTING + 1, leaf))
        assert isinstance(too_deep, Rejection) and too_deep.reason == "MALFORMED_JSON"


def test_an_accepted_event_carries_the_normalised_fields() -> None:
    e = check(
        record(
            event_id=" E-9 ",
            customer_id=" C-3 ",
            operation=" u ",
            status=" inactive ",
            phone=34555024900,
            email=None,
            metadata={"lsn": " 0/10 ", "source_table": "customers", "tx_id": 77},
        )
    )
    assert isinstance(e, CdcEvent)
    assert (e.event_id, e.customer_id, e.operation) == ("E-9", "C-3", Operation.UPDATE)
    assert e.values["status"] == "INACTIVE" and e.values["phone"] == "34555024900"
    assert e.values["email"] is None and list(e.values) == list(ATTRIBUTES)  # ATTRIBUTES order
    assert (e.lsn, e.lsn_number, e.tx_id, e.source_table) == ("0/10", 16, "77", "customers")
    numeric = check(record(event_id=42, metadata={"lsn": 24023128}))
    assert isinstance(numeric, CdcEvent)
    assert (numeric.event_id, numeric.lsn, numeric.lsn_number) == ("42", "24023128", 24023128)
    assert (numeric.tx_id, numeric.source_table) == (None, None)
    delete = check(record(operation="D", status="bogus", city={"a": 1}))
    assert isinstance(delete, CdcEvent) and delete.values == {}


def test_clock_skew_boundary() -> None:
    for ts in ("2026-01-01T12:05:00Z", "2026-01-01T12:02:00Z", "2026-01-01T11:58:00Z"):
        assert isinstance(check(record(event_timestamp=ts)), CdcEvent), ts
    assert rejected(record(event_timestamp="2026-01-01T12:05:00.000001Z")).reason == (
        "FUTURE_EVENT_TIMESTAMP"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1000000000", datetime(1970, 1, 12, 13, 46, 40, tzinfo=UTC)),  # 10 digits: epoch ms
        (" 1000000000 ", datetime(1970, 1, 12, 13, 46, 40, tzinfo=UTC)),
        ("-1000000000", datetime(1969, 12, 20, 10, 13, 20, tzinfo=UTC)),
        (1000, datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
        ("2025-05-12T10:00:00+05:30", datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
        ("2025-05-12T10:00:00", datetime(2025, 5, 12, 10, 0, tzinfo=UTC)),
    ],
)
def test_event_timestamps(value: object, expected: datetime) -> None:
    parsed = parse_event_timestamp(value)
    assert parsed == expected and parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "value", [1.5, JsonNumber("1e12"), None, [1], "123456789", "\u00b9" + "\u00b2" * 12]
)
def test_not_event_timestamps(value: object) -> None:
    with pytest.raises(InvalidTimestamp, match="event_timestamp"):
        parse_event_timestamp(value)


def test_timestamp_range_edges() -> None:
    for beyond in ("9999-12-31T23:00:00-05:00", 10**15, str(10**15)):
        with pytest.raises(TimestampBeyondRange, match="event_timestamp is after year 9999"):
            parse_event_timestamp(beyond)
    with pytest.raises(InvalidTimestamp) as info:
        parse_event_timestamp("0001-01-01T00:00:00+01:00")
    assert not isinstance(info.value, TimestampBeyondRange)


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("2025-01-01T10:00:00Z", 0),
        ("2025-01-01T10:00:00.123456Z", 0),
        ("2025-01-01T10:00:00.1234567Z", 700),
        ("2025-01-01T10:00:00.0000005Z", 500),
        ("2025-01-01T10:00:00.000000012Z", 12),
        ("2025-01-01T10:00:00.0000000129Z", 12),  # digits beyond the ninth are ignored
        ("2016-12-31T23:59:60Z", 999),
        (1700000000000, 0),
    ],
)
def test_sub_microsecond_nanos(text: object, nanos: int) -> None:
    assert sub_microsecond_nanos(text) == nanos


def test_content_hash_ignores_key_order_also_for_big_integers() -> None:
    big = 2**70
    assert content_hash({"a": big, "b": "é"}) == content_hash({"b": "é", "a": big})
    assert content_hash({"a": big}) != content_hash({"a": big + 1})
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})


def test_kind_of_names_json_kinds() -> None:
    kinds = [
        (None, "null"),
        (True, "a boolean"),
        (3, "an integer"),
        (1.5, "a number with a fraction or exponent"),
        (JsonNumber("1e2"), "a number with a fraction or exponent"),
        ("x", "a string"),
        ({}, "an object"),
        ([], "an array"),
        (b"x", "bytes"),
    ]
    assert [kind_of(value) for value, _ in kinds] == [kind for _, kind in kinds]


def test_pattern_errors_name_the_key_and_re2s_reason(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as info:
        RuleSet(r"^(C)-\1$", NOW, SKEW)
    message = str(info.value)
    assert message.startswith("processing.customer_id_pattern: ")
    assert "RE2" in message and message.endswith("invalid escape sequence: \\1")
    assert capfd.readouterr().err == ""  # raised, not also printed by RE2
    assert unsupported_by_re2(re2_error(b"bad \xff")).endswith(": bad \ufffd")
    assert unsupported_by_re2(re2_error()).endswith(": re2_error()")


def re2_error(*args: object) -> Exception:
    class re2_error(Exception):
        def __repr__(self) -> str:
            return "re2_error()"

        __str__ = __repr__

    return re2_error(*args)


def test_rule_set_patterns() -> None:
    compiled = RuleSet(re.compile(r"C-[0-9]+"), NOW, SKEW)
    assert isinstance(compiled.customer_id_pattern, CustomerIdPattern)
    assert compiled.customer_id_pattern.pattern == "C-[0-9]+"
    assert compiled.customer_id_matches("C-1") and not compiled.customer_id_matches("C-1x")
    with pytest.raises(ValueError, match="flags inline"):
        RuleSet(re.compile("c-[0-9]+", re.IGNORECASE), NOW, SKEW)
    assert RuleSet("(?i)c-[0-9]+", NOW, SKEW).customer_id_matches("C-1")  # inline, as text
    assert repr(rules_now().customer_id_pattern) == "CustomerIdPattern('C-[0-9]+')"
    r = rejected(record(customer_id="X-1"))
    assert "'C-[0-9]+'" in r.detail


# --- plan/replay.py -------------------------------------------------------------------------


def test_bucket_count() -> None:
    assert bucket_count(0, 10) == 1
    assert bucket_count(10, 10) == 1
    assert bucket_count(11, 10) == 2
    assert bucket_count(30, 10) == 3
    assert bucket_count(1, 1) == 1
    assert bucket_count(500_001) == 3  # default: about 250,000 rows a bucket
    with pytest.raises(ValueError, match="positive"):
        bucket_count(5, 0)


def test_revalidate_replays_the_rules_of_each_batch() -> None:
    batch_1 = NOW - timedelta(days=1)
    first = record(event_id="E-1", event_timestamp="2025-12-31T12:03:00Z")  # within the skew
    first_event = validate_record(json.dumps(first), RuleSet("C-[0-9]+", batch_1, SKEW))
    assert isinstance(first_event, CdcEvent)
    rows = [
        (json.dumps(first), batch_1, first_event.sequence),
        (json.dumps(record(event_id="E-2", operation="U")), NOW, "stale"),
        (json.dumps(record(event_id="E-1")), NOW, "x"),  # a second first copy of E-1
        ("not json", NOW, "x"),
        (json.dumps(record(event_id="E-3", customer_id="X-1")), NOW, "x"),
        (json.dumps(record(event_id="E-4", event_timestamp="2026-01-01T12:03:00Z")), batch_1, "x"),
    ]
    rows += [  # each kind once more: counts, not flags
        (json.dumps(record(event_id="E-5", operation="D")), NOW, "stale too"),
        (json.dumps(record(event_id="E-6", operation="D")), NOW, "x"),
        (json.dumps(record(event_id="E-2")), NOW, "x"),
        ("[]", NOW, "x"),
        (json.dumps(record(event_id="E-7", customer_id="X-2")), NOW, "x"),
        (json.dumps(record(event_id="E-8", event_timestamp="2026-01-01T12:04:00Z")), batch_1, "x"),
    ]
    e6 = validate_record(json.dumps(record(event_id="E-6", operation="D")), rules_now())
    assert isinstance(e6, CdcEvent)
    rows[7] = (rows[7][0], NOW, e6.sequence)
    e9 = validate_record(json.dumps(record(event_id="E-9", operation="D")), rules_now())
    assert isinstance(e9, CdcEvent)
    rows.append((json.dumps(record(event_id="E-9", operation="D")), NOW, e9.sequence))
    # three stored sequences match, two do not
    out = revalidate(rows, "C-[0-9]+", SKEW)
    assert out.accepted == 5
    assert out.columns["event_id"] == ["E-1", "E-2", "E-5", "E-6", "E-9"]
    assert out.columns["operation"] == ["INSERT", "UPDATE", "DELETE", "DELETE", "DELETE"]
    assert out.columns["ingested_at"] == [batch_1, NOW, NOW, NOW, NOW]
    assert out.columns["sequence"][0] == first_event.sequence
    assert out.columns["present_mask"] == [0b111111, 0b111111, 0, 0, 0]
    assert out.columns["city"] == ["Rennes", "Rennes", None, None, None]
    assert out.columns["lsn"] == ["0/10"] * 5 and out.columns["customer_id"] == ["C-1"] * 5
    assert out.columns["event_timestamp"][0] == datetime(2025, 12, 31, 12, 3, tzinfo=UTC)
    assert out.sequence_mismatches == 2 and out.duplicate_ids == 2
    assert out.rejected == {
        "MALFORMED_JSON": 2,
        "INVALID_CUSTOMER_ID_FORMAT": 2,
        "FUTURE_EVENT_TIMESTAMP": 2,
    }


# --- model/contracts.py ---------------------------------------------------------------------


def test_contract_column_lookup() -> None:
    assert CUSTOMERS.column("city").name == "city"
    assert CUSTOMERS.column("status").name == "status"
    with pytest.raises(KeyError, match="no_such_column"):
        CUSTOMERS.column("no_such_column")
