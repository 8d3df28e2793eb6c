"""The core issue's scenarios, asserting Silver rows, quarantine reasons and outcomes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import NOW, Lake, ev, full


def test_new_insert(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", **full())])
    lake.run()
    row = lake.silver()["C-1"]
    assert row["email"] == "aarav@example.com"
    assert row["status"] == "ACTIVE"
    assert row["is_active"] is True and row["is_deleted"] is False
    assert row["created_at"] == row["last_updated_at"] == NOW - timedelta(minutes=60)
    assert (row["last_event_id"], row["last_operation"], row["last_lsn"]) == (
        "E1",
        "INSERT",
        "0/10",
    )
    assert lake.outcomes() == {"E1": ["APPLIED"]}
    assert lake.silver() == lake.expected().rows


def test_update_of_email_and_city(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full())])
    lake.run()
    lake.write(
        [ev("E2", "C-1", "UPDATE", "0/20", minutes_ago=30, email="new@x.com", city="Mumbai")]
    )
    lake.run()
    row = lake.silver()["C-1"]
    assert (row["email"], row["city"]) == ("new@x.com", "Mumbai")
    assert row["customer_name"] == "Aarav Sharma"  # partial update keeps other columns
    assert row["created_at"] == NOW - timedelta(minutes=60)
    assert row["last_updated_at"] == NOW - timedelta(minutes=30)
    assert row["last_operation"] == "UPDATE"
    assert lake.outcomes() == {"E1": ["APPLIED"], "E2": ["APPLIED"]}


def test_delete_soft_mode(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full())])
    lake.write([ev("E2", "C-1", "DELETE", "0/20", minutes_ago=10, city=None, status="DELETED")])
    lake.run()
    row = lake.silver()["C-1"]
    assert row["is_deleted"] is True and row["is_active"] is False
    assert row["status"] == "DELETED"
    assert row["deleted_at"] == NOW - timedelta(minutes=10)
    assert row["city"] == "Bengaluru"  # attributes inside a DELETE are ignored
    assert lake.outcomes() == {"E1": ["SUPERSEDED_IN_BATCH"], "E2": ["APPLIED"]}


def test_delete_hard_mode_and_tombstone(hard_lake: Lake) -> None:
    hard_lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full())])
    hard_lake.write([ev("E2", "C-1", "DELETE", "0/20", minutes_ago=10)])
    hard_lake.run()
    assert hard_lake.silver() == {}
    tombs = hard_lake.table("silver/customer_tombstones").to_dicts()
    assert [(t["customer_id"], t["last_event_id"]) for t in tombs] == [("C-1", "E2")]
    # a late, older UPDATE cannot resurrect the row
    hard_lake.write([ev("E3", "C-1", "UPDATE", "0/15", minutes_ago=20, city="Lyon")])
    hard_lake.run()
    assert hard_lake.silver() == {}
    assert hard_lake.outcomes()["E3"] == ["TOMBSTONED"]
    # a newer INSERT starts a fresh row (absent attributes are null)
    hard_lake.write(
        [ev("E4", "C-1", "INSERT", "0/30", minutes_ago=5, status="ACTIVE", city="Oslo")]
    )
    hard_lake.run()
    row = hard_lake.silver()["C-1"]
    assert (row["city"], row["email"], row["status"]) == ("Oslo", None, "ACTIVE")
    assert row["created_at"] == NOW - timedelta(minutes=5)
    assert hard_lake.silver() == hard_lake.expected().rows


def test_tombstones_past_retention_are_purged(hard_lake: Lake) -> None:
    # retention 0: a tombstone is expired from the first micro-batch after the one that wrote it
    hard_lake.config.processing.tombstone_retention = timedelta(0)
    hard_lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full())])
    hard_lake.write([ev("E2", "C-1", "DELETE", "0/20", minutes_ago=10)])
    hard_lake.run()
    tombs = hard_lake.table("silver/customer_tombstones")
    assert tombs["customer_id"].to_list() == ["C-1"]  # its own batch: not older than the cutoff
    hard_lake.write([ev("E5", "C-5", "INSERT", "0/50", minutes_ago=5, **full())])
    hard_lake.run()
    assert hard_lake.table("silver/customer_tombstones").height == 0
    # purged: a late UPDATE older than the DELETE is no longer refused (the retention's price)
    hard_lake.write([ev("E3", "C-1", "UPDATE", "0/15", minutes_ago=20, city="Lyon")])
    hard_lake.run()
    assert hard_lake.outcomes()["E3"] == ["APPLIED"]
    assert hard_lake.silver()["C-1"]["city"] == "Lyon"


def test_tombstone_statistics_tell_when_nothing_is_expired(tmp_path: Path) -> None:
    """Both engines' purge asks the Delta file statistics first (no scan, no Spark job)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from cdcflow.engines.local.delta import nothing_expired
    from cdcflow.layers.tables import TOMBSTONES

    table = DeltaTable.create(str(tmp_path / "t"), schema=TOMBSTONES.schema)
    assert nothing_expired(table, NOW)  # no file: nothing to purge
    row = {
        "customer_id": "C-1",
        "_cdc_seq": "s",
        "deleted_at": NOW,
        "last_event_id": "E1",
        "last_lsn": "1",
        "tombstoned_at": NOW - timedelta(hours=1),
    }
    write_deltalake(table, pa.Table.from_pylist([row], schema=TOMBSTONES.schema), mode="append")
    later = NOW + timedelta(hours=1)
    write_deltalake(
        table,
        pa.Table.from_pylist([{**row, "tombstoned_at": later}], schema=TOMBSTONES.schema),
        mode="append",
    )
    assert nothing_expired(table, NOW - timedelta(hours=1))  # equal to the cutoff: kept
    assert not nothing_expired(table, NOW)  # the first file's minimum is before it


