"""Table contracts: typed coercion, constraints, the shipped customers contract, config errors."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.errors import ConfigError
from cdcflow.layers.contract_tables import contract_tables, fold_columns
from cdcflow.layers.tables import (
    BRONZE,
    EVENT_OUTCOMES,
    FOLD_COLUMNS,
    HISTORY,
    QUARANTINE,
    SILVER,
    TOMBSTONES,
)
from cdcflow.model.contracts import (
    CUSTOMERS,
    ColumnSpec,
    TableContract,
    TypeMismatch,
    check_constraints,
    coerce,
)
from cdcflow.model.events import ATTRIBUTES, PII_ATTRIBUTES, STATUSES
from cdcflow.pipeline import Pipeline
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator
from cdcflow.plan.rules import JsonNumber, Rejection, RuleSet, validate_record
from tests.test_property import streams


@pytest.mark.parametrize(
    ("value", "type_text", "stored"),
    [
        ("Lyon", "string", "Lyon"),
        (34555024900, "string", "34555024900"),  # the flat format's rule: JSON text
        (True, "string", "true"),
        (JsonNumber("1.50"), "string", "1.50"),
        (7, "integer", 7),
        (" 007 ", "integer", 7),  # SEMANTICS.md point 10
        ("-12", "integer", -12),
        (2**63 - 1, "integer", 2**63 - 1),
        (JsonNumber("12.5"), "decimal(5,2)", Decimal("12.50")),
        ("999.99", "decimal(5,2)", Decimal("999.99")),
        (3, "decimal(5,2)", Decimal("3.00")),
        (JsonNumber("1.50"), "decimal(5,1)", Decimal("1.5")),  # a trailing zero is no digit
        (JsonNumber("2.5e1"), "double", 25.0),
        ("1e-3", "double", 0.001),
        (False, "boolean", False),
        (" TRUE ", "boolean", True),
        ("2025-05-12", "date", date(2025, 5, 12)),
        (20220, "date", date(2025, 5, 12)),  # days since 1970-01-01 (Debezium Date)
        ("2025-05-12T10:00:00+05:30", "timestamp", datetime(2025, 5, 12, 4, 30, tzinfo=UTC)),
        (1747044000000, "timestamp", datetime(2025, 5, 12, 10, 0, tzinfo=UTC)),
        ({"b": [1, 2], "a": None}, "json", '{"a":null,"b":[1,2]}'),
        # a number stays a number inside JSON, with its exact text (not "2.50", a string)
        (
            {"x": JsonNumber("2.50"), "y": [1, JsonNumber("1e3")], "é": "s"},
            "json",
            '{"x":2.50,"y":[1,1e3],"é":"s"}',
        ),
        (None, "integer", None),
    ],
)
def test_values_are_coerced_to_their_declared_type(value: Any, type_text: str, stored: Any) -> None:
    got = coerce(value, type_text)
    assert got == stored and type(got) is type(stored)


@pytest.mark.parametrize(
    ("value", "type_text"),
    [
        ({"a": 1}, "string"),
        ([1], "string"),
        (True, "integer"),
        (1.5, "integer"),
        ("7a", "integer"),
        (2**63, "integer"),
        ("", "integer"),
        (JsonNumber("12.345"), "decimal(5,2)"),  # never rounded
        ("1000.00", "decimal(5,2)"),  # too many integer digits
        ("NaN", "decimal(5,2)"),
        ("Infinity", "double"),
        (JsonNumber("1e999"), "double"),
        ("yes", "boolean"),
        (1, "boolean"),
        ("2025-02-30", "date"),
        ("12/05/2025", "date"),
        (True, "date"),
        ("tomorrow", "timestamp"),
    ],
)
def test_values_that_do_not_fit_their_type_are_mismatches(value: Any, type_text: str) -> None:
    with pytest.raises(TypeMismatch) as caught:
        coerce(value, type_text)
    assert type_text in str(caught.value)
    assert str(value) not in str(caught.value) or str(value) in type_text  # never the value


def test_constraints_name_the_column_never_the_value() -> None:
    score = ColumnSpec(name="score", type="integer", minimum=0, maximum=100, nullable=False)
    assert check_constraints(score, 50) is None
    assert check_constraints(score, 101) == "score is outside its maximum 100"
    assert check_constraints(score, None) == "score must not be null"
    code = ColumnSpec(name="code", pattern=r"[A-Z]{3}", pii=True)
    assert check_constraints(code, "ABC") is None
    detail = check_constraints(code, "secret-value")
    assert detail is not None and "secret-value" not in detail and "code" in detail


def test_allowed_values_compare_as_values_of_the_column_type() -> None:
    flag = ColumnSpec(name="flag", type="boolean", allowed_values=("true",))
    assert check_constraints(flag, True) is None  # its text would be "True"
    assert check_constraints(flag, False) == "flag is not one of true"
    price = ColumnSpec(name="price", type="decimal(5,2)", allowed_values=("1.50", "2"))
    assert check_constraints(price, Decimal("1.5")) is None
    assert check_constraints(price, Decimal("2.00")) is None
    assert check_constraints(price, Decimal("2.01")) == "price is not one of 1.50, 2"
    day = ColumnSpec(name="day", type="date", allowed_values=("2024-01-02",))
    assert check_constraints(day, date(2024, 1, 2)) is None
    # a value the type cannot hold is refused when the contract is loaded, naming it
    with pytest.raises(ValueError, match="allowed_values: 'maybe' is not a value of type boolean"):
        ColumnSpec(name="flag", type="boolean", allowed_values=("maybe",))


def test_customers_contract_is_todays_table() -> None:
    """The shipped contract describes exactly what the customers pipeline has always been."""
    assert CUSTOMERS.keys == ("customer_id",)
    assert tuple(c.name for c in CUSTOMERS.attributes) == ATTRIBUTES
    assert tuple(c.name for c in CUSTOMERS.columns if c.pii) == PII_ATTRIBUTES
    status = CUSTOMERS.column("status")
    assert status.allowed_values == STATUSES and status.reason == "INVALID_STATUS"
    names = CUSTOMERS.table_names
    specs = (BRONZE, QUARANTINE, SILVER, HISTORY, TOMBSTONES)
    assert (names.bronze, names.quarantine, names.silver, names.history, names.tombstones) == (
        tuple(spec.name for spec in specs)
    )
    assert names.snowflake == "DIM_CUSTOMER_CURRENT"
    assert all(c.type == "string" for c in CUSTOMERS.columns)


def test_config_without_tables_runs_the_customers_contract_with_its_processing() -> None:
    config = CdcflowConfig(processing={"delete_mode": "hard", "customer_id_pattern": "^K[0-9]$"})
    (contract,) = config.contracts()
    assert contract.name == "customers" and contract.delete_mode == "hard"
    assert contract.key_patterns == {"customer_id": "^K[0-9]$"}


def _write(tmp_path: Path, tables: str) -> Path:
    path = tmp_path / "cdcflow.yaml"
    path.write_text("storage: {root: ./lake}\ntables:\n" + tables)
    return path


ACCOUNTS = """\
  - name: accounts
    keys: [account_id]
    columns:
      - {name: account_id, type: integer}
      - {name: balance, type: "decimal(12,2)"}
      - {name: opened_on, type: date}
      - {name: flagged, type: boolean}
  - name: order_lines
    keys: [order_id, line_no]
    delete_mode: hard
    columns:
      - {name: order_id, type: string}
      - {name: line_no, type: integer}
      - {name: sku, type: string, pattern: "[A-Z]{3}-[0-9]+"}
      - {name: placed_at, type: timestamp}
      - {name: attributes, type: json}
