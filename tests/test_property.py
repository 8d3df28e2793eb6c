"""Order-independence against the independent oracle (``tests/oracle.py``).

Streams of valid and invalid records — every reason code, exact and conflicting duplicates,
copies with reordered keys and other whitespace, LSNs crossing a hex width in both halves of
PostgreSQL's ``X/Y`` and in decimal, every notation mixed with padding and surrounding spaces,
equal LSNs, timestamps with offsets and up to nine fractional digits, partial updates, deletes
and revivals — shuffled, cut into micro-batches of random sizes, and run. Silver, the
tombstones and the fate of every input line (Bronze or quarantine, by position, with the
oracle's reason) must equal the oracle's.

Profiles: ``ci`` (the default: derandomized, so CI runs the same examples every time) and
``deep`` (many more random examples): ``uv run pytest tests/test_property.py
--hypothesis-profile=deep``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import NOW, Lake

#: LSN neighbourhoods: the low half crossing 24 bits, the low half overflowing into the high
#: half (0/FFFFFFFF → 1/0), the high half crossing a hex width (F/… → 10/…), decimal lengths.
_LSN_BASES = (0xFFFFF8, 0xFFFFFFF8, (0xF << 32) + 0xFFFFFFF8, 99_999_998)
_ATTRS = ("customer_name", "email", "phone", "city", "country")

#: One invalid record per reason (before duplicates): a function of a valid event.
_INVALID: dict[str, Any] = {
    "MALFORMED_JSON": lambda e: "{" + json.dumps(e)[1:-1],
    "MALFORMED_UTF8": lambda e: b'{"customer_id": "C-1", "city": "\xff"}',
    "NOT_AN_OBJECT": lambda e: json.dumps([e]),
    "NAN": lambda e: json.dumps(e)[:-1] + ', "phone": NaN}',
    "NULL_CUSTOMER_ID": lambda e: {**e, "customer_id": "  "},
    "MISSING_CUSTOMER_ID": lambda e: {k: v for k, v in e.items() if k != "customer_id"},
    "INVALID_CUSTOMER_ID_FORMAT": lambda e: {**e, "customer_id": "X-1"},
    "NUMERIC_CUSTOMER_ID": lambda e: {**e, "customer_id": 17},
    "NULL_EVENT_ID": lambda e: {**e, "event_id": None},
    "INVALID_OPERATION": lambda e: {**e, "operation": "MERGE"},
    "NULL_EVENT_TIMESTAMP": lambda e: {**e, "event_timestamp": ""},
    "INVALID_EVENT_TIMESTAMP": lambda e: {**e, "event_timestamp": "yesterday"},
    "FUTURE_EVENT_TIMESTAMP": lambda e: {**e, "event_timestamp": _iso(-24 * 60)},
    "NULL_LSN": lambda e: {**e, "metadata": {"source_table": "customers"}},
    "INVALID_LSN": lambda e: {**e, "metadata": {"lsn": "G/1"}},
    "NEGATIVE_LSN": lambda e: {**e, "metadata": {"lsn": -5}},
    "INVALID_STATUS": lambda e: {**e, "operation": "INSERT", "status": "GONE"},
    "SCHEMA_MISMATCH": lambda e: {**e, "operation": "UPDATE", "city": {"name": "Lyon"}},
}


def _iso(minutes_ago: float, offset_minutes: int = 0, digits: int = 0, lower: bool = False) -> str:
    """``NOW - minutes_ago`` as ISO-8601 text in a given UTC offset with ``digits`` fraction."""
    instant = NOW - timedelta(minutes=minutes_ago)
    local = instant + timedelta(minutes=offset_minutes)
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{local.microsecond:06d}{instant.second * 7 % 1000:03d}"[:digits]
    if offset_minutes == 0:
        return text + ("z" if lower else "Z")
    sign = "+" if offset_minutes > 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


def _lsn(draw: st.DrawFn, number: int) -> Any:
    notation = draw(st.sampled_from(["pg", "pg_lower", "pg_padded", "mssql", "dec", "int"]))
    text: Any
    if notation == "pg":
        text = f"{number >> 32:X}/{number & 0xFFFFFFFF:X}"
    elif notation == "pg_lower":
        text = f"{number >> 32:x}/{number & 0xFFFFFFFF:x}"
    elif notation == "pg_padded":
        text = f"{number >> 32:08X}/{number & 0xFFFFFFFF:08X}"
    elif notation == "mssql":
        text = f"{number >> 48:08x}:{(number >> 16) & 0xFFFFFFFF:08x}:{number & 0xFFFF:04x}"
    elif notation == "dec":
        text = "0" * draw(st.integers(0, 3)) + str(number)
    else:
        return number
    return draw(st.sampled_from(["", " ", "\t"])) + text + draw(st.sampled_from(["", " "]))


def _value(draw: st.DrawFn, name: str, i: int) -> Any:
    return draw(st.sampled_from([None, f"{name}-{i}", "x", " padded ", 42, 1.5, True, "é✓"]))


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Any], list[int], int]:
    """(records in arrival order before shuffling, file sizes, shuffle seed)."""
    n = draw(st.integers(min_value=1, max_value=28))
    base = draw(st.sampled_from(_LSN_BASES))
    events: list[dict[str, Any]] = []
    for i in range(n):
        cid = draw(st.sampled_from(["C-1", "C-2", "C-3", " C-1", "C-2 "]))
        op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE", "u", " d ", "c", "R"]))
        attrs: dict[str, Any] = {}
        for name in _ATTRS:
            if draw(st.integers(0, 2)) == 0:
                attrs[name] = _value(draw, name, i)
        if op in ("INSERT", "c", "R") or draw(st.booleans()):
            attrs["status"] = draw(st.sampled_from(["ACTIVE", "inactive ", "SUSPENDED", "deleted"]))
        timestamp = _iso(
            draw(st.integers(1, 6)),  # few distinct instants: equal LSNs order by time, then id
            offset_minutes=draw(st.sampled_from([0, 0, 330, -180])),
            digits=draw(st.sampled_from([0, 3, 6, 7, 9])),
            lower=draw(st.booleans()),
        )
        events.append(
            {
                "event_id": f"E-{i:03d}",
                "customer_id": cid,
                "operation": op,
                "event_timestamp": timestamp,
                **attrs,
                "metadata": {
                    "source_table": "customers",
                    "lsn": _lsn(draw, base + draw(st.integers(0, 16))),
                    "tx_id": f"TX-{i}",
                },
            }
        )
    records: list[Any] = list(events)
    # redeliveries: up to 3 copies of an event, each exact, reordered or conflicting, so a
    # later copy must be compared with the FIRST accepted one (not the last seen)
    for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        for kind in draw(
            st.lists(st.sampled_from(["exact", "reordered", "conflict"]), min_size=1, max_size=3)
        ):
            copy = events[i]
            if kind == "exact":
                records.append(copy)
            elif kind == "reordered":
                reordered = dict(reversed(list(copy.items())))
                records.append(json.dumps(reordered, indent=1).replace("\n", ""))
            else:
                records.append({**copy, "city": f"conflict-{i}-{len(records)}"})
    for reason in draw(st.lists(st.sampled_from(sorted(_INVALID)), max_size=4)):
        record = _INVALID[reason](events[draw(st.integers(0, n - 1))])
        records.append(record)
    records += draw(st.lists(st.sampled_from(["", "   "]), max_size=2))  # blank: no record
    seed = draw(st.integers(0, 2**32 - 1))
    cuts = draw(st.lists(st.integers(1, 7), min_size=1, max_size=5))
    return records, cuts, seed


def check_against_oracle(lake: Lake, inputs: int) -> None:
    """Silver, tombstones and every input line's fate equal the oracle's."""
    expected = lake.expected()
    assert lake.silver() == expected.rows
    if lake.mode == "hard":
        tombs = lake.table("silver/customer_tombstones")
        got = dict(zip(tombs["customer_id"], tombs["_cdc_seq"], strict=True))
        assert got == expected.tombstones

    bronze = lake.table("bronze/customer_events")
    quarantine = lake.table("quarantine/customer_events")
    fates: dict[tuple[str, int], list[str]] = {}
    for row in bronze.select("source_file", "source_line", "is_duplicate").to_dicts():
        fate = "DUPLICATE" if row["is_duplicate"] else "ACCEPTED"
        fates.setdefault((Path(row["source_file"]).name, row["source_line"]), []).append(fate)
    for row in quarantine.select("source_file", "source_line", "failure_reason").to_dicts():
        position = (Path(row["source_file"]).name, row["source_line"])
        fates.setdefault(position, []).append(row["failure_reason"])
    # exactly once, by position: every non-blank input line has one fate, the oracle's
    want = {
        lake.positions[index]: [verdict if verdict != "QUARANTINED" else detail]
        for index, verdict, detail in lake.verdicts()
    }
    assert fates == want
    assert len(lake.arrival) == inputs


#: Landing files per micro-batch: one (every file boundary a batch boundary) or a few (copies,
#: conflicts and late events also meet inside a batch, in arrival order across its files).
FILES_PER_BATCH = st.sampled_from([1, 2, 3])


def _run(
    tmp: Path, mode: str, stream: tuple[list[Any], list[int], int], max_files: int = 1
) -> None:
    records, cuts, seed = stream
    lake = Lake(tmp, mode=mode, max_files=max_files)
    # what is checked is Silver, tombstones and each line's fate: no Gold refresh after each of
    # the stream's micro-batches (a quarter of a batch's time; Gold: tests/test_gold.py)
    lake.config.gold.refresh_every_batches = 0
    lake.write_stream(list(records), cuts, seed)
    lake.run("available-now")
    check_against_oracle(lake, len(records))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["soft", "hard"])
@given(stream=streams(), max_files=FILES_PER_BATCH)
def test_shuffled_batched_streams_match_oracle(tmp_path_factory, mode, stream, max_files) -> None:
    _run(tmp_path_factory.mktemp(mode), mode, stream, max_files)
