"""The right to erasure (``cdcflow erase``): a subject's personal data is gone from every file of
the lakehouse and the checkpoint — Parquet files read back as values, Delta logs and
checkpoints, the checkpoint folder — while other subjects' data, replay and reconciliation are
intact; the same through a SIGKILL at every step of the erasure, for a late event after it, in
Snowflake, and on the Spark engine."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from cdcflow.config import SnowflakeSection
from cdcflow.layers.erasure import ERASURE_CRASH_POINTS, erase, erasure_log, redact_text
from cdcflow.layers.lag import end_to_end_lag
from tests.conftest import REPO, Lake, ev, full

SUBJECT = "C-7"
#: the subject's personal data, as the requester knows it
VALUES = ("Jane Q. Erasable", "jane.erasable@example.com", "+44-7700900123", "jane.new@example.org")
OTHER = {"customer_name": "Keep Me", "email": "keep.me@example.com", "phone": "+1-5550100"}

_db_numbers = itertools.count(1000)


def subject_events() -> list[list[Any]]:
    """Files of records: the subject inserted, updated (partially, twice with the same event:
    a duplicate), deleted and revived, quarantined records holding their e-mail (a broken
    line without a key, an unknown operation with the key), and another customer."""
    name, email, phone, new_email = VALUES
    mine = full(customer_name=name, email=email, phone=phone)
    return [
        [
            ev("E1", SUBJECT, "INSERT", 10, **mine),
            ev("E2", "C-8", "INSERT", 11, **full(**OTHER)),
            f'{{"event_id": "BAD1", "email": "{email}", broken',
        ],
        [
            ev("E3", SUBJECT, "UPDATE", 20, email=new_email),
            ev("E3", SUBJECT, "UPDATE", 20, email=new_email),  # duplicate
            ev("E4", SUBJECT, "FROBNICATE", 21, phone=phone),  # quarantined with the key
        ],
        [
            ev("E5", SUBJECT, "DELETE", 30),
            ev("E6", SUBJECT, "UPDATE", 40, customer_name=name, city="Leeds"),
            ev("E7", "C-8", "UPDATE", 41, city="York"),
        ],
    ]


def lake_with_subject(root: Path, engine: str = "local", mode: str = "soft") -> Lake:
    lake = Lake(root, mode=mode)
    lake.config.pipeline.engine = engine  # type: ignore[assignment]
    for records in subject_events():
        lake.write(records)
        lake.run()
    return lake


def write_config(lake: Lake) -> Path:
    path = lake.root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(lake.config.model_dump(mode="json", by_alias=True)))
    return path


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CDCFLOW", "PYTEST_"))}
    return subprocess.run(
        [sys.executable, "-m", "cdcflow", *args],
        cwd=REPO, env={**base, **(env or {})}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip


def files_holding(roots: list[Path], values: tuple[str, ...]) -> list[str]:
    """Every file under ``roots`` whose content holds one of ``values``: Parquet files read
    back as values (every column as text), gzip files decompressed, every other file (Delta
    logs and checkpoints' JSON, the checkpoint's offsets) as bytes, JSON-escaped forms too."""
    forms = {v for v in values} | {json.dumps(v)[1:-1] for v in values}
    found = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            if "_snowflake_emulator" in path.parts:
                continue
            data = path.read_bytes()
            if path.suffix == ".parquet":
                table = pq.read_table(io.BytesIO(data))
                text = "\n".join(
                    str(v) for column in table.columns for v in column.to_pylist() if v is not None
                )
            else:
                if path.suffix == ".gz":
                    data = gzip.decompress(data)
                text = data.decode("utf-8", errors="replace")
            if any(form in text for form in forms):
                found.append(str(path.relative_to(root)))
    return found


def lake_files(lake: Lake) -> list[Path]:
    return [lake.root / "lake"]


def others(lake: Lake) -> dict[str, Any]:
    """Everything about other subjects: their Silver rows and history."""
    return {
        "silver": {k: r for k, r in lake.silver().items() if k != SUBJECT},
        "history": lake.table("silver/customer_history")
        .filter(pl.col("customer_id") != SUBJECT)
        .sort("customer_id", "sequence")
        .to_dicts(),
    }


def test_redact_text_keeps_the_structure() -> None:
    raw = json.dumps({"email": "a@b.co", "note": "mail a@b.co", "after": {"phone": "+1-23"}})
    assert json.loads(redact_text(raw, {"email", "phone"}, ["a@b.co"]) or "") == {
        "email": None,
        "note": "mail [erased]",
        "after": {"phone": None},
    }
    assert redact_text('{"email": "a@b.co", broken', {"email"}, ["a@b.co"]) == (
        '{"email": "[erased]", broken'
    )


def test_erase_leaves_no_trace_and_keeps_everything_else(tmp_path: Path) -> None:
    lake = lake_with_subject(tmp_path)
    config = write_config(lake)
    before = others(lake)
    assert files_holding(lake_files(lake), VALUES)  # the scan finds them before
    assert lake.table("quarantine/customer_events").height == 2
    refused = cli("erase", "--config", str(config), "--key", SUBJECT)
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    dry = cli("erase", "--config", str(config), "--key", SUBJECT, "--dry-run", "--output", "json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)["rows"]
    # 4 Bronze rows hold PII (E1, E3, its duplicate, E6; not the DELETE E5), 2 quarantined
    # (BAD1 by its e-mail, E4)
    assert planned["bronze/customer_events"] == 4
    assert planned["quarantine/customer_events"] == 2
    assert files_holding(lake_files(lake), VALUES)  # a dry run writes nothing
    unverified = cli("erase", "--config", str(config), "--verify", "--key", SUBJECT)
    assert unverified.returncode == 1 and "FAIL" in unverified.stdout
    hour_ago = datetime.now(UTC) - timedelta(hours=1)  # status's window
    lag_before = end_to_end_lag(lake.config, since=hour_ago)

    done = cli("erase", "--config", str(config), "--key", SUBJECT, "--yes", "--reason", "TICKET-1")
    assert done.returncode == 0, done.stderr
    assert files_holding(lake_files(lake), VALUES) == []
    for value in VALUES:  # nor in what the command printed or logged
        assert value not in done.stdout + done.stderr
    # the subject stays, without personal data; everything else is as it was
    row = lake.silver()[SUBJECT]
    assert (row["customer_name"], row["email"], row["phone"]) == (None, None, None)
    assert (row["city"], row["is_deleted"], row["last_event_id"]) == ("Leeds", False, "E6")
    assert others(lake) == before
    # the erasure truncated Silver's Delta log: the lag still counts every micro-batch (a
    # trial saw status's lag drop to 0 events), from the batches' ends
    lag_after = end_to_end_lag(lake.config, since=hour_ago)
    assert [x.events for x in lag_after] == [x.events for x in lag_before]
    assert lag_after[0].events > 0 and lag_after[0].p50 is not None
    log = erasure_log(lake.config)
    assert sorted(log["status"].to_list()) == ["completed", "requested"]
    assert set(log["reason"]) == {"TICKET-1"} and SUBJECT not in log.write_csv()
    verify = cli(
        "erase", "--config", str(config), "--verify", "--key", SUBJECT,
        *itertools.chain.from_iterable(("--value", v) for v in VALUES),
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "FAIL" not in verify.stdout and verify.stdout.count("PASS") >= 9
    status = cli("erase", "--config", str(config), "--status", "--output", "json")
    assert status.returncode == 0 and SUBJECT not in status.stdout
    assert len(json.loads(status.stdout)) == 2
    for key, count in ((SUBJECT, 2), ("C-8", 0)):  # one subject's rows
        mine = cli("erase", "--config", str(config), "--status", "--key", key, "--output", "json")
        assert mine.returncode == 0 and len(json.loads(mine.stdout)) == count, mine.stderr
    # Bronze's versions before the erasure are gone: a replay of one says so in one line
    gone = cli("replay", "--config", str(config), "--verify", "--to-version", "0")
    assert gone.returncode == 2 and "time travel starts at version" in gone.stderr, gone.stderr
    # replay from the redacted Bronze reproduces Silver; the pipeline goes on
    replay = cli("replay", "--config", str(config), "--verify")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    lake.write([ev("E9", "C-8", "UPDATE", 50, city="Hull")])
    lake.run()
    assert lake.silver()["C-8"]["city"] == "Hull"


def test_a_late_event_of_an_erased_subject_keeps_no_personal_data(tmp_path: Path) -> None:
    lake = lake_with_subject(tmp_path)
    erase(lake.config, "customers", [SUBJECT], confirmed=True)
    # a late UPDATE (lower sequence) and a new one, both with personal data
    lake.write(
        [
            ev("L1", SUBJECT, "UPDATE", 15, email="late.leak@example.com", city="Bath"),
            ev("L2", SUBJECT, "UPDATE", 60, customer_name="Jane Again", phone="+44-123456"),
        ]
    )
    lake.run()
    leaked = ("late.leak@example.com", "Jane Again", "+44-123456")
    assert files_holding(lake_files(lake), leaked) == []
    row = lake.silver()[SUBJECT]
    assert (row["customer_name"], row["email"], row["phone"]) == (None, None, None)
    assert row["last_event_id"] == "L2"  # applied, with its personal data nulled
    log = erasure_log(lake.config)
    assert log.filter(pl.col("reason").str.starts_with("late event")).height == 2


@pytest.mark.slow
def test_erase_killed_at_every_step_finishes_when_run_again(tmp_path: Path) -> None:
    """SIGKILL after each step; the re-run finishes the same request: no trace left, one
    requested and one completed log row, each table's redaction committed once."""
    template = lake_with_subject(tmp_path / "template")
    for point in ERASURE_CRASH_POINTS:
        root = tmp_path / point
        shutil.copytree(template.root, root)
        lake = Lake(root)
        config = write_config(lake)
        killed = cli(
            "erase", "--config", str(config), "--key", SUBJECT, "--yes",
            env={"CDCFLOW_CRASH_AT": point},
        )  # fmt: skip
        assert killed.returncode == -9, (point, killed.stderr[-2000:])
        again = cli("erase", "--config", str(config), "--key", SUBJECT, "--yes")
        assert again.returncode == 0, (point, again.stderr[-2000:])
        assert files_holding([root / "lake"], VALUES) == [], point
        log = erasure_log(lake.config)
        assert sorted(log["status"].to_list()) == ["completed", "requested"], point
        assert log["request_id"].n_unique() == 1, point
        from deltalake import DeltaTable

        app_id = f"cdcflow-erase-{log['request_id'][0]}"
        for name in ("bronze/customer_events", "silver/customers", "silver/customer_history"):
            assert DeltaTable(lake.config.table_uri(name)).transaction_version(app_id) == 1
        assert cli("replay", "--config", str(config), "--verify").returncode == 0, point