def test_insert_and_two_updates_in_one_batch(lake: Lake) -> None:
    lake.write(
        [
            ev("E3", "C-1", "UPDATE", "0/30", minutes_ago=10, city="Paris"),
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=30, **full()),
            ev("E2", "C-1", "UPDATE", "0/20", minutes_ago=20, email="b@x.com", city="Lyon"),
        ]
    )
    reports = lake.run("once")
    assert len(reports) == 1
    row = lake.silver()["C-1"]
    assert (row["city"], row["email"], row["phone"]) == ("Paris", "b@x.com", "+91-9876543210")
    assert row["last_event_id"] == "E3"
    assert row["created_at"] == NOW - timedelta(minutes=30)
    assert lake.outcomes() == {
        "E1": ["SUPERSEDED_IN_BATCH"],
        "E2": ["SUPERSEDED_IN_BATCH"],
        "E3": ["APPLIED"],
    }
    assert lake.table("silver/customers").height == 1


def test_identical_redelivery_is_a_duplicate(lake: Lake) -> None:
    event = ev("E1", "C-1", "INSERT", "0/10", **full())
    lake.write([event])
    lake.run()
    version = lake.table("audit/batch_log")["silver_version"].to_list()
    # same content, other key order and whitespace: still the same event
    pairs = [f'"{k}":  {json.dumps(v)}' for k, v in reversed(event.items())]
    reordered = "{" + ", ".join(pairs) + "}"
    lake.write([reordered, event])
    lake.run()
    assert lake.outcomes() == {"E1": ["APPLIED", "DUPLICATE", "DUPLICATE"]}
    assert lake.table("bronze/customer_events").height == 3
    log = lake.table("audit/batch_log").sort("batch_id")
    assert log["duplicates"].to_list() == [0, 2]
    assert log["silver_version"].to_list() == [version[0], version[0]]  # Silver untouched


def test_conflicting_redelivery_is_quarantined(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", **full())])
    lake.write([ev("E1", "C-1", "INSERT", "0/10", **full(city="Elsewhere"))])
    lake.run()
    assert lake.quarantine_reasons() == ["DUPLICATE_EVENT_CONFLICT"]
    assert lake.silver()["C-1"]["city"] == "Bengaluru"


def test_older_update_after_newer_one_is_stale(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=60, **full())])
    lake.write([ev("E3", "C-1", "UPDATE", "0/30", minutes_ago=10, city="Paris")])
    lake.run()
    lake.write([ev("E2", "C-1", "UPDATE", "0/20", minutes_ago=20, city="Lyon", phone="+1-555")])
    lake.run()
    row = lake.silver()["C-1"]
    assert row["city"] == "Paris"  # newer city kept
    assert row["phone"] == "+1-555"  # no newer event set phone: the late update fills it
    assert row["last_event_id"] == "E3"
    assert lake.outcomes()["E2"] == ["STALE"]
    assert lake.table("audit/batch_log").sort("batch_id")["stale_ignored"].to_list() == [0, 1]


def test_late_update_after_soft_delete_updates_deleted_row(lake: Lake) -> None:
    # SEMANTICS.md example 9: Rennes -> Nantes -> Lyon -> deleted
    lake.write(
        [
            ev("E1", "C-1", "INSERT", 100, minutes_ago=40, **full(city="Rennes")),
            ev("E2", "C-1", "UPDATE", 200, minutes_ago=30, city="Nantes"),
            ev("E3", "C-1", "DELETE", 300, minutes_ago=10),
        ]
    )
    lake.run()
    lake.write([ev("E4", "C-1", "UPDATE", 250, minutes_ago=20, city="Lyon")])
    lake.run()
    row = lake.silver()["C-1"]
    assert (row["city"], row["is_deleted"], row["last_lsn"]) == ("Lyon", True, "300")


