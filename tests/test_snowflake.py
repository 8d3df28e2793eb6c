"""Snowflake sync against the fakesnow emulator's HTTP server (real connector, real connection)."""

from __future__ import annotations

import itertools
import json
import os
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from cdcflow.config import SnowflakeSection
from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import ConfigError
from cdcflow.plan.reference import SILVER_COLUMNS
from cdcflow.sinks.snowflake.connection import connect
from cdcflow.sinks.snowflake.faults import (
    BULK_POINTS,
    ENV_VAR,
    SYNC_POINTS,
    InjectedSyncFailure,
)
from cdcflow.sinks.snowflake.reconcile import read_state, reconcile_snowflake
from cdcflow.sinks.snowflake.settings import SnowflakeCredentials
from cdcflow.sinks.snowflake.sync import NEVER_SYNCED, sync_snowflake
from tests.conftest import Lake, ev, full

_db_numbers = itertools.count()


def _attach(lake: Lake, **settings: Any) -> Lake:
    """Point the lake's config at a fresh database of the session's emulator."""
    lake.config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:", **settings
    )
    return lake


@pytest.fixture
def sf_lake(tmp_path: Path, emulator: dict[str, Any]) -> Lake:
    return _attach(Lake(tmp_path / "soft"))


@pytest.fixture
def sf_hard_lake(tmp_path: Path, emulator: dict[str, Any]) -> Lake:
    return _attach(Lake(tmp_path / "hard", mode="hard"))


def first_batch(lake: Lake) -> None:
    lake.write(
        [
            ev("e1", "C-1", "INSERT", 10, **full()),
            ev("e2", "C-2", "INSERT", 11, **full(email=None, city="Pune")),
            ev("e3", "C-3", "INSERT", 12, **full(status="INACTIVE")),
            ev("e4", "C-4", "INSERT", 13, **full(country="Nepal")),
            ev("e5", "C-1", "UPDATE", 14, city="Mysuru"),
            ev("e6", "C-5", "INSERT", 15, **full()),
        ]
    )
    lake.run()


def second_batch(lake: Lake) -> None:
    lake.write(
        [
            ev("e7", "C-2", "UPDATE", 20, email="new@example.com"),
            ev("e8", "C-4", "DELETE", 21),
            ev("e9", "C-6", "INSERT", 22, **full(city="Delhi")),
            ev("e5", "C-1", "UPDATE", 14, city="Mysuru"),  # re-delivery: changes nothing
        ]
    )
    lake.run()


def dim_rows(lake: Lake) -> dict[str, dict[str, Any]]:
    """DIM_CUSTOMER_CURRENT as customer_id → row (timestamps as epoch microseconds)."""
    with connect(lake.config) as conn:
        cur = conn.cursor()
        cur.execute(
            "SELECT CUSTOMER_ID, CITY, EMAIL, STATUS, IS_DELETED, IS_ACTIVE, SYNCED_VERSION, "
            "DATE_PART(EPOCH_MICROSECOND, DELETED_AT) FROM DIM_CUSTOMER_CURRENT"
        )
        names = ["customer_id", "city", "email", "status", "is_deleted", "is_active", "v", "del"]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def state_version(lake: Lake) -> int | None:
    with connect(lake.config) as conn:
        row = (
            conn.cursor()
            .execute(
                "SELECT DELTA_VERSION FROM CDC_SYNC_STATE WHERE TARGET_TABLE = %s",
                ("DIM_CUSTOMER_CURRENT",),
            )
            .fetchone()
        )
    assert row is not None  # the sync creates the state row first
    return None if int(row[0]) == NEVER_SYNCED else int(row[0])


