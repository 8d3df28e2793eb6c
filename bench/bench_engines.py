"""Local vs Spark engine throughput on the same workload (not a test).

Usage::

    scripts/spark/fetch-jars.sh                        # once: the Delta jars
    uv run python bench/bench_engines.py               # 1,000,000 events over 100,000 customers
    uv run python bench/bench_engines.py --events 20000 --customers 2000   # a quick run
    # micro-batch latency, also on the standalone cluster (scripts/spark/cluster.sh):
    uv run python bench/bench_engines.py --events 10000 --customers 2000 --files 10 \
        --max-files-per-trigger 1 --cluster

Generates one landing folder (:func:`cdcflow.generator.generate`), then runs the pipeline with
trigger ``available-now`` over it once per engine, each in its own process (so peak memory is
per engine) and into its own lake and checkpoint, and checks that the Silver tables are
identical. The engines: ``local``, ``spark`` (``local[2]``) and, with ``--cluster``,
``spark-cluster``: the Spark engine on the standalone cluster of ``scripts/spark/cluster.sh``
(a master and two workers of one core and 1 GiB each on 127.0.0.1; started for the run when not
running, and then stopped again), one executor of one core and 900 MiB per worker.

Prints and writes to ``bench/results/<UTC time>-engines-<events>.json``, per engine: events/s
(records delivered / wall seconds of the run; the Spark figures exclude the SparkSession start,
reported separately), peak resident memory (MiB; for Spark the Python driver's plus the driver
JVM's high-water marks; Python workers and executors not counted), and per micro-batch: the
median records and seconds of the warm micro-batches (``audit/batch_log.duration_ms``; every
batch but the first), the median Spark jobs per micro-batch (``audit/batch_log.spark_jobs``)
and the median seconds per stage of the warm micro-batches. Then the ratios spark/local (and
spark-cluster/local).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
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
from cdcflow.engines.local.delta import read_arrow
from cdcflow.generator import GeneratorConfig, generate
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.reference import SILVER_COLUMNS

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = PROJECT / "scripts" / "spark" / "cluster.sh"
#: the engines a run compares: name -> the pipeline engine it configures
ENGINES = {"local": "local", "spark": "spark", "spark-cluster": "spark"}
#: the Spark application on the standalone cluster (as config/spark-cluster.yaml)
CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",  # the workers reach the driver on the loopback
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.cores": "1",  # one executor of one core on each worker
    "spark.executor.memory": "900m",  # within the 1g a worker offers
}


def _config(
    root: Path, landing: Path, name: str, max_files: int, master: str = ""
) -> CdcflowConfig:
    spark: dict[str, Any] = {}
    if name == "spark-cluster":
        spark = {"master": master, "conf": CLUSTER_CONF}
    return CdcflowConfig(
        pipeline={"engine": ENGINES[name]},
        storage={"root": str(root / name / "lake")},
        source={"path": str(landing), "max_files_per_trigger": max_files},
        checkpoint={"location": str(root / name / "checkpoint")},
        gold={"refresh_every_batches": 0},
        spark=spark,
    )


def _silver(config: CdcflowConfig) -> pl.DataFrame:
    frame = pl.from_arrow(read_arrow(DeltaTable(config.table_uri("silver/customers"))))
    assert isinstance(frame, pl.DataFrame)
    return frame.select(SILVER_COLUMNS).sort("customer_id")


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _micro_batches(config: CdcflowConfig, stages: list[dict[str, float]]) -> dict[str, Any]:
    """Per micro-batch figures from ``audit/batch_log`` and the reports' stage seconds: medians
    over the warm micro-batches (all but the first, which also creates the tables)."""
    log = pl.from_arrow(read_arrow(DeltaTable(config.table_uri("audit/batch_log"))))
    assert isinstance(log, pl.DataFrame)
    warm = log.sort("batch_id").slice(1)
    jobs = [n for n in log["spark_jobs"].to_list() if n is not None]
    names = sorted({name for batch in stages[1:] for name in batch})
    return {
        "warm_batches": warm.height,
        "median_batch_records": _median([float(n) for n in warm["records_received"]]),
        "median_batch_s": _median([ms / 1000 for ms in warm["duration_ms"]]),
        "max_batch_s": round(max(warm["duration_ms"]) / 1000, 3) if warm.height else None,
        "median_spark_jobs": _median([float(n) for n in jobs]),
        "median_stage_s": {
            name: _median([batch.get(name, 0.0) for batch in stages[1:]]) for name in names
        },
    }


def _one_engine(root: Path, landing: Path, name: str, max_files: int, master: str) -> None:
    """Child process: run one engine, print its JSON result on the last stdout line."""
    config = _config(root, landing, name, max_files, master)
    session_s = 0.0
    spark = ENGINES[name] == "spark"
    if spark:
        from cdcflow.engines.spark.session import get_session

        started = time.perf_counter()
        get_session(config.spark, config.storage)
        session_s = time.perf_counter() - started
    started = time.perf_counter()
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    seconds = time.perf_counter() - started
    jvm_kib = 0
    if spark:
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
                "batches": len(reports),
                "session_start_s": session_s,
                "driver_peak_rss_mib": round(driver_kib / 1024, 1),
                "jvm_peak_rss_mib": round(jvm_kib / 1024, 1),
                "peak_rss_mib": round((driver_kib + jvm_kib) / 1024, 1),
                **_micro_batches(config, [report.stage_seconds for report in reports]),
            }
        )
    )


def _start_cluster() -> tuple[str, bool]:
    """Start the standalone cluster unless it runs; returns (master URL, started by us)."""
    status = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], cwd=PROJECT, check=False)
    started = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start"],
        cwd=PROJECT,
        check=True,
        capture_output=True,
        text=True,
    )
    return started.stdout.strip().splitlines()[-1], status.returncode != 0


def main() -> None:
    """Run the benchmark (see module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--max-files-per-trigger", type=int, default=5)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also run the Spark engine on the standalone cluster (scripts/spark/cluster.sh)",
    )
    parser.add_argument("--only", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--master", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:  # child process of the benchmark
        root = Path(args.root)
        _one_engine(root, root / "landing", args.only, args.max_files_per_trigger, args.master)
        return

    engines = ["local", "spark"] + (["spark-cluster"] if args.cluster else [])
    master, stop_cluster = _start_cluster() if args.cluster else ("", False)
    try:
        with tempfile.TemporaryDirectory(prefix="cdcflow-bench-engines-") as tmp:
            result = _compare(args, Path(tmp), engines, master)
    finally:
        if stop_cluster:
            subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], cwd=PROJECT, check=False)

    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{stamp}-engines-{args.events}.json").write_text(json.dumps(result, indent=1))


def _compare(args: argparse.Namespace, root: Path, engines: list[str], master: str) -> dict:
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
    for name in engines:
        command = [sys.executable, __file__, "--only", name, "--root", str(root)]
        command += ["--max-files-per-trigger", str(args.max_files_per_trigger)]
        command += ["--master", master]
        child = subprocess.run(command, check=False, capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit(f"bench: the {name} run failed:\n{child.stderr[-4000:]}")
        run = json.loads(child.stdout.strip().splitlines()[-1])
        run["events_s"] = args.events / run["seconds"]
        result[name] = run
    for name in engines[1:]:
        ratio = result[name]["events_s"] / result["local"]["events_s"]
        result[f"ratio_{name.replace('-', '_')}_over_local"] = ratio
    silvers = [
        _silver(_config(root, landing, name, args.max_files_per_trigger, master))
        for name in engines
    ]
    result["silver_identical"] = all(silvers[0].equals(other) for other in silvers[1:])
    return result


if __name__ == "__main__":
    main()
