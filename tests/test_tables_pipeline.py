"""Declared tables through the pipeline: ``tables:`` → every contract in one micro-batch loop.

Two test contracts besides customers (declared as a table in the property): ``accounts`` (an
integer key; decimal, date, timestamp, boolean and double columns) and ``order_lines`` (a
composite key: a string and an integer).
Records are routed by ``metadata.source_table``; one table's bad records never block another.
The property: whatever the arrival order, re-deliveries and file (micro-batch) boundaries,
each table's Silver equals the contract's reference fold (:func:`cdcflow.plan.reference.
fold_changes`) of its first-arriving valid copies, in both delete modes.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import TableError
from cdcflow.layers.contract_replay import replay_table
from cdcflow.layers.schema_log import (
    SchemaDriftError,
    accept,
    contract_changes,
    recorded_contracts,
    utc_now,
)
from cdcflow.model.contracts import CUSTOMERS, ColumnSpec, TableContract
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator, TruncateEvent
from cdcflow.plan.history import contract_timeline
from cdcflow.plan.reference import fold_changes
from cdcflow.reconcile import contract_public_schema, reconcile_table
from tests import forkrun
from tests.conftest import REPO
from tests.crashkit import run_cli

NOW = datetime.now(UTC).replace(microsecond=0)

TABLES = [
    {
        "name": "accounts",
        "keys": ["account_id"],
        "columns": [
            {"name": "account_id", "type": "integer"},
            {"name": "owner", "type": "string", "pii": True},
            {"name": "balance", "type": "decimal(12,2)", "minimum": 0},
            {"name": "opened_on", "type": "date"},
            {"name": "closed_at", "type": "timestamp"},
            {"name": "vip", "type": "boolean"},
            {"name": "rate", "type": "double"},
        ],
    },
    {
        "name": "order_lines",
        "keys": ["order_id", "line_no"],
        "columns": [
            {"name": "order_id", "type": "string"},
            {"name": "line_no", "type": "integer"},
            {"name": "sku", "type": "string", "pattern": "[A-Z]{3}-[0-9]+"},
            {"name": "quantity", "type": "integer", "minimum": 1},
            {"name": "attributes", "type": "json"},
        ],
    },
]


def write_config(
    root: Path,
    mode: str = "soft",
    customers: bool = False,
    truncate: str | None = None,
    **pipeline: Any,
) -> CdcflowConfig:
    """A config declaring both test tables in ``mode`` (and first, with ``customers``, the
    shipped customers contract as a declared table), its landing folder under ``root``;
    ``truncate``: the accounts table's truncate policy."""
    declared = [CUSTOMERS.model_dump(mode="json", exclude_defaults=True)] if customers else []
    tables = [{**table, "delete_mode": mode} for table in (*declared, *TABLES)]
    if truncate is not None:
        next(t for t in tables if t["name"] == "accounts")["truncate"] = truncate
    raw = {
        "pipeline": {"name": "shop", **pipeline},
        "storage": {"root": str(root / "lake")},
        "source": {"path": str(root / "landing"), "max_files_per_trigger": 1},
        "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "shop")},
        "tables": tables,
    }
    path = root / "cdcflow.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    (root / "landing").mkdir(exist_ok=True)
    return load_config(path)


def write_files(config: CdcflowConfig, files: list[list[str]]) -> None:
    """Landing files in order (increasing modification times)."""
    landing = Path(config.source.path)
    start = len(list(landing.glob("*.jsonl")))
    for i, lines in enumerate(files, start=start):
        path = landing / f"{i:04d}.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def rec(
    table: str, event_id: str, op: str, lsn: int, minutes_ago: int = 5, **fields: Any
) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "operation": op,
        "event_timestamp": (NOW - timedelta(minutes=minutes_ago)).isoformat(),
        "metadata": {"lsn": lsn, "source_table": table, "tx_id": f"TX-{lsn}"},
        **fields,
    }


def rows(config: CdcflowConfig, name: str) -> list[dict[str, Any]]:
    return read_arrow(DeltaTable(config.table_uri(name))).to_pylist()


def silver(config: CdcflowConfig, contract: TableContract) -> dict[tuple[Any, ...], dict]:
    out = {}
    for row in rows(config, contract.table_names.silver):
        out[tuple(row[k] for k in contract.keys)] = row
    return out


def contract_of(config: CdcflowConfig, name: str) -> TableContract:
    return next(c for c in config.contracts() if c.name == name)


def first_copies(
    config: CdcflowConfig, lines: list[str], name: str
) -> list[ChangeEvent | TruncateEvent]:
    """``name``'s first-arriving valid copies (truncates among them), in arrival order."""
    contract = contract_of(config, name)
    validator = ContractValidator(contract, NOW + timedelta(hours=1), timedelta(minutes=5))
    first: dict[str, ChangeEvent | TruncateEvent] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        table = record.get("metadata", {}).get("source_table")
        if not isinstance(table, str) or table.split(".")[-1] != name:
            continue
        event = validator.validate_object(record)
        if isinstance(event, ChangeEvent | TruncateEvent):
            first.setdefault(event.event_id, event)
    return list(first.values())


