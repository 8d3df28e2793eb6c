"""Gold tables: hand-computed numbers for a small stream; brute force from the reference."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from deltalake.exceptions import TableNotFoundError
from hypothesis import HealthCheck, given, settings

from cdcflow.layers.gold import MAX_FILLED_GAP_DAYS, PCT_DECIMALS
from cdcflow.plan.history import state_as_of
from tests.conftest import Lake, ev, full
from tests.oracle import Oracle
from tests.test_property import streams

D1 = date(2025, 1, 1)


def at(day: int, hour: int) -> str:
    """ISO instant on day D1 + ``day`` at ``hour`` UTC."""
    return datetime.combine(D1 + timedelta(days=day), time(hour), UTC).isoformat()


def e(event_id: str, cid: str, op: str, lsn: int, ts: str, **attrs: Any) -> dict[str, Any]:
    record = ev(event_id, cid, op, lsn, **attrs)
    record["event_timestamp"] = ts
    return record


HAND = [
    e("E1", "C-1", "INSERT", 10, at(0, 9), **full(city="Paris", country="France")),
    e("E2", "C-2", "INSERT", 11, at(0, 10), **full(city="Lyon", country="France")),
    e("E3", "C-3", "INSERT", 12, at(0, 11), **full(city="Pune", status="INACTIVE")),
    e("E4", "C-1", "UPDATE", 20, at(1, 9), status="SUSPENDED"),  # deactivation
    e("E5", "C-3", "UPDATE", 21, at(1, 10), status="ACTIVE"),  # reactivation
    e("E6", "C-4", "INSERT", 22, at(1, 11), **full(city="Paris", country="France")),
    e("E7", "C-2", "DELETE", 23, at(1, 12)),  # deletion
    e("E8", "C-2", "UPDATE", 40, at(3, 9), status="ACTIVE"),  # revival: not a reactivation
    e("E9", "C-1", "UPDATE", 41, at(3, 10), status="ACTIVE"),  # reactivation
    e("E10", "C-3", "DELETE", 42, at(3, 11)),  # deletion
]


def gold(lake: Lake, name: str) -> list[dict[str, Any]]:
    return lake.table(f"gold/{name}").to_dicts()


def _hand_lake(lake: Lake) -> Lake:
    # scrambled arrival, a duplicate, three micro-batches: Gold only depends on the timeline
    lake.write([HAND[i] for i in (6, 0, 9)])
    lake.write([HAND[i] for i in (3, 1, 2, 8)])
    lake.write([HAND[i] for i in (4, 5, 7, 0)])
    lake.run()
    return lake


def test_daily_metrics_hand_computed(lake: Lake) -> None:
    _hand_lake(lake)
    cols = ("new_registrations", "deletions", "deactivations", "reactivations")
    rows = gold(lake, "daily_customer_metrics")
    got = [
        (r["date"], *(r[c] for c in cols), r["active_at_end_of_day"], r["churn_pct"]) for r in rows
    ]
    day = [D1 + timedelta(days=i) for i in range(4)]
    assert got == [
        (day[0], 3, 0, 0, 0, 2, None),  # C-1, C-2 active; C-3 INACTIVE; nobody at start
        (day[1], 1, 1, 1, 1, 2, 100.0),  # C-1 suspended, C-2 deleted: both of the 2 at start
        (day[2], 0, 0, 0, 0, 2, 0.0),  # a day without changes
        (day[3], 0, 1, 0, 1, 3, 50.0),  # C-3 deleted (1 of C-3, C-4); C-1, C-2 back: not netted
    ]


def test_one_outlying_timestamp_adds_one_row_not_a_century(lake: Lake) -> None:
    # one event dated 1900 (epoch milliseconds), another 40 days after the hand stream: the
    # quiet periods are not filled in, short gaps still are (day 2 of the hand stream)
    old = e("E0", "C-9", "INSERT", 5, "-2208988800000", **full(city="Oslo"))
    late = e("E11", "C-4", "UPDATE", 50, at(43, 9), status="INACTIVE")
    lake.write([*HAND, old, late])
    lake.run()
    rows = gold(lake, "daily_customer_metrics")
    dates = [r["date"] for r in rows]
    assert dates == [date(1900, 1, 1), *[D1 + timedelta(days=i) for i in range(4)], at_day(43)]
    assert [r["active_at_end_of_day"] for r in rows] == [1, 3, 3, 3, 4, 3]
    assert [r["new_registrations"] for r in rows] == [1, 3, 1, 0, 0, 0]
    assert rows[-1]["deactivations"] == 1 and rows[-1]["churn_pct"] == 25.0


def at_day(day: int) -> date:
    return D1 + timedelta(days=day)


def test_snapshot_tables_hand_computed(lake: Lake) -> None:
    _hand_lake(lake)
    assert gold(lake, "active_customers_by_geo") == [
        {"country": "France", "city": "Lyon", "active_customers": 1},
        {"country": "France", "city": "Paris", "active_customers": 2},
    ]
    assert gold(lake, "status_distribution") == [
        {"status": "ACTIVE", "customers": 3, "share_pct": 75.0},
        {"status": "INACTIVE", "customers": 0, "share_pct": 0.0},
        {"status": "SUSPENDED", "customers": 0, "share_pct": 0.0},
        {"status": "DELETED", "customers": 1, "share_pct": 25.0},
    ]
    active = gold(lake, "active_customers")
    assert [r["customer_id"] for r in active] == ["C-1", "C-2", "C-4"]
    assert not any(r["is_deleted"] for r in active)
    assert active[1]["city"] == "Lyon"  # soft mode: the revived row keeps its attributes


def test_hard_mode_revival_starts_empty(hard_lake: Lake) -> None:
    _hand_lake(hard_lake)
    assert gold(hard_lake, "active_customers_by_geo") == [
        {"country": "France", "city": "Paris", "active_customers": 2},
        {"country": None, "city": None, "active_customers": 1},
    ]
    dist = {r["status"]: r["customers"] for r in gold(hard_lake, "status_distribution")}
    assert dist == {"ACTIVE": 3, "INACTIVE": 0, "SUSPENDED": 0, "DELETED": 1}
    assert "C-3" not in {r["customer_id"] for r in gold(hard_lake, "active_customers")}


def test_manual_refresh_and_policy(tmp_path: Path) -> None:
    from cdcflow.engines.local.gold import refresh_gold

    lake = Lake(tmp_path)
    lake.config.gold.refresh_every_batches = 0
    lake.write(HAND[:3])
    lake.run()
    with pytest.raises(TableNotFoundError):
        lake.table("gold/status_distribution")  # the policy skipped the refresh
    assert refresh_gold(lake.config)["gold/status_distribution"] == 4
    assert gold(lake, "active_customers_by_geo")[0]["active_customers"] == 1


def test_churn_counts_customers_not_transitions(lake: Lake) -> None:
    # the old rate, (deletions + deactivations) / active at start, read 300% here: one active
    # customer at the start, who flaps twice, and two registered and deleted the same day
    day0 = [e("A1", "C-1", "INSERT", 10, at(0, 9), **full())]
    day1 = [
        e("A2", "C-1", "UPDATE", 20, at(1, 9), status="INACTIVE"),
        e("A3", "C-1", "UPDATE", 21, at(1, 10), status="ACTIVE"),
        e("A4", "C-1", "UPDATE", 22, at(1, 11), status="SUSPENDED"),
        e("A5", "C-2", "INSERT", 23, at(1, 12), **full()),
        e("A6", "C-2", "DELETE", 24, at(1, 13)),
        e("A7", "C-3", "INSERT", 25, at(1, 14), **full(status="INACTIVE")),
        e("A8", "C-3", "DELETE", 26, at(1, 15)),
    ]
    lake.write(day0 + day1)
    lake.run()
    last = gold(lake, "daily_customer_metrics")[-1]
    assert (last["deactivations"], last["deletions"]) == (2, 2)
    assert last["churn_pct"] == 100.0  # C-1, the one customer active at the start, is lost


def pct(part: int, whole: int) -> float | None:
    """The documented rule: 100 * part / whole, rounded half to even to PCT_DECIMALS."""
    return float(round(Fraction(100 * part, whole), PCT_DECIMALS)) if whole else None


def test_percent_rounding_halfway_and_bounds() -> None:
    import polars as pl

    from cdcflow.engines.local.gold import percent

    pairs = [(1, 3), (2, 3), (1, 8), (1, 800), (3, 800), (5, 800), (1, 7), (0, 5), (5, 5), (0, 0)]
    pairs += [(a, b) for b in range(1, 60) for a in range(b + 1)]
    frame = pl.DataFrame({"a": [a for a, _ in pairs], "b": [b for _, b in pairs]})
    got = frame.select(percent(pl.col("a"), pl.col("b")))[:, 0].to_list()
    assert got == [pct(a, b) for a, b in pairs]
    assert got[:4] == [33.33, 66.67, 12.5, 0.12] and got[4:6] == [0.38, 0.62]
    assert all(v is None or 0 <= v <= 100 for v in got)


# ---------------------------------------------------------------- brute force from the reference
def brute_force(history: dict[str, list[dict]], mode: str) -> dict[str, list[dict]]:
    """Gold tables from the reference timeline, one customer and one day at a time."""
    days: dict[date, Counter[str]] = {}
    for versions in history.values():
        registered = False
        for i, v in enumerate(versions):
            count = days.setdefault(v["valid_from"].date(), Counter())
            if v["operation"] == "INSERT" and not registered:
                registered = True
                count["new_registrations"] += 1
            if i == 0:
                continue
            prev = versions[i - 1]
            if v["is_deleted"] and not prev["is_deleted"]:
                count["deletions"] += 1
            if (
                prev["is_active"]
                and not v["is_deleted"]
                and v["status"] in ("INACTIVE", "SUSPENDED")
            ):
                count["deactivations"] += 1
            if (
                not prev["is_deleted"]
                and prev["status"] in ("INACTIVE", "SUSPENDED")
                and v["is_active"]
            ):
                count["reactivations"] += 1
    daily = []
    changed = sorted(days)
    calendar = [
        a + timedelta(days=n)
        for a, b in zip(changed, [*changed[1:], changed[-1]], strict=True)
        for n in range((b - a).days if 0 < (b - a).days <= MAX_FILLED_GAP_DAYS else 1)
    ]
    start_active: set[str] = set()
    for d in calendar:
        end = datetime.combine(d + timedelta(days=1), time(0), UTC) - timedelta(microseconds=1)
        state = state_as_of(history, end, mode)  # type: ignore[arg-type]
        active = {key for key, row in state.items() if row["is_active"]}
        c = days.get(d, Counter())
        churn = pct(len(start_active - active), len(start_active))
        daily.append(
            {
                "date": d,
                "new_registrations": c["new_registrations"],
                "deletions": c["deletions"],
                "deactivations": c["deactivations"],
                "reactivations": c["reactivations"],
                "active_at_end_of_day": len(active),
                "churn_pct": churn,
            }
        )
        start_active = active
    current = [versions[-1] for versions in history.values()]
    geo = Counter((v["country"], v["city"]) for v in current if v["is_active"])
    statuses = Counter(v["status"] for v in current)
    shares = {s: pct(n, len(current)) for s, n in statuses.items()}
    return {
        "daily": daily,
        "geo": sorted(
            ({"country": k[0], "city": k[1], "active_customers": n} for k, n in geo.items()),
            key=lambda r: (
                r["country"] is None,
                r["country"] or "",
                r["city"] is None,
                r["city"] or "",
            ),
        ),
        "status": {s: n for s, n in statuses.items()},
        "share": shares,
    }


def _random_days(records: list[dict], seed: int) -> None:
    """Spread the stream's events over four days (same event_id → same timestamp)."""
    rng = random.Random(seed)
    stamps: dict[str, str] = {}
    for record in records:
        if record["event_id"] not in stamps:
            stamps[record["event_id"]] = at(rng.randint(0, 3), rng.randint(0, 23))
    for record in records:
        record["event_timestamp"] = stamps[record["event_id"]]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["soft", "hard"])
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=streams())
def test_gold_matches_brute_force(tmp_path_factory, mode, stream) -> None:
    records, cuts, seed = stream
    # the events of the stream (JSON objects with an event id); invalid lines and re-serialised
    # copies are the property tests' concern, Gold only needs a valid timeline
    records = [
        dict(r) for r in records if isinstance(r, dict) and isinstance(r.get("event_id"), str)
    ]
    _random_days(records, seed)
    random.Random(seed).shuffle(records)
    lake = Lake(tmp_path_factory.mktemp(mode), mode=mode, max_files=1)
    start, cut = 0, 0
    while start < len(records):
        size = cuts[cut % len(cuts)]
        lake.write(records[start : start + size])
        start, cut = start + size, cut + 1
    lake.run()
    expected = brute_force(Oracle().timeline(lake.arrival, mode), mode)
    assert gold(lake, "daily_customer_metrics") == expected["daily"]
    assert gold(lake, "active_customers_by_geo") == expected["geo"]
    status_rows = gold(lake, "status_distribution")
    got_status = {r["status"]: r["customers"] for r in status_rows}
    assert {s: n for s, n in got_status.items() if n} == expected["status"]
    got_share = {r["status"]: r["share_pct"] for r in status_rows if r["customers"]}
    assert got_share == expected["share"]


def test_gold_table_of_an_earlier_schema_takes_the_pct_columns(lake: Lake) -> None:
    # a lakehouse written before the *_pct columns (share, churn_rate as fractions)
    import pyarrow as pa
    from deltalake import write_deltalake

    from cdcflow.engines.local.gold import refresh_gold

    old = pa.table(
        {
            "status": pa.array(["ACTIVE"]),
            "customers": pa.array([1], pa.int64()),
            "share": pa.array([1.0]),
        }
    )
    write_deltalake(lake.config.table_uri("gold/status_distribution"), old)
    lake.write(HAND[:3])
    lake.run()
    refresh_gold(lake.config)
    rows = gold(lake, "status_distribution")
    assert rows[0] == {"status": "ACTIVE", "customers": 2, "share_pct": 66.67}