@pytest.mark.parametrize("method", ["bind", "bulk"])
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_dim_matches_silver_after_stream(
    tmp_path: Path, emulator: dict[str, Any], mode: str, method: str
) -> None:
    """Both load paths (row binding; Parquet files PUT to a stage and COPY INTO the stage
    table) give the same DIM."""
    lake = _attach(Lake(tmp_path / mode, mode=mode), load_method=method)
    first_batch(lake)
    second_batch(lake)
    report = sync_snowflake(lake.config)
    assert report.dim.kind == "full"  # bootstrap
    assert report.dim.load_method == method

    silver = lake.silver()
    assert silver == lake.expected().rows  # the pipeline itself is right
    dim = dim_rows(lake)
    assert set(dim) == set(silver)
    for key, row in silver.items():
        for col in ("city", "email", "status", "is_deleted", "is_active"):
            assert dim[key][col] == row[col], (key, col)
    if mode == "soft":
        assert dim["C-4"]["is_deleted"] is True and dim["C-4"]["status"] == "DELETED"
        assert dim["C-4"]["del"] is not None
    else:
        assert "C-4" not in dim
    assert dim["C-2"]["email"] == "new@example.com"

    result = reconcile_snowflake(lake.config)
    assert result.equal, result.log_fields()
    assert result.dim.target_rows == len(silver)
    assert result.target_active == sum(r["is_active"] for r in silver.values())
    assert result.synced_version == result.silver_version


def test_resync_changes_nothing(sf_lake: Lake) -> None:
    first_batch(sf_lake)
    sync_snowflake(sf_lake.config)
    before = dim_rows(sf_lake)

    again = sync_snowflake(sf_lake.config)
    assert again.dim.kind == "noop"
    refresh = sync_snowflake(sf_lake.config, full=True)
    assert refresh.dim.kind == "full"
    assert (refresh.dim.inserted, refresh.dim.updated, refresh.dim.deleted) == (0, 0, 0)
    assert dim_rows(sf_lake) == before
    assert reconcile_snowflake(sf_lake.config).equal


def test_incremental_sync_applies_only_the_changes(sf_hard_lake: Lake) -> None:
    lake = sf_hard_lake
    first_batch(lake)
    first = sync_snowflake(lake.config)
    v1 = first.dim.to_version
    second_batch(lake)
    report = sync_snowflake(lake.config).dim
    assert report.kind == "incremental" and report.from_version == v1
    # C-2 updated, C-4 hard-deleted, C-6 inserted; the re-delivery of e5 changes nothing
    assert report.staged == 3
    assert (report.inserted, report.updated, report.deleted) == (1, 1, 1)
    dim = dim_rows(lake)
    assert {k: r["v"] for k, r in dim.items()} == {
        "C-1": v1,
        "C-2": report.to_version,
        "C-3": v1,
        "C-5": v1,
        "C-6": report.to_version,
    }
    assert reconcile_snowflake(lake.config).equal


@pytest.mark.parametrize(
    ("method", "point"),
    [
        (m, p) if p in ("after_state", "after_copy") else pytest.param(m, p, marks=pytest.mark.slow)
        for m, points in (("bind", SYNC_POINTS), ("bulk", (*BULK_POINTS, *SYNC_POINTS)))
        for p in points
    ],
)
def test_failure_between_steps_recovers(sf_lake: Lake, method: str, point: str) -> None:
    sf_lake.config.snowflake.load_method = method  # type: ignore[assignment]
    first_batch(sf_lake)
    v1 = sync_snowflake(sf_lake.config).dim.to_version
    before = dim_rows(sf_lake)
    second_batch(sf_lake)

    with pytest.raises(InjectedSyncFailure):
        sync_snowflake(sf_lake.config, fail_at=point)
    if point == "after_commit":  # DIM committed; the Gold copies had not started
        assert state_version(sf_lake) == v1 + 1
        committed = reconcile_snowflake(sf_lake.config)
        assert committed.dim.equal and committed.silver_hash == committed.target_hash
    else:  # rolled back: neither the target nor the state moved
        assert state_version(sf_lake) == v1
        assert dim_rows(sf_lake) == before
        assert not reconcile_snowflake(sf_lake.config).equal

    retry = sync_snowflake(sf_lake.config).dim
    assert retry.kind == ("noop" if point == "after_commit" else "incremental")
    result = reconcile_snowflake(sf_lake.config)
    assert result.equal, result.log_fields()
    assert sync_snowflake(sf_lake.config).dim.kind == "noop"