def expected_silver(
    config: CdcflowConfig, lines: list[str], name: str
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The reference fold of ``name``'s first-arriving valid copies, in arrival order."""
    contract = contract_of(config, name)
    return fold_changes(first_copies(config, lines, name), contract, contract.delete_mode).rows


def assert_silver_is_the_fold(
    config: CdcflowConfig, lines: list[str], names: tuple[str, ...] = ("accounts", "order_lines")
) -> None:
    """Silver equals the reference fold, and the SCD2 history the reference timeline, for each
    table of ``names``."""
    for name in names:
        want = expected_silver(config, lines, name)
        contract = contract_of(config, name)
        got = silver(config, contract)
        assert set(got) == set(want), name
        for key, row in want.items():
            assert {c: got[key][c] for c in row} == row, (name, key)
        events = first_copies(config, lines, name)
        timelines = contract_timeline(events, contract, contract.delete_mode)
        stored: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for version in sorted(
            rows(config, contract.table_names.history), key=lambda r: r["sequence"]
        ):
            stored.setdefault(tuple(version[k] for k in contract.keys), []).append(version)
        assert set(stored) == set(timelines), name
        for key, versions in timelines.items():
            assert [
                {c: v[c] for c in want_v} for v, want_v in zip(stored[key], versions, strict=True)
            ] == versions, (name, key)


# ----------------------------------------------------------------------------- scenarios
def test_two_tables_typed_and_composite_keys(tmp_path: Path) -> None:
    config = write_config(tmp_path, mode="hard")
    batch0 = [
        rec(
            "accounts",
            "A1",
            "INSERT",
            10,
            account_id=1,
            owner="Ann",
            balance="10.50",
            opened_on="2024-02-29",
            vip=True,
            rate=0.5,
        ),
        rec("accounts", "A2", "UPDATE", 30, account_id=1, balance=12),  # partial update
        rec(
            "public.order_lines",
            "L1",
            "INSERT",
            11,
            order_id="O-1",
            line_no=1,
            sku="ABC-1",
            quantity=2,
            attributes={"gift": True},
        ),
        rec("order_lines", "L2", "INSERT", 12, order_id="O-1", line_no=2, sku="ABC-2", quantity=1),
        rec("accounts", "A3", "UPDATE", 31, account_id=1, balance=-1),  # below its minimum
        rec("accounts", "A4", "INSERT", 32, account_id="x1", balance=1),  # key of another type
        rec("accounts", "A5", "INSERT", 33, balance=1),  # no key
        rec("order_lines", "L3", "INSERT", 13, order_id="O-2", line_no=1, quantity="many"),
        rec("invoices", "I1", "INSERT", 14, invoice_id=1),  # no such table
        "{not json",
    ]
    batch1 = [
        rec("accounts", "A6", "UPDATE", 20, account_id=1, balance=99),  # stale: below LSN 30
        json.dumps(
            rec(
                "accounts",
                "A1",
                "INSERT",
                10,
                account_id=1,
                owner="Ann",
                balance="10.50",
                opened_on="2024-02-29",
                vip=True,
                rate=0.5,
            )
        ),
        rec("order_lines", "L4", "DELETE", 15, order_id="O-1", line_no=2),  # hard delete
        rec(
            "order_lines", "L5", "INSERT", 16, order_id="O-1", line_no=2, sku="XYZ-9", quantity=5
        ),  # revival after the tombstone
        rec("order_lines", "L6", "UPDATE", 14, order_id="O-1", line_no=2, quantity=7),  # dead
    ]
    write_files(
        config,
        [
            [r if isinstance(r, str) else json.dumps(r) for r in batch0],
            [r if isinstance(r, str) else json.dumps(r) for r in batch1],
        ],
    )
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert [r.batch_id for r in reports] == [0, 1]

    accounts = silver(config, contract_of(config, "accounts"))
    assert list(accounts) == [(1,)]
    one = accounts[(1,)]
    assert one["balance"] == Decimal("12.00") and one["owner"] == "Ann"  # partial update
    assert one["opened_on"] == date(2024, 2, 29) and one["vip"] is True and one["rate"] == 0.5
    assert one["last_event_id"] == "A2" and one["closed_at"] is None
    lines = silver(config, contract_of(config, "order_lines"))
    assert sorted(lines) == [("O-1", 1), ("O-1", 2)]
    assert lines[("O-1", 1)]["attributes"] == '{"gift":true}'
    revived = lines[("O-1", 2)]
    assert (revived["sku"], revived["quantity"], revived["last_event_id"]) == ("XYZ-9", 5, "L5")
    tombs = rows(config, "silver/order_lines_tombstones")
    assert [(t["order_id"], t["line_no"], t["last_event_id"]) for t in tombs] == [("O-1", 2, "L4")]

    quarantined = {r["source_line"]: r for r in rows(config, "quarantine/accounts_events")}
    assert {n: (r["event_id"], r["failure_reason"]) for n, r in quarantined.items()} == {
        5: ("A3", "SCHEMA_MISMATCH"),
        6: (None, "INVALID_ACCOUNT_ID_FORMAT"),  # as customers: the key is checked first
        7: (None, "NULL_ACCOUNT_ID"),
    }
    assert quarantined[5]["failure_detail"] == "balance is outside its minimum 0"
    assert (quarantined[6]["account_id"], quarantined[7]["account_id"]) == ("x1", None)
    line_q = rows(config, "quarantine/order_lines_events")
    assert [(r["event_id"], r["failure_reason"], r["order_id"], r["line_no"]) for r in line_q] == [
        ("L3", "SCHEMA_MISMATCH", "O-2", "1")
    ]
    assert line_q[0]["failure_detail"] == "quantity is not a value of type integer"
    unrouted = sorted(rows(config, "quarantine/unrouted_events"), key=lambda r: r["source_line"])
    assert [(r["source_line"], r["failure_reason"], r["source_table"]) for r in unrouted] == [
        (9, "UNKNOWN_TABLE", "invoices"),
        (10, "MALFORMED_JSON", None),
    ]
    bronze = sorted(rows(config, "bronze/accounts_events"), key=lambda r: r["ingested_at"])
    bronze.sort(key=lambda r: (r["batch_id"], r["source_line"]))
    assert [(r["event_id"], r["is_duplicate"], r["batch_id"]) for r in bronze] == [
        ("A1", False, 0),
        ("A2", False, 0),
        ("A6", False, 1),
        ("A1", True, 1),
    ]
    log = sorted(
        rows(config, "audit/table_batch_log"), key=lambda r: (r["batch_id"], r["table_name"])
    )
    assert [(r["batch_id"], r["table_name"], r["accepted"], r["quarantined"]) for r in log] == [
        (0, "accounts", 2, 3),
        (0, "order_lines", 2, 1),
        (1, "accounts", 2, 0),
        (1, "order_lines", 3, 0),
    ]
    batch_log = sorted(rows(config, "audit/batch_log"), key=lambda r: r["batch_id"])
    assert [(r["records_received"], r["accepted"], r["quarantined"]) for r in batch_log] == [
        (10, 4, 6),
        (5, 5, 0),
    ]
    # Silver files rewritten: none in batch 0 (empty tables); the batch's = its tables' sum
    assert [r["silver_files_rewritten"] for r in log if r["batch_id"] == 0] == [0, 0]
    assert [r["silver_files_rewritten"] for r in batch_log] == [
        sum(r["silver_files_rewritten"] for r in log if r["batch_id"] == b) for b in (0, 1)
    ]
    # what became of each accepted delivery, per table (the customers engine's outcomes)
    outcomes = {
        (r["batch_id"], r["event_id"], r["outcome"])
        for name in ("audit/accounts_event_outcomes", "audit/order_lines_event_outcomes")
        for r in rows(config, name)
    }
    assert outcomes == {
        (0, "A1", "SUPERSEDED_IN_BATCH"),
        (0, "A2", "APPLIED"),
        (0, "L1", "APPLIED"),
        (0, "L2", "APPLIED"),
        (1, "A6", "STALE"),
        (1, "A1", "DUPLICATE"),
        (1, "L4", "SUPERSEDED_IN_BATCH"),
        (1, "L5", "APPLIED"),
        (1, "L6", "SUPERSEDED_IN_BATCH"),
    }
    line_keys = {
        (r["order_id"], r["line_no"]) for r in rows(config, "audit/order_lines_event_outcomes")
    }
    assert line_keys == {("O-1", 1), ("O-1", 2)}  # typed key columns
    assert [(r["stale_ignored"], r["tombstoned"]) for r in batch_log] == [(0, 0), (1, 0)]
    # a further run reads nothing new and writes nothing
    versions = {n: DeltaTable(config.table_uri(n)).version() for n in ("silver/accounts",)}
    assert Pipeline(config).run(Trigger.parse("available-now")) == []
    assert versions == {n: DeltaTable(config.table_uri(n)).version() for n in versions}


def comparable(config: CdcflowConfig, name: str) -> list[str]:
    """The rows of table ``name`` as sorted JSON texts, without the processing-time columns
    (each run reads its own clock) and with landing paths reduced to the file name."""
    clock = {
        "ingested_at",
        "quarantined_at",
        "tombstoned_at",
        "ingestion_date",
        "lag_s",
        "skipped_at",
    }
    out = []
    for row in rows(config, name):
        kept = {k: v for k, v in row.items() if k not in clock}
        if "source_file" in kept:
            kept["source_file"] = Path(kept["source_file"]).name
        out.append(json.dumps(kept, default=str, sort_keys=True))
    return sorted(out)


def test_a_killed_run_recovers_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """A real SIGKILL at each table-level commit of a micro-batch, then a restart."""
    files = [
        [
            json.dumps(rec("accounts", f"A{i}", "INSERT", 10 + i, account_id=i, balance=i))
            for i in range(3)
        ]
        + [json.dumps(rec("order_lines", "L1", "INSERT", 5, order_id="O", line_no=1, quantity=1))],
        [
            json.dumps(rec("accounts", "A9", "DELETE", 40, account_id=1)),
            json.dumps(rec("order_lines", "L2", "DELETE", 41, order_id="O", line_no=1)),
            json.dumps(rec("order_lines", "L3", "UPDATE", 42, order_id="O", line_no=1, sku="bad")),
        ],
    ]
    reference = write_config(tmp_path / "reference", mode="hard")
    write_files(reference, files)
    Pipeline(reference).run(Trigger.parse("available-now"))

    config = write_config(tmp_path / "killed", mode="hard")
    write_files(config, files)
    path = tmp_path / "killed" / "cdcflow.yaml"
    for point in (
        "after_bronze",
        "after_quarantine",
        "after_silver_merge",
        "after_silver",
        "after_history",
        "after_outcomes",
        "after_audit",
        "after_commit",
    ):
        killed = run_cli(path, crash=f"{point}@1")
        assert killed.returncode != 0, (point, killed.stderr[-2000:])
    done = run_cli(path)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in (
        "silver/accounts",
        "silver/order_lines",
        "silver/accounts_tombstones",
        "silver/order_lines_tombstones",
        "silver/accounts_history",
        "silver/order_lines_history",
        "quarantine/order_lines_events",
        "audit/table_batch_log",
        "audit/accounts_event_outcomes",
        "audit/order_lines_event_outcomes",
    ):
        assert comparable(config, name) == comparable(reference, name), name
    for name in ("bronze/accounts_events", "silver/accounts", "audit/batch_log"):
        assert (
            DeltaTable(config.table_uri(name)).version()
            == DeltaTable(reference.table_uri(name)).version()
        ), name


def test_commands_that_do_not_take_declared_tables_say_so(tmp_path: Path) -> None:
    write_config(tmp_path)
    path = tmp_path / "cdcflow.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    result = forkrun.run(["gold", "--config", str(path)], env, REPO, 120)
    assert result.returncode == 2
    assert "cdcflow.yaml: key 'tables': this command works on" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_replay_apply_rebuilds_every_table_and_a_killed_apply_is_finished(
    tmp_path: Path,
) -> None:
    """``replay --apply``: each declared table's Silver (and tombstones) rewritten from Bronze
    alone; a drifted Silver is repaired; an apply killed after its first table leaves the
    pipeline refusing to run until a second apply finishes it; micro-batches continue after."""
    config = write_config(tmp_path, mode="hard")
    lines = [
        json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, owner="Ann", balance=5)),
        json.dumps(rec("accounts", "A2", "UPDATE", 12, account_id=1, vip=True)),
        json.dumps(rec("order_lines", "L1", "INSERT", 11, order_id="O", line_no=1, quantity=2)),
        json.dumps(rec("order_lines", "L2", "DELETE", 13, order_id="O", line_no=1)),
        json.dumps(rec("order_lines", "L3", "INSERT", 14, order_id="O", line_no=2, quantity=4)),
    ]
    write_files(config, [lines[:3], lines[3:]])
    Pipeline(config).run(Trigger.parse("available-now"))
    path = Path(config.file)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    # drift: Silver edited behind the pipeline's back, a tombstone lost
    DeltaTable(config.table_uri("silver/accounts")).update({"owner": "'Zed'"})
    DeltaTable(config.table_uri("silver/order_lines_tombstones")).delete()
    verify = forkrun.run(["replay", "--config", str(path), "--verify"], env, REPO, 120)
    assert verify.returncode == 1 and "accounts:" in verify.stdout and "DIFFERENT" in verify.stdout

    env_crash = {**env, "CDCFLOW_CRASH_AT": "replay_after_silver@0"}
    killed = forkrun.run(["replay", "--config", str(path), "--apply"], env_crash, REPO, 120)
    assert killed.returncode != 0
    refused = forkrun.run(["run", "--config", str(path)], env, REPO, 120)
    assert refused.returncode != 0 and "replay 0" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    applied = forkrun.run(["replay", "--config", str(path), "--apply"], env, REPO, 120)
    assert applied.returncode == 0, applied.stderr
    assert "replay 0 applied" in applied.stdout and "DIFFERENT" not in applied.stdout
    assert_silver_is_the_fold(config, lines)
    tombs = rows(config, "silver/order_lines_tombstones")
    assert [(t["order_id"], t["line_no"], t["last_event_id"]) for t in tombs] == [("O", 1, "L2")]
    log = [r for r in rows(config, "audit/batch_log") if r["kind"] == "replay"]
    assert len(log) == 1 and log[0]["accepted"] == 5
    # optimize takes declared tables: every table compacted (and vacuumed), content unchanged
    before = comparable(config, "silver/accounts")
    optimized = forkrun.run(["optimize", "--config", str(path)], env, REPO, 120)
    assert optimized.returncode == 0, optimized.stderr
    assert "silver/order_lines_tombstones" in optimized.stdout
    assert comparable(config, "silver/accounts") == before
    # the rewritten Silver keeps its sequence registers: a late, stale update stays ignored
    more = [json.dumps(rec("accounts", "A0", "UPDATE", 11, account_id=1, vip=False))]
    write_files(config, [more])
    Pipeline(config).run(Trigger.parse("available-now"))
    assert silver(config, contract_of(config, "accounts"))[(1,)]["vip"] is True
    assert_silver_is_the_fold(config, lines + more)


