"""silver/customer_history (SCD2) equals the independent oracle's timeline, whatever the arrival
order (the product's own reference timeline, ``plan/history.py``, is checked against the
oracle in ``tests/test_oracle.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from cdcflow.plan.history import HISTORY_COLUMNS
from cdcflow.plan.reference import SILVER_COLUMNS
from tests.conftest import Lake, ev, full
from tests.oracle import Oracle
from tests.test_property import FILES_PER_BATCH, streams


def history(lake: Lake) -> dict[str, list[dict[str, Any]]]:
    rows = (
        lake.table("silver/customer_history")
        .select(HISTORY_COLUMNS)
        .sort("customer_id", "sequence")
        .to_dicts()
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["customer_id"], []).append(row)
    return out


def expected(lake: Lake) -> dict[str, list[dict[str, Any]]]:
    """The independent oracle's timeline of everything written (``tests/oracle.py``)."""
    return Oracle().timeline(lake.arrival, lake.mode)


def _run(tmp: Path, mode: str, stream: tuple[list[dict], list[int], int], max_files: int) -> None:
    records, cuts, seed = stream
    lake = Lake(tmp, mode=mode, max_files=max_files)
    lake.config.gold.refresh_every_batches = 0  # history and Silver are checked, not Gold
    lake.write_stream(list(records), cuts, seed)
    lake.run("available-now")
    got = history(lake)
    assert got == expected(lake)
    # the current version of every customer is its Silver row (hard mode: no row after DELETE)
    silver = lake.silver()
    current = {
        key: {c: versions[-1][c] for c in SILVER_COLUMNS}
        for key, versions in got.items()
        if not (mode == "hard" and versions[-1]["is_deleted"])
    }
    assert current == silver


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["soft", "hard"])
@settings(max_examples=15)
@given(stream=streams(), max_files=FILES_PER_BATCH)
def test_history_matches_reference_timeline(tmp_path_factory, mode, stream, max_files) -> None:
    _run(tmp_path_factory.mktemp(mode), mode, stream, max_files)


def test_late_event_fixes_both_neighbours(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", 100, 50, **full(city="Rennes"))])
    lake.write([ev("E2", "C-1", "UPDATE", 200, 40, city="Nantes")])
    lake.write([ev("E3", "C-1", "DELETE", 300, 30)])
    lake.run()
    before = history(lake)["C-1"]
    assert [v["event_id"] for v in before] == ["E1", "E2", "E3"]
    assert before[1]["valid_to"] == before[2]["valid_from"]

    lake.write([ev("E4", "C-1", "UPDATE", 250, 35, city="Lyon")])  # late: between E2 and E3
    lake.run()
    after = history(lake)["C-1"]
    assert [v["event_id"] for v in after] == ["E1", "E2", "E4", "E3"]
    e2, e4, e3 = after[1], after[2], after[3]
    assert e2["valid_to"] == e4["valid_from"]  # the earlier neighbour's window now ends at E4
    assert e4["valid_to"] == e3["valid_from"]
    assert e3["valid_to"] is None and e3["is_current"]
    assert [v["is_current"] for v in after] == [False, False, False, True]
    # every later image is recomputed: the DELETE's image carries Lyon (SEMANTICS.md point 9)
    assert e4["city"] == "Lyon" and e3["city"] == "Lyon" and e3["status"] == "DELETED"
    assert after == expected(lake)["C-1"]
    assert lake.silver()["C-1"] == {c: e3[c] for c in SILVER_COLUMNS}


def test_duplicates_and_replays_add_nothing(lake: Lake) -> None:
    first = [ev("E1", "C-1", "INSERT", 100, 50, **full()), ev("E2", "C-1", "UPDATE", 200, 40)]
    lake.write(first)
    lake.run()
    table = lake.table("silver/customer_history")
    lake.write(first)  # the whole batch again: duplicates only
    lake.write([first[1]])
    lake.run()
    assert lake.table("silver/customer_history").sort("sequence").equals(table.sort("sequence"))
    assert len(table) == 2


def test_hard_delete_version_and_revival(hard_lake: Lake) -> None:
    hard_lake.write(
        [
            ev("E1", "C-1", "INSERT", 100, 50, **full(city="Rennes")),
            ev("E2", "C-1", "DELETE", 200, 40),
            ev("E3", "C-1", "UPDATE", 300, 30, status="ACTIVE"),
        ]
    )
    hard_lake.run()
    _, e2, e3 = history(hard_lake)["C-1"]
    assert e2["is_deleted"] and e2["status"] == "DELETED" and e2["city"] is None
    assert e2["created_at"] is None and e2["deleted_at"] == e2["valid_from"]
    # revival starts an empty row: the city of the first life is gone
    assert e3["city"] is None and e3["created_at"] == e3["valid_from"] and e3["is_active"]
    assert history(hard_lake) == expected(hard_lake)
