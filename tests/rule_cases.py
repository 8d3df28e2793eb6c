"""Records shared by the agreement tests of the rules' renderings (Spark, local columns)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.test_rules import good


def edge_records() -> list[str]:
    """Lines for every rule and its edge cases (one JSON line each)."""
    base = json.dumps(good())[:-1]
    records: list[Any] = [
        good(),
        good(customer_id=...),
        good(customer_id=None),
        good(customer_id=" \u3000"),
        good(customer_id="\u3000C-1\t"),
        good(customer_id="customer-1"),
        good(customer_id=9021),
        good(event_id=None),
        good(event_id="\u00a0"),
        good(event_id=17),
        good(event_id=True),
        good(operation="MERGE"),
        good(operation=None),
        good(operation=" d ", city={"a": 1}, status=[1]),
        good(operation="u", status=...),
        good(operation="ınsert"),
        good(event_timestamp=...),
        good(event_timestamp=True),
        good(event_timestamp={"t": 1}),
        good(event_timestamp="2026-11-29T12:06:00Z"),
        good(event_timestamp="2025-05-12T10:00:00+05:30"),
        good(event_timestamp="2025-05-12T10:00:00.5-03:00"),
        good(event_timestamp="2025-05-12 10:00:00.123456789Z"),
        good(event_timestamp=1747024200000),
        good(event_timestamp="1747024200000"),
        good(metadata=None),
        good(metadata="oops"),
        good(metadata={"lsn": None}),
        good(metadata={"lsn": " "}),
        good(metadata={"lsn": "zz/1"}),
        good(metadata={"lsn": -5}),
        good(metadata={"lsn": True}),
        good(metadata={"lsn": [1]}),
        good(metadata={"lsn": "0/16B3748"}),
        good(metadata={"lsn": "FFFFFFFF/FFFFFFFF"}),
        good(metadata={"lsn": "0000000000/00000010"}),
        good(metadata={"lsn": 24023128}),
        good(metadata={"lsn": " 24023128 "}),
        good(metadata={"lsn": "0/10", "tx_id": 5, "source_table": ["x"]}),
        good(metadata={"lsn": "0/10", "tx_id": {"a": 1}}),
        good(status=...),
        good(status=None),
        good(status="ARCHIVED"),
        good(status=" active "),
        good(operation="UPDATE", status="gone"),
        good(city={"name": "x"}),
        good(phone=[1]),
        good(phone=34555024900, country=False, city=None),
        good(customer_id=None, event_id=None, operation="X"),
        good(metadata={"lsn": "bad"}, status="bad"),
        good(status="bad", city={}),
        good(x={"b": 1, "a": [1, {"d": 2, "c": 3}]}, y="é☃😀", z='a\nb"\\/'),
    ]
    raws = [json.dumps(r) for r in records]
    raws += [
        json.dumps(good(customer_name="Zoë Ünal 😀"), ensure_ascii=False),
        "[1,2]",
        '"text"',
        "{}",
        base + "} x",
        base + "}, 1",
        base + '}],"y":[1',
    ]
    return raws


_TEXT = st.text(alphabet=st.sampled_from(list('aZ09 -_:/.\t\u3000é😀"\\')), max_size=8)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-5, 10**13),
    _TEXT,
)
_VALUE = st.one_of(
    _SCALAR, st.lists(_SCALAR, max_size=2), st.dictionaries(_TEXT, _SCALAR, max_size=2)
)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "customer_id": st.one_of(
        st.sampled_from(["C-1", " C-22 ", "c-1", "C-", "\tC-3\u2003"]), _VALUE
    ),
    "event_id": st.one_of(st.sampled_from(["E1", " E2 ", ""]), _VALUE),
    "operation": st.one_of(st.sampled_from(["INSERT", " u ", "d", "R", "merge", ""]), _VALUE),
    "event_timestamp": st.one_of(
        st.sampled_from(
            [
                "2026-11-29T11:00:00Z",
                " 2026-11-29 11:59:59.1234567+01:00 ",
                "2026-11-29T12:04:59.999999Z",
                "2026-11-29T12:06:00Z",
                "2026-02-30T10:00:00Z",
                "1764412000000",
                "2026-11-29",
            ]
        ),
        st.integers(-(2**62), 2**62),
        _VALUE,
    ),
    "status": st.one_of(st.sampled_from(["ACTIVE", " deleted ", "suspended", "gone"]), _VALUE),
    "city": _VALUE,
    "phone": _VALUE,
}
_LSN = st.one_of(
    st.sampled_from(
        ["0/16B3748", "16/B374D848", "00000028:000001bc:0001", "24023128", " 7 ", "x/1"]
    ),
    st.integers(-3, 2**66),
    _VALUE,
)


@st.composite
def messy_records(draw: st.DrawFn) -> str:
    record: dict[str, Any] = {}
    for name, strategy in _FIELDS.items():
        if draw(st.integers(0, 9)) > 0:
            record[name] = draw(strategy)
    if draw(st.booleans()):
        record["metadata"] = {"lsn": draw(_LSN), "tx_id": draw(_SCALAR)}
    elif draw(st.booleans()):
        record["metadata"] = draw(_VALUE)
    return json.dumps(record, ensure_ascii=draw(st.booleans()))
