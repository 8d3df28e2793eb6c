"""Local vs Spark engine throughput on the same workload (not a test).

Usage::

    scripts/spark/fetch-jars.sh                        # once: the Delta jars
    uv run python bench/bench_engines.py               # 1,000,000 events over 100,000 customers
    uv run python bench/bench_engines.py --events 20000 --customers 2000   # a quick run

Generates one landing folder (:func:`cdcflow.generator.generate`), then runs the pipeline with
trigger ``available-now`` over it once per engine, each in its own process (so peak memory is
per engine) and into its own lake and checkpoint, and checks that both Silver tables are
identical. Prints and writes to ``bench/results/<UTC time>-engines-<events>.json``: events/s per
engine (records delivered / wall seconds of the run; the Spark figure excludes the SparkSession
start, reported separately), peak resident memory per engine (MiB; for Spark the Python driver's
plus the JVM's high-water marks, Python workers not counted) and the ratio spark/local.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.generator import GeneratorConfig, generate
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.reference import SILVER_COLUMNS

RESULTS = Path(__file__).resolve().parent / "results"


def _config(root: Path, landing: Path, engine: str, max_files: int) -> CdcflowConfig:
    return CdcflowConfig(
        pipeline={"engine": engine},
        storage={"root": str(root / "lake")},
        source={"path": str(landing), "max_files_per_trigger": max_files},
        checkpoint={"location": str(root / "checkpoint")},
        gold={"refresh_every_batches": 0},
    )


def _silver(config: CdcflowConfig) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(config.table_uri("silver/customers")).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.select(SILVER_COLUMNS).sort("customer_id")


def _run(config: CdcflowConfig) -> tuple[float, int]:
    started = time.perf_counter()
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    return time.perf_counter() - started, len(reports)


def _one_engine(root: Path, landing: Path, engine: str, max_files: int) -> None:
    """Child process: run one engine, print its JSON result on the last stdout line."""
    config = _config(root / engine, landing, engine, max_files)
    session_s = 0.0
    if engine == "spark":
        from cdcflow.engines.spark.session import get_session

        started = time.perf_counter()
        get_session(config.spark)
        session_s = time.perf_counter() - started
    seconds, batches = _run(config)
    jvm_kib = 0
    if engine == "spark":
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        assert gateway is not None
        status = Path(f"/proc/{gateway.proc.pid}/status").read_text(encoding="utf-8")
        jvm_kib = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmHWM:"))
    driver_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": seconds,
                "batches": batches,
                "session_start_s": session_s,
                "driver_peak_rss_mib": round(driver_kib / 1024, 1),
                "jvm_peak_rss_mib": round(jvm_kib / 1024, 1),
                "peak_rss_mib": round((driver_kib + jvm_kib) / 1024, 1),
            }
        )
    )


def main() -> None:
    """Run the benchmark (see module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--max-files-per-trigger", type=int, default=5)
    parser.add_argument("--only", choices=["local", "spark"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:  # child process of the benchmark
        root = Path(args.root)
        _one_engine(root, root / "landing", args.only, args.max_files_per_trigger)
        return

    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-engines-") as tmp:
        root = Path(tmp)
        landing = root / "landing"
        generate(
            landing,
            GeneratorConfig(events=args.events, customers=args.customers, files=args.files),
        )
        result: dict[str, Any] = {
            "events": args.events,
            "customers": args.customers,
            "files": args.files,
            "max_files_per_trigger": args.max_files_per_trigger,
            "machine": {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
        }
        for engine in ("local", "spark"):
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--only",
                    engine,
                    "--root",
                    str(root),
                    "--max-files-per-trigger",
                    str(args.max_files_per_trigger),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            run = json.loads(child.stdout.strip().splitlines()[-1])
            run["events_s"] = args.events / run["seconds"]
            result[engine] = run
        result["ratio_spark_over_local"] = result["spark"]["events_s"] / result["local"]["events_s"]
        local = _config(root / "local", landing, "local", args.max_files_per_trigger)
        spark_config = _config(root / "spark", landing, "spark", args.max_files_per_trigger)
        result["silver_identical"] = _silver(local).equals(_silver(spark_config))

    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{stamp}-engines-{args.events}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