# ----------------------------------------------------------------------------- property
_VALUES: dict[str, list[Any]] = {
    "owner": ["Ann", "Bo", None, 7],
    "balance": [1.5, "10.25", 0, None, -3],  # -3: below the minimum (quarantined)
    "opened_on": ["2024-02-29", 19000, None, "2024-02-30"],  # the last: not a date
    "closed_at": ["2025-05-12T10:00:00+02:00", 1747044000000, None],
    "vip": [True, "false", None],
    "rate": [0.5, "1e3", None],
    "sku": ["ABC-1", "XYZ-22", None, "abc"],  # "abc": breaks the pattern
    "quantity": [1, "002", None, 0],  # 0: below the minimum
    "attributes": [{"k": [1, 2]}, [], None, "x"],
    "status": ["active", " INACTIVE ", "bogus", None],  # bogus: INVALID_STATUS
    "city": ["Lyon", None, 12.5],  # a number keeps its JSON text
    "email": ["a@x.com", ""],
}


@st.composite
def stream(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    """Records of the three tables (some invalid, some for no table), duplicated and cut in
    files."""
    lines: list[str] = []
    for i in range(draw(st.integers(1, 24))):
        table = draw(
            st.sampled_from(["customers", "accounts", "order_lines", "order_lines", "nowhere"])
        )
        op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]))
        lsn = draw(st.integers(100, 110))
        record = rec(table, f"E{i}", op, lsn, minutes_ago=draw(st.integers(1, 3)))
        if op == "TRUNCATE":  # accounts applies it; elsewhere an INVALID_OPERATION (no key)
            pass
        elif table == "customers":
            record["customer_id"] = draw(st.sampled_from(["C-1", "C-2", "c-3"]))
        elif table == "accounts":
            record["account_id"] = draw(st.sampled_from([1, 2, "3", "x"]))
        else:
            record["order_id"] = draw(st.sampled_from(["O-1", "O-2"]))
            record["line_no"] = draw(st.sampled_from([1, 2]))
        names = {
            "customers": ["status", "city", "email"],
            "accounts": ["owner", "balance", "opened_on", "closed_at", "vip", "rate"],
        }.get(table, ["sku", "quantity", "attributes"])
        for name in names:
            if draw(st.booleans()):
                record[name] = draw(st.sampled_from(_VALUES[name]))
        line = json.dumps(record)
        lines.append(line)
        if draw(st.integers(0, 4)) == 0:  # a re-delivery, later in the stream
            lines.append(line)
    order = draw(st.permutations(range(len(lines))))
    shuffled = [lines[i] for i in order]
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(shuffled) - 1)), max_size=3)))
    return shuffled, cuts


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_an_applied_truncate_in_the_pipeline(tmp_path: Path, mode: str) -> None:
    """``truncate: apply`` through the local pipeline: the truncate deletes the key with an
    earlier event and leaves the key above it; its redelivery is a duplicate in
    ``audit/source_truncates``; a late event below it ends deleted; the outcomes of the events
    it deleted in the same micro-batch are ``SUPERSEDED_IN_BATCH``."""
    config = write_config(tmp_path, mode=mode, truncate="apply")
    truncate = rec("accounts", "T1", "TRUNCATE", 20)
    batch0 = [
        rec("accounts", "A1", "INSERT", 10, account_id=1, owner="Ann"),
        truncate,
        rec("accounts", "A2", "INSERT", 30, account_id=2, owner="Bo"),
    ]
    batch1 = [rec("accounts", "A3", "UPDATE", 15, account_id=3, owner="Late"), truncate]
    lines = [json.dumps(r) for r in [*batch0, *batch1]]
    write_files(config, [lines[:3], lines[3:]])
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert [r.duplicates for r in reports] == [0, 1]
    assert_silver_is_the_fold(config, lines, ("accounts",))
    state = silver(config, contract_of(config, "accounts"))
    if mode == "soft":
        assert {k: r["is_deleted"] for k, r in state.items()} == {
            (1,): True,
            (2,): False,
            (3,): True,
        }
        assert state[(1,)]["last_event_id"] == "T1"
    else:
        assert set(state) == {(2,)}
        tombstones = rows(config, "silver/accounts_tombstones")
        assert {t["account_id"] for t in tombstones} == {1, 3}
    kept = sorted(rows(config, "audit/source_truncates"), key=lambda r: r["batch_id"])
    assert [(r["batch_id"], r["event_id"], r["is_duplicate"]) for r in kept] == [
        (0, "T1", False),
        (1, "T1", True),
    ]
    outcomes = {r["event_id"]: r["outcome"] for r in rows(config, "audit/accounts_event_outcomes")}
    assert outcomes == {"A1": "SUPERSEDED_IN_BATCH", "A2": "APPLIED", "A3": "SUPERSEDED_IN_BATCH"}


