"""Validation parity: ``cdcflow validate`` re-checks Silver against the table contracts."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.engines.local.delta import read_arrow
from cdcflow.layers.validation import validate_silver
from cdcflow.model.contracts import (
    CUSTOMERS,
    ColumnSpec,
    TableContract,
    check_constraints,
    constraint_violations,
)
from tests.conftest import Lake, ev, full
from tests.crashkit import config_file
from tests.test_cli import cdcflow

ACCOUNTS = TableContract(
    name="accounts",
    keys=("account_id",),
    columns=(
        ColumnSpec(name="account_id", type="integer", nullable=False),
        ColumnSpec(name="customer_id", nullable=False, references="customers.customer_id"),
        ColumnSpec(name="balance", type="decimal(12,2)", minimum="0"),
        ColumnSpec(name="kind", allowed_values=("CHECKING", "SAVINGS")),
        ColumnSpec(name="iban", pii=True, pattern=r"[A-Z]{2}[0-9]{2}[A-Z0-9]+"),
        ColumnSpec(name="opened_on", type="date", maximum="2030-01-01"),
    ),
)


def _customers(*ids: str, deleted: tuple[str, ...] = ()) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "customer_id": list(ids),
            "status": ["DELETED" if i in deleted else "ACTIVE" for i in ids],
            "is_deleted": [i in deleted for i in ids],
        }
    )


def _accounts(rows: list[tuple]) -> pl.DataFrame:
    names = ["account_id", "customer_id", "balance", "kind", "iban", "opened_on", "is_deleted"]
    schema = {
        "account_id": pl.Int64,
        "customer_id": pl.String,
        "balance": pl.Decimal(12, 2),
        "kind": pl.String,
        "iban": pl.String,
        "opened_on": pl.Date,
        "is_deleted": pl.Boolean,
    }
    return pl.DataFrame([dict(zip(names, r, strict=True)) for r in rows], schema=schema)


GOOD = (1, "C-1", Decimal("10.00"), "CHECKING", "FR76ABC", date(2024, 1, 2), False)


def test_a_clean_table_passes() -> None:
    report = validate_silver(ACCOUNTS, _accounts([GOOD]), {"customers": _customers("C-1")})
    assert report.ok and report.violations == []
    assert report.tables == {"accounts": (1, 1)}


def test_each_rule_names_column_rule_rows_and_example_keys() -> None:
    rows = [
        GOOD,
        (2, "C-9", Decimal("-1.00"), "LOAN", "fr76abc", date(2031, 1, 1), False),
        (3, "C-2", Decimal("5.00"), "SAVINGS", None, None, False),  # C-2 deleted: broken FK
        (4, None, None, None, None, None, False),
        (5, "C-9", Decimal("-9.00"), "LOAN", "bad", date(2040, 1, 1), True),  # deleted: skipped
        (1, "C-1", Decimal("1.00"), "SAVINGS", None, None, False),  # key 1 twice
    ]
    others = {"customers": _customers("C-1", "C-2", deleted=("C-2",))}
    report = validate_silver(ACCOUNTS, _accounts(rows), others)
    got = {(v.column, v.rule): (v.rows, v.examples) for v in report.violations}
    assert got == {
        ("account_id", "KEY_DUPLICATE"): (2, ("1",)),
        ("customer_id", "NOT_NULL"): (1, ("4",)),
        ("customer_id", "FOREIGN_KEY"): (2, ("2", "3")),
        ("balance", "MINIMUM"): (1, ("2",)),
        ("kind", "ALLOWED_VALUES"): (1, ("2",)),
        ("iban", "PATTERN"): (1, ("2",)),
        ("opened_on", "MAXIMUM"): (1, ("2",)),
    }
    assert report.tables == {"accounts": (6, 5)}
    assert not report.ok
    # no value of any row in the report: a PII column's value is never quoted
    text = json.dumps(report.to_json())
    assert "fr76abc" not in text and "LOAN" not in text


def test_composite_keys_and_a_pii_key() -> None:
    lines = TableContract(
        name="order_lines",
        keys=("order_id", "line_no"),
        columns=(
            ColumnSpec(name="order_id", pii=True),
            ColumnSpec(name="line_no"),
            ColumnSpec(name="sku", nullable=False),
        ),
    )
    frame = pl.DataFrame(
        {
            "order_id": ["a|b", "a", "x", "x"],
            "line_no": ["c", "b|c", "1", "1"],  # same text when joined with "|", other keys
            "sku": ["s", "s", "s", None],
            "is_deleted": [False] * 4,
        }
    )
    report = validate_silver(lines, frame)
    got = {(v.column, v.rule): (v.rows, v.examples) for v in report.violations}
    # the PII key column: counts only, no example key
    assert got == {("order_id, line_no", "KEY_DUPLICATE"): (2, ()), ("sku", "NOT_NULL"): (1, ())}


def test_key_pattern_and_null_key() -> None:
    contract = CUSTOMERS.model_copy(update={"key_patterns": {"customer_id": r"^C-[0-9]+$"}})
    frame = _customers("C-1", "X-2").vstack(
        pl.DataFrame({"customer_id": [None], "status": ["ACTIVE"], "is_deleted": [False]})
    )
    report = validate_silver(contract, frame)
    got = {(v.column, v.rule): (v.rows, v.examples) for v in report.violations}
    assert got == {
        ("customer_id", "KEY_NULL"): (1, ()),
        ("customer_id", "KEY_PATTERN"): (1, ("X-2",)),
    }


def test_cli_passes_on_a_pipeline_silver_then_fails_on_a_tampered_one(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.write(
        [
            ev("E1", "C-1", "INSERT", "0/10", **full()),
            ev("E2", "C-2", "INSERT", "0/20", **full(email="secret@example.com")),
            ev("E3", "C-2", "DELETE", "0/30"),
        ]
    )
    lake.run()
    config = config_file(lake)
    passed = cdcflow("validate", "--config", str(config), cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "PASS" in passed.stdout and "customers" in passed.stdout

    silver = DeltaTable(lake.config.table_uri("silver/customers"))
    stored = read_arrow(silver)
    rows = stored.to_pylist()
    live = next(r for r in rows if r["customer_id"] == "C-1")
    tampered = [{**live, "status": "BOGUS", "email": "leak@example.com"}]  # and C-1 twice
    write_deltalake(silver, pa.Table.from_pylist(tampered, schema=stored.schema), mode="append")
    failed = cdcflow("validate", "--config", str(config), "--output", "json", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    report = json.loads(failed.stdout)
    got = {(v["column"], v["rule"]): (v["rows"], v["examples"]) for v in report["violations"]}
    assert got == {
        ("customer_id", "KEY_DUPLICATE"): (2, ["C-1"]),
        ("status", "ALLOWED_VALUES"): (1, ["C-1"]),
    }
    assert report["tables"] == {"customers": {"rows": 3, "live_rows": 2}}
    assert "leak@example.com" not in failed.stdout + failed.stderr
    table = cdcflow("validate", "--config", str(config), cwd=tmp_path)
    assert table.returncode == 1 and "FAIL" in table.stdout and "ALLOWED_VALUES" in table.stdout


def test_cli_before_any_run_is_one_line_exit_2(tmp_path: Path) -> None:
    config = config_file(Lake(tmp_path))
    result = cdcflow("validate", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "run the pipeline first" in result.stderr


@pytest.mark.parametrize("bad", ["customers", "customers.", "a.b.c"])
def test_a_malformed_reference_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="references"):
        ColumnSpec(name="x", references=bad)


@settings(max_examples=60)
@given(
    rows=st.lists(
        st.tuples(
            st.none() | st.decimals(min_value=-5, max_value=5, places=2),
            st.none() | st.sampled_from(["CHECKING", "SAVINGS", "LOAN", "checking"]),
            st.none() | st.sampled_from(["FR76ABC", "fr76abc", "DE00X", "1", ""]),
            st.none() | st.dates(min_value=date(2029, 12, 30), max_value=date(2030, 1, 3)),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_validate_judges_every_value_as_ingestion_does(rows: list[tuple]) -> None:
    """Each live row is reported under exactly the rules ``constraint_violations`` finds for its
    values (the rules ingestion quarantines by: ``check_constraints`` = the first of them)."""
    frame = _accounts(
        [(i, "C-1", b, k, iban, d, False) for i, (b, k, iban, d) in enumerate(rows, start=1)]
    )
    report = validate_silver(ACCOUNTS, frame, {"customers": _customers("C-1")})
    got = {(v.column, v.rule): v.rows for v in report.violations}
    want: dict[tuple[str, str], int] = {}
    for values in rows:
        for name, value in zip(("balance", "kind", "iban", "opened_on"), values, strict=True):
            spec = ACCOUNTS.column(name)
            broken = list(constraint_violations(spec, value))
            first = check_constraints(spec, value)
            assert first == (broken[0][1] if broken else None)
            for rule, _ in broken:
                want[(name, rule)] = want.get((name, rule), 0) + 1
    assert got == want


def test_a_column_no_event_has_set_yet_is_no_not_null_violation(tmp_path: Path) -> None:
    """A key first seen in a partial UPDATE has a null status until an event sets one
    (shared/SEMANTICS.md point 3): unknown, not a broken NOT NULL. A null whose sequence
    register is set (written by another tool) still is one."""
    lake = Lake(tmp_path)
    lake.write(
        [
            ev("E1", "C-1", "INSERT", "0/10", **full()),
            ev("E2", "C-2", "UPDATE", "0/20", city="Lyon"),  # its INSERT has not arrived
        ]
    )
    lake.run()
    config = config_file(lake)
    assert lake.silver()["C-2"]["status"] is None
    passed = cdcflow("validate", "--config", str(config), "--output", "json", cwd=tmp_path)
    assert passed.returncode == 0, passed.stdout
    assert json.loads(passed.stdout)["violations"] == []

    silver = DeltaTable(lake.config.table_uri("silver/customers"))
    stored = read_arrow(silver)
    c1 = next(r for r in stored.to_pylist() if r["customer_id"] == "C-1")
    nulled = [{**c1, "customer_id": "C-3", "status": None}]  # C-1's register, status nulled
    write_deltalake(silver, pa.Table.from_pylist(nulled, schema=stored.schema), mode="append")
    failed = cdcflow("validate", "--config", str(config), "--output", "json", cwd=tmp_path)
    assert failed.returncode == 1, failed.stdout
    got = [(v["column"], v["rule"], v["examples"]) for v in json.loads(failed.stdout)["violations"]]
    assert got == [("status", "NOT_NULL", ["C-3"])]
