"""Debezium and AWS DMS record formats (``source.format``): decoding and the pipeline.

The fixtures are written here after the Debezium documentation (PostgreSQL, MySQL and SQL
Server connectors: "Data change events", "Data type mappings") and the AWS DMS User Guide
(Kafka/Kinesis target message format; S3 target ``Op`` column, ``AR_H_CHANGE_SEQ``): every
op, every logical type the decoder reads, schemas on and off, tombstones, the unavailable-value
placeholder, binlog position order, and a DMS full-load + CDC mix. Through the pipeline, a
shuffled, re-delivered Debezium stream of two tables gives each table's reference fold, and
every line lands exactly once in Bronze, a quarantine or ``audit/skipped_records``.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import ConfigError
from cdcflow.model.contracts import TableContract
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator, TruncateEvent
from cdcflow.plan.reference import fold_changes
from cdcflow.plan.routing import Router
from cdcflow.plan.rules import Rejection
from cdcflow.sources.formats import Skipped
from cdcflow.sources.formats.debezium import UNAVAILABLE, DebeziumDecoder
from cdcflow.sources.formats.dms import DmsDecoder

NOW = datetime.now(UTC).replace(microsecond=0)
TS_MS = int((NOW - timedelta(minutes=10)).timestamp() * 1000)

ACCOUNTS = TableContract.model_validate(
    {
        "name": "accounts",
        "keys": ["account_id"],
        "columns": [
            {"name": "account_id", "type": "integer"},
            {"name": "owner", "type": "string", "pii": True},
            {"name": "balance", "type": "decimal(12,2)"},
            {"name": "opened_on", "type": "date"},
            {"name": "closed_at", "type": "timestamp"},
            {"name": "profile", "type": "json"},
        ],
    }
)
ORDERS = TableContract.model_validate(
    {
        "name": "orders",
        "keys": ["order_id"],
        "columns": [
            {"name": "order_id", "type": "string"},
            {"name": "amount", "type": "decimal(10,3)"},
            {"name": "placed_at", "type": "timestamp"},
        ],
    }
)


def validate(flat: Any, contract: TableContract = ACCOUNTS) -> ChangeEvent | Rejection:
    """The validated event of a decoded record (a decoder's rejection as it is)."""
    if isinstance(flat, Rejection):
        return flat
    assert isinstance(flat, dict), flat
    return ContractValidator(contract, NOW, timedelta(minutes=5)).validate_object(flat)


# ----------------------------------------------------------------------------- Debezium
def decimal_b64(value: str, scale: int) -> str:
    """Connect's Decimal: the unscaled value, two's-complement big-endian, base64."""
    unscaled = int(Decimal(value).scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


ACCOUNT_FIELDS = [
    {"type": "int64", "optional": False, "field": "account_id"},
    {"type": "string", "optional": True, "field": "owner"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "12"},
        "field": "balance",
    },
    {
        "type": "int32",
        "optional": True,
        "name": "io.debezium.time.Date",
        "version": 1,
        "field": "opened_on",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
        "field": "closed_at",
    },
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "profile"},
]


def pg_source(lsn: int, last_commit: int | None = None, table: str = "accounts") -> dict:
    source = {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "shop",
        "ts_ms": TS_MS + lsn,
        "snapshot": "false",
        "db": "shop",
        "schema": "public",
        "table": table,
        "txId": 700 + lsn,
        "lsn": lsn,
        "xmin": None,
    }
    if last_commit is not None:
        source["sequence"] = json.dumps([str(last_commit), str(lsn)])
    return source