@pytest.mark.parametrize("policy", ["ignore", "quarantine"])
def test_a_flat_truncate_follows_the_table_s_policy(tmp_path: Path, policy: str) -> None:
    """A flat record whose operation is TRUNCATE (no key) under ``truncate: ignore`` is skipped
    and counted in ``audit/skipped_records``; under ``quarantine`` it is quarantined as
    ``SOURCE_TRUNCATE``, as a Debezium ``op: t`` is, not as a record without a key; Silver
    keeps its rows either way."""
    config = write_config(tmp_path, truncate=policy)
    lines = [
        json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, owner="Ann")),
        json.dumps(rec("accounts", "T1", "TRUNCATE", 20)),
        json.dumps(rec("accounts", "A2", "UPDATE", 30, account_id=1, owner="Bo")),
    ]
    write_files(config, [lines])
    (report,) = Pipeline(config).run(Trigger.parse("available-now"))
    state = silver(config, contract_of(config, "accounts"))
    assert {k: (r["owner"], r["is_deleted"]) for k, r in state.items()} == {(1,): ("Bo", False)}
    quarantined = [
        (r["event_id"], r["failure_reason"]) for r in rows(config, "quarantine/accounts_events")
    ]
    skipped_path = Path(config.table_uri("audit/skipped_records"))
    skipped = (
        [(r["table_name"], r["kind"]) for r in rows(config, "audit/skipped_records")]
        if skipped_path.exists()
        else []
    )
    if policy == "ignore":
        assert (quarantined, skipped) == ([], [("accounts", "truncate")])
    else:
        assert (quarantined, skipped) == ([("T1", "SOURCE_TRUNCATE")], [])
        assert report.quarantined == 1


def test_a_deleted_row_s_version_closes_at_the_next_version_in_sequence_order(
    tmp_path: Path,
) -> None:
    """Hard mode: a key whose stored current version is a DELETE gets two new events in a
    later micro-batch, the higher sequence with the earlier event time: the DELETE version's
    ``valid_to`` is the ``valid_from`` of the next version by sequence (the reference
    timeline), not the earliest event time of the batch (a bug found by the engines'
    conformance test)."""
    config = write_config(tmp_path, mode="hard")
    batch0 = [
        rec("accounts", "A1", "INSERT", 10, minutes_ago=30, account_id=1, owner="Ann"),
        rec("accounts", "A2", "DELETE", 11, minutes_ago=25, account_id=1),
    ]
    batch1 = [
        rec("accounts", "A3", "INSERT", 20, minutes_ago=10, account_id=1, owner="Bo"),
        rec("accounts", "A4", "UPDATE", 30, minutes_ago=15, account_id=1, owner="Cy"),
    ]
    lines = [json.dumps(r) for r in [*batch0, *batch1]]
    write_files(config, [lines[:2], lines[2:]])
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 2
    assert_silver_is_the_fold(config, lines, ("accounts",))
    versions = sorted(rows(config, "silver/accounts_history"), key=lambda r: r["sequence"])
    assert [v["event_id"] for v in versions] == ["A1", "A2", "A3", "A4"]
    assert versions[1]["valid_to"] == versions[2]["valid_from"]