def test_failure_injected_by_env_var(sf_lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    first_batch(sf_lake)
    monkeypatch.setenv(ENV_VAR, "after_state")
    with pytest.raises(InjectedSyncFailure):
        sync_snowflake(sf_lake.config)
    assert state_version(sf_lake) is None  # the bootstrap's state upsert was rolled back
    assert dim_rows(sf_lake) == {}
    monkeypatch.delenv(ENV_VAR)
    sync_snowflake(sf_lake.config)
    assert reconcile_snowflake(sf_lake.config).equal


def test_reconcile_reports_drift_and_full_refresh_repairs(sf_lake: Lake) -> None:
    first_batch(sf_lake)
    sync_snowflake(sf_lake.config)
    with connect(sf_lake.config) as conn:
        cur = conn.cursor()
        cur.execute("UPDATE DIM_CUSTOMER_CURRENT SET CITY = 'X' WHERE CUSTOMER_ID = 'C-1'")
        cur.execute("DELETE FROM DIM_CUSTOMER_CURRENT WHERE CUSTOMER_ID = 'C-3'")
        cur.execute(
            "INSERT INTO DIM_CUSTOMER_CURRENT (CUSTOMER_ID, IS_DELETED, IS_ACTIVE, SYNCED_VERSION)"
            " VALUES ('C-99', FALSE, TRUE, 0)"
        )
    drift = reconcile_snowflake(sf_lake.config)
    assert not drift.equal
    assert (drift.dim.missing, drift.dim.extra, drift.dim.mismatched) == (1, 1, 1)
    assert drift.dim.mismatched_columns == {"city": 1}
    assert set(drift.dim.sample_keys) == {"C-1", "C-3", "C-99"}
    assert drift.silver_hash != drift.target_hash

    assert sync_snowflake(sf_lake.config).dim.kind == "noop"  # incremental cannot see drift
    repair = sync_snowflake(sf_lake.config, full=True).dim
    assert (repair.inserted, repair.updated, repair.deleted) == (1, 1, 1)
    assert reconcile_snowflake(sf_lake.config).equal


@pytest.mark.parametrize("method", ["bind", "bulk"])
def test_gold_tables_equal_agg_tables(sf_lake: Lake, method: str) -> None:
    sf_lake.config.snowflake.load_method = method  # type: ignore[assignment]
    first_batch(sf_lake)
    second_batch(sf_lake)
    report = sync_snowflake(sf_lake.config)
    gold_targets = {t.target: t for t in report.tables[1:]}
    assert {t.load_method for t in report.tables} == {method}
    if not DeltaTable.is_deltatable(sf_lake.config.table_uri("gold/daily_customer_metrics")):
        pytest.fail("the pipeline wrote no Gold tables")
    assert "AGG_CUSTOMER_METRICS" in gold_targets
    result = reconcile_snowflake(sf_lake.config)
    assert result.gold and all(g.equal for g in result.gold), [
        (g.target, g.missing, g.extra) for g in result.gold
    ]
    status = read_arrow(DeltaTable(sf_lake.config.table_uri("gold/status_distribution")))
    with connect(sf_lake.config) as conn:
        count = conn.cursor().execute("SELECT COUNT(*) FROM AGG_STATUS_DISTRIBUTION").fetchone()
    assert count is not None and count[0] == status.num_rows
    # unchanged Gold versions are not copied again
    assert {t.kind for t in sync_snowflake(sf_lake.config).tables[1:]} == {"noop"}


@pytest.mark.slow
def test_inline_mode_syncs_after_each_batch(tmp_path: Path, emulator: dict[str, Any]) -> None:
    lake = _attach(Lake(tmp_path / "inline", mode="hard"), mode="inline")
    first_batch(lake)
    assert reconcile_snowflake(lake.config).equal
    second_batch(lake)
    assert reconcile_snowflake(lake.config).equal
    sync_log = lake.table("audit/snowflake_sync")
    log = sync_log.filter(sync_log["target_table"] == "DIM_CUSTOMER_CURRENT").sort("batch_id")
    assert log["batch_id"].to_list() == [0, 1]
    assert log["kind"].to_list() == ["full", "incremental"]
    assert all(lag is not None and lag >= 0 for lag in log["lag_s"].to_list())
    batch_log = lake.table("audit/batch_log").sort("batch_id")
    lags = batch_log["snowflake_sync_lag_s"].to_list()
    assert len(lags) == 2 and all(lag is not None and lag >= 0 for lag in lags)


def test_read_state_is_shaped_like_silver(sf_lake: Lake) -> None:
    first_batch(sf_lake)
    second_batch(sf_lake)
    sync_snowflake(sf_lake.config)
    frame = read_state(sf_lake.config).sort("customer_id")
    silver = sf_lake.table("silver/customers").select(SILVER_COLUMNS).sort("customer_id")
    assert frame.columns == list(SILVER_COLUMNS)
    assert frame.to_dicts() == silver.to_dicts()


def standalone_config(lake: Lake, folder: Path, *snowflake: str) -> Path:
    """``folder``/cdcflow.yaml: ``lake``'s pipeline with a standalone Snowflake sync to an
    in-memory emulator of the command's own (``snowflake``: more keys of that section)."""
    config = folder / "cdcflow.yaml"
    section = ", ".join(
        ["mode: standalone", *snowflake, "emulator: 'on'", "emulator_path: ':memory:'"]
    )
    config.write_text(
        f"storage: {{root: '{lake.config.storage.root}'}}\n"
        f"source: {{path: '{lake.config.source.path}'}}\n"
        f"checkpoint: {{location: '{lake.config.checkpoint.location}'}}\n"
        f"snowflake: {{{section}}}\n"
    )
    return config


def test_cli_sync_verify(sf_lake: Lake, tmp_path: Path) -> None:
    from cdcflow.cli.app import app

    first_batch(sf_lake)
    config = standalone_config(sf_lake, tmp_path, f"database: {sf_lake.config.snowflake.database}")
    result = CliRunner().invoke(app, ["sync", "snowflake", "--config", str(config), "--verify"])
    assert result.exit_code == 0, result.output
    assert "snowflake reconciliation: EQUAL" in result.output
    with connect(sf_lake.config) as conn:
        conn.cursor().execute("DELETE FROM DIM_CUSTOMER_CURRENT WHERE CUSTOMER_ID = 'C-1'")
    result = CliRunner().invoke(app, ["sync", "snowflake", "--config", str(config), "--verify"])
    assert result.exit_code == 1, result.output
    assert "DIFFERENT" in result.output


def test_continuous_sync_prints_a_table_only_when_something_changed(
    sf_lake: Lake, tmp_path: Path
) -> None:
    """``sync snowflake --continuous`` prints its table after the first sync and after each
    sync that changed something; a quiet round prints nothing (a new-user trial saw the same
    table every 10 s). SIGINT stops it cleanly."""
    import signal
    import subprocess
    import sys
    import time

    first_batch(sf_lake)
    config = standalone_config(sf_lake, tmp_path)
    out = tmp_path / "sync.out"
    command = [sys.executable, "-m", "cdcflow", "sync", "snowflake", "--config", str(config),
               "--continuous", "--interval", "100ms"]  # fmt: skip
    tables = lambda: out.read_text().count("Snowflake sync (")  # noqa: E731

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 120
        while tables() < count:
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)

    with out.open("w") as stdout:
        proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(1)
            time.sleep(3)  # about twenty quiet rounds
            assert tables() == 1, out.read_text()
            second_batch(sf_lake)  # a micro-batch: the next round(s) change Snowflake
            wait_for(2)
            time.sleep(2)  # a round may have taken Silver's commit, the next one Gold's
            changed = tables()
            assert changed in (2, 3), out.read_text()
            time.sleep(3)  # quiet again
            assert tables() == changed, out.read_text()
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
    assert code == 0, out.read_text()