"""


def test_tables_are_declared_in_the_config(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, ACCOUNTS))
    accounts, lines = config.contracts()
    assert accounts.keys == ("account_id",) and accounts.column("balance").type == "decimal(12,2)"
    assert lines.keys == ("order_id", "line_no") and lines.delete_mode == "hard"
    assert lines.table_names.silver == "silver/order_lines"
    assert [c.name for c in lines.attributes] == ["sku", "placed_at", "attributes"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("type: boolean}", "type: boolen}"), "tables[accounts].columns[flagged].type"),
        (("{name: flagged, type: boolean}", "{name: flagged, nulable: true}"), "did you mean"),
        (("keys: [account_id]", "keys: [acount_id]"), "key column(s) not declared"),
        (("keys: [account_id]", "keys: []"), "tables[accounts].keys"),
        (("decimal(12,2)", "decimal(12,20)"), "scale at most the precision"),
        (('"[A-Z]{3}-[0-9]+"', '"(a)\\\\1"'), "not an RE2 pattern"),
        (("name: order_lines", "name: accounts"), "tables declared twice: accounts"),
        # a foreign key names a declared table and a column of the same type
        (
            (
                "{name: line_no, type: integer}",
                "{name: line_no, type: integer, references: acounts.account_id}",
            ),
            "column line_no references acounts.account_id, but no table acounts is declared "
            "(declared: accounts, order_lines), did you mean accounts?",
        ),
        (
            (
                "{name: line_no, type: integer}",
                "{name: line_no, type: integer, references: accounts.acount_id}",
            ),
            "table accounts has no column acount_id, did you mean account_id?",
        ),
        (
            (
                "{name: order_id, type: string}",
                "{name: order_id, type: string, references: accounts.account_id}",
            ),
            "whose type integer differs from the column's type string",
        ),
    ],
)
def test_contract_errors_name_the_file_the_table_and_the_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    assert edit[0] in ACCOUNTS
    path = _write(tmp_path, ACCOUNTS.replace(*edit))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_table_contract_may_be_a_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tables:`` items that are paths: relative to the config file, one contract or a list."""
    (tmp_path / "conf" / "t").mkdir(parents=True)
    (tmp_path / "conf" / "t" / "one.yaml").write_text(
        "name: accounts\nkeys: [id]\ncolumns: [{name: id, type: integer}, {name: n}]\n"
    )
    (tmp_path / "conf" / "t" / "two.yaml").write_text(
        "- {name: a, keys: [k], columns: [{name: k}]}\n"
        "- {name: b, keys: [k], columns: [{name: k}]}\n"
    )
    config = tmp_path / "conf" / "cdcflow.yaml"
    config.write_text(
        "tables:\n  - t/one.yaml\n  - {name: inline, keys: [k], columns: [{name: k}]}\n"
        "  - t/two.yaml\n"
    )
    monkeypatch.chdir(tmp_path)  # relative to the config file, not to the current folder
    loaded = load_config(config)
    assert [c.name for c in loaded.contracts()] == ["accounts", "inline", "a", "b"]
    assert loaded.contracts()[0].column("id").type == "integer"
    # an error inside a table file names the config, the key and the table file
    (tmp_path / "conf" / "t" / "one.yaml").write_text(
        "name: accounts\nkeys: [id]\ncolumns: [{name: id, type: integr}]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert str(config) in message and "tables[accounts].columns[id].type" in message
    assert "one.yaml" in message and "\n" not in message
    # a missing or malformed table file: one line naming the item and the file
    for text, problem in (("  - t/none.yaml\n", "cannot read"), ("  - t/bad.yaml\n", "YAML")):
        (tmp_path / "conf" / "t" / "bad.yaml").write_text("name: [unclosed\n")
        config.write_text("tables:\n" + text)
        with pytest.raises(ConfigError) as caught:
            load_config(config)
        message = str(caught.value)
        assert "tables[0]" in message and problem in message and "\n" not in message


def test_a_key_column_must_be_keyable() -> None:
    with pytest.raises(ValueError, match="cannot be a key"):
        TableContract(name="t", keys=("v",), columns=(ColumnSpec(name="v", type="json"),))


def _flat_lines(records: list[Any]) -> list[bytes]:
    return [
        (json.dumps(r) if isinstance(r, dict) else r).encode() if not isinstance(r, bytes) else r
        for r in records
    ]


@settings(max_examples=200)
@given(stream=streams())
def test_customers_contract_validates_like_the_flat_rules(stream: Any) -> None:
    """The contract-driven validator with the shipped customers contract judges every record
    of the property streams as the flat customers rules do: same reason, or the same event."""
    now = datetime.now(UTC)
    rules = RuleSet("^C-[0-9]+$", now, timedelta(minutes=5))
    validator = ContractValidator(CUSTOMERS, now, timedelta(minutes=5))
    for line in _flat_lines(stream[0]):
        if not line.strip():
            continue
        flat, typed = validate_record(line, rules), validator.validate(line)
        if isinstance(flat, Rejection):
            assert isinstance(typed, Rejection) and typed.reason == flat.reason, line
            continue
        assert isinstance(typed, ChangeEvent), (line, typed)
        assert typed.key == (flat.customer_id,)
        assert (typed.event_id, typed.operation, typed.event_timestamp) == (
            flat.event_id,
            flat.operation,
            flat.event_timestamp,
        )
        assert (typed.lsn, typed.lsn_number, typed.sequence) == (
            flat.lsn,
            flat.lsn_number,
            flat.sequence,
        )
        assert typed.values == flat.values and typed.content_hash == flat.content_hash


ACCOUNT = TableContract(
    name="accounts",
    keys=("region", "account_id"),
    columns=(
        ColumnSpec(name="region", type="string"),
        ColumnSpec(name="account_id", type="integer"),
        ColumnSpec(name="balance", type="decimal(12,2)", minimum=0),
        ColumnSpec(name="opened_on", type="date", nullable=False),
        ColumnSpec(name="tier", allowed_values=("GOLD", "SILVER")),
    ),
    key_patterns={"region": "[A-Z]{2}"},
    unknown_fields="quarantine",
)


def _account(**fields: Any) -> bytes:
    record = {
        "event_id": "A1",
        "operation": "UPDATE",
        "event_timestamp": "2025-05-12T10:00:00Z",
        "region": "EU",
        "account_id": "0042",
        "balance": 10.5,
        "metadata": {"lsn": "0/10"},
        **fields,
    }
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("fields", "reason", "named"),
    [
        ({"region": None}, "NULL_REGION", "region"),
        ({"region": "eu"}, "INVALID_REGION_FORMAT", "region"),
        ({"account_id": ...}, "NULL_ACCOUNT_ID", "account_id"),
        ({"account_id": "4x"}, "INVALID_ACCOUNT_ID_FORMAT", "integer"),
        ({"balance": 1.234}, "SCHEMA_MISMATCH", "decimal(12,2)"),
        ({"balance": -1}, "SCHEMA_MISMATCH", "minimum"),
        ({"opened_on": None}, "SCHEMA_MISMATCH", "opened_on must not be null"),
        ({"tier": "BRONZE"}, "SCHEMA_MISMATCH", "tier is not one of GOLD, SILVER"),
        ({"nickname": "Bob"}, "SCHEMA_MISMATCH", "nickname"),
        ({"metadata": {"lsn": "x"}}, "INVALID_LSN", "metadata.lsn"),
    ],
)
def test_typed_contract_rejections(fields: dict[str, Any], reason: str, named: str) -> None:
    validator = ContractValidator(ACCOUNT, datetime.now(UTC), timedelta(minutes=5))
    result = validator.validate(_account(**fields))
    assert isinstance(result, Rejection) and result.reason == reason, result
    assert named in result.detail and "Bob" not in result.detail


