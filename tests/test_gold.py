"""Gold tables: hand-computed numbers for a small stream; brute force from the reference."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake.exceptions import TableNotFoundError
from hypothesis import HealthCheck, given, settings

from cdcflow.layers.gold import MAX_FILLED_GAP_DAYS
from cdcflow.plan.history import state_as_of, timeline
from tests.conftest import Lake, ev, full
from tests.test_history import first_copies
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
        (r["date"], *(r[c] for c in cols), r["active_at_end_of_day"], r["churn_rate"]) for r in rows
    ]
    day = [D1 + timedelta(days=i) for i in range(4)]
    assert got == [
        (day[0], 3, 0, 0, 0, 2, None),  # C-1, C-2 active; C-3 INACTIVE; nobody at start
        (day[1], 1, 1, 1, 1, 2, 1.0),  # (1 deletion + 1 deactivation) / 2 active at start
        (day[2], 0, 0, 0, 0, 2, 0.0),  # a day without changes
        (day[3], 0, 1, 0, 1, 3, 0.5),  # C-3 deleted; C-1 reactivated; C-2 revived
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
    assert rows[-1]["deactivations"] == 1 and rows[-1]["churn_rate"] == 0.25


def at_day(day: int) -> date:
    return D1 + timedelta(days=day)


def test_snapshot_tables_hand_computed(lake: Lake) -> None:
    _hand_lake(lake)
    assert gold(lake, "active_customers_by_geo") == [
        {"country": "France", "city": "Lyon", "active_customers": 1},
        {"country": "France", "city": "Paris", "active_customers": 2},
    ]
    assert gold(lake, "status_distribution") == [
        {"status": "ACTIVE", "customers": 3, "share": 0.75},
        {"status": "INACTIVE", "customers": 0, "share": 0.0},
        {"status": "SUSPENDED", "customers": 0, "share": 0.0},
        {"status": "DELETED", "customers": 1, "share": 0.25},
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
    start_active = 0
    for d in calendar:
        end = datetime.combine(d + timedelta(days=1), time(0), UTC) - timedelta(microseconds=1)
        active = sum(row["is_active"] for row in state_as_of(history, end, mode).values())  # type: ignore[arg-type]
        c = days.get(d, Counter())
        churn = (c["deletions"] + c["deactivations"]) / start_active if start_active else None
        daily.append(
            {
                "date": d,
                "new_registrations": c["new_registrations"],
                "deletions": c["deletions"],
                "deactivations": c["deactivations"],
                "reactivations": c["reactivations"],
                "active_at_end_of_day": active,
                "churn_rate": churn,
            }
        )
        start_active = active
    current = [versions[-1] for versions in history.values()]
    geo = Counter((v["country"], v["city"]) for v in current if v["is_active"])
    statuses = Counter(v["status"] for v in current)
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
    records = [dict(r) for r in records]
    _random_days(records, seed)
    random.Random(seed).shuffle(records)
    lake = Lake(tmp_path_factory.mktemp(mode), mode=mode, max_files=1)
    start, cut = 0, 0
    while start < len(records):
        size = cuts[cut % len(cuts)]
        lake.write(records[start : start + size])
        start, cut = start + size, cut + 1
    lake.run()
    expected = brute_force(timeline(first_copies(lake), mode), mode)  # type: ignore[arg-type]
    assert gold(lake, "daily_customer_metrics") == expected["daily"]
    assert gold(lake, "active_customers_by_geo") == expected["geo"]
    got_status = {r["status"]: r["customers"] for r in gold(lake, "status_distribution")}
    assert {s: n for s, n in got_status.items() if n} == expected["status"]