def test_valid_event_24h_old_is_applied_and_late(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=24 * 60 + 5, **full())])
    lake.run()
    assert lake.silver()["C-1"]["is_active"] is True
    outcomes = lake.table("audit/event_outcomes").to_dicts()
    assert outcomes[0]["is_late"] is True and outcomes[0]["lag_s"] > 24 * 3600
    assert lake.table("audit/batch_log")["late_events"].to_list() == [1]


def test_invalid_operation_is_quarantined(lake: Lake) -> None:
    lake.write(
        [
            ev("E1", "C-1", "INVALID_OP", "0/10", **full()),
            ev("E2", "C-2", " u ", "0/11", city="Lyon"),  # alias, trimmed and upper-cased
        ]
    )
    lake.run()
    assert lake.quarantine_reasons() == ["INVALID_OPERATION"]
    assert set(lake.silver()) == {"C-2"}
    assert lake.silver()["C-2"]["status"] is None  # new key from a partial UPDATE
    assert lake.silver()["C-2"]["is_active"] is False


def test_null_customer_id_is_quarantined(lake: Lake) -> None:
    bad = ev("E1", "C-1", "INSERT", "0/10", **full())
    bad["customer_id"] = None
    blank = ev("E2", "C-1", "INSERT", "0/10", **full())
    blank["customer_id"] = "   "
    lake.write([bad, "", "   ", blank])
    lake.run()
    rows = lake.table("quarantine/customer_events").sort("source_line").to_dicts()
    assert [(r["failure_reason"], r["source_line"]) for r in rows] == [
        ("NULL_CUSTOMER_ID", 1),
        ("NULL_CUSTOMER_ID", 4),
    ]
    assert lake.table("bronze/customer_events").height == 0
    assert lake.silver() == {}


def test_every_record_lands_once_and_gzip_files(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", **full()), "{not json", b"\xff\xfe"], gz=True)
    lake.write([ev("E2", "C-1", "UPDATE", "0/11", city="Lyon"), "[1, 2]"])
    lake.run()
    assert lake.table("bronze/customer_events").height == 2
    assert lake.quarantine_reasons() == ["MALFORMED_JSON", "MALFORMED_JSON", "MALFORMED_JSON"]
    assert lake.silver()["C-1"]["city"] == "Lyon"


def test_rerun_changes_nothing(lake: Lake) -> None:
    lake.write([ev("E1", "C-1", "INSERT", "0/10", **full())])
    lake.run()
    before = {
        name: lake.table(name).height for name in ("bronze/customer_events", "audit/batch_log")
    }
    assert lake.run() == []  # no new files: nothing to do
    assert {name: lake.table(name).height for name in before} == before


def test_available_now_respects_max_files(tmp_path) -> None:
    lake = Lake(tmp_path, max_files=2)
    for i in range(5):
        lake.write([ev(f"E{i}", "C-1", "UPDATE", 10 + i, city=f"city-{i}")])
    reports = lake.run("available-now")
    assert [r.files for r in reports] == [2, 2, 1]
    assert lake.silver()["C-1"]["city"] == "city-4"


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_delete_and_revival_of_an_existing_row_in_one_micro_batch(
    tmp_path: Path, mode: str
) -> None:
    """A row from an earlier micro-batch is deleted and revived within one later micro-batch,
    delivered in reverse order: soft mode keeps the first life's attributes (absent =
    unchanged), hard mode starts the revived row empty with a new created_at."""
    lake = Lake(tmp_path / mode, mode=mode)
    lake.write([ev("E1", "C-1", "INSERT", 100, minutes_ago=50, **full(city="Rennes"))])
    lake.run()
    lake.write(
        [
            ev("E3", "C-1", "UPDATE", 300, minutes_ago=30, email="back@x.com", status="ACTIVE"),
            ev("E2", "C-1", "DELETE", 200, minutes_ago=40),
        ]
    )
    lake.run()
    row = lake.silver()["C-1"]
    assert lake.silver() == lake.expected().rows
    assert (row["is_deleted"], row["is_active"], row["email"]) == (False, True, "back@x.com")
    assert row["last_event_id"] == "E3" and row["deleted_at"] is None
    if mode == "soft":
        assert row["city"] == "Rennes" and row["created_at"] < row["last_updated_at"]
    else:
        assert row["city"] is None and row["created_at"] == row["last_updated_at"]
        tombs = lake.table("silver/customer_tombstones")
        assert tombs["customer_id"].to_list() == ["C-1"]
        assert tombs["_cdc_seq"].to_list() == [lake.expected().tombstones["C-1"]]
