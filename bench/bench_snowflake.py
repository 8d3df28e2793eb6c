"""Snowflake sync benchmark against the local fakesnow server (not a test).

Usage::

    .venv/bin/python bench/bench_snowflake.py                         # 100,000 keys
    .venv/bin/python bench/bench_snowflake.py --customers 1000000 --methods auto
    .venv/bin/python bench/bench_snowflake.py --customers 20000 --events 1000
    .venv/bin/python bench/bench_snowflake.py --methods auto --continuous 60

One lakehouse of ``--customers`` keys (one INSERT each, in ``--files`` landing files, through
the local engine), then per load method (``--methods``: ``auto`` = the default
``snowflake.load_method``, Parquet files PUT to a stage and COPY INTO the stage table from
``bulk_min_rows`` rows on, row binding below (the small Gold tables); ``bulk`` = always the
stage; ``bind`` = row binding with ``executemany`` always, run only up to ``--bind-max`` keys: it
loads a few hundred rows per second):

1. a full sync (bootstrap) into a fresh emulator database, in a child process of its own:
   seconds, rows/s, peak RSS of that process;
2. after ``--events`` UPDATEs of distinct keys (one more micro-batch), an incremental sync of
   those keys into the same target: seconds, peak RSS;

each followed by ``reconcile_snowflake`` (Silver vs the target: EQUAL or not) in another child
process (not measured);

3. with ``--continuous S`` (seconds; 0, the default, skips it), the continuous mode on that
   lakehouse: ``cdcflow run --trigger processing-time=1s`` and ``cdcflow sync snowflake --continuous
   --interval 500ms`` as two processes while this one lands ``--rate`` (1,000) UPDATEs a second
   (one file a second, event times = the time the file is written) for S seconds; then both
   stop on SIGTERM once the sync has caught up. Each sync's record (``audit/snowflake_sync``,
   mode ``continuous``) holds the p50 / p95 of source event time → Snowflake commit over the
   rows it upserted: reported are the median of the per-sync p50s, the largest per-sync p95
   and the lag from the Silver commit, then a reconciliation.

What the figures measure: the whole sync path — the Delta read (snapshot or Change Data Feed),
the Parquet files or the bound rows, PUT, COPY, the MERGE and the state update, each connection's
login — against the fakesnow emulator (DuckDB behind Snowflake's wire protocol), running in the
same process as the sync (its memory is in the peak RSS; its start, before the first
connection, is not in the seconds). The emulator's speed is not Snowflake's: a real account
adds network round trips and runs COPY and MERGE on a warehouse.

Results are printed and written to ``bench/results/<UTC time>-snowflake.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pipeline import RESULTS, machine
from cdcflow.engines.local.delta import read_arrow


def _config(work: Path, method: str) -> Any:
    from cdcflow.config import CdcflowConfig

    return CdcflowConfig(
        storage={"root": str(work / "lake")},
        source={"path": str(work / "landing"), "max_records_per_trigger": 250_000},
        checkpoint={"location": str(work / "lake" / "_checkpoints" / "customers")},
        logging={"level": "WARNING"},
        snowflake={
            "emulator": "on",
            "emulator_path": str(work / f"snowflake-{method}"),
            "load_method": method,
        },
    )


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    import polars as pl

    tmp = path.with_suffix(".tmp")
    pl.DataFrame(records).write_ndjson(tmp)
    tmp.rename(path)


def build_lake(work: Path, customers: int, files: int) -> None:
    """``customers`` INSERTs (one per key) in ``files`` landing files, run to Silver."""
    from cdcflow.pipeline import Pipeline, Trigger

    landing = work / "landing"
    landing.mkdir(parents=True)
    stamp = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    per_file = -(-customers // files)
    for f in range(files):
        keys = range(f * per_file, min(customers, (f + 1) * per_file))
        _write(
            landing / f"{f:04d}.jsonl",
            [
                {
                    "event_id": f"E{k}",
                    "customer_id": f"C-{k}",
                    "operation": "INSERT",
                    "event_timestamp": stamp,
                    "customer_name": f"name {k}",
                    "email": f"c{k}@example.com",
                    "phone": "+1 555 0100",
                    "city": ("Pune", "Oslo", "Lima")[k % 3],
                    "country": ("IN", "NO", "PE")[k % 3],
                    "status": "ACTIVE",
                    "metadata": {"lsn": k + 1, "source_table": "public.customers"},
                }
                for k in keys
            ],
        )
    Pipeline(_config(work, "bulk")).run(Trigger.parse("available-now"))


def update_keys(work: Path, customers: int, events: int) -> None:
    """``events`` UPDATEs of distinct keys (city and status), one more micro-batch."""
    from cdcflow.pipeline import Pipeline, Trigger

    stamp = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    step = max(1, customers // max(1, events))
    keys = list(range(0, customers, step))[:events]
    _write(
        work / "landing" / "9999.jsonl",
        [
            {
                "event_id": f"U{k}",
                "customer_id": f"C-{k}",
                "operation": "UPDATE",
                "event_timestamp": stamp,
                "city": "Quito",
                "status": "SUSPENDED",
                "metadata": {"lsn": customers + k + 10},
            }
            for k in keys
        ],
    )
    Pipeline(_config(work, "bulk")).run(Trigger.parse("available-now"))


def _child(work: Path, method: str, out: Path) -> None:
    """One sync in this process (its report to ``out``), or with ``out`` ending in
    ``.reconcile.json`` the reconciliation of the last one (a process of its own: its memory is
    not the sync's)."""
    from cdcflow.sinks.snowflake.connection import connect
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    config = _config(work, method)
    if out.name.endswith(".reconcile.json"):
        out.write_text(json.dumps({"equal": reconcile_snowflake(config).equal}))
        return
    with connect(config):  # the emulator's server starts here, outside the measured sync
        pass
    started = time.perf_counter()
    report = sync_snowflake(config)
    seconds = time.perf_counter() - started
    dim = report.dim
    equal = None
    out.write_text(
        json.dumps(
            {
                "seconds": seconds,
                "kind": dim.kind,
                "load_method": dim.load_method,
                "staged": dim.staged,
                "equal": equal,
            }
        )
    )


def measure(work: Path, method: str) -> dict[str, Any]:
    """A sync in a child process; its peak RSS sampled (children included)."""
    out = work / f"sync-{method}.json"
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", method, "--work", str(work), "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if child.returncode != 0:
        stderr = child.stderr.read() if child.stderr else ""
        raise SystemExit(f"sync ({method}) failed: {stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.read_text())
    check = work / f"sync-{method}.reconcile.json"
    args = [sys.executable, __file__, "--child", method, "--work", str(work), "--out", str(check)]
    subprocess.run(args, check=True)
    result["equal"] = json.loads(check.read_text())["equal"]
    result["peak_rss_mib"] = round(peak / 2**20)
    result["rows_per_s"] = (
        round(result["staged"] / result["seconds"]) if result["seconds"] else None
    )
    return result


def _config_file(work: Path) -> Path:
    """The ``auto`` config as a YAML file (for the ``cdcflow`` processes)."""
    import yaml

    path = work / "cdcflow.yaml"
    raw = _config(work, "auto").model_dump(mode="json", exclude_defaults=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _round(value: Any) -> float | None:
    """Seconds to two decimals; None when nothing was measured (no sync with changed rows)."""
    return None if value is None else round(float(value), 2)


def _wait(done: Any, timeout_s: float) -> bool:
    """Poll ``done()`` every second until it is true (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(1)
    return False


def _received(work: Path) -> int:
    """Records the pipeline has committed (``audit/batch_log``)."""
    from deltalake import DeltaTable

    log = read_arrow(DeltaTable(str(work / "lake" / "audit" / "batch_log")))
    return int(sum(log.column("records_received").to_pylist()))


def _synced(work: Path) -> bool:
    """Whether ``audit/snowflake_sync`` holds, for Silver and every Gold table, a sync of its
    current Delta version."""
    import polars as pl
    from deltalake import DeltaTable

    from cdcflow.sinks.snowflake.inline import SYNC_LOG_TABLE
    from cdcflow.sinks.snowflake.tables import DIM_TABLE, GOLD_TABLES, SILVER_TABLE

    log = work / "lake" / SYNC_LOG_TABLE
    if not DeltaTable.is_deltatable(str(log)):  # no sync recorded yet
        return False
    frame = pl.from_arrow(read_arrow(DeltaTable(str(log))))
    assert isinstance(frame, pl.DataFrame)
    for name, target in {SILVER_TABLE: DIM_TABLE, **GOLD_TABLES}.items():
        path = work / "lake" / name
        if not DeltaTable.is_deltatable(str(path)):
            continue
        versions = frame.filter(pl.col("target_table") == target)["to_version"]
        if versions.is_empty() or versions.max() != DeltaTable(str(path)).version():
            return False
    return True


def continuous(work: Path, customers: int, seconds: int, rate: int) -> dict[str, Any]:
    """The continuous phase (module doc, 3.): the figures of its syncs."""
    import random
    import signal

    import polars as pl
    from deltalake import DeltaTable

    from cdcflow.sinks.snowflake.inline import SYNC_LOG_TABLE

    config = _config_file(work)
    before = _received(work)  # the records of the lakehouse's build and update
    cli = [sys.executable, "-m", "cdcflow"]
    logs = (work / "run.log").open("w"), (work / "sync.log").open("w")
    run = subprocess.Popen(
        [*cli, "run", "--config", str(config), "--trigger", "processing-time=1s"],
        stdout=logs[0],
        stderr=subprocess.STDOUT,
    )
    sync = subprocess.Popen(
        [*cli, "sync", "snowflake", "--config", str(config), "--continuous", "--interval", "500ms"],
        stdout=logs[1],
        stderr=subprocess.STDOUT,
    )
    rng = random.Random(7)
    lsn = 10 * customers
    started = time.monotonic()
    try:
        for second in range(seconds):
            now = datetime.now(UTC).isoformat()
            records = []
            for n in range(rate):
                lsn += 1
                k = rng.randrange(customers)
                records.append(
                    {"event_id": f"L{second}-{n}", "customer_id": f"C-{k}",
                     "operation": "UPDATE", "event_timestamp": now,
                     "city": rng.choice(["Quito", "Oslo", "Pune"]), "metadata": {"lsn": lsn}}
                )  # fmt: skip
            _write(work / "landing" / f"live-{second:05d}.jsonl", records)
            time.sleep(max(0.0, started + second + 1 - time.monotonic()))
        landed = time.monotonic()
        drained = _wait(lambda: _received(work) >= before + seconds * rate, 600)
        drain_s = time.monotonic() - landed
        run.send_signal(signal.SIGTERM)  # no commit after this: the next sync round is the last
        run.wait(timeout=120)
        caught_up = _wait(lambda: _synced(work) or sync.poll() is not None, 300)
        if sync.poll() is not None:  # the sync stopped on its own: an error, in its log
            logs[1].flush()
            tail = Path(logs[1].name).read_text().strip().splitlines()[-3:]
            raise SystemExit(f"sync snowflake --continuous exited {sync.returncode}: {tail}")
    finally:
        for process in (run, sync):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (run, sync):
            process.wait(timeout=120)
        for log_file in logs:
            log_file.close()
    frame = pl.from_arrow(read_arrow(DeltaTable(str(work / "lake" / SYNC_LOG_TABLE))))
    assert isinstance(frame, pl.DataFrame)
    dim = frame.filter(
        (pl.col("target_table") == "DIM_CUSTOMER_CURRENT") & (pl.col("mode") == "continuous")
    )
    measured = dim.filter(pl.col("event_lag_p50_s").is_not_null())
    check = work / "sync-auto.reconcile.json"
    args = [sys.executable, __file__, "--child", "auto", "--work", str(work), "--out", str(check)]
    subprocess.run(args, check=True)
    return {
        "seconds": seconds,
        "events_per_s": rate,
        "events": seconds * rate,
        "syncs": dim.height,
        "event_lag_p50_s": _round(measured["event_lag_p50_s"].median()),
        "event_lag_p95_s": _round(measured["event_lag_p95_s"].max()),
        "silver_to_snowflake_p50_s": _round(dim["lag_s"].median()),
        "drain_s": round(drain_s, 1),
        "drained": drained,
        "caught_up": caught_up,
        "pipeline_exit": run.returncode,
        "sync_exit": sync.returncode,
        "equal": json.loads(check.read_text())["equal"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--customers", type=int, default=100_000, help="keys in Silver")
    parser.add_argument("--events", type=int, default=1_000, help="keys changed, incremental")
    parser.add_argument("--files", type=int, default=4, help="landing files of the load")
    parser.add_argument("--methods", default="auto,bind")
    parser.add_argument("--bind-max", type=int, default=20_000, help="largest bind run (keys)")
    parser.add_argument("--continuous", type=int, default=0, help="seconds; 0: skip")
    parser.add_argument("--rate", type=int, default=1_000, help="events/s, continuous phase")
    parser.add_argument("--child")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.work, args.child, args.out)
        return
    methods = [m for m in args.methods.split(",") if m]
    skipped = [m for m in methods if m == "bind" and args.customers > args.bind_max]
    methods = [m for m in methods if m not in skipped]
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-sf-") as folder:
        work = Path(folder)
        started = time.perf_counter()
        build_lake(work, args.customers, args.files)
        print(
            f"lakehouse of {args.customers:,} keys built in {time.perf_counter() - started:.1f} s"
        )
        full = {m: measure(work, m) for m in methods}
        update_keys(work, args.customers, args.events)
        incremental = {m: measure(work, m) for m in methods}
        live = None
        if args.continuous:
            live = continuous(work, args.customers, args.continuous, args.rate)
    rows = []
    header = ("sync", "method", "rows", "seconds", "rows/s", "peak MiB")
    print("{:<12} {:<6} {:>9} {:>8} {:>9} {:>9}  equal".format(*header))
    for kind, results in (("full", full), ("incremental", incremental)):
        for method, r in results.items():
            rows.append({"sync": kind, "method": method, **r})
            print(
                f"{kind:<12} {method:<6} {r['staged']:>9,} {r['seconds']:>8.2f} "
                f"{r['rows_per_s'] or 0:>9,} {r['peak_rss_mib']:>9}  {r['equal']}"
            )
    for method in skipped:
        print(f"{method}: not run above --bind-max {args.bind_max:,} keys")
    if live:
        print(
            f"continuous: {live['events']:,} events at {live['events_per_s']:,}/s, "
            f"{live['syncs']} syncs; source event time → Snowflake commit p50 "
            f"{live['event_lag_p50_s']} s (median of the syncs' p50), p95 {live['event_lag_p95_s']}"
            f" s (largest sync p95); Silver commit → Snowflake commit p50 "
            f"{live['silver_to_snowflake_p50_s']} s; the pipeline drained the landing "
            f"{live['drain_s']} s after the last file; reconciled {live['equal']}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-snowflake.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine(),
                "customers": args.customers,
                "events": args.events,
                "runs": rows,
                "skipped": skipped,
                "continuous": live,
            },
            indent=1,
        )
    )
    print(f"written {out}")
    if not all(r["equal"] for r in rows) or (live and not live["equal"]):
        raise SystemExit("a sync did not reconcile EQUAL")


if __name__ == "__main__":
    main()