@pytest.mark.parametrize("mode", ["soft", "hard"])
@settings(max_examples=int(os.environ.get("CDCFLOW_EXAMPLES", "8")), deadline=None)
@given(data=stream())
def test_declared_tables_match_the_reference_fold(
    tmp_path_factory: pytest.TempPathFactory, mode: str, data: tuple[list[str], list[int]]
) -> None:
    lines, cuts = data
    config = write_config(
        tmp_path_factory.mktemp("tables"), mode=mode, customers=True, truncate="apply"
    )
    bounds = [0, *cuts, len(lines)]
    write_files(config, [lines[a:b] for a, b in itertools.pairwise(bounds) if b > a])
    Pipeline(config).run(Trigger.parse("available-now"))
    assert_silver_is_the_fold(config, lines, ("customers", "accounts", "order_lines"))
    # every input line exactly once in a Bronze table or a quarantine table
    seen = []
    for name in (
        "bronze/customer_events",
        "bronze/accounts_events",
        "bronze/order_lines_events",
        "quarantine/customer_events",
        "quarantine/accounts_events",
        "quarantine/order_lines_events",
        "quarantine/unrouted_events",
        "audit/source_truncates",
    ):
        seen += [(Path(r["source_file"]).name, r["source_line"]) for r in rows(config, name)]
    expected = [
        (f"{i:04d}.jsonl", n)
        for i, (a, b) in enumerate(x for x in itertools.pairwise(bounds) if x[1] > x[0])
        for n in range(1, b - a + 1)
    ]
    assert sorted(seen) == sorted(expected)


# ----------------------------------------------------------------------------- schema drift
def _declare(config: CdcflowConfig, edit: Any) -> CdcflowConfig:
    """Rewrite the config file with ``edit(raw)`` applied, and load it again."""
    path = Path(config.file)
    raw = yaml.safe_load(path.read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path)


def _accounts(raw: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in raw["tables"] if t["name"] == "accounts")


def test_contract_changes_evolve_or_stop_until_accepted(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_files(config, [[json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, vip=True))]])
    Pipeline(config).run(Trigger.parse("available-now"))

    # v2: a new nullable column in the middle of the contract; old rows read null
    def add_tier(raw: dict[str, Any]) -> None:
        accounts = _accounts(raw)
        accounts["version"] = 2
        accounts["columns"].insert(2, {"name": "loyalty_tier", "type": "string"})

    config = _declare(config, add_tier)
    write_files(
        config,
        [[json.dumps(rec("accounts", "A2", "INSERT", 20, account_id=2, loyalty_tier="GOLD"))]],
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    evolved = forkrun.run(["run", "--config", config.file], env, REPO, 120)
    assert evolved.returncode == 0, evolved.stderr
    assert "table accounts: added column loyalty_tier (string)" in evolved.stdout  # said once
    assert evolved.stdout.count("loyalty_tier") == 1
    shown = forkrun.run(
        ["schema", "log", "--config", config.file, "--output", "json"], env, REPO, 120
    )
    assert [(r["table_name"], r["version"], r["change"]) for r in json.loads(shown.stdout)][-1] == (
        "accounts",
        2,
        "added column loyalty_tier (string)",
    )
    contract = contract_of(config, "accounts")
    got = silver(config, contract)
    assert (got[(1,)]["loyalty_tier"], got[(2,)]["loyalty_tier"]) == (None, "GOLD")
    assert got[(1,)]["vip"] is True
    bronze = rows(config, "bronze/accounts_events")
    assert sorted(r.get("loyalty_tier") or "" for r in bronze) == ["", "GOLD"]
    log = rows(config, "audit/schema_log")
    assert sorted((r["table_name"], r["version"], r["change"]) for r in log) == [
        ("accounts", 1, "created"),
        ("accounts", 2, "added column loyalty_tier (string)"),
        ("order_lines", 1, "created"),
    ]

    # an incompatible change: the key column's type; the run stops and writes nothing
    def key_as_text(raw: dict[str, Any]) -> None:
        _accounts(raw)["columns"][0]["type"] = "string"

    stopped = _declare(config, key_as_text)
    write_files(stopped, [[json.dumps(rec("accounts", "A3", "INSERT", 30, account_id="A-3"))]])
    versions = {name: DeltaTable(config.table_uri(name)).version() for name in ("silver/accounts",)}
    with pytest.raises(SchemaDriftError) as caught:
        Pipeline(stopped)
    message = str(caught.value)
    assert "table accounts: key columns changed from (account_id integer)" in message
    assert "cdcflow schema accept" in message and "\n" not in message
    assert versions == {n: DeltaTable(config.table_uri(n)).version() for n in versions}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    again = forkrun.run(["run", "--config", stopped.file], env, REPO, 120)
    assert again.returncode == 2 and "table accounts: key columns changed" in again.stderr

    # restoring the contract runs again; then changing it and accepting starts the table afresh
    def key_as_integer(raw: dict[str, Any]) -> None:
        _accounts(raw)["columns"][0]["type"] = "integer"

    _declare(stopped, key_as_integer)
    accepted = forkrun.run(
        ["schema", "accept", "--config", stopped.file, "--table", "accounts"], env, REPO, 120
    )
    assert accepted.returncode == 0 and "no incompatible change" in accepted.stdout
    stopped = _declare(stopped, key_as_text)
    accepted = forkrun.run(
        ["schema", "accept", "--config", stopped.file, "--table", "accounts"], env, REPO, 120
    )
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted key columns changed" in accepted.stdout
    retired = list((tmp_path / "lake" / "_retired" / "accounts").iterdir())
    assert len(retired) == 1 and (retired[0] / "silver" / "accounts" / "_delta_log").is_dir()
    Pipeline(stopped).run(Trigger.parse("available-now"))
    fresh = silver(stopped, contract_of(stopped, "accounts"))
    assert list(fresh) == [("A-3",)]  # the table started afresh under the accepted contract
    assert rows(stopped, "silver/order_lines") == []  # the other table untouched (empty)


def test_a_widened_column_type_is_applied_and_narrowing_stops(tmp_path: Path) -> None:
    """Type widening (decimal scale/precision up, integer → decimal) rewrites the column in
    Bronze, Silver and the history; earlier values are kept exactly; narrowing stops the run."""
    config = write_config(tmp_path, mode="hard")
    first = [
        json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, balance="10.50")),
        json.dumps(rec("order_lines", "L1", "INSERT", 11, order_id="O", line_no=1, quantity=3)),
        json.dumps(rec("accounts", "A2", "UPDATE", 12, account_id=1, balance="11.25")),
    ]
    write_files(config, [first])
    Pipeline(config).run(Trigger.parse("available-now"))

    def widen(raw: dict[str, Any]) -> None:
        _accounts(raw)["columns"][2]["type"] = "decimal(15,3)"
        lines = next(t for t in raw["tables"] if t["name"] == "order_lines")
        next(c for c in lines["columns"] if c["name"] == "quantity")["type"] = "decimal(20,0)"

    config = _declare(config, widen)
    second = [
        json.dumps(rec("accounts", "A3", "UPDATE", 20, account_id=1, balance="12.125")),
        json.dumps(rec("order_lines", "L2", "UPDATE", 21, order_id="O", line_no=1, quantity="4")),
    ]
    write_files(config, [second])
    Pipeline(config).run(Trigger.parse("available-now"))
    # every table of the column holds the new type; Silver and history equal the reference
    for name, column, wanted in (
        ("bronze/accounts_events", "balance", pa.decimal128(15, 3)),
        ("silver/accounts", "balance", pa.decimal128(15, 3)),
        ("silver/accounts_history", "balance", pa.decimal128(15, 3)),
        ("silver/order_lines_history", "quantity", pa.decimal128(20, 0)),
    ):
        schema = read_arrow(DeltaTable(config.table_uri(name))).schema
        assert schema.field(column).type == wanted, name
    assert_silver_is_the_fold(config, first + second)
    history = sorted(rows(config, "silver/accounts_history"), key=lambda r: r["sequence"])
    assert [r["balance"] for r in history] == [
        Decimal("10.500"),
        Decimal("11.250"),
        Decimal("12.125"),
    ]
    log = {(r["table_name"], r["change"]) for r in rows(config, "audit/schema_log")}
    assert ("accounts", "widened column balance from decimal(12,2) to decimal(15,3)") in log
    assert ("order_lines", "widened column quantity from integer to decimal(20,0)") in log

    def narrow(raw: dict[str, Any]) -> None:
        _accounts(raw)["columns"][2]["type"] = "decimal(10,3)"

    with pytest.raises(SchemaDriftError, match="column balance changed type from decimal"):
        Pipeline(_declare(config, narrow))