def test_credentials_only_from_env_and_secret_files(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    assert SnowflakeCredentials.from_env({}) is None
    with pytest.raises(ConfigError, match="authentication"):
        SnowflakeCredentials.from_env({"SNOWFLAKE_ACCOUNT": "acme", "SNOWFLAKE_USER": "etl"})
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t-value\n")
    creds = SnowflakeCredentials.from_env(
        {
            "SNOWFLAKE_ACCOUNT": "acme",
            "SNOWFLAKE_USER": "etl",
            "SNOWFLAKE_ROLE": "LOADER",
            "SNOWFLAKE_PASSWORD_FILE": str(secret),
        }
    )
    assert creds is not None
    assert "s3cr3t" not in repr(creds)
    assert creds.connect_kwargs()["password"] == "s3cr3t-value"
    assert creds.connect_kwargs()["role"] == "LOADER"

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "key.p8"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter2-pass"),
        )
    )
    env = {
        "SNOWFLAKE_ACCOUNT": "acme",
        "SNOWFLAKE_USER": "etl",
        "SNOWFLAKE_PRIVATE_KEY_FILE": str(pem),
        "SNOWFLAKE_PRIVATE_KEY_PASSPHRASE": "hunter2-pass",
    }
    creds = SnowflakeCredentials.from_env(env)
    assert creds is not None and "hunter2" not in repr(creds)
    der = creds.connect_kwargs()["private_key"]
    assert isinstance(der, bytes) and "password" not in creds.connect_kwargs()
    loaded = serialization.load_der_private_key(der, password=None)
    assert loaded.private_numbers() == key.private_numbers()  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="passphrase"):
        SnowflakeCredentials.from_env(
            {**env, "SNOWFLAKE_PRIVATE_KEY_PASSPHRASE": "wrong"}
        ).connect_kwargs()  # type: ignore[union-attr]


