"""Prometheus metrics of a continuous run, scraped over loopback while it runs and compared
with what the audit tables recorded (``cdcflow run --metrics-port``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from cdcflow.generator import GeneratorConfig, generate
from tests.ports import unused_port
from tests.test_cli import CONFIG, cdcflow


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) → value of every cdcflow sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("cdcflow_")
    }


def test_metrics_endpoint_counts_what_the_audit_tables_record(tmp_path: Path) -> None:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)  # three files per micro-batch
    generate(tmp_path / "landing", GeneratorConfig(events=400, customers=50, files=5, seed=11))
    port = unused_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    command = [sys.executable, "-m", "cdcflow", "run", "--config", "cdcflow.yaml"]
    proc = subprocess.Popen(
        [*command, "--trigger", "processing-time=1s", "--metrics-port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        commits = tmp_path / "lakehouse" / "_checkpoints" / "customers" / "commits"
        deadline = time.monotonic() + 90
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        while time.monotonic() < deadline:  # both micro-batches committed and counted
            if (commits / "1.json").exists():
                samples = _scrape(port)
                if samples.get(("cdcflow_batches_total", (("pipeline", "customers"),))) == 2:
                    break
            time.sleep(0.3)
        assert proc.poll() is None, "the run must still be running while it is scraped"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err

    lake = tmp_path / "lakehouse"
    log = pl.read_delta(str(lake / "audit" / "batch_log"))
    assert log.height == 2
    table = (("pipeline", "customers"), ("table", "customers"))

    def records(outcome: str) -> float:
        return samples[("cdcflow_records_total", (("outcome", outcome), *table))]

    assert records("received") == log["records_received"].sum() > 0
    assert records("accepted") == log["accepted"].sum()
    assert records("quarantined") == log["quarantined"].sum() > 0
    assert records("duplicate") == log["duplicates"].sum()
    for operation, column in (("INSERT", "inserts"), ("UPDATE", "updates"), ("DELETE", "deletes")):
        key = ("cdcflow_changes_total", (("operation", operation), *table))
        assert samples[key] == log[column].sum()
    quarantine = pl.read_delta(str(lake / "quarantine" / "customer_events"))
    for reason, n in quarantine["failure_reason"].value_counts().iter_rows():
        key = (
            "cdcflow_quarantined_records_total",
            (("pipeline", "customers"), ("reason", reason), ("table", "customers")),
        )
        assert samples[key] == n
    assert samples[("cdcflow_batch_duration_seconds_count", table)] == 2
    total_s = samples[("cdcflow_batch_duration_seconds_sum", table)]
    assert abs(total_s - log["duration_ms"].sum() / 1000) < 0.01
    last = log.sort("batch_id")["max_event_lag_s"][-1]
    assert samples[("cdcflow_event_lag_seconds", table)] == last
    assert 0 < time.time() - samples[("cdcflow_last_commit_timestamp_seconds", table)] < 120
    # counts, reason codes and times only: every label value is a known name, no record value
    known = {"customers", *quarantine["failure_reason"].unique().to_list()}
    known |= {"received", "accepted", "quarantined", "duplicate", "STALE", "TOMBSTONED", "LATE"}
    known |= {"INSERT", "UPDATE", "DELETE"}
    for _, labels in samples:
        assert all(value in known for name, value in labels if name != "le"), labels


def test_a_port_in_use_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cdcflow(
            "run", "--config", "cdcflow.yaml", "--trigger", "once", "--metrics-port", str(port),
            cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line == f"error: --metrics-port: cannot serve on 127.0.0.1:{port} " + (
        "([Errno 98] Address already in use)"
    )
    assert not (tmp_path / "lakehouse").exists()  # nothing ran


def test_declared_tables_get_their_own_duration_lag_and_last_commit(tmp_path: Path) -> None:
    """Two declared tables, micro-batches that bring one or both: each table's histogram counts
    the micro-batches that brought it records, its lag gauge is the largest ``ingested_at`` −
    event time of its last batch's Bronze rows, its last-commit gauge is set only by those."""
    from prometheus_client import generate_latest

    from cdcflow.layers.metrics import PipelineMetrics
    from cdcflow.pipeline import Pipeline, Trigger
    from tests.test_tables_pipeline import rec, write_config, write_files

    config = write_config(tmp_path)
    accounts = {"owner": "Ann", "balance": "1.00", "opened_on": "2024-01-01"}
    write_files(
        config,
        [
            [json_line(rec("accounts", "A1", "INSERT", 10, 90, account_id=1, **accounts))],
            [
                json_line(rec("accounts", "A2", "UPDATE", 20, 30, account_id=1, balance=2)),
                json_line(
                    rec(
                        "order_lines",
                        "L1",
                        "INSERT",
                        21,
                        7,
                        order_id="O-1",
                        line_no=1,
                        sku="ABC-1",
                        quantity=1,
                    )
                ),
            ],
            [json_line(rec("accounts", "A3", "UPDATE", 30, 1, account_id=1, balance=3))],
        ],
    )
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert len(reports) == 3
    metrics = PipelineMetrics(config)
    for report in reports:
        metrics.observe(report)
    text = generate_latest(metrics.registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def sample(name: str, table: str) -> float | None:
        return samples.get((name, (("pipeline", "shop"), ("table", table))))

    assert sample("cdcflow_batch_duration_seconds_count", "accounts") == 3
    assert sample("cdcflow_batch_duration_seconds_count", "order_lines") == 1
    for table, batch in (("accounts", 2), ("order_lines", 1)):
        bronze = pl.read_delta(config.table_uri(f"bronze/{table}_events"))
        bronze = bronze.filter(pl.col("batch_id") == batch)
        lag = (bronze["ingested_at"] - bronze["event_timestamp"]).dt.total_microseconds().max()
        assert sample("cdcflow_event_lag_seconds", table) == lag / 1e6
    # the accounts' last batch is the third (an event of 1 minute before the tests' NOW), the
    # order lines' the second (7 minutes): their lags differ by about 6 minutes (NOW is when
    # the module was imported, so each lag also holds the time since)
    accounts_lag = sample("cdcflow_event_lag_seconds", "accounts")
    lines_lag = sample("cdcflow_event_lag_seconds", "order_lines")
    assert accounts_lag is not None and lines_lag is not None
    assert 330 < lines_lag - accounts_lag < 400
    last_accounts = sample("cdcflow_last_commit_timestamp_seconds", "accounts")
    last_lines = sample("cdcflow_last_commit_timestamp_seconds", "order_lines")
    assert last_accounts is not None and last_lines is not None
    assert last_lines <= last_accounts


def json_line(record: dict[str, object]) -> str:
    import json

    return json.dumps(record)
