"""Order-independence: shuffled, duplicated, re-batched streams give the reference fold's Silver."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.model.lsn import format_mssql_lsn, format_pg_lsn
from tests.conftest import Lake, ev

# LSNs around 0/FFFFFF -> 0/1000000 so Postgres notations cross a hex width
_LSN_BASE = 0xFFFFF8
_ATTRS = ["customer_name", "email", "phone", "city", "country"]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[dict], list[int], int]:
    n = draw(st.integers(min_value=1, max_value=24))
    events = []
    for i in range(n):
        cid = f"C-{draw(st.integers(1, 4))}"
        op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE", "u", "D", "c"]))
        offset = draw(st.integers(0, 16))
        number = _LSN_BASE + offset
        notation = draw(st.sampled_from(["pg", "mssql", "dec", "int"]))
        lsn = {
            "pg": format_pg_lsn(number),
            "mssql": format_mssql_lsn(number),
            "dec": str(number),
            "int": number,
        }[notation]
        attrs = {}
        for name in _ATTRS:
            if draw(st.booleans()):
                attrs[name] = draw(st.sampled_from([None, f"{name}-{i}", "x"]))
        if op in ("INSERT", "c") or draw(st.booleans()):
            attrs["status"] = draw(st.sampled_from(["ACTIVE", "inactive ", "SUSPENDED"]))
        minutes = draw(st.integers(1, 5))  # equal LSNs still order by time, then event_id
        events.append(ev(f"E-{i:03d}", cid, op, lsn, minutes_ago=minutes, **attrs))
    dups = draw(st.lists(st.integers(0, n - 1), max_size=4))
    seed = draw(st.integers(0, 2**32 - 1))
    cuts = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    return events + [events[d] for d in dups], cuts, seed


def _run(tmp: Path, mode: str, stream: tuple[list[dict], list[int], int]) -> None:
    records, cuts, seed = stream
    lake = Lake(tmp, mode=mode, max_files=1)
    lake.write_stream(records, cuts, seed)
    lake.run("available-now")
    expected = lake.expected()
    assert lake.silver() == expected.rows
    if mode == "hard":
        tombs = lake.table("silver/customer_tombstones")
        got = dict(zip(tombs["customer_id"], tombs["_cdc_seq"], strict=True))
        assert got == expected.tombstones
    # every input record is in Bronze or quarantine exactly once
    assert lake.table("bronze/customer_events").height + lake.table(
        "quarantine/customer_events"
    ).height == len(records)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["soft", "hard"])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=streams())
def test_shuffled_batched_streams_match_reference(tmp_path_factory, mode, stream) -> None:
    _run(tmp_path_factory.mktemp(mode), mode, stream)