@pytest.mark.parametrize("method", ["bind", "bulk"])
def test_declared_tables_sync_to_their_tables_with_mapped_types(
    tmp_path: Path, emulator: dict[str, Any], method: str
) -> None:
    """Each declared table → its Snowflake table (``<NAME>_CURRENT``), keyed on its key
    columns (a composite key too), typed from the contract; incremental after the first sync."""
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.sinks.snowflake.reconcile import reconcile_target
    from cdcflow.sinks.snowflake.tables import contract_target
    from tests.test_tables_pipeline import rec, write_config, write_files

    config = write_config(tmp_path, mode="hard")
    config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}",
        emulator="on",
        emulator_path=":memory:",
        load_method=method,
    )
    row = {"owner": "Ann", "balance": "12.50", "opened_on": "2024-02-29", "vip": True}
    line = {"sku": "ABC-1", "quantity": 2, "attributes": {"gift": True, "tags": ["a"]}}
    write_files(
        config,
        [
            [
                json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1, **row)),
                json.dumps(rec("accounts", "A2", "INSERT", 11, account_id=2, rate=0.25)),
                json.dumps(rec("order_lines", "L1", "INSERT", 12, order_id="O", line_no=1, **line)),
                json.dumps(rec("order_lines", "L2", "INSERT", 13, order_id="O", line_no=2, **line)),
            ]
        ],
    )
    Pipeline(config).run(Trigger.parse("available-now"))
    first = sync_snowflake(config)
    assert [(t.target, t.kind) for t in first.tables] == [
        ("ACCOUNTS_CURRENT", "full"),
        ("ORDER_LINES_CURRENT", "full"),
    ]
    targets = [contract_target(c) for c in config.contracts()]
    assert all(reconcile_target(config, t).equal for t in targets)
    with connect(config) as conn:
        cur = conn.cursor()
        cur.execute("SELECT BALANCE, OPENED_ON, VIP FROM ACCOUNTS_CURRENT WHERE ACCOUNT_ID = 1")
        assert cur.fetchone() == (Decimal("12.50"), date(2024, 2, 29), True)
        cur.execute("SELECT ATTRIBUTES:gift, LINE_NO FROM ORDER_LINES_CURRENT WHERE LINE_NO = 2")
        gift, line_no = cur.fetchone()
        assert json.loads(str(gift)) is True and line_no == 2

    # an update, a hard delete of one line of a composite key: applied incrementally
    write_files(
        config,
        [
            [
                json.dumps(rec("accounts", "A3", "UPDATE", 20, account_id=1, balance="99.99")),
                json.dumps(rec("order_lines", "L3", "DELETE", 21, order_id="O", line_no=1)),
            ]
        ],
    )
    Pipeline(config).run(Trigger.parse("available-now"))
    second = sync_snowflake(config)
    assert [(t.kind, t.updated, t.deleted) for t in second.tables] == [
        ("incremental", 1, 0),
        ("incremental", 0, 1),
    ]
    assert all(reconcile_target(config, t).equal for t in targets)
    with connect(config) as conn:
        cur = conn.cursor()
        cur.execute("SELECT LINE_NO FROM ORDER_LINES_CURRENT")
        assert [r[0] for r in cur.fetchall()] == [2]
    # drift is found
    with connect(config) as conn:
        conn.cursor().execute("UPDATE ACCOUNTS_CURRENT SET OWNER = 'Zed' WHERE ACCOUNT_ID = 1")
    drift = reconcile_target(config, targets[0])
    assert not drift.equal and drift.mismatched_columns == {"owner": 1}