def test_typed_contract_event() -> None:
    validator = ContractValidator(ACCOUNT, datetime.now(UTC), timedelta(minutes=5))
    event = validator.validate(_account(opened_on="2020-01-31", tier="GOLD"))
    assert isinstance(event, ChangeEvent)
    assert event.key == ("EU", 42)  # "0042" as an integer key is 42 (SEMANTICS.md point 10)
    assert event.values == {
        "balance": Decimal("10.50"),
        "opened_on": date(2020, 1, 31),
        "tier": "GOLD",
    }
    deleted = validator.validate(_account(operation="DELETE", balance="junk", nickname=...))
    assert isinstance(deleted, ChangeEvent) and deleted.values == {}


def test_customers_contract_tables_are_todays_tables() -> None:
    """The table specs generated from the customers contract are exactly today's tables."""
    generated = contract_tables(CUSTOMERS)
    for spec, today in (
        (generated.bronze, BRONZE),
        (generated.quarantine, QUARANTINE),
        (generated.silver, SILVER),
        (generated.tombstones, TOMBSTONES),
        (generated.history, HISTORY),
        (generated.outcomes, EVENT_OUTCOMES),
    ):
        assert spec == today
    assert fold_columns(CUSTOMERS) == FOLD_COLUMNS


def test_typed_contract_tables() -> None:
    tables = contract_tables(ACCOUNT)
    silver = tables.silver.schema
    assert silver.field("account_id").type == pa.int64() and not silver.field("region").nullable
    assert silver.field("balance").type == pa.decimal128(12, 2)
    assert silver.field("opened_on").type == pa.date32()
    assert "is_active" not in silver.names  # no derived_active declared
    assert tables.quarantine.schema.field("account_id").type == pa.string()
    assert tables.silver.name == "silver/accounts" and tables.bronze.partition_by