def dbz(
    op: str,
    after: dict | None,
    before: dict | None = None,
    *,
    lsn: int,
    schema: bool = True,
    last_commit: int | None = None,
    table: str = "accounts",
    fields: list[dict] | None = None,
) -> dict:
    """A Debezium PostgreSQL change-event value (JsonConverter, schemas on or off)."""
    payload = {
        "before": before,
        "after": after,
        "source": pg_source(lsn, last_commit, table),
        "op": op,
        "ts_ms": TS_MS + lsn + 5,
        "transaction": None,
    }
    if not schema:
        return payload
    row = {"type": "struct", "fields": fields or ACCOUNT_FIELDS, "optional": True}
    value_schema = {
        "type": "struct",
        "name": f"shop.public.{table}.Envelope",
        "fields": [
            {**row, "name": f"shop.public.{table}.Value", "field": "before"},
            {**row, "name": f"shop.public.{table}.Value", "field": "after"},
            {"type": "struct", "fields": [], "name": "io.debezium.connector.postgresql.Source",
             "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }  # fmt: skip
    return {"schema": value_schema, "payload": payload}


OPENED = date(2024, 2, 29)
CLOSED = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def account_row(account_id: int, owner: str | None = "Ann", balance: str = "1234.50") -> dict:
    return {
        "account_id": account_id,
        "owner": owner,
        "balance": decimal_b64(balance, 2),
        "opened_on": (OPENED - date(1970, 1, 1)).days,
        "closed_at": int(CLOSED.timestamp()) * 1_000_000 + CLOSED.microsecond,
        "profile": '{"tier": "gold", "limits": [1, 2.5]}',
    }


@pytest.mark.parametrize("schema", [True, False], ids=["schemas.enable", "no-schema"])
def test_debezium_create_decodes_every_logical_type(schema: bool) -> None:
    value = dbz("c", account_row(7), lsn=1000, schema=schema)
    event = validate(DebeziumDecoder().decode(value, ACCOUNTS))
    assert isinstance(event, ChangeEvent), event
    assert event.key == (7,)
    assert event.operation.value == "INSERT"
    assert event.values == {
        "owner": "Ann",
        "balance": Decimal("1234.50"),
        "opened_on": OPENED,
        "closed_at": CLOSED,
        "profile": '{"limits":[1,2.5],"tier":"gold"}',
    }
    assert event.event_timestamp == datetime.fromtimestamp((TS_MS + 1000) / 1000, UTC)
    assert event.lsn_number == 1000 << 64


def test_debezium_negative_decimal_and_variable_scale() -> None:
    fields = [
        {"type": "string", "optional": False, "field": "order_id"},
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "field": "amount",
         "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]},
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp", "field": "placed_at"},
    ]  # fmt: skip
    nanos = 1_700_000_000_123_456_789
    after = {
        "order_id": "O-1",
        "amount": {"scale": 3, "value": decimal_b64("-12.345", 3)},
        "placed_at": nanos,
    }
    value = dbz("c", after, lsn=5, table="orders", fields=fields)
    event = validate(DebeziumDecoder().decode(value, ORDERS), ORDERS)
    assert isinstance(event, ChangeEvent), event
    assert event.values["amount"] == Decimal("-12.345")
    assert event.values["placed_at"] == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    # the schemaless Decimal of a decimal(10,3) column: base64 at the contract's scale
    bare = dbz("c", {**after, "amount": decimal_b64("-0.5", 3)}, lsn=6, schema=False,
               table="orders")  # fmt: skip
    event = validate(DebeziumDecoder().decode(bare, ORDERS), ORDERS)
    assert isinstance(event, ChangeEvent), event
    assert event.values["amount"] == Decimal("-0.500")


def test_debezium_update_delete_read_and_partial_toast() -> None:
    decoder = DebeziumDecoder()
    read = validate(decoder.decode(dbz("r", account_row(1), lsn=10), ACCOUNTS))
    assert isinstance(read, ChangeEvent) and read.operation.value == "INSERT"
    after = {
        **account_row(1),
        "owner": UNAVAILABLE,
        "balance": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==",
    }
    update = validate(decoder.decode(dbz("u", after, lsn=20), ACCOUNTS))
    assert isinstance(update, ChangeEvent) and update.operation.value == "UPDATE"
    assert "owner" not in update.values and "balance" not in update.values  # unchanged
    assert update.values["opened_on"] == OPENED
    delete = validate(decoder.decode(dbz("d", None, {"account_id": 1, "owner": None}, lsn=30),
                                     ACCOUNTS))  # fmt: skip
    assert isinstance(delete, ChangeEvent) and delete.operation.value == "DELETE"
    assert delete.key == (1,) and delete.values == {}
    assert read.sequence < update.sequence < delete.sequence


def test_debezium_tombstones_truncates_and_bad_events() -> None:
    decoder = DebeziumDecoder()
    assert decoder.decode(None, ACCOUNTS) == Skipped(
        "tombstone", decoder.decode(None, ACCOUNTS).detail
    )  # type: ignore[union-attr]
    assert isinstance(decoder.decode({"schema": None, "payload": None}, ACCOUNTS), Skipped)
    truncate = dbz("t", None, lsn=40)
    got = decoder.decode(truncate, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "SOURCE_TRUNCATE"
    skipped = DebeziumDecoder(truncate="ignore").decode(truncate, ACCOUNTS)
    assert isinstance(skipped, Skipped) and skipped.kind == "truncate"
    bad_op = dbz("x", account_row(1), lsn=41)
    got = decoder.decode(bad_op, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "INVALID_OPERATION"
    got = decoder.decode({"id": 1, "name": "Ann"}, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "MALFORMED_JSON"
    assert "Ann" not in got.detail
    no_lsn = dbz("c", account_row(1), lsn=42)
    del no_lsn["payload"]["source"]["lsn"]
    event = validate(decoder.decode(no_lsn, ACCOUNTS))
    assert isinstance(event, Rejection) and event.reason == "NULL_LSN"
    oracle = dbz("c", account_row(1), lsn=43)
    oracle["payload"]["source"]["connector"] = "oracle"
    got = decoder.decode(oracle, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "INVALID_LSN"


def test_debezium_redelivery_is_an_exact_duplicate_and_ids_are_distinct() -> None:
    decoder = DebeziumDecoder()
    one = validate(decoder.decode(dbz("c", account_row(1), lsn=10), ACCOUNTS))
    again = validate(decoder.decode(dbz("c", account_row(1), lsn=10, schema=False), ACCOUNTS))
    assert isinstance(one, ChangeEvent) and isinstance(again, ChangeEvent)
    assert (one.event_id, one.content_hash) == (again.event_id, again.content_hash)
    # snapshot rows share a position: the key keeps their ids apart
    a = validate(decoder.decode(dbz("r", account_row(1), lsn=5), ACCOUNTS))
    b = validate(decoder.decode(dbz("r", account_row(2), lsn=5), ACCOUNTS))
    assert isinstance(a, ChangeEvent) and isinstance(b, ChangeEvent)
    assert a.event_id != b.event_id


def test_debezium_postgres_orders_by_lsn_with_or_without_sequence() -> None:
    """A row's changes are ordered by their own LSN (one open transaction changes a row at a
    time); ``source.sequence``'s last commit LSN only breaks ties, so events with and without
    it compare alike."""
    decoder = DebeziumDecoder()
    old = validate(decoder.decode(dbz("u", account_row(1, owner="old"), lsn=100), ACCOUNTS))
    new = validate(
        decoder.decode(dbz("u", account_row(1, owner="new"), lsn=200, last_commit=0), ACCOUNTS)
    )
    newer = validate(
        decoder.decode(dbz("u", account_row(1, owner="x"), lsn=300, last_commit=250), ACCOUNTS)
    )
    assert isinstance(old, ChangeEvent) and isinstance(new, ChangeEvent)
    assert isinstance(newer, ChangeEvent)
    assert old.sequence < new.sequence < newer.sequence
    state = fold_changes([newer, old, new], ACCOUNTS, "soft").rows
    assert state[(1,)]["owner"] == "x"


def test_debezium_bad_values_are_rejections_that_quote_nothing() -> None:
    decoder = DebeziumDecoder()
    secret = "Ann SECRET"
    connector = dbz("c", account_row(1), lsn=5)
    connector["payload"]["source"]["connector"] = secret
    got = decoder.decode(connector, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "INVALID_LSN"
    assert secret not in got.detail
    arabic = dbz("c", account_row(1), lsn=5)
    arabic["payload"]["source"]["sequence"] = '["\u0661\u0662", "2"]'
    got = decoder.decode(arabic, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "INVALID_LSN"
    # a value its logical type cannot decode is rejected, never stored as text
    undecodable = dbz("c", {**account_row(1), "balance": "not base64!"}, lsn=6)
    got = decoder.decode(undecodable, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "SCHEMA_MISMATCH"
    assert "balance" in got.detail and "not base64" not in got.detail
    # a source column with the name of a field of the flat record cannot be carried
    clash = dbz("c", {**account_row(1), "operation": "refund"}, lsn=7, schema=False)
    got = decoder.decode(clash, ACCOUNTS)
    assert isinstance(got, Rejection) and got.reason == "SCHEMA_MISMATCH"
    assert "refund" not in got.detail
    # a JSON text nested deeper than a record may be: a rejection, not a crash
    deep = dbz("c", {**account_row(1), "profile": "[" * 400 + "]" * 400}, lsn=8)
    got = validate(decoder.decode(deep, ACCOUNTS))
    assert isinstance(got, Rejection) and got.reason == "MALFORMED_JSON"


def mysql(file: str, pos: int, row: int = 0, **extra: Any) -> dict:
    source = {"connector": "mysql", "db": "shop", "table": "accounts", "file": file,
              "pos": pos, "row": row, "ts_ms": TS_MS, "server_id": 1, **extra}  # fmt: skip
    return {"op": "u", "before": None, "after": {"account_id": 1, "owner": f"{file}{pos}"},
            "source": source, "ts_ms": TS_MS}  # fmt: skip


def test_mysql_binlog_positions_compare_as_numbers_part_by_part() -> None:
    decoder = DebeziumDecoder()
    order = [
        mysql("mysql-bin.000009", 99_999),
        mysql("mysql-bin.000010", 4),
        mysql("mysql-bin.000010", 99),
        mysql("mysql-bin.000010", 123),
        mysql("mysql-bin.000010", 123, row=1),
        mysql("mysql-bin.000010", 123, row=10),
        mysql("mysql-bin.000100", 4),
    ]
    events = [validate(decoder.decode(v, ACCOUNTS)) for v in order]
    assert all(isinstance(e, ChangeEvent) for e in events), events
    sequences = [e.sequence for e in events]  # type: ignore[union-attr]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_sqlserver_change_lsn_then_event_serial_no() -> None:
    decoder = DebeziumDecoder()

    def ss(change: str | None, serial: int, commit: str = "00000027:00000758:0005") -> Any:
        source = {"connector": "sqlserver", "schema": "dbo", "table": "accounts",
                  "change_lsn": change, "commit_lsn": commit, "event_serial_no": serial,
                  "ts_ms": TS_MS}  # fmt: skip
        return {"op": "u", "after": {"account_id": 1}, "source": source}

    snapshot = validate(decoder.decode(ss(None, 0, "00000027:00000700:0001"), ACCOUNTS))
    first = validate(decoder.decode(ss("00000027:00000758:0003", 1), ACCOUNTS))
    second = validate(decoder.decode(ss("00000027:00000758:0003", 2), ACCOUNTS))
    later = validate(decoder.decode(ss("00000028:00000010:0001", 1, "00000028:00000010:0002"),
                                    ACCOUNTS))  # fmt: skip
    events = [snapshot, first, second, later]
    assert all(isinstance(e, ChangeEvent) for e in events), events
    sequences = [e.sequence for e in events]  # type: ignore[union-attr]
    assert sequences == sorted(sequences) and len(set(sequences)) == 4
    # a transaction open during a snapshot: its change LSN is below the snapshot's, its commit
    # after it, so it wins over the snapshot row; a change committed before the snapshot loses
    snap = validate(decoder.decode(ss(None, 0, "00000025:00000500:0001"), ACCOUNTS))
    open_tx = validate(decoder.decode(ss("00000025:00000480:0002", 2, "00000025:00000520:0003"),
                                      ACCOUNTS))  # fmt: skip
    before = validate(decoder.decode(ss("00000025:00000400:0002", 1, "00000025:00000490:0003"),
                                     ACCOUNTS))  # fmt: skip
    in_tx = [validate(decoder.decode(ss(f"00000025:00000{n}:0001", 1, "00000025:00000520:0003"),
                                     ACCOUNTS)) for n in (501, 510, 519)]  # fmt: skip
    assert all(isinstance(e, ChangeEvent) for e in (snap, open_tx, before, *in_tx))
    assert before.sequence < snap.sequence < open_tx.sequence  # type: ignore[union-attr]
    assert [e.sequence for e in in_tx] == sorted(e.sequence for e in in_tx)  # type: ignore[union-attr]
    # a change after its commit is no position
    bad = validate(decoder.decode(ss("00000026:00000001:0001", 1, "00000025:00000520:0003"),
                                  ACCOUNTS))  # fmt: skip
    assert isinstance(bad, Rejection) and bad.reason == "INVALID_LSN"


# ----------------------------------------------------------------------------- AWS DMS
def dms_message(operation: str, data: dict, ts: str, **meta: Any) -> dict:
    metadata = {"timestamp": ts, "record-type": "data", "operation": operation,
                "partition-key-type": "primary-key", "schema-name": "public",
                "table-name": "accounts", **meta}  # fmt: skip
    return {"data": data, "metadata": metadata}


def test_dms_messages_full_load_orders_before_every_change() -> None:
    decoder = DmsDecoder()
    change_ts = (NOW - timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    load_ts = (NOW - timedelta(minutes=30)).isoformat().replace("+00:00", "Z")  # loaded later
    tx = {"transaction-id": 77}
    new = {"account_id": 1, "owner": "New"}
    update = dms_message("update", new, change_ts, **tx, **{"transaction-record-id": 2})
    load = dms_message("load", {"account_id": 1, "owner": "Old"}, load_ts)
    delete = dms_message("delete", new, change_ts, **tx, **{"transaction-record-id": 3})
    update, load, delete = (validate(decoder.decode(v, ACCOUNTS)) for v in (update, load, delete))
    assert isinstance(load, ChangeEvent) and isinstance(update, ChangeEvent)
    assert isinstance(delete, ChangeEvent)
    assert load.sequence < update.sequence < delete.sequence
    assert update.event_id == "dms-00000000000000000077-0000000002"
    assert delete.values == {}
    state = fold_changes([update, delete, load], ACCOUNTS, "soft").rows
    assert state[(1,)]["is_deleted"] is True
    control = {"data": {}, "metadata": {"record-type": "control", "operation": "create-table",
                                       "table-name": "accounts"}}  # fmt: skip
    assert isinstance(decoder.decode(control, ACCOUNTS), Skipped)
    bad = decoder.decode(dms_message("merge", {"account_id": 1}, change_ts), ACCOUNTS)
    assert isinstance(bad, Rejection) and bad.reason == "INVALID_OPERATION"


def test_dms_flat_rows_op_and_a_35_digit_change_sequence() -> None:
    decoder = DmsDecoder()
    stamp = (NOW - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    low = "2024050110000000000000000000000099"  # fewer digits: a smaller number
    high = "20240501100000000000000000000000100"
    load = validate(decoder.decode({"account_id": 1, "owner": "Old"}, ACCOUNTS))
    u_high = validate(decoder.decode({"Op": "U", "account_id": 1, "owner": "B",
                                      "AR_H_CHANGE_SEQ": high, "AR_H_TIMESTAMP": stamp},
                                     ACCOUNTS))  # fmt: skip
    u_low = validate(decoder.decode({"Op": "U", "account_id": 1, "owner": "A",
                                     "AR_H_CHANGE_SEQ": low, "AR_H_TIMESTAMP": stamp},
                                    ACCOUNTS))  # fmt: skip
    events = [load, u_low, u_high]
    assert all(isinstance(e, ChangeEvent) for e in events), events
    assert load.sequence < u_low.sequence < u_high.sequence  # type: ignore[union-attr]
    assert "AR_H_CHANGE_SEQ" not in u_low.values  # type: ignore[union-attr]
    state = fold_changes([u_high, load, u_low], ACCOUNTS, "soft").rows  # type: ignore[list-item]
    assert state[(1,)]["owner"] == "B"
    missing = validate(decoder.decode({"Op": "D", "account_id": 1, "AR_H_TIMESTAMP": stamp},
                                      ACCOUNTS))  # fmt: skip
    assert isinstance(missing, Rejection) and missing.reason == "NULL_LSN"


def test_a_dms_row_is_the_whole_row_a_left_out_column_is_null() -> None:
    """DMS leaves NULL columns out of its records (``IncludeNullAndEmpty`` is false by
    default): an UPDATE without ``owner`` set it to NULL at the source, and Silver must say so
    (an attack found the old value kept, as if the record were a partial update). Both
    flavours; a DELETE still carries the key only."""
    decoder = DmsDecoder()
    ts = (NOW - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    insert = dms_message("insert", {"account_id": 1, "owner": "Ann", "balance": "5.00"}, ts,
                         **{"transaction-id": 1, "transaction-record-id": 1})  # fmt: skip
    update = dms_message("update", {"account_id": 1, "balance": "6.00"}, ts,
                         **{"transaction-id": 2, "transaction-record-id": 1})  # fmt: skip
    events = [validate(decoder.decode(v, ACCOUNTS)) for v in (insert, update)]
    assert all(isinstance(e, ChangeEvent) for e in events), events
    assert events[1].values["owner"] is None  # type: ignore[union-attr]
    state = fold_changes(events, ACCOUNTS, "soft").rows  # type: ignore[arg-type]
    assert (state[(1,)]["owner"], state[(1,)]["balance"]) == (None, Decimal("6.00"))
    stamp = (NOW - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    flat = [
        {"Op": "I", "account_id": 2, "owner": "Bo", "AR_H_CHANGE_SEQ": "10",
         "AR_H_TIMESTAMP": stamp},
        {"Op": "U", "account_id": 2, "balance": "1.00", "AR_H_CHANGE_SEQ": "11",
         "AR_H_TIMESTAMP": stamp},
    ]  # fmt: skip
    flat_events = [validate(decoder.decode(v, ACCOUNTS)) for v in flat]
    state = fold_changes(flat_events, ACCOUNTS, "soft").rows  # type: ignore[arg-type]
    assert (state[(2,)]["owner"], state[(2,)]["balance"]) == (None, Decimal("1.00"))
    delete = validate(decoder.decode(dms_message("delete", {"account_id": 1}, ts), ACCOUNTS))
    assert isinstance(delete, ChangeEvent) and delete.values == {}


def test_control_records_are_skipped_whatever_table_they_name() -> None:
    """A DMS control message has ``control`` and no ``data``; a PostgreSQL logical decoding
    message (Debezium ``op: m``) names no table: both are skipped, never quarantined as
    ``UNKNOWN_TABLE`` (an attack found both in ``quarantine/unrouted_events``), on a file
    source and on Kafka; a control record of a declared table keeps it as the skip's table."""

    def dms_control(table: str) -> dict:
        metadata = {"timestamp": NOW.isoformat(), "record-type": "control",
                    "operation": "create-table", "partition-key-type": "task-id",
                    "schema-name": "public", "table-name": table}  # fmt: skip
        return {"control": {"table-def": {}}, "metadata": metadata}

    dms = Router([ACCOUNTS.model_copy(update={"format": "dms"})], "dms")
    for table, kept in (("accounts", "accounts"), ("awsdms_status", None)):
        route = dms.route(json.dumps(dms_control(table)).encode())
        assert route.skipped is not None and route.skipped.kind == "control", route
        assert route.table == kept and route.rejection is None
    message = dbz("m", None, lsn=500, table="")
    message["payload"]["message"] = {"prefix": "audit", "content": "Y29udGVudA=="}
    debezium = Router([ACCOUNTS], "debezium")
    route = debezium.route(json.dumps(message).encode())
    assert route.skipped is not None and route.skipped.kind == "control", route
    kafka = Router([ACCOUNTS], "debezium", topic_tables={})
    line = json.dumps({"_kafka": {"topic": "shop.message"}, "value": message}).encode()
    route = kafka.route(line)
    assert route.skipped is not None and route.rejection is None and route.table is None
    # a record of an undeclared table is still unrouted
    other = debezium.route(json.dumps(dbz("c", {"account_id": 1}, lsn=9, table="x")).encode())
    assert other.rejection is not None and other.rejection.reason == "UNKNOWN_TABLE"


def test_a_dms_flat_change_without_a_sequence_has_an_id_of_its_own() -> None:
    """A flat change without ``AR_H_CHANGE_SEQ`` is ``NULL_LSN``, with an event id of its own
    (was ``dms-None``, shared by every such record)."""
    decoder = DmsDecoder()
    stamp = (NOW - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    ids = []
    for n in (1, 2):
        record = {"Op": "U", "account_id": n, "owner": "X", "AR_H_TIMESTAMP": stamp}
        flat = decoder.decode(record, ACCOUNTS)
        assert isinstance(flat, dict)
        ids.append(flat["event_id"])
        rejected = validate(flat)
        assert isinstance(rejected, Rejection) and rejected.reason == "NULL_LSN"
    assert ids[0] != ids[1] and all(i.startswith("dms-") and "None" not in i for i in ids)


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_an_applied_truncate_deletes_every_key_with_an_earlier_event(mode: str) -> None:
    """``truncate: apply``: the truncate at LSN 200 deletes keys 1 and 2 (events before it),
    whatever arrives after it: key 2's late update below it still ends deleted; key 3's event
    above it is untouched; key 1 revives by an insert above it."""
    contract = ACCOUNTS.model_copy(update={"truncate": "apply", "delete_mode": mode})
    decoder = DebeziumDecoder(truncate="apply")
    flat = decoder.decode(dbz("t", None, lsn=200), contract)
    assert isinstance(flat, dict) and flat["operation"] == "TRUNCATE"
    truncate = validate(flat, contract)
    assert isinstance(truncate, TruncateEvent) and truncate.lsn_number >> 64 == 200
    assert truncate.event_id == validate(flat, contract).event_id  # redelivery: same id
    events = [
        validate(decoder.decode(dbz("c", account_row(1), lsn=100), contract), contract),
        validate(decoder.decode(dbz("c", account_row(2), lsn=110), contract), contract),
        truncate,
        validate(decoder.decode(dbz("c", account_row(3, owner="Cy"), lsn=300), contract),
                 contract),
        validate(decoder.decode(dbz("u", account_row(2, owner="Late"), lsn=150), contract),
                 contract),
        validate(decoder.decode(dbz("c", account_row(1, owner="Again"), lsn=400), contract),
                 contract),
    ]  # fmt: skip
    state = fold_changes(events, contract, mode)
    assert state.rows[(3,)]["owner"] == "Cy" and state.rows[(3,)]["is_deleted"] is False
    assert state.rows[(1,)]["owner"] == "Again" and state.rows[(1,)]["is_deleted"] is False
    if mode == "soft":
        two = state.rows[(2,)]
        assert two["is_deleted"] is True and two["owner"] == "Late"  # updated, then truncated
        assert two["last_event_id"] == truncate.event_id and two["last_lsn"] == truncate.lsn
    else:
        assert (2,) not in state.rows and state.tombstones[(2,)] == truncate.sequence
        assert state.tombstones[(1,)] == truncate.sequence
        assert (3,) not in state.tombstones
    # a flat record says TRUNCATE too; under the default policy it is quarantined as what it
    # is (SOURCE_TRUNCATE, as a Debezium op t), not as a record without a key
    record = {"event_id": "T1", "operation": "truncate", "event_timestamp": NOW.isoformat(),
              "metadata": {"lsn": 5}}  # fmt: skip
    assert isinstance(validate(record, contract), TruncateEvent)
    rejected = validate(record, ACCOUNTS)
    assert isinstance(rejected, Rejection) and rejected.reason == "SOURCE_TRUNCATE"
    assert rejected.event_id == "T1"
    no_lsn = validate({**record, "metadata": {}}, contract)
    assert isinstance(no_lsn, Rejection) and no_lsn.reason == "NULL_LSN"


# ----------------------------------------------------------------------------- config
def test_a_decoding_format_needs_declared_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"source": {"format": "debezium"}}))
    with pytest.raises(ConfigError, match=r"source\.format"):
        load_config(path)


# ----------------------------------------------------------------------------- pipeline
TABLES = [
    ACCOUNTS.model_dump(mode="json", exclude_defaults=True),
    {**ORDERS.model_dump(mode="json", exclude_defaults=True), "truncate": "ignore"},
]


def write_config(root: Path, mode: str = "soft", truncate: str = "quarantine") -> CdcflowConfig:
    """Both Debezium tables in ``mode``; ``truncate``: the accounts table's truncate policy
    (orders: ``ignore``)."""
    tables = [{**t, "delete_mode": mode} for t in TABLES]
    if truncate != "quarantine":
        tables[0]["truncate"] = truncate
    raw = {
        "pipeline": {"name": "dbz"},
        "storage": {"root": str(root / "lake")},
        "source": {"path": str(root / "landing"), "format": "debezium",
                   "max_files_per_trigger": 1},
        "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "dbz")},
        "tables": tables,
    }  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "landing").mkdir(exist_ok=True)
    path = root / "cdcflow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path)


ORDER_FIELDS = [
    {"type": "string", "optional": False, "field": "order_id"},
    {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "3"}, "field": "amount"},
    {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "placed_at"},
]  # fmt: skip


@st.composite
def debezium_stream(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    """Debezium values of two tables (with and without schema), tombstones after deletes,
    truncates, bad events, re-deliveries; shuffled and cut into files."""
    lines: list[str] = []
    for i in range(draw(st.integers(1, 20))):
        lsn = 100 + i * 10 + draw(st.integers(0, 3))
        schema = draw(st.booleans())
        table = draw(st.sampled_from(["accounts", "orders", "nowhere"]))
        op = draw(st.sampled_from(["c", "u", "u", "d", "r", "t"]))
        if table == "orders":
            key = {"order_id": draw(st.sampled_from(["O-1", "O-2"]))}
            amount = decimal_b64(draw(st.sampled_from(["1.5", "-2.125"])), 3)
            placed = draw(st.sampled_from(["2024-01-01T00:00:00Z", UNAVAILABLE]))
            row = {**key, "amount": amount, "placed_at": placed}
            fields = ORDER_FIELDS
        else:
            key = {"account_id": draw(st.sampled_from([1, 2, 3]))}
            owner = draw(st.sampled_from(["A", None, UNAVAILABLE]))
            row = account_row(key["account_id"], owner=owner)
            fields = ACCOUNT_FIELDS
        value = dbz(op, None if op == "d" else row, key if op == "d" else None, lsn=lsn,
                    schema=schema, table=table, fields=fields)  # fmt: skip
        line = json.dumps(value)
        lines.append(line)
        if op == "d":
            lines.append("null")  # the Kafka tombstone after a delete
        if draw(st.integers(0, 4)) == 0:
            lines.append(line)  # a re-delivery
    if draw(st.booleans()):
        lines.append('{"not": "debezium"}')
    order = draw(st.permutations(range(len(lines))))
    shuffled = [lines[i] for i in order]
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(shuffled) - 1)), max_size=3)))
    return shuffled, cuts


def table_rows(config: CdcflowConfig, name: str) -> list[dict[str, Any]]:
    return read_arrow(DeltaTable(config.table_uri(name))).to_pylist()


def expected_state(config: CdcflowConfig, lines: list[str], contract: TableContract) -> dict:
    """The reference fold of the first valid copy of each event of ``contract``'s table."""
    router = Router(config.contracts(), "debezium")
    validator = ContractValidator(contract, NOW + timedelta(hours=1), timedelta(minutes=5))
    first: dict[str, ChangeEvent | TruncateEvent] = {}
    for line in lines:
        route = router.route(line.encode())
        if route.table != contract.name or route.record is None:
            continue
        event = validator.validate_object(route.record)
        if isinstance(event, ChangeEvent | TruncateEvent):
            first.setdefault(event.event_id, event)
    return fold_changes(list(first.values()), contract, contract.delete_mode).rows


@pytest.mark.parametrize(
    ("mode", "truncate"), [("soft", "quarantine"), ("hard", "apply"), ("soft", "apply")]
)
@settings(max_examples=int(os.environ.get("CDCFLOW_EXAMPLES", "6")), deadline=None)
@given(data=debezium_stream())
def test_debezium_streams_match_the_reference_fold(
    tmp_path_factory: pytest.TempPathFactory,
    mode: str,
    truncate: str,
    data: tuple[list[str], list[int]],
) -> None:
    lines, cuts = data
    config = write_config(tmp_path_factory.mktemp("dbz"), mode, truncate)
    bounds = [0, *cuts, len(lines)]
    files = [lines[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    landing = Path(config.source.path)
    for i, chunk in enumerate(files):
        path = landing / f"{i:04d}.jsonl"
        path.write_text("".join(line + "\n" for line in chunk))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    Pipeline(config).run(Trigger.parse("available-now"))
    for contract in config.contracts():
        want = expected_state(config, lines, contract)
        got = {
            tuple(r[k] for k in contract.keys): r
            for r in table_rows(config, contract.table_names.silver)
        }
        assert set(got) == set(want), contract.name
        for key, row in want.items():
            assert {c: got[key][c] for c in row} == row, (contract.name, key)
    # every line exactly once: Bronze, a quarantine, or a skipped record
    seen = []
    for name in (
        "bronze/accounts_events",
        "bronze/orders_events",
        "quarantine/accounts_events",
        "quarantine/orders_events",
        "quarantine/unrouted_events",
        "audit/skipped_records",
        *(["audit/source_truncates"] if truncate == "apply" else []),
    ):
        seen += [(Path(r["source_file"]).name, r["source_line"]) for r in table_rows(config, name)]
    expected = [
        (f"{i:04d}.jsonl", n) for i, chunk in enumerate(files) for n in range(1, len(chunk) + 1)
    ]
    assert sorted(seen) == sorted(expected)
    skipped = table_rows(config, "audit/skipped_records")
    assert sum(r["kind"] == "tombstone" for r in skipped) == lines.count("null")

    def truncates(table: str) -> int:
        return sum(1 for x in lines if '"op": "t"' in x and f'"table": "{table}"' in x)

    quarantined = [r["failure_reason"] for r in table_rows(config, "quarantine/accounts_events")]
    if truncate == "apply":
        applied = [r["table_name"] for r in table_rows(config, "audit/source_truncates")]
        assert applied == ["accounts"] * truncates("accounts")
        assert "SOURCE_TRUNCATE" not in quarantined
    else:
        assert quarantined.count("SOURCE_TRUNCATE") == truncates("accounts")
    assert sum(r["kind"] == "truncate" for r in skipped) == truncates("orders")  # truncate: ignore


def test_a_debezium_landing_file_end_to_end_with_replay(tmp_path: Path) -> None:
    from cdcflow.layers.contract_replay import replay_tables

    config = write_config(tmp_path)
    toast = {**account_row(1, owner=UNAVAILABLE), "balance": decimal_b64("99.99", 2)}
    created = json.dumps(dbz("c", account_row(1), lsn=100))
    lines = [
        json.dumps(dbz("r", account_row(2, owner="Bo"), lsn=50, schema=False)),
        json.dumps(dbz("u", toast, lsn=200)),  # arrives before its create
        created,
        created,  # a re-delivery
        json.dumps(dbz("d", None, {"account_id": 2}, lsn=300)),
        "null",  # its tombstone
    ]
    (Path(config.source.path) / "0000.jsonl").write_text("\n".join(lines) + "\n")
    Pipeline(config).run(Trigger.parse("available-now"))
    rows = {r["account_id"]: r for r in table_rows(config, "silver/accounts")}
    assert rows[1]["owner"] == "Ann"  # the TOASTed owner kept from the create
    assert rows[1]["balance"] == Decimal("99.99") and rows[1]["is_deleted"] is False
    assert rows[1]["profile"] == '{"limits":[1,2.5],"tier":"gold"}'
    assert rows[2]["owner"] == "Bo" and rows[2]["is_deleted"] is True
    bronze = table_rows(config, "bronze/accounts_events")
    assert len(bronze) == 5 and sum(r["is_duplicate"] for r in bronze) == 1
    assert json.loads(bronze[0]["raw_payload"])  # Bronze keeps the delivered value
    [skipped] = table_rows(config, "audit/skipped_records")
    assert (skipped["kind"], skipped["source_line"], skipped["table_name"]) == (
        "tombstone",
        6,
        None,
    )
    [replay] = [r for r in replay_tables(config) if r.table == "accounts"]
    assert replay.report is not None and replay.report.ok and replay.silver_rows == 2


def dbz_files(seed: int) -> list[list[str]]:
    """A fixed Debezium workload of both tables (for the engines' conformance test): creates,
    updates with TOAST placeholders, deletes and their tombstones, a truncate of each table,
    an event of no declared table, re-deliveries; shuffled and cut into five files."""
    import random

    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(60):
        lsn = 1000 + 10 * i
        table = rng.choice(["accounts", "accounts", "orders", "nowhere"])
        op = rng.choice(["c", "u", "u", "d", "r"])
        truncated = {30: "accounts", 45: "orders"}.get(i)  # a truncate of each table
        if truncated:
            table, op = truncated, "t"
        if table == "orders":
            key: dict[str, Any] = {"order_id": rng.choice(["O-1", "O-2", "O-3"])}
            row = {**key, "amount": decimal_b64(rng.choice(["1.5", "-2.125"]), 3),
                   "placed_at": rng.choice(["2024-01-01T00:00:00Z", UNAVAILABLE])}  # fmt: skip
            fields = ORDER_FIELDS
        else:
            key = {"account_id": rng.randint(1, 5)}
            row = account_row(key["account_id"], owner=rng.choice(["A", "B", UNAVAILABLE]))
            fields = ACCOUNT_FIELDS
        value = dbz(op, None if op == "d" else row, key if op == "d" else None, lsn=lsn,
                    schema=rng.random() < 0.5, table=table, fields=fields)  # fmt: skip
        lines.append(json.dumps(value))
        if op == "d":
            lines.append("null")
        if rng.random() < 0.2:
            lines.append(json.dumps(value))
    rng.shuffle(lines)
    cuts = sorted(rng.sample(range(1, len(lines)), 4))
    return [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]


def test_router_envelopes_non_objects_and_the_dms_fallback() -> None:
    """The Kafka envelope is only read on a Kafka source (elsewhere ``_kafka`` is a field like
    any other); a value that is not an object is ``MALFORMED_JSON``; a record that names its
    table goes there unless the topic is mapped explicitly; the one-DMS-table fallback takes
    DMS-like rows only."""
    flat = ACCOUNTS.model_copy(update={"format": "flat"})
    record = {
        "event_id": "E1", "account_id": 1, "operation": "INSERT",
        "event_timestamp": NOW.isoformat(), "metadata": {"lsn": 5, "source_table": "accounts"},
        "_kafka": {"topic": "elsewhere.orders"},
    }  # fmt: skip
    files = Router([flat], "flat")
    route = files.route(json.dumps(record).encode())
    assert route.table == "accounts" and route.record == record
    kafka = Router([flat], "flat", topic_tables={})
    for value in ("[1, 2]", '"text"', "42"):
        line = f'{{"_kafka": {{"topic": "shop.public.accounts"}}, "value": {value}}}'
        route = kafka.route(line.encode())
        assert route.table == "accounts" and route.rejection is not None
        assert route.rejection.reason == "MALFORMED_JSON"
    assert kafka.route(b"null").rejection is not None  # a null line of no Kafka record
    # the table a record names wins over the topic's name, an explicit mapping over both
    orders_event = json.dumps(dbz("c", {"order_id": "O-1"}, lsn=9, table="orders",
                                      fields=ORDER_FIELDS))  # fmt: skip
    line = f'{{"_kafka": {{"topic": "one.topic.accounts"}}, "value": {orders_event}}}'.encode()
    both = Router([ACCOUNTS, ORDERS], "debezium", topic_tables={})
    assert both.route(line).table == "orders"
    mapped = Router([ACCOUNTS, ORDERS], "debezium", topic_tables={"one.topic.accounts": "accounts"})
    assert mapped.route(line).table == "accounts"
    # one DMS table: rows naming no table go to it, flat or Debezium records do not
    ledger = ORDERS.model_copy(update={"name": "ledger", "format": "dms"})
    mixed = Router([flat, ledger], "flat")
    assert mixed.route(b'{"Op": "I", "order_id": "O-1", "AR_H_CHANGE_SEQ": "1"}').table == "ledger"
    typo = {**record, "metadata": {"lsn": 5, "source_table": "acounts"}}
    del typo["_kafka"]
    assert mixed.route(json.dumps(typo).encode()).rejection.reason == "UNKNOWN_TABLE"  # type: ignore[union-attr]


def raw_balance(account_id: int, balance: str) -> dict:
    """An accounts row whose ``balance`` is the given JSON text as it is (not base64)."""
    return {"account_id": account_id, "owner": "Ann", "balance": balance}


def test_decimals_that_are_no_number_are_rejected_never_guessed() -> None:
    """A Connect Decimal without bytes, a VariableScaleDecimal with a null value, and the
    ``NaN`` / ``Infinity`` text of ``decimal.handling.mode=string`` (a field of Connect type
    ``string``) are ``SCHEMA_MISMATCH``: never read as base64 into a made-up number."""
    as_text = [*ACCOUNT_FIELDS[:2], {"type": "string", "optional": True, "field": "balance"}]
    cases = [
        dbz("c", raw_balance(1, ""), lsn=10),  # Decimal: no bytes
        dbz("c", raw_balance(2, "Infinity"), lsn=11, fields=as_text),
        dbz("c", raw_balance(3, "NaN"), lsn=12, fields=as_text),
        dbz("c", raw_balance(4, "-Infinity"), lsn=13, schema=False),
        dbz("c", raw_balance(5, ""), lsn=14, schema=False),
    ]
    for value in cases:
        outcome = validate(DebeziumDecoder().decode(value, ACCOUNTS))
        assert isinstance(outcome, Rejection) and outcome.reason == "SCHEMA_MISMATCH", (
            value["payload"]["after"] if "payload" in value else value["after"],
            outcome,
        )
    # the string mode's numbers are the numbers themselves (not base64: "1234" is valid base64)
    value = dbz("c", raw_balance(6, "1234"), lsn=15, fields=as_text)
    number = validate(DebeziumDecoder().decode(value, ACCOUNTS))
    assert isinstance(number, ChangeEvent) and number.values["balance"] == Decimal("1234.00")
    fields = [
        {"type": "string", "optional": False, "field": "order_id"},
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "field": "amount",
         "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}]},
    ]  # fmt: skip
    for amount in ({"scale": 0, "value": None}, {"scale": "x", "value": "AA=="}, {"scale": 1}):
        value = dbz("c", {"order_id": "O-1", "amount": amount}, lsn=16, table="orders",
                    fields=fields)  # fmt: skip
        outcome = validate(DebeziumDecoder().decode(value, ORDERS), ORDERS)
        assert isinstance(outcome, Rejection) and outcome.reason == "SCHEMA_MISMATCH", amount


def test_dms_messages_order_by_the_change_sequence_header_when_present() -> None:
    """A task that adds ``AR_H_CHANGE_SEQ`` to ``data``: its changes order by that number
    (not the hash of the record) when their timestamps tie; a full-load row stays first."""
    decoder = DmsDecoder()
    ts = (NOW - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    older = "20261201100003000000000000000000100"
    newer = "20261201100003000000000000000000200"
    for owners in (("a", "b"), ("b", "a"), ("x", "y"), ("y", "x")):  # either hash order
        first = dms_message("update", {"account_id": 5, "owner": owners[0],
                                       "AR_H_CHANGE_SEQ": older}, ts)  # fmt: skip
        second = dms_message("update", {"account_id": 5, "owner": owners[1],
                                        "AR_H_CHANGE_SEQ": newer}, ts)  # fmt: skip
        load = dms_message("load", {"account_id": 5, "owner": "loaded"}, ts)
        events = [validate(decoder.decode(v, ACCOUNTS)) for v in (second, load, first)]
        assert all(isinstance(e, ChangeEvent) for e in events), events
        state = fold_changes(events, ACCOUNTS, "soft").rows  # type: ignore[arg-type]
        assert state[(5,)]["owner"] == owners[1]
        assert "AR_H_CHANGE_SEQ" not in events[0].values  # type: ignore[union-attr]


def test_a_null_payload_envelope_in_a_landing_file_is_a_skipped_tombstone() -> None:
    """JsonConverter's ``{"schema": null, "payload": null}`` is skipped as a tombstone from a
    landing file as from Kafka; a flat-only pipeline, which has no tombstones, rejects it."""
    line = json.dumps({"schema": None, "payload": None}).encode()
    route = Router([ACCOUNTS], "debezium").route(line)
    assert route.skipped is not None and route.skipped.kind == "tombstone", route
    flat = Router([ACCOUNTS.model_copy(update={"format": "flat"})], "flat").route(line)
    assert flat.rejection is not None and flat.skipped is None