def test_declared_tables_sync_inline_after_each_batch(
    tmp_path: Path, emulator: dict[str, Any]
) -> None:
    """``snowflake.mode: inline`` with declared tables: after each micro-batch every table's
    Snowflake table equals its Silver; the lag of each sync is logged, the largest in
    ``audit/batch_log``."""
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.sinks.snowflake.reconcile import reconcile_target
    from cdcflow.sinks.snowflake.tables import contract_target
    from tests.test_tables_pipeline import rec, rows, write_config, write_files

    config = write_config(tmp_path, mode="hard")
    config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:", mode="inline"
    )
    targets = [contract_target(c) for c in config.contracts()]
    batches = [
        [
            rec("accounts", "A1", "INSERT", 10, account_id=1, owner="Ann", balance="1.50"),
            rec("order_lines", "L1", "INSERT", 11, order_id="O", line_no=1, quantity=2),
        ],
        [
            rec("accounts", "A2", "UPDATE", 20, account_id=1, balance="2.25"),
            rec("order_lines", "L2", "DELETE", 21, order_id="O", line_no=1),
        ],
    ]
    for batch in batches:
        write_files(config, [[json.dumps(r) for r in batch]])
        assert len(Pipeline(config).run(Trigger.parse("available-now"))) == 1
        assert all(reconcile_target(config, t).equal for t in targets)
    log = sorted(
        rows(config, "audit/snowflake_sync"), key=lambda r: (r["batch_id"], r["target_table"])
    )
    assert [(r["batch_id"], r["target_table"], r["kind"]) for r in log] == [
        (0, "ACCOUNTS_CURRENT", "full"),
        (0, "ORDER_LINES_CURRENT", "full"),
        (1, "ACCOUNTS_CURRENT", "incremental"),
        (1, "ORDER_LINES_CURRENT", "incremental"),
    ]
    batch_log = sorted(rows(config, "audit/batch_log"), key=lambda r: r["batch_id"])
    for batch_id, logged in enumerate(batch_log):
        lags = [r["lag_s"] for r in log if r["batch_id"] == batch_id]
        assert logged["snowflake_sync_lag_s"] == max(lags)


def test_an_evolved_column_is_added_to_the_snowflake_table(
    tmp_path: Path, emulator: dict[str, Any]
) -> None:
    """``unknown_fields: evolve``: a field first seen after the first sync becomes a Silver
    column, then ``ALTER TABLE … ADD COLUMN`` on the Snowflake table (and its stage), filled by
    the next sync on both load paths."""
    import yaml

    from cdcflow.layers.contract_replay import held_contracts
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.sinks.snowflake.reconcile import reconcile_target
    from cdcflow.sinks.snowflake.tables import contract_target
    from tests.test_tables_pipeline import rec, write_config, write_files

    config = write_config(tmp_path)
    raw = yaml.safe_load(Path(config.file).read_text())
    raw["tables"][0]["unknown_fields"] = "evolve"
    Path(config.file).write_text(yaml.safe_dump(raw, sort_keys=False))
    from cdcflow.config import load_config

    config = load_config(config.file)
    config.snowflake = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:"
    )
    write_files(config, [[json.dumps(rec("accounts", "A1", "INSERT", 10, account_id=1))]])
    Pipeline(config).run(Trigger.parse("available-now"))
    sync_snowflake(config)
    for method, i in (("bind", 2), ("bulk", 3)):
        config.snowflake.load_method = method  # type: ignore[assignment]
        event = rec("accounts", f"A{i}", "INSERT", 10 + i, account_id=i, nickname=f"n{i}")
        write_files(config, [[json.dumps(event)]])
        Pipeline(config).run(Trigger.parse("available-now"))
        sync_snowflake(config)
        targets = [contract_target(c) for c in held_contracts(config)]
        assert all(reconcile_target(config, t).equal for t in targets), method
    with connect(config) as conn:
        cur = conn.cursor()
        cur.execute("SELECT ACCOUNT_ID, NICKNAME FROM ACCOUNTS_CURRENT ORDER BY ACCOUNT_ID")
        assert cur.fetchall() == [(1, None), (2, "n2"), (3, "n3")]