def test_a_run_takes_declared_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared tables are run (tests/test_tables_pipeline.py), never silently ignored: each
    gets its Delta tables at its declared paths."""
    from cdcflow.engines.local.contracts import LocalContractsEngine

    monkeypatch.chdir(tmp_path)  # the config's relative paths
    config = load_config(_write(tmp_path, ACCOUNTS))
    pipeline = Pipeline(config)
    assert isinstance(pipeline.engine, LocalContractsEngine)
    assert list(pipeline.engine.tables) == ["accounts", "order_lines"]
    for name in ("silver/accounts", "bronze/order_lines_events", "silver/order_lines_tombstones"):
        assert (tmp_path / "lake" / name / "_delta_log").is_dir(), name


@pytest.mark.parametrize("value", ["1e100", 1e100, "1E+50", "NaN", "Infinity", "-Infinity"])
def test_a_decimal_beyond_its_context_is_a_schema_mismatch(value: Any) -> None:
    """An exponent too large to quantize at the column's scale is a value that does not fit
    the type (SEMANTICS.md point 13), not an unprocessable record."""
    with pytest.raises(TypeMismatch):
        coerce(value, "decimal(12,2)")
    validator = ContractValidator(ACCOUNT, datetime.now(UTC), timedelta(minutes=5))
    result = validator.validate(_account(balance=value))
    assert isinstance(result, Rejection) and result.reason == "SCHEMA_MISMATCH", result
    assert "balance is not a value of type decimal(12,2)" in result.detail


def test_an_insert_must_carry_its_not_null_columns_an_update_need_not() -> None:
    """``nullable: false``: an INSERT that omits the column is quarantined like one that sets
    it to null; an UPDATE's absent column is unchanged (a partial update)."""
    validator = ContractValidator(ACCOUNT, datetime.now(UTC), timedelta(minutes=5))
    insert = validator.validate(_account(operation="INSERT"))
    assert isinstance(insert, Rejection) and insert.reason == "SCHEMA_MISMATCH", insert
    assert insert.detail == "an INSERT must carry opened_on"
    carried = validator.validate(_account(operation="INSERT", opened_on="2020-01-31"))
    assert isinstance(carried, ChangeEvent)
    update = validator.validate(_account(operation="UPDATE"))
    assert isinstance(update, ChangeEvent) and "opened_on" not in update.values