def test_unknown_fields_evolve_into_columns(tmp_path: Path) -> None:
    """``unknown_fields: evolve``: an unknown event field becomes a nullable column of the
    inferred type, recorded, kept by later runs; a value that then does not fit is quarantined."""
    config = write_config(tmp_path)
    config = _declare(config, lambda raw: _accounts(raw).update(unknown_fields="evolve"))
    first = [
        json.dumps(
            rec("accounts", "A1", "INSERT", 10, account_id=1, nickname="Al", score=3)
            | {"extras": {"a": [1]}, "note": None, "bad-name": 1}
        ),
        json.dumps(rec("order_lines", "L1", "INSERT", 11, order_id="O", line_no=1, stray=1)),
    ]
    second = [
        json.dumps(rec("accounts", "A2", "UPDATE", 20, account_id=1, score="x")),
        json.dumps(rec("accounts", "A3", "INSERT", 21, account_id=2, score=7, note="hi")),
        json.dumps(rec("accounts", "A4", "UPDATE", 22, account_id=1, rating=4.5)),
    ]
    write_files(config, [first, second])
    Pipeline(config).run(Trigger.parse("available-now"))

    log = rows(config, "audit/schema_log")
    evolved = sorted(r["change"] for r in log if r["change"].startswith("evolved"))
    assert evolved == [
        "evolved column extras (json) from an event field",
        "evolved column nickname (string) from an event field",
        "evolved column note (string) from an event field",  # all null: a string column
        "evolved column rating (double) from an event field",
        "evolved column score (integer) from an event field",
    ]
    recorded = recorded_contracts(DeltaTable(config.table_uri("audit/schema_log")))["accounts"]
    got = silver(config, recorded)
    assert got[(1,)]["nickname"] == "Al" and got[(1,)]["score"] == 3
    assert got[(1,)]["extras"] == '{"a":[1]}' and got[(1,)]["rating"] == 4.5
    assert (got[(2,)]["score"], got[(2,)]["note"]) == (7, "hi")
    # the type is fixed once evolved: "x" is not an integer
    quarantined = rows(config, "quarantine/accounts_events")
    assert [(q["event_id"], q["failure_reason"]) for q in quarantined] == [
        ("A2", "SCHEMA_MISMATCH")
    ]
    assert "score" in quarantined[0]["failure_detail"]
    # order_lines ignores unknown fields (the default): no column
    assert "stray" not in rows(config, "silver/order_lines")[0]
    # Silver and history equal the reference fold under the evolved contract
    events = []
    validator = ContractValidator(recorded, NOW + timedelta(hours=1), timedelta(minutes=5))
    for line in first + second:
        if json.loads(line)["metadata"]["source_table"] == "accounts":
            event = validator.validate_object(json.loads(line))
            if isinstance(event, ChangeEvent):
                events.append(event)
    want = fold_changes(events, recorded, "soft").rows
    assert {k: {c: got[k][c] for c in row} for k, row in want.items()} == want
    # a later run keeps the evolved columns (no drift stop), and writes nothing new
    before = DeltaTable(config.table_uri("silver/accounts")).version()
    Pipeline(load_config(Path(config.file))).run(Trigger.parse("available-now"))
    assert DeltaTable(config.table_uri("silver/accounts")).version() == before
    assert len(rows(config, "audit/schema_log")) == len(log)
    # as-of shows the evolved columns too (the contract the tables hold)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    argv = ["as-of", "--config", config.file, "--table", "accounts", "--key", "account_id=1"]
    shown = forkrun.run([*argv, "--version", str(before), "--output", "json"], env, REPO, 120)
    assert shown.returncode == 0, shown.stderr
    assert [(r["nickname"], r["score"]) for r in json.loads(shown.stdout)] == [("Al", 3)]