def test_every_sync_is_recorded_with_its_event_lag_and_status_shows_it(
    tmp_path: Path, emulator: dict[str, Any]
) -> None:
    """``cdcflow sync snowflake`` (once, then ``--continuous`` until SIGINT) records each sync
    in ``audit/snowflake_sync`` with its mode; an incremental sync's event lag (source event
    time → Snowflake commit) is the median and 95th percentile over the rows it upserted;
    ``cdcflow status`` shows the latest figures (text and JSON)."""
    import os
    import signal
    import threading

    import yaml

    from cdcflow.cli.app import app
    from cdcflow.config import load_config
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import rec, rows, write_config, write_files

    config = write_config(tmp_path)
    raw = yaml.safe_load(Path(config.file).read_text())
    raw["snowflake"] = {"mode": "standalone", "database": f"TEST_{next(_db_numbers)}",
                        "emulator": "on", "emulator_path": ":memory:"}  # fmt: skip
    Path(config.file).write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(config.file)
    cli = ["--config", str(config.file)]
    write_files(config, [[json.dumps(rec("accounts", "A0", "INSERT", 1, account_id=9))]])
    Pipeline(config).run(Trigger.parse("available-now"))
    result = CliRunner().invoke(app, ["sync", "snowflake", *cli])
    assert result.exit_code == 0, result.output
    # three accounts changed 2, 5 and 10 minutes before: an incremental sync's lags follow
    write_files(
        config,
        [[json.dumps(rec("accounts", f"A{m}", "INSERT", 10 + m, minutes_ago=m, account_id=m))
          for m in (2, 5, 10)]],
    )  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    result = CliRunner().invoke(app, ["sync", "snowflake", *cli])
    assert result.exit_code == 0, result.output
    log = sorted(rows(config, "audit/snowflake_sync"), key=lambda r: r["synced_at"])
    accounts = [r for r in log if r["target_table"] == "ACCOUNTS_CURRENT"]
    assert [(r["mode"], r["kind"]) for r in accounts] == [("once", "full"), ("once", "incremental")]
    assert accounts[0]["event_lag_p50_s"] is None  # a full sync measures no event lag
    p50, p95 = accounts[1]["event_lag_p50_s"], accounts[1]["event_lag_p95_s"]
    from tests.test_tables_pipeline import NOW

    base = (accounts[1]["synced_at"] - NOW).total_seconds()  # the events' times are NOW-based
    assert abs(p50 - (base + 300)) < 1 and abs(p95 - (base + 600)) < 1
    # --continuous: the first sync (a full one) then noop syncs until SIGINT
    timer = threading.Timer(4.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    result = CliRunner().invoke(
        app, ["sync", "snowflake", *cli, "--continuous", "--full", "--interval", "500ms"]
    )
    timer.join()
    assert result.exit_code == 0, result.output
    modes = [r["mode"] for r in rows(config, "audit/snowflake_sync")]
    assert modes.count("continuous") == 2  # both tables' full syncs; noop syncs not recorded
    result = CliRunner().invoke(app, ["status", *cli, "--output", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["batches"] == 2 and found["last_batch"]["accepted"] == 3
    shown = {s["target"]: s for s in found["snowflake"]}
    assert shown["ACCOUNTS_CURRENT"]["syncs"] == 3
    assert shown["ACCOUNTS_CURRENT"]["last_mode"] == "continuous"
    assert shown["ACCOUNTS_CURRENT"]["event_lag_p50_s"] == pytest.approx(p50)
    assert shown["ACCOUNTS_CURRENT"]["recent_event_lag_p95_s"] == pytest.approx(p95)
    text = CliRunner().invoke(app, ["status", *cli])
    assert text.exit_code == 0 and "ACCOUNTS" in text.output, text.output
    assert "2 micro-batches" in text.output


def test_the_command_removes_the_emulators_stage_folder(sf_lake: Lake, tmp_path: Path) -> None:
    """fakesnow makes a stage folder (``fakesnow_bucket_*``) in the temporary folder of every
    process that imports it and never removes it; a ``cdcflow`` command removes its own."""
    import subprocess
    import sys

    first_batch(sf_lake)
    config = standalone_config(sf_lake, tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "cdcflow", "sync", "snowflake", "--config", str(config), "--verify"],
        env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "snowflake reconciliation: EQUAL" in done.stdout + done.stderr
    assert not list(temp.glob("fakesnow_bucket_*"))


def test_a_widened_decimal_and_a_composite_key_of_text_with_the_separator(
    tmp_path: Path, emulator: dict[str, Any]
) -> None:
    """A contract that widens ``bal`` from decimal(10,2) to decimal(12,3) after a sync: the
    next sync rebuilds the Snowflake table with NUMBER(12,3) and refreshes it from Silver, so
    1.255 is not stored as 1.26 (an attack found the old type kept, every later value rounded
    and ``--verify`` the only sign). And ``--verify`` tells the composite keys ("x|y", "z")
    and ("x", "y|z") apart (joined by "|" they were one key: a lost row went unnoticed)."""
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.sinks.snowflake.reconcile import reconcile_target
    from cdcflow.sinks.snowflake.tables import contract_target
    from tests.test_tables_pipeline import _declare_tables, rec, write_files

    columns = [{"name": "id", "type": "integer"}, {"name": "bal", "type": "decimal(10,2)"}]
    acc = {"name": "acc", "keys": ["id"], "columns": columns}
    ext = {"name": "ext", "keys": ["k1", "k2"], "columns": [{"name": "k1"}, {"name": "k2"},
                                                            {"name": "note"}]}  # fmt: skip
    section = SnowflakeSection(
        database=f"TEST_{next(_db_numbers)}", emulator="on", emulator_path=":memory:"
    )
    config = _declare_tables(tmp_path, [acc, ext])
    config.snowflake = section
    write_files(config, [[
        json.dumps(rec("acc", "a1", "INSERT", 1, id=1, bal="1.25")),
        *(json.dumps(rec("ext", f"x{i}", "INSERT", 2 + i, k1=k1, k2=k2, note="n"))
          for i, (k1, k2) in enumerate([("x|y", "z"), ("x", "y|z"), ("p", "q")])),
    ]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    sync_snowflake(config)
    with connect(config) as conn:
        conn.cursor().execute("DELETE FROM EXT_CURRENT WHERE K1 = 'x|y' AND K2 = 'z'")
    lost = reconcile_target(config, contract_target(config.contracts()[1]))
    assert not lost.equal and lost.missing == 1

    widened = [columns[0], {"name": "bal", "type": "decimal(12,3)"}]
    config = _declare_tables(tmp_path, [{**acc, "version": 2, "columns": widened}, ext])
    config.snowflake = section
    write_files(config, [[
        json.dumps(rec("acc", "a2", "UPDATE", 10, id=1, bal="1.255")),
        json.dumps(rec("acc", "a3", "INSERT", 11, id=2, bal="0.004")),
    ]])  # fmt: skip
    Pipeline(config).run(Trigger.parse("available-now"))
    report = sync_snowflake(config)
    assert [t.kind for t in report.tables] == ["full", "noop"]  # acc rebuilt
    with connect(config) as conn:
        cur = conn.cursor()
        cur.execute("SELECT ID, BAL FROM ACC_CURRENT ORDER BY ID")
        assert cur.fetchall() == [(1, Decimal("1.255")), (2, Decimal("0.004"))]
        cur.execute(
            "SELECT NUMERIC_PRECISION, NUMERIC_SCALE FROM INFORMATION_SCHEMA.COLUMNS "
            "WHERE TABLE_NAME = 'ACC_CURRENT' AND COLUMN_NAME = 'BAL'"
        )
        assert cur.fetchone() == (12, 3)
    assert reconcile_target(config, contract_target(config.contracts()[0])).equal
    sync_snowflake(config, full=True)  # the lost row back
    assert reconcile_target(config, contract_target(config.contracts()[1])).equal
    again = sync_snowflake(config)
    assert [t.kind for t in again.tables] == ["noop", "noop"]
