"""``cdcflow catalog``: every Delta table of a run has an entry whose columns are the live
table's, PII flags come from the contract, and ``--check`` fails on a table without an entry or
an entry that no longer matches its table."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field

from cdcflow.model.contracts import CUSTOMERS
from tests.test_cli import cdcflow

CONFIG = """
pipeline: {name: customers, engine: local}
storage: {root: ./lakehouse}
source: {type: files, format: flat, path: ./landing, max_files_per_trigger: 3}
checkpoint: {location: ./lakehouse/_checkpoints/customers}
catalog: {owner: data-platform, consumers: [finance-dashboard, churn-model]}
"""


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "200", "--files", "2", cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    run = cdcflow("run", "--config", "cdcflow.yaml", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return tmp_path


def _tables(root: Path) -> set[str]:
    """Every Delta table under ``root`` (its folders starting with ``_`` aside)."""
    found = set()
    for folder, subfolders, _ in os.walk(root):
        if "_delta_log" in subfolders:
            found.add(Path(folder).relative_to(root).as_posix())
            subfolders.clear()
        subfolders[:] = [s for s in subfolders if not s.startswith("_")]
    return found


def test_every_table_has_an_entry_matching_it(lake: Path) -> None:
    made = cdcflow("catalog", "--config", "cdcflow.yaml", "--out", "docs-catalog", cwd=lake)
    assert made.returncode == 0, made.stderr
    datasets = yaml.safe_load((lake / "docs-catalog" / "catalog.yaml").read_text())["datasets"]
    by_name = {d["name"]: d for d in datasets}
    root = lake / "lakehouse"
    tables = _tables(root)
    assert tables and tables <= set(by_name)
    for name in tables:
        live = pa.schema(DeltaTable(str(root / name)).schema().to_arrow())
        entry = by_name[name]
        assert [(c["name"], c["type"]) for c in entry["columns"]] == [
            (f.name, str(f.type)) for f in live
        ], name
        assert entry["uri"] == str(root / name) and entry["grain"] and entry["layer"]
        assert entry["owner"] == "data-platform"
        assert entry["consumers"] == ["finance-dashboard", "churn-model"]
    pii = {c.name for c in CUSTOMERS.columns if c.pii}
    assert pii  # the shipped contract marks personal data
    silver = {c["name"]: c["pii"] for c in by_name["silver/customers"]["columns"]}
    assert {n for n, flagged in silver.items() if flagged} == pii
    bronze = {c["name"]: c["pii"] for c in by_name["bronze/customer_events"]["columns"]}
    assert {n for n, flagged in bronze.items() if flagged} == pii | {"raw_payload"}
    assert by_name["silver/customers"]["key"] == ["customer_id"]
    assert "silver/customers" in by_name["bronze/customer_events"]["downstream"]
    page = (lake / "docs-catalog" / "catalog.md").read_text()
    assert all(f"## `{name}`" in page for name in tables)
    # no values of the data in the catalog: names, types and descriptions only
    emails = pl.read_delta(str(root / "silver" / "customers"))["email"].drop_nulls()
    assert emails.len() and not any(e in page for e in emails.to_list())

    check = cdcflow("catalog", "--config", "cdcflow.yaml", "--check", cwd=lake)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(f"catalog: {len(datasets)} datasets; every Delta table")


def test_check_fails_on_an_unlisted_table_and_on_a_changed_schema(lake: Path) -> None:
    root = lake / "lakehouse"
    write_deltalake(str(root / "scratch" / "copy"), pa.table({"x": [1]}))
    DeltaTable(str(root / "silver" / "customers")).alter.add_columns(
        [Field("loyalty_tier", "string")]
    )
    check = cdcflow("catalog", "--config", "cdcflow.yaml", "--check", cwd=lake)
    assert check.returncode == 1
    (line,) = check.stderr.strip().splitlines()
    assert line.startswith("catalog: ")
    assert "scratch/copy: a Delta table without a catalog entry" in line
    assert "silver/customers: columns not in the catalog: loyalty_tier" in line
