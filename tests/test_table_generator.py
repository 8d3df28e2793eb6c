"""The multi-table generator and the declared tables' reconciliation.

``cdcflow generate --config F --expected DIR`` writes every declared table's changes and, from
the delivered lines alone, their expected state; ``cdcflow run`` then ``cdcflow reconcile
--config F --expected DIR`` must match it table by table, and must say so when it does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from deltalake import DeltaTable

from cdcflow.config import load_config
from cdcflow.engines.local.delta import read_arrow
from cdcflow.model.contracts import TableContract, check_constraints, coerce, normalise
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator, route_name
from cdcflow.plan.rules import Rejection, parse_record
from cdcflow.table_generator import TablesWorkload, expected_tables, generate_tables

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)

#: Contracts with every type, constraint and envelope option the generator must honour.
TABLES: list[dict[str, Any]] = [
    {
        "name": "members",
        "keys": ["member_id"],
        "key_patterns": {"member_id": "M-[0-9]{3}"},
        "lsn_field": "source.lsn",
        "operation_field": "op",
        "columns": [
            {"name": "member_id", "type": "string"},
            {"name": "email", "type": "string", "pii": True, "nullable": False},
            {"name": "plan", "type": "string", "allowed_values": ["FREE", "PRO"]},
            {"name": "credit", "type": "decimal(6,2)", "minimum": "10.50", "maximum": 99},
            {"name": "joined", "type": "date", "minimum": "2024-01-01"},
            {"name": "score", "type": "double", "maximum": 5},
            {"name": "active", "type": "boolean", "source": "is_active_flag"},
        ],
    },
    {
        "name": "visits",
        "keys": ["site", "visit_no"],
        "delete_mode": "hard",
        "columns": [
            {"name": "site", "type": "string", "pattern": "[a-z]{2}-[0-9]"},
            {"name": "visit_no", "type": "integer"},
            {"name": "member_id", "type": "string", "references": "members.member_id"},
            {"name": "seen_at", "type": "timestamp"},
            {"name": "pages", "type": "integer", "minimum": 1, "maximum": 40},
            {"name": "meta", "type": "json"},
        ],
    },
]


def write_config(root: Path) -> Path:
    raw = {
        "pipeline": {"name": "gen"},
        "storage": {"root": str(root / "lake")},
        "source": {"path": str(root / "landing"), "max_files_per_trigger": 2},
        "checkpoint": {"location": str(root / "lake" / "_checkpoints" / "gen")},
        "logging": {"level": "WARNING"},
        "tables": TABLES,
    }
    path = root / "cdcflow.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdcflow", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "COLUMNS": "200"},
    )


def contracts(path: Path) -> list[TableContract]:
    return load_config(path).contracts()


def test_generated_values_keep_their_contracts(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    declared = {c.name: c for c in contracts(config)}
    workload = TablesWorkload(events=600, keys=25, files=3, seed=7, now=NOW)
    summary = generate_tables(tmp_path / "landing", list(declared.values()), workload)
    assert summary.records == len(summary.lines) == 600 + 30 + 12
    assert sorted(summary.changes) == ["members", "visits"]
    validators = {n: ContractValidator(c, NOW, timedelta(0)) for n, c in declared.items()}
    changes: Counter[str] = Counter()
    invalid = 0
    for line in summary.lines:
        record = parse_record(line)
        if isinstance(record, Rejection):
            invalid += 1
            continue
        name = route_name(record)
        event_id = record.get("event_id")
        if name not in declared:
            assert str(event_id).startswith("BAD-")
            invalid += 1
            continue
        contract = declared[name]
        result = validators[name].validate_object(record)
        if str(event_id).startswith("BAD-"):
            invalid += 1
            assert isinstance(result, Rejection), line  # each invalid record is rejected
            continue
        # every generated change is valid under its contract, in its envelope fields
        assert isinstance(result, ChangeEvent), (line, result)
        if name == "members":
            assert "op" in record and "lsn" in record["source"] and "operation" not in record
        for spec in contract.attributes:
            if spec.field in record:
                stored = normalise(spec, coerce(record[spec.field], spec.type))
                assert stored is None or check_constraints(spec, stored) is None
        changes[name] += 1
    assert invalid == summary.invalid == 12
    assert sum(changes.values()) == 600 + 30  # changes and their re-deliveries
    # the source kept its foreign key: every live visit names a live member
    outcomes, unrouted = expected_tables(summary.lines, list(declared.values()), NOW)
    members = {k[0] for k, row in outcomes["members"].state.rows.items() if not row["is_deleted"]}
    visits = outcomes["visits"].state.rows.values()
    assert visits and all(v["member_id"] is None or v["member_id"] in members for v in visits)
    assert outcomes["visits"].state.tombstones  # hard deletes happened
    assert sum(unrouted.values()) > 0
    # the same seed and instant: the same stream; another seed: another one
    again = generate_tables(tmp_path / "again", list(declared.values()), workload)
    assert again.lines == summary.lines
    other = TablesWorkload(events=600, keys=25, files=3, seed=8, now=NOW)
    assert generate_tables(tmp_path / "other", list(declared.values()), other).lines != again.lines


def test_a_generated_workload_runs_and_reconciles_table_by_table(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    gen = cli(
        "generate", "--config", str(config), "--events", "800", "--keys", "30", "--files", "4",
        "--expected", "expected", cwd=tmp_path,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert "members" in gen.stdout and "visits" in gen.stdout
    assert len(list((tmp_path / "landing").glob("events-*.jsonl"))) == 4
    run = cli("run", "--config", str(config), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    ok = cli("reconcile", "--config", str(config), "--expected", "expected", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("MATCH") == 2 and "MISMATCH" not in ok.stdout
    # a replay rebuilds each table from Bronze alone: the same Silver
    replayed = cli("replay", "--config", str(config), "--verify", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert replayed.stdout.count("verified") == 2 and "0 rejected on replay" in replayed.stdout

    # the expected counts are what the pipeline wrote, table by table
    counts = json.loads((tmp_path / "expected" / "counts.json").read_text())
    lake = tmp_path / "lake"
    for name, want in counts["tables"].items():
        bronze = pl.read_delta(str(lake / "bronze" / f"{name}_events"))
        assert bronze.height == want["accepted"]
        assert int(bronze["is_duplicate"].sum()) == want["duplicates"]
        quarantine = pl.read_delta(str(lake / "quarantine" / f"{name}_events"))
        assert dict(Counter(quarantine["failure_reason"].to_list())) == want["quarantine"]
    unrouted = pl.read_delta(str(lake / "quarantine" / "unrouted_events"))
    assert dict(Counter(unrouted["failure_reason"].to_list())) == counts["unrouted"]
    assert sum(counts["unrouted"].values()) > 0

    # a difference is found and reported without personal data
    members = pl.read_parquet(tmp_path / "expected" / "members.parquet")
    changed = members.with_columns(
        pl.when(pl.int_range(pl.len()) == 0)
        .then(pl.lit("someone@example.org"))
        .otherwise(pl.col("email"))
        .alias("email")
    ).slice(0, members.height - 1)  # and one member less: an extra key in Silver
    changed.write_parquet(tmp_path / "expected" / "members.parquet")
    bad = cli(
        "reconcile", "--config", str(config), "--expected", "expected", "--output", "json",
        cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert report["ok"] is False and report["tables"]["visits"]["ok"] is True
    members_report = report["tables"]["members"]
    assert members_report["extra_keys"] == 1 and members_report["field_differences"] == {"email": 1}
    assert "someone@example.org" not in bad.stdout and "<masked>" in bad.stdout
    # the expected state must be a folder with declared tables: a usage error, one line
    wrong = cli("reconcile", "--config", str(config), "--expected", "x.parquet", cwd=tmp_path)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert "not a folder" in wrong.stderr
    # a Silver row lost behind the pipeline's back: the replay finds it
    visits = DeltaTable(str(lake / "silver" / "visits"))
    site = read_arrow(visits, columns=["site"])["site"][0].as_py()
    visits.delete(f"site = '{site}'")
    lost = cli("replay", "--config", str(config), "--verify", "--output", "json", cwd=tmp_path)
    assert lost.returncode == 1, lost.stdout + lost.stderr
    verdicts = {r["table"]: r["verified"] for r in json.loads(lost.stdout)}
    assert verdicts == {"members": True, "visits": False}


def test_generate_continues_a_workload_after_a_contract_change(tmp_path: Path) -> None:
    """``generate --config F --continue``: a second workload in the same landing folder
    continues the first (later event ids, LSNs and times, the same keys and references),
    here after a v2 contract with a new nullable column; its expected state covers everything
    landed. Without --continue, a non-empty folder is refused in one line."""
    from tests import forkrun

    config = write_config(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def cdcflow(*args: str) -> subprocess.CompletedProcess[str]:
        return forkrun.run(list(args), env, tmp_path, 300)

    size = ("--events", "300", "--keys", "20", "--files", "2")
    first = cdcflow("generate", "--config", str(config), *size, "--expected", "exp1")
    assert first.returncode == 0, first.stderr
    assert cdcflow("run", "--config", str(config)).returncode == 0
    raw = yaml.safe_load(config.read_text())
    members = raw["tables"][0]
    members["version"] = 2
    members["columns"].append({"name": "tier", "type": "string", "allowed_values": ["A", "B"]})
    config.write_text(yaml.safe_dump(raw, sort_keys=False))

    refused = cdcflow("generate", "--config", str(config), *size)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "already holds 2 landing file(s)" in refused.stderr and "--continue" in refused.stderr
    more = ("--seed", "7", "--expected", "exp2")
    second = cdcflow("generate", "--config", str(config), *size, *more, "--continue")
    assert second.returncode == 0, second.stderr
    assert len(list((tmp_path / "landing").glob("events-*.jsonl"))) == 4
    assert cdcflow("run", "--config", str(config)).returncode == 0
    ok = cdcflow("reconcile", "--config", str(config), "--expected", "exp2")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("MATCH") == 2 and "MISMATCH" not in ok.stdout
    lake = tmp_path / "lake"
    silver = pl.read_delta(str(lake / "silver" / "members"))
    assert silver["tier"].null_count() < silver.height  # the new column has values
    bronze = pl.read_delta(str(lake / "bronze" / "members_events"))
    quarantine = pl.read_delta(str(lake / "quarantine" / "members_events"))
    assert "DUPLICATE_EVENT_CONFLICT" not in quarantine["failure_reason"].to_list()
    assert bronze["batch_id"].unique().sort().to_list() == [0, 1]  # one micro-batch each