def test_a_contract_s_own_envelope_fields_are_known_fields() -> None:
    """With ``unknown_fields: quarantine`` the fields named by ``operation_field``,
    ``event_id_field`` and ``timestamp_field`` are the envelope, not unknown fields."""
    contract = ACCOUNT.model_copy(
        update={"operation_field": "op", "event_id_field": "eid", "timestamp_field": "ts"}
    )
    record = json.loads(_account(opened_on="2020-01-31"))
    record["op"], record["eid"], record["ts"] = (
        record.pop("operation"),
        record.pop("event_id"),
        record.pop("event_timestamp"),
    )
    validator = ContractValidator(contract, datetime.now(UTC), timedelta(minutes=5))
    event = validator.validate(json.dumps(record))
    assert isinstance(event, ChangeEvent), event
    record["nickname"] = "Bob"  # still an unknown field
    unknown = validator.validate(json.dumps(record))
    assert isinstance(unknown, Rejection) and "nickname" in unknown.detail


def test_a_key_pattern_re2_cannot_compile_and_too_many_columns_are_config_errors(
    tmp_path: Path,
) -> None:
    pattern = '    keys: [account_id]\n    key_patterns: {account_id: "(?<=a)b"}'
    path = _write(tmp_path, ACCOUNTS.replace("    keys: [account_id]", pattern))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value) and "not an RE2 pattern" in str(caught.value)
    wide = [{"name": "k", "type": "integer"}] + [{"name": f"c{i}"} for i in range(63)]
    with pytest.raises(ValueError, match="at most 62 non-key columns"):
        TableContract.model_validate({"name": "w", "keys": ["k"], "columns": wide})
    assert len(TableContract.model_validate(
        {"name": "w", "keys": ["k"], "columns": wide[:63]}
    ).attributes) == 62  # fmt: skip