def test_as_of_reads_a_declared_table_at_an_instant_or_a_version(tmp_path: Path) -> None:
    """``as-of --table T --key C=V``: a key's state at an instant is its latest version then
    (hard mode: absent after its DELETE); ``--version``: Silver by time travel."""
    config = write_config(tmp_path, mode="hard")
    key = {"order_id": "O-7", "line_no": 2}
    write_files(
        config,
        [
            [
                json.dumps(
                    rec("order_lines", "L1", "INSERT", 10, 50, **key, sku="ABC-1", quantity=1)
                )
            ],
            [json.dumps(rec("order_lines", "L2", "UPDATE", 11, 40, **key, quantity=5))],
            [json.dumps(rec("order_lines", "L3", "DELETE", 12, 30, **key))],
        ],
    )
    Pipeline(config).run(Trigger.parse("available-now"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    base = ["as-of", "--config", config.file, "--table", "order_lines", "--output", "json"]
    keys = ["--key", "order_id=O-7", "--key", "line_no=2"]
    for minutes_ago, wanted in ((45, 1), (35, 5), (25, None)):
        instant = (NOW - timedelta(minutes=minutes_ago)).isoformat()
        shown = forkrun.run([*base, *keys, "--timestamp", instant], env, REPO, 120)
        assert shown.returncode == 0, shown.stderr
        got = json.loads(shown.stdout)
        if wanted is None:
            assert got == []  # hard-deleted by then
        else:
            assert [(r["order_id"], r["line_no"], r["quantity"]) for r in got] == [
                ("O-7", 2, wanted)
            ]
    # time travel: Silver version 1 held the first image
    shown = forkrun.run([*base, *keys, "--version", "1"], env, REPO, 120)
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["quantity"] == 1
    bad = forkrun.run([*base, "--key", "line_no=two", "--version", "1"], env, REPO, 120)
    assert bad.returncode == 2 and "line_no is not a value of type integer" in bad.stderr


def test_evolution_skips_names_a_delta_table_cannot_hold_twice() -> None:
    """``unknown_fields: evolve``: a field equal to a column but for case, a second field
    equal to another but for case, or a system column's name stays in the raw payload (Delta
    column names are case-insensitive: such a column would stop every later micro-batch)."""
    from cdcflow.engines.local.contracts import evolution

    contract = TableContract(
        name="people",
        keys=["pid"],
        columns=[{"name": "pid", "type": "integer"}, {"name": "email", "type": "string"}],
    )
    values = {"Email": ["b@x"], "Nick": ["n"], "nick": ["m"], "OK": [True], "_x": [1], "age": [3]}
    evolved = evolution(contract, values, 0)
    assert evolved is not None
    assert [(c.name, c.type) for c in evolved[0].columns] == [
        ("pid", "integer"),
        ("email", "string"),
        ("Nick", "string"),
        ("age", "integer"),
    ]
    with pytest.raises(ValueError, match="column ok: a name cdcflow's own columns use"):
        TableContract(
            name="t", keys=["k"], columns=[{"name": "k", "type": "integer"}, {"name": "ok"}]
        )


def test_a_lost_table_is_refused_and_a_newly_declared_table_starts_empty(tmp_path: Path) -> None:
    """After committed micro-batches a run refuses a lakehouse where a declared table lost one
    of its Delta tables (recreating it empty would silently restart it), while a table declared
    since the last run (none of its tables exist yet) starts empty."""
    config = write_config(tmp_path)
    path = tmp_path / "cdcflow.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["tables"] = [t for t in raw["tables"] if t["name"] == "accounts"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    only_accounts = load_config(path)
    write_files(config, [[json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1))]])
    assert len(Pipeline(only_accounts).run(Trigger.parse("available-now"))) == 1
    lines = contract_of(config, "order_lines").table_names
    assert not DeltaTable.is_deltatable(config.table_uri(lines.silver))
    # order_lines declared now: its tables are created, the run goes on
    write_files(config, [[json.dumps(rec("order_lines", "L1", "INSERT", 11, order_id="O-1",
                                         line_no=1, sku="ABC-1", quantity=2))]])  # fmt: skip
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 1
    assert list(silver(config, contract_of(config, "order_lines"))) == [("O-1", 1)]
    # accounts' Silver lost: refused before anything is written or created
    accounts = contract_of(config, "accounts").table_names
    shutil.rmtree(config.table_uri(accounts.silver))
    write_files(config, [[json.dumps(rec("accounts", "A2", "UPDATE", 20, account_id=1))]])
    with pytest.raises(TableError, match=rf"{accounts.silver}: missing under storage.root"):
        Pipeline(config)
    assert not DeltaTable.is_deltatable(config.table_uri(accounts.silver))
    # replay --apply rebuilds it from Bronze; the run then goes on
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    applied = forkrun.run(["replay", "--config", str(path), "--apply"], env, REPO, 120)
    assert applied.returncode == 0, applied.stderr
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 1
    assert silver(config, contract_of(config, "accounts"))[(1,)]["last_event_id"] == "A2"


def _declare_tables(root: Path, tables: list[dict[str, Any]], mode: str = "soft") -> CdcflowConfig:
    """A config of ``tables`` (each in ``mode``), one landing file per micro-batch."""
    raw = {
        "pipeline": {"name": "odd"},
        "storage": {"root": str(root / "lake")},
        "source": {"path": str(root / "landing"), "max_files_per_trigger": 1},
        "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "odd")},
        "tables": [{**t, "delete_mode": mode} for t in tables],
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "landing").mkdir(exist_ok=True)
    path = root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path)


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_a_table_of_keys_only_and_a_table_of_62_columns_follow_the_fold(
    tmp_path: Path, mode: str
) -> None:
    """A link table (every column a key: no column registers) and a table whose present_mask
    needs 64 bits (over 31 non-key columns) run, micro-batch after micro-batch, to the
    reference fold and timeline."""
    wide_columns = [{"name": "id", "type": "integer"}] + [
        {"name": f"c{i}", "type": "integer"} for i in range(62)
    ]
    config = _declare_tables(
        tmp_path,
        [
            {
                "name": "memberships",
                "keys": ["user_id", "group_id"],
                "columns": [
                    {"name": "user_id", "type": "integer"},
                    {"name": "group_id", "type": "integer"},
                ],
            },
            {"name": "wide", "keys": ["id"], "columns": wide_columns},
        ],
        mode,
    )
    files = [
        [
            rec("memberships", "m1", "INSERT", 1, user_id=1, group_id=2),
            rec("memberships", "m2", "INSERT", 2, user_id=1, group_id=3),
            rec("wide", "w1", "INSERT", 3, id=1, **{f"c{i}": i for i in range(62)}),
        ],
        [
            rec("memberships", "m3", "DELETE", 5, user_id=1, group_id=2),
            rec("wide", "w2", "UPDATE", 6, id=1, c61=-1, c0=-2),
            rec("wide", "w0", "UPDATE", 2, id=1, c30=-3),  # late: before the INSERT
        ],
        [
            rec("memberships", "m4", "INSERT", 7, user_id=1, group_id=2),  # back again
            rec("memberships", "m5", "DELETE", 4, user_id=1, group_id=3),  # late
            rec("wide", "w3", "UPDATE", 8, id=1, c40=40_000),
        ],
    ]
    lines = [json.dumps(r) for batch in files for r in batch]
    write_files(config, [[json.dumps(r) for r in batch] for batch in files])
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 3
    assert_silver_is_the_fold(config, lines, ("memberships", "wide"))
    wide = silver(config, contract_of(config, "wide"))[(1,)]
    assert (wide["c0"], wide["c30"], wide["c40"], wide["c61"]) == (-2, 30, 40_000, -1)


