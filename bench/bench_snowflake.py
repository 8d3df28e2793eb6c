"""Snowflake sync benchmark against the local fakesnow server (not a test).

Usage::

    .venv/bin/python bench/bench_snowflake.py                         # 100,000 keys
    .venv/bin/python bench/bench_snowflake.py --customers 1000000 --methods auto
    .venv/bin/python bench/bench_snowflake.py --customers 20000 --events 1000

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
process (not measured).

What the figures measure: the whole sync path — the Delta read (snapshot or Change Data Feed),
the Parquet files or the bound rows, PUT, COPY, the MERGE and the state update — against the
fakesnow emulator (DuckDB behind Snowflake's wire protocol), running in the same process as the
sync (its memory is in the peak RSS). The emulator's speed is not Snowflake's: a real account
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
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    config = _config(work, method)
    if out.name.endswith(".reconcile.json"):
        out.write_text(json.dumps({"equal": reconcile_snowflake(config).equal}))
        return
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--customers", type=int, default=100_000, help="keys in Silver")
    parser.add_argument("--events", type=int, default=1_000, help="keys changed, incremental")
    parser.add_argument("--files", type=int, default=4, help="landing files of the load")
    parser.add_argument("--methods", default="auto,bind")
    parser.add_argument("--bind-max", type=int, default=20_000, help="largest bind run (keys)")
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
            },
            indent=1,
        )
    )
    print(f"written {out}")
    if not all(r["equal"] for r in rows):
        raise SystemExit("a sync did not reconcile EQUAL")


if __name__ == "__main__":
    main()