def test_snowflake_rows_are_redacted_in_the_same_run(
    tmp_path: Path, emulator: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Snowflake table's rows of the subject are redacted by the erasure's sync, and so are
    its stage's: the last micro-batch's inline sync fails after its load and leaves the
    subject's new values in ``DIM_CUSTOMER_CURRENT_STAGE`` (an attack found them kept there,
    and ``--verify`` passing)."""
    from cdcflow.sinks.snowflake.faults import ENV_VAR

    lake = Lake(tmp_path)
    lake.config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:",
        mode="inline",
    )  # fmt: skip
    events = subject_events()
    for n, records in enumerate(events):
        if n == len(events) - 1:
            monkeypatch.setenv(ENV_VAR, "after_load")  # logged; the batch commits
        lake.write(records)
        lake.run()
    monkeypatch.delenv(ENV_VAR)
    from cdcflow.layers.erasure import verify_erasure
    from cdcflow.sinks.snowflake.connection import connect

    def staged() -> int:
        with connect(lake.config) as conn:
            cur = conn.cursor()
            cur.execute(
                "SELECT COUNT(*) FROM DIM_CUSTOMER_CURRENT_STAGE WHERE customer_id = %s",
                (SUBJECT,),
            )
            return int(cur.fetchone()[0])

    assert staged() > 0
    before = verify_erasure(lake.config, "customers", [SUBJECT], VALUES)
    assert not next(c for c in before if c.what.startswith("Snowflake")).ok

    def dim_row() -> tuple[Any, ...]:
        with connect(lake.config) as conn:
            cur = conn.cursor()
            cur.execute(
                "SELECT customer_name, email, phone, city FROM DIM_CUSTOMER_CURRENT "
                "WHERE customer_id = %s",
                (SUBJECT,),
            )
            (row,) = cur.fetchall()
            return tuple(row)

    assert dim_row()[:3] == (VALUES[0], VALUES[3], VALUES[2])
    report = erase(lake.config, "customers", [SUBJECT], confirmed=True)
    assert report.snowflake == "synced"
    assert dim_row() == (None, None, None, "Leeds")
    assert staged() == 0
    checks = verify_erasure(lake.config, "customers", [SUBJECT], VALUES)
    assert all(c.ok for c in checks), [vars(c) for c in checks if not c.ok]
    assert any(c.what.startswith("Snowflake DIM_CUSTOMER_CURRENT") for c in checks)


@pytest.mark.spark
def test_erase_on_the_spark_engine(spark: Any, tmp_path: Path) -> None:
    """Tables written by the Spark engine are erased the same way; Spark continues them, and a
    late event it applies is erased again after its commit."""
    lake = lake_with_subject(tmp_path, engine="spark")
    before = others(lake)
    erase(lake.config, "customers", [SUBJECT], confirmed=True)
    assert files_holding(lake_files(lake), VALUES) == []
    assert others(lake) == before
    lake.write([ev("L1", SUBJECT, "UPDATE", 60, email="spark.leak@example.com")])
    lake.run()
    assert files_holding(lake_files(lake), ("spark.leak@example.com",)) == []
    row = lake.silver()[SUBJECT]
    assert row["email"] is None and row["last_event_id"] == "L1"


def test_a_declared_table_with_an_integer_key(tmp_path: Path) -> None:
    """A declared table (``accounts``: integer key, ``owner`` marked pii): the subject's owner
    is gone from Bronze (column and raw payload), history and Silver; the other account and
    the other table are untouched; the key given as text matches the integer key."""
    from tests.test_tables_pipeline import rec, write_config, write_files
    from tests.test_tables_pipeline import rows as table_rows

    config = write_config(tmp_path, mode="soft")
    opened = {"balance": "1.00", "opened_on": "2024-01-01"}
    write_files(
        config,
        [
            [json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=7, owner="Ann Secret",
                            **opened)),
             json.dumps(rec("accounts", "A2", "INSERT", 11, account_id=8, owner="Bob Kept",
                            **opened))],
            [json.dumps(rec("accounts", "A3", "UPDATE", 20, account_id=7, owner="Ann Q. Secret")),
             json.dumps(rec("order_lines", "L1", "INSERT", 21, order_id="O-1", line_no=1,
                            sku="ABC-1", quantity=1))],
        ],
    )  # fmt: skip
    from cdcflow.pipeline import Pipeline, Trigger

    Pipeline(config).run(Trigger.parse("available-now"))
    before_lines = table_rows(config, "silver/order_lines")
    report = erase(config, "accounts", ["7"], confirmed=True)
    assert report.rows["bronze/accounts_events"] == 2
    assert files_holding([tmp_path / "lake"], ("Ann Secret", "Ann Q. Secret")) == []
    owners = {r["account_id"]: r["owner"] for r in table_rows(config, "silver/accounts")}
    assert owners == {7: None, 8: "Bob Kept"}
    assert table_rows(config, "silver/order_lines") == before_lines
    # a later record of the subject that no contract takes (a misspelled source table)
    landing = Path(config.source.path)
    late = json.dumps(rec("acounts", "A9", "UPDATE", 30, account_id=7, owner="Ann Unrouted"))
    (landing / "zz_late.jsonl").write_text(late + "\n")
    Pipeline(config).run(Trigger.parse("available-now"))
    assert table_rows(config, "quarantine/unrouted_events")  # it went there
    assert files_holding([tmp_path / "lake"], ("Ann Unrouted",)) == []
    with pytest.raises(Exception, match="no such table"):
        erase(config, "invoices", ["1"], confirmed=True)
    with pytest.raises(Exception, match="marks no column pii"):
        erase(config, "order_lines", ['["O-1", 1]'], confirmed=True)


def test_a_key_is_erased_in_every_form_records_give_it(tmp_path: Path) -> None:
    """Keys are equal by value (``docs/SEMANTICS.md``): the integer key 2 is ``2``, ``"002"``
    and ``"02"`` in records, and an instant key is ISO text or epoch milliseconds. Whatever
    form ``--key`` and the records use, every layer's rows of the subject are erased, the
    quarantined ones too, and a late quarantined record of it later (an attack found the
    key compared as text: ``--key 002`` erased the quarantine only and said it was done)."""
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import _declare_tables, rec, write_files

    accounts = {"name": "accounts", "keys": ["account_id"], "columns": [
        {"name": "account_id", "type": "integer"}, {"name": "owner", "pii": True},
        {"name": "balance", "type": "decimal(12,2)", "minimum": 0}]}  # fmt: skip
    readings = {"name": "readings", "keys": ["device", "taken_at"], "columns": [
        {"name": "device"}, {"name": "taken_at", "type": "timestamp"},
        {"name": "note", "pii": True}]}  # fmt: skip
    config = _declare_tables(tmp_path, [accounts, readings])
    write_files(
        config,
        [[
            json.dumps(rec("accounts", "a1", "INSERT", 1, account_id=2, owner="Alice Secret",
                           balance="10.00")),
            json.dumps(rec("accounts", "a2", "UPDATE", 2, account_id="002", owner="Bob Hidden",
                           balance=-5)),  # quarantined: below the minimum
            json.dumps(rec("accounts", "a3", "INSERT", 3, account_id=3, owner="Carl Kept")),
            json.dumps(rec("readings", "r1", "INSERT", 4, device="D1",
                           taken_at=1_704_067_200_000, note="Dora Secret")),
            json.dumps(rec("readings", "r2", "UPDATE", 5, device="D1",
                           taken_at="2024-01-01T01:00:00+01:00", note="Dora Again")),
        ]],
    )  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    secrets_ = ("Alice Secret", "Bob Hidden", "Dora Secret", "Dora Again")
    assert len(files_holding([tmp_path / "lake"], secrets_)) > 0
    erase(config, "accounts", ["002"], confirmed=True)
    erase(config, "readings", ['["D1", "2024-01-01T00:00:00Z"]'], confirmed=True)
    assert files_holding([tmp_path / "lake"], secrets_) == []
    assert files_holding([tmp_path / "lake"], ("Carl Kept",))  # another account stays
    write_files(config, [[json.dumps(rec("accounts", "a9", "UPDATE", 9, account_id="02",
                                         owner="Finn Late", balance=-1))]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))  # quarantined, then erased again
    assert files_holding([tmp_path / "lake"], ("Finn Late",)) == []


def test_tables_retired_by_schema_accept_are_erased_too(tmp_path: Path) -> None:
    """``cdcflow schema accept`` moves a table's Delta tables under ``_retired/`` inside the
    lakehouse: they hold the subject's data as well, and an erasure redacts them (an attack
    found them left as they were, and ``erase --verify --value`` failing)."""
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import _declare_tables, rec, write_files

    table = {"name": "accounts", "keys": ["account_id"], "columns": [
        {"name": "account_id", "type": "integer"}, {"name": "owner", "pii": True}]}  # fmt: skip
    config = _declare_tables(tmp_path, [table], mode="soft")
    write_files(config, [[json.dumps(rec("accounts", "a1", "INSERT", 1, account_id=1,
                                         owner="Alice Retired"))]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    config = _declare_tables(tmp_path, [table], mode="hard")  # an incompatible change
    accepted = cli("schema", "accept", "--config", config.file, "--table", "accounts")
    assert accepted.returncode == 0, accepted.stderr
    assert files_holding([tmp_path / "lake" / "_retired"], ("Alice Retired",))
    write_files(config, [[json.dumps(rec("accounts", "a2", "UPDATE", 2, account_id=1,
                                         owner="Alice Now"))]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    erase(config, "accounts", ["1"], confirmed=True)
    assert files_holding([tmp_path / "lake"], ("Alice Retired", "Alice Now")) == []
    verify = cli("erase", "--config", config.file, "--verify", "--table", "accounts", "--key",
                 "1", "--value", "Alice Retired")  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_usage_errors_and_keys_no_layer_holds(tmp_path: Path) -> None:
    """No key, an empty key, ``--verify`` without a key: usage errors (exit 2); keys no layer
    holds: nothing written; a reason holding personal data or the key: refused."""
    lake = lake_with_subject(tmp_path)
    config = str(write_config(lake))
    for args in (
        ("--yes",),
        ("--key", " ", "--yes"),
        ("--verify",),
        ("--verify", "--value", VALUES[1]),
    ):
        done = cli("erase", "--config", config, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert "--key" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    unknown = cli("erase", "--config", config, "--key", "C-404", "--yes")
    assert unknown.returncode == 2 and "nothing written" in unknown.stderr, unknown.stderr
    assert erasure_log(lake.config).is_empty()
    for reason in (f"asked by {VALUES[1].upper()}", "call +44 7700 900", f"ticket for {SUBJECT}"):
        refused = cli("erase", "--config", config, "--key", SUBJECT, "--yes", "--reason", reason)
        assert refused.returncode == 2 and "--reason" in refused.stderr, refused.stderr
        assert VALUES[1] not in refused.stderr.lower()
    assert erasure_log(lake.config).is_empty()
    assert files_holding(lake_files(lake), VALUES)  # nothing was erased
    # one key held, one not: the held one is erased, the other left out (not logged)
    both = cli("erase", "--config", config, "--key", SUBJECT, "--key", "C-404", "--yes",
               "--wait", "5s", "--output", "json")  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert json.loads(both.stdout)["unknown"] == 1
    assert erasure_log(lake.config).height == 2  # requested + completed, one subject
    assert files_holding(lake_files(lake), VALUES) == []


def test_what_arrives_after_or_beside_an_erasure(tmp_path: Path) -> None:
    """A late record of an erased subject that is quarantined (a bad operation, a broken line
    naming the key) keeps no personal data; a replay's shadow Silver is erased too; an e-mail
    a source put in a column not marked pii stays in both the column and the raw payload, so
    replay still verifies; the HTML report still renders after the vacuum."""
    lake = lake_with_subject(tmp_path)
    config = str(write_config(lake))
    lake.write(
        [
            ev("E8", SUBJECT, "UPDATE", 45, city=VALUES[1]),  # an e-mail in city
            # another customer's quarantined record that shares the subject's name
            ev("Q8", "C-8", "FROBNICATE", 46, customer_name=VALUES[0], email=OTHER["email"]),
        ]
    )
    lake.run()
    quarantine = "quarantine/customer_events"
    theirs = lake.table(quarantine).filter(pl.col("event_id") == "Q8")["raw_line"].to_list()
    rebuilt = cli("replay", "--config", config, "--verify")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    shadow = tmp_path / "lake" / "_shadow"
    assert files_holding([shadow], (VALUES[0],))  # the shadow holds the subject's name
    erase(lake.config, "customers", [SUBJECT], confirmed=True, reason="TICKET-2")
    assert files_holding([shadow], VALUES[:1] + VALUES[2:]) == []
    # the other customer's line is theirs: untouched, their e-mail and the shared name kept
    assert lake.table(quarantine).filter(pl.col("event_id") == "Q8")["raw_line"].to_list() == (
        theirs
    )
    assert lake.silver()[SUBJECT]["city"] == VALUES[1]  # not a pii column: kept
    replay = cli("replay", "--config", config, "--verify")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    report = cli("report", "--config", config, "--out", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    older = cli("as-of", "--config", config, "--version", "1")
    assert older.returncode == 1 and "time travel starts at version" in older.stderr, older.stderr
    late = ("late.bad@example.com", "broken.late@example.com", "padded.late@example.com")
    lake.write(
        [
            ev("L1", SUBJECT, "FROBNICATE", 70, email=late[0]),
            f'{{"event_id": "L2", "customer_id": "{SUBJECT}", "email": "{late[1]}", broken',
            f'{{"event_id": "L3", "customer_id": " {SUBJECT} ", "email": "{late[2]}", broken',
        ]
    )
    lake.run()
    table = lake.table("quarantine/customer_events")
    quarantined = table.filter(pl.col("batch_id") == table["batch_id"].max())
    assert quarantined.height == 3
    # the broken line (no key column was read from it) is replaced whole
    assert "[erased]" in quarantined["raw_line"].to_list()
    assert files_holding(lake_files(lake), late) == []
    log = erasure_log(lake.config)
    assert log.filter(pl.col("reason").str.starts_with("late event")).height == 2


def test_a_late_event_during_an_unfinished_erasure(tmp_path: Path) -> None:
    """The erasure is killed after Bronze; a micro-batch then brings the subject's new data:
    the batch finishes the unfinished request (same id and reason), the new values included;
    the re-run of the command writes nothing more."""
    lake = lake_with_subject(tmp_path)
    config = str(write_config(lake))
    killed = cli("erase", "--config", config, "--key", SUBJECT, "--yes", "--reason", "TICKET-3",
                 env={"CDCFLOW_CRASH_AT": "erase_after_bronze"})  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    new = ("Jane Meanwhile", "meanwhile@example.com")
    lake.write([ev("M1", SUBJECT, "UPDATE", 80, customer_name=new[0], email=new[1])])
    lake.run()
    assert files_holding(lake_files(lake), VALUES + new) == []
    log = erasure_log(lake.config)
    assert log["request_id"].n_unique() == 1 and set(log["reason"]) == {"TICKET-3"}
    assert sorted(log["status"].to_list()) == ["completed", "requested"]
    from deltalake import DeltaTable

    bronze = DeltaTable(lake.config.table_uri("bronze/customer_events"))
    version = bronze.version()
    again = cli("erase", "--config", config, "--key", SUBJECT, "--yes", "--output", "json")
    assert again.returncode == 0, again.stderr
    assert set(json.loads(again.stdout)["rows"].values()) == {0}
    assert DeltaTable(lake.config.table_uri("bronze/customer_events")).version() >= version


def test_an_erasure_during_a_replay_rebuild_leaves_no_shadow(tmp_path: Path) -> None:
    """``cdcflow replay`` takes no lock: an erasure that completes while it rebuilds makes the
    rebuild fail and empties the shadow tables it had written (whose buckets may hold the
    erased values)."""
    from cdcflow.engines.local.replay import rebuild_shadow

    lake = lake_with_subject(tmp_path)
    for n in range(40):  # more customers: several buckets
        lake.write([ev(f"X{n}", f"C-{100 + n}", "INSERT", 100 + n, **full(**OTHER))])
    lake.run()
    erased: list[int] = []

    def on_bucket(done: int, total: int) -> None:
        if done == 1:
            assert total > 1
            erase(lake.config, "customers", [SUBJECT], confirmed=True)
            erased.append(done)

    with pytest.raises(Exception):  # noqa: B017 (the erasure's vacuum may fail the read first)
        rebuild_shadow(lake.config, bucket_rows=5, on_bucket=on_bucket)
    assert erased
    assert files_holding([tmp_path / "lake" / "_shadow"], VALUES) == []
    assert files_holding(lake_files(lake), VALUES) == []


def test_a_replay_over_an_unfinished_erasure_leaves_no_shadow(tmp_path: Path) -> None:
    """An erasure requested before a replay's rebuild began, and still redacting while it
    reads Bronze (the window an attack hit: the rebuild saw no new log row and kept the
    subject's values in the shadow): an unfinished request fails the rebuild too, and the
    shadow is emptied; once the erasure is finished the replay runs."""
    from cdcflow.engines.local.replay import ReplayError, rebuild_shadow

    lake = lake_with_subject(tmp_path)
    config = write_config(lake)
    killed = cli("erase", "--config", str(config), "--key", SUBJECT, "--yes",
                 env={"CDCFLOW_CRASH_AT": "erase_after_log"})  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert files_holding(lake_files(lake), VALUES)  # requested, nothing redacted yet
    with pytest.raises(ReplayError, match="or one is unfinished"):
        rebuild_shadow(lake.config)
    assert files_holding([tmp_path / "lake" / "_shadow"], VALUES) == []
    again = cli("erase", "--config", str(config), "--key", SUBJECT, "--yes")
    assert again.returncode == 0, again.stderr[-2000:]
    result = rebuild_shadow(lake.config)
    assert result.silver_rows > 0
    assert files_holding([tmp_path / "lake" / "_shadow"], VALUES) == []


def declared_table(tmp_path: Path, columns: list[dict[str, Any]], keys: list[str]) -> Path:
    """A pipeline of one declared table ``t`` (flat records under ``landing/``): its config."""
    (tmp_path / "landing").mkdir(parents=True)
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump({"name": "t", "keys": keys, "columns": columns})
    )
    config = tmp_path / "cdcflow.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pipeline": {"name": "p"},
                "storage": {"root": str(tmp_path / "lake")},
                "source": {"type": "files", "format": "flat", "path": str(tmp_path / "landing")},
                "checkpoint": {"location": str(tmp_path / "lake" / "_checkpoints" / "p")},
                "tables": [str(tmp_path / "t.yaml")],
            }
        )
    )
    return config


def test_a_pii_column_read_from_another_field(tmp_path: Path) -> None:
    """``owner`` is read from the record field ``owner_name`` (``source:``) and a json column
    holds a nested key ``owner`` that is not personal data: erasure nulls ``owner_name`` in the
    raw payload and keeps the json column as it was, so a replay rebuilds the erased Silver."""
    config = declared_table(
        tmp_path,
        [
            {"name": "id", "type": "integer"},
            {"name": "owner", "type": "string", "pii": True, "source": "owner_name"},
            {"name": "attributes", "type": "json"},
        ],
        ["id"],
    )
    record = {
        "event_id": "e1", "operation": "INSERT", "event_timestamp": "2025-01-01T00:00:00Z",
        "id": 1, "owner_name": "Ann Secret", "attributes": {"owner": "team-x"},
        "metadata": {"lsn": "100", "source_table": "t"},
    }  # fmt: skip
    (tmp_path / "landing" / "f1.jsonl").write_text(json.dumps(record) + "\n")
    assert cli("run", "--config", str(config)).returncode == 0
    erased = cli("erase", "--config", str(config), "--table", "t", "--key", "1", "--yes")
    assert erased.returncode == 0, erased.stderr[-2000:]
    assert files_holding([tmp_path / "lake"], ("Ann Secret",)) == []
    verify = ("--table", "t", "--verify", "--key", "1", "--value", "Ann Secret")
    checked = cli("erase", "--config", str(config), *verify)
    assert checked.returncode == 0, checked.stdout[-2000:]
    replayed = cli("replay", "--config", str(config), "--verify")
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    silver = pl.read_delta(str(tmp_path / "lake" / "silver" / "t")).to_dicts()
    assert [(r["id"], r["owner"], json.loads(r["attributes"])) for r in silver] == [
        (1, None, {"owner": "team-x"})
    ]


def test_a_required_pii_column_and_a_pii_key(tmp_path: Path) -> None:
    """``owner`` is ``nullable: false`` and the key ``email`` is marked pii: erasure nulls
    ``owner`` and keeps the key; the replay takes the erased INSERT (its null owner is the
    erasure's, not the source's) and rebuilds the row with its other columns; a later event
    of the subject and another key's go on; a table whose only pii column is its key has
    nothing to erase (exit 2, nothing written)."""
    config = declared_table(
        tmp_path,
        [
            {"name": "email", "type": "string", "pii": True},
            {"name": "owner", "type": "string", "pii": True, "nullable": False},
            {"name": "city", "type": "string"},
        ],
        ["email"],
    )

    def record(event_id: str, operation: str, lsn: int, **fields: Any) -> str:
        return json.dumps(
            {
                "event_id": event_id, "operation": operation,
                "event_timestamp": "2025-01-01T00:00:00Z", **fields,
                "metadata": {"lsn": str(lsn), "source_table": "t"},
            }
        )  # fmt: skip

    landing = tmp_path / "landing"
    (landing / "f1.jsonl").write_text(
        record("e1", "INSERT", 100, email="ann@x.com", owner="Ann Secret", city="Paris")
        + "\n"
        + record("e2", "INSERT", 101, email="bob@x.com", owner="Bob Kept", city="Nice")
        + "\n"
    )
    assert cli("run", "--config", str(config)).returncode == 0
    erased = cli("erase", "--config", str(config), "--table", "t", "--key", "ann@x.com", "--yes")
    assert erased.returncode == 0, erased.stderr[-2000:]
    assert files_holding([tmp_path / "lake"], ("Ann Secret",)) == []
    (landing / "f2.jsonl").write_text(
        record("e3", "UPDATE", 200, email="ann@x.com", city="Lyon")
        + "\n"
        + record("e4", "INSERT", 201, email="cy@x.com", owner="Cy", city="Nantes")
        + "\n"
    )
    assert cli("run", "--config", str(config)).returncode == 0
    replayed = cli("replay", "--config", str(config), "--verify")
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    assert "0 rejected on replay" in replayed.stdout
    silver = pl.read_delta(str(tmp_path / "lake" / "silver" / "t")).sort("email")
    assert silver.select("email", "owner", "city").rows() == [
        ("ann@x.com", None, "Lyon"),
        ("bob@x.com", "Bob Kept", "Nice"),
        ("cy@x.com", "Cy", "Nantes"),
    ]

    only_key = declared_table(
        tmp_path / "only-key",
        [{"name": "email", "type": "string", "pii": True}, {"name": "city", "type": "string"}],
        ["email"],
    )
    (tmp_path / "only-key" / "landing" / "f1.jsonl").write_text(
        record("e1", "INSERT", 100, email="ann@x.com", city="Paris") + "\n"
    )
    assert cli("run", "--config", str(only_key)).returncode == 0
    refused = cli("erase", "--config", str(only_key), "--table", "t", "--key", "ann@x.com", "--yes")
    assert refused.returncode == 2, refused.stderr
    assert "only pii columns are key columns" in refused.stderr
    assert not (tmp_path / "only-key" / "lake" / "audit" / "erasure_log").exists()


def test_a_column_marked_pii_after_an_erasure_is_erased_too(tmp_path: Path) -> None:
    """A contract that marks more columns ``pii`` after an erasure (``nickname`` flagged, a
    ``phone`` column added for a field the records held all along): the next run erases the
    erased subjects again before it records the change (killed inside it, the next run
    finishes the same request), so no layer — Bronze's raw payloads
    included — keeps their values, and a ``replay --apply`` of Bronze brings none back (it
    brought the phone back into Silver); other subjects keep theirs."""
    from cdcflow.engines.local.contract_replay import apply_tables
    from cdcflow.layers.contract_replay import replay_tables
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import _declare_tables, rec, write_files
    from tests.test_tables_pipeline import rows as table_rows

    columns = [{"name": "account_id", "type": "integer"}, {"name": "owner", "pii": True},
               {"name": "nickname"}]  # fmt: skip
    v1 = {"name": "accounts", "keys": ["account_id"], "columns": columns}
    config = _declare_tables(tmp_path, [v1])
    write_files(config, [[
        json.dumps(rec("accounts", "a1", "INSERT", 1, account_id=7, owner="Ann Secret",
                       nickname="Annie Private", phone="+44 7700 900999")),
        json.dumps(rec("accounts", "a2", "INSERT", 2, account_id=8, owner="Bob Kept",
                       nickname="Bobby Kept", phone="+44 7700 900888")),
    ]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    erase(config, "accounts", ["7"], confirmed=True)
    lake = [tmp_path / "lake"]
    assert files_holding(lake, ("Ann Secret",)) == []
    # not pii in v1: kept (Silver, history, Bronze's column and raw payload)
    assert files_holding(lake, ("Annie Private", "+44 7700 900999"))

    flagged = [*columns[:2], {"name": "nickname", "pii": True}, {"name": "phone", "pii": True}]
    config = _declare_tables(tmp_path, [{**v1, "version": 2, "columns": flagged}])
    # killed inside that erasure: the change is not recorded yet, the next run finishes it
    killed = cli("run", "--config", config.file, env={"CDCFLOW_CRASH_AT": "erase_after_bronze"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    engine_changes = Pipeline(config).engine.schema_changes
    assert "table accounts: 1 erased subject(s) erased again for the columns now marked pii" in (
        engine_changes
    )
    assert files_holding(lake, ("Annie Private", "+44 7700 900999")) == []
    assert files_holding(lake, ("Bobby Kept",)) and files_holding(lake, ("+44 7700 900888",))
    reasons = erasure_log(config).filter(pl.col("status") == "completed")["reason"].to_list()
    assert reasons.count("contract v2 marks more columns pii") == 1
    # the change is recorded: the next run erases nothing again
    Pipeline(config).run(Trigger.parse("available-now"))
    assert len(erasure_log(config)) == 4  # two requests (the killed one finished), 2 rows each

    replays = replay_tables(config)
    apply_tables(config, replays)
    rebuilt = {r["account_id"]: r for r in table_rows(config, "silver/accounts")}
    assert rebuilt[8]["phone"] == "+44 7700 900888"  # the replay reads the field from Bronze
    assert (rebuilt[7]["owner"], rebuilt[7]["nickname"], rebuilt[7]["phone"]) == (None,) * 3
    assert files_holding(lake, ("Ann Secret", "Annie Private", "+44 7700 900999")) == []


def test_a_subject_whose_key_is_a_word_of_the_late_event_reason(tmp_path: Path) -> None:
    """The reason cdcflow records for a late event of an erased subject is its own text, not
    checked for personal data: a subject keyed ``eve`` (a word of "late event of an erased
    subject") stopped every run that brought a late event of it."""
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import _declare_tables, rec, write_files

    users = {"name": "users", "keys": ["user_id"], "columns": [
        {"name": "user_id"}, {"name": "full_name", "pii": True}]}  # fmt: skip
    config = _declare_tables(tmp_path, [users])
    write_files(config, [[json.dumps(rec("users", "u1", "INSERT", 1, user_id="eve",
                                         full_name="Eve Secret"))]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    erase(config, "users", ["eve"], confirmed=True)
    write_files(config, [[json.dumps(rec("users", "u2", "UPDATE", 2, user_id="eve",
                                         full_name="Eve Late"))]])  # fmt: skip
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert [r.batch_id for r in reports] == [1]
    assert files_holding([tmp_path / "lake"], ("Eve Secret", "Eve Late")) == []
    reasons = erasure_log(config).filter(pl.col("status") == "completed")["reason"].to_list()
    assert "late event of an erased subject (micro-batch 1)" in reasons