def test_a_moved_delta_table_stops_the_run_until_restored_or_accepted(tmp_path: Path) -> None:
    """A changed Delta table path under ``tables:`` would leave the tables built so far behind
    and restart the table empty: an incompatible change, whichever path moved."""
    config = write_config(tmp_path)
    write_files(config, [[json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1))]])
    Pipeline(config).run(Trigger.parse("available-now"))
    defaults = contract_of(config, "accounts").table_names.model_dump(exclude_defaults=True)
    for kind in ("bronze", "silver", "history", "tombstones", "quarantine", "outcomes"):

        def move(raw: dict[str, Any], kind: str = kind) -> None:
            _accounts(raw)["tables"] = {**defaults, kind: f"moved/accounts_{kind}"}

        moved = _declare(config, move)
        with pytest.raises(SchemaDriftError) as caught:
            Pipeline(moved)
        assert f"Delta table paths changed ({kind} from " in str(caught.value), kind
        assert not (tmp_path / "lake" / "moved").exists()
    # the same paths spelled out, and a new Snowflake table name, are no drift
    renamed = _declare(
        config,
        lambda raw: _accounts(raw).update(tables={**defaults, "snowflake": "ACCOUNTS_V2"}),
    )
    write_files(renamed, [[json.dumps(rec("accounts", "A2", "INSERT", 20, account_id=2))]])
    Pipeline(renamed).run(Trigger.parse("available-now"))
    assert set(silver(renamed, contract_of(renamed, "accounts"))) == {(1,), (2,)}
    # accepting a move retires the old tables; the table starts afresh at the new path
    moved = _declare(
        renamed,
        lambda raw: _accounts(raw).update(tables={**defaults, "silver": "silver/accounts_v2"}),
    )
    log = DeltaTable(config.table_uri("audit/schema_log"))
    accepted = accept(log, str(tmp_path / "lake"), contract_of(moved, "accounts"), utc_now())
    assert accepted.changes and accepted.retired_to is not None
    assert (accepted.retired_to / "silver" / "accounts" / "_delta_log").is_dir()
    write_files(moved, [[json.dumps(rec("accounts", "A3", "INSERT", 30, account_id=3))]])
    Pipeline(moved).run(Trigger.parse("available-now"))
    assert set(silver(moved, contract_of(moved, "accounts"))) == {(3,)}


def test_replay_to_an_older_bronze_version_compares_with_silver_of_that_time(
    tmp_path: Path,
) -> None:
    """``replay --verify --to-version N`` of a declared table compares the replay of Bronze
    version N with Silver as the last micro-batch in it left Silver (found by a new-user
    trial: it was compared with today's Silver and reported every later change)."""
    config = write_config(tmp_path)
    write_files(
        config,
        [
            [json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, vip=True))],
            [json.dumps(rec("accounts", "A2", "UPDATE", 20, account_id=1, vip=False))],
        ],
    )
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 2
    contract = contract_of(config, "accounts")
    bronze = DeltaTable(config.table_uri("bronze/accounts_events"))
    first = next(
        v for v in range(bronze.version() + 1)
        if len(read_arrow(DeltaTable(bronze.table_uri, version=v))) == 1
    )  # fmt: skip
    old = replay_table(config, contract, to_version=first)
    assert old.report.ok, old.report.to_json()
    assert old.report.actual_label.endswith("(after micro-batch 0)")
    latest = replay_table(config, contract)
    assert latest.report.ok and latest.report.actual_label == "live silver"
    # the comparison is real: damaging Silver now leaves the old comparison alone
    DeltaTable(config.table_uri("silver/accounts")).update(
        updates={"vip": "true"}, predicate="account_id = 1"
    )
    assert replay_table(config, contract, to_version=first).report.ok
    assert not replay_table(config, contract).report.ok


def test_non_key_columns_growing_past_31_stop_the_run() -> None:
    """Bronze's present_mask keeps the width its table was created with (32 bits up to 31
    non-key columns): a contract growing past 31 is an incompatible change."""
    columns = [ColumnSpec(name="id", type="integer")] + [
        ColumnSpec(name=f"c{i}") for i in range(30)
    ]
    old = TableContract(name="w", keys=("id",), columns=tuple(columns))
    grown = old.model_copy(
        update={"columns": (*columns, *(ColumnSpec(name=f"n{i}") for i in range(3)))}
    )
    changes = contract_changes(old, grown)
    assert not changes[0].compatible and "past 31" in changes[0].text  # incompatible first
    assert [c.text for c in changes[1:]] == [f"added column n{i} (string)" for i in range(3)]
    one_more = old.model_copy(update={"columns": (*columns, ColumnSpec(name="n0"))})
    assert all(c.compatible for c in contract_changes(old, one_more))  # 31: still 32 bits


def test_a_pii_key_is_masked_in_reconcile_samples() -> None:
    """A key column marked pii is personal data: reconcile's and replay's samples of missing,
    extra and differing keys never show its values."""
    contract = TableContract(
        name="people",
        keys=("email",),
        columns=(ColumnSpec(name="email", pii=True), ColumnSpec(name="city")),
    )
    schema = contract_public_schema(contract)
    frame = lambda rows: pl.from_arrow(pa.Table.from_pylist(rows, schema=schema))  # noqa: E731
    base = {"is_deleted": False, "created_at": None, "last_updated_at": None}
    actual = frame([{**base, "email": "ann@x.com", "city": "Paris"},
                    {**base, "email": "bob@x.com", "city": "Rome"}])  # fmt: skip
    expected = frame([{**base, "email": "ann@x.com", "city": "Lyon"},
                      {**base, "email": "eve@x.com", "city": "Nice"}])  # fmt: skip
    report = reconcile_table(actual, expected, contract)
    assert report.missing_keys == report.extra_keys == report.rows_with_differences == 1
    shown = json.dumps(report.to_json(), default=str)
    assert not any(e in shown for e in ("ann@x.com", "bob@x.com", "eve@x.com")), shown
    assert "Lyon" in shown  # a value of a column that is no personal data is shown


def test_replay_apply_refuses_to_drop_events_a_changed_contract_rejects(tmp_path: Path) -> None:
    """A constraint added after an event was accepted applies to the next micro-batches: a
    replay under it would reject that event, so --apply writes nothing (found by an attack:
    Silver lost the accepted row)."""
    table = {"name": "scores", "keys": ["id"], "columns": [
        {"name": "id", "type": "integer"}, {"name": "v", "type": "integer"}]}  # fmt: skip
    config = _declare_tables(tmp_path, [table])
    write_files(config, [[json.dumps(rec("scores", "s1", "INSERT", 1, id=1, v=500))]])
    assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 1
    table["columns"][1]["maximum"] = 100  # type: ignore[index]
    config = _declare_tables(tmp_path, [table])
    assert Pipeline(config).run(Trigger.parse("available-now")) == []  # the change is recorded
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    path = str(tmp_path / "cdcflow.yaml")
    verify = forkrun.run(["replay", "--config", path, "--verify"], env, REPO, 120)
    assert verify.returncode == 1 and "rejected on replay" in verify.stdout, verify.stdout
    applied = forkrun.run(["replay", "--config", path, "--apply"], env, REPO, 120)
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert "table scores: 1 (SCHEMA_MISMATCH)" in applied.stderr and "nothing was written" in (
        applied.stderr
    )
    assert silver(config, contract_of(config, "scores"))[(1,)]["v"] == 500
