"""Growth and trickle benchmarks of the local engine (not tests).

Usage::

    .venv/bin/python bench/growth.py growth                      # 100 micro-batches
    .venv/bin/python bench/growth.py growth --batches 120 --events-per-batch 5000
    .venv/bin/python bench/growth.py trickle --keys 1000000      # 1,000 events/s, 1M keys
    .venv/bin/python bench/growth.py trickle --keys 100000 --seconds 30

``growth``: one data set (``cdcflow generate``: re-deliveries, late and out-of-order events,
partial updates, deletes) in ``--batches`` landing files of equal size, one micro-batch per
file. Reports the duration of the first and of the last micro-batches (``BatchReport``
``duration_ms``; the median of the first 5 and of the last 5, so one slow batch does not decide)
and their ratio: how the cost of a micro-batch grows with the lakehouse.

``trickle``: first a snapshot of ``--keys`` customers (one INSERT each) in one micro-batch,
then a producer thread writes ``--rate`` events/s as one small file every ``--interval``
seconds (written under a temporary name and renamed into place: the landing time), while the
pipeline runs with trigger ``processing-time=<interval>``. Reports p50/p95/max of landing →
Silver commit (the batch's commit marker) over every file.

Results are printed and written to ``bench/results/<UTC time>-<kind>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pipeline import RESULTS, PeakRss, machine


def _config(work: Path, landing: Path, **source: Any) -> Any:
    from cdcflow.config import CdcflowConfig

    return CdcflowConfig(
        storage={"root": str(work / "lake")},
        source={"path": str(landing), **source},
        checkpoint={"location": str(work / "lake" / "_checkpoints" / "customers")},
        logging={"level": "WARNING"},
    )


def growth(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run ``args.batches`` equal micro-batches; first vs last duration."""
    from cdcflow.generator import GeneratorConfig, generate
    from cdcflow.pipeline import Pipeline, Trigger

    landing = work / "landing"
    events = args.batches * args.events_per_batch
    generate(
        landing,
        GeneratorConfig(
            events=events,
            customers=args.customers,
            files=args.batches,
            seed=7,
            **({"out_of_order_rate": 0.0, "late_rate": 0.0} if args.in_order else {}),
        ),
    )
    config = _config(work, landing, max_files_per_trigger=1)
    with PeakRss() as rss:
        started = time.perf_counter()
        reports = Pipeline(config).run(Trigger.parse("available-now"))
        seconds = time.perf_counter() - started
    durations = [r.duration_ms / 1000 for r in reports]
    first = statistics.median(durations[:5])
    last = statistics.median(durations[-5:])
    return {
        "kind": "growth",
        "events": events,
        "customers": args.customers,
        "in_order": args.in_order,
        "micro_batches": len(reports),
        "records_per_batch": statistics.median(r.records_received for r in reports),
        "first_batch_s": round(first, 3),
        "last_batch_s": round(last, 3),
        "ratio_last_to_first": round(last / first, 2),
        "run_s": round(seconds, 1),
        "events_per_s": round(events / seconds),
        "peak_rss_mib": round(rss.peak / 2**20),
        "durations_s": [round(d, 3) for d in durations],
        "first_stage_s": _stage_medians(reports[:5]),
        "last_stage_s": _stage_medians(reports[-5:]),
    }


def _stage_medians(reports: list[Any]) -> dict[str, float]:
    """Median seconds per stage (``BatchReport.stage_seconds``) over ``reports``."""
    stages = sorted({name for r in reports for name in r.stage_seconds})
    return {
        name: round(statistics.median(r.stage_seconds.get(name, 0.0) for r in reports), 3)
        for name in stages
    }


def _snapshot(landing: Path, keys: int) -> None:
    """One INSERT per key, in one file (the initial load)."""
    now = datetime.now(UTC)
    with open(landing / "snapshot.jsonl.part", "w", encoding="utf-8") as out:
        for i in range(keys):
            record = {
                "event_id": f"S-{i}",
                "customer_id": f"C-{i}",
                "operation": "INSERT",
                "event_timestamp": now.isoformat(),
                "customer_name": f"Name {i}",
                "email": f"user{i}@example.com",
                "city": "Paris",
                "country": "France",
                "status": "ACTIVE",
                "metadata": {"source_table": "customers", "lsn": str(1000 + i)},
            }
            out.write(json.dumps(record) + "\n")
    os.replace(landing / "snapshot.jsonl.part", landing / "snapshot.jsonl")
    os.utime(landing / "snapshot.jsonl", (1_700_000_000, 1_700_000_000))


def trickle(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A snapshot of ``args.keys`` keys, then ``args.rate`` events/s; landing → commit."""
    import random

    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.state.checkpoint import Checkpoint

    landing = work / "landing"
    landing.mkdir(parents=True)
    _snapshot(landing, args.keys)
    config = _config(work, landing)
    started = time.perf_counter()
    Pipeline(config).run(Trigger.parse("available-now"))
    load_s = time.perf_counter() - started

    per_file = max(1, int(args.rate * args.interval))
    files = int(args.seconds / args.interval)
    landed: dict[str, float] = {}
    rng = random.Random(3)
    pipeline = Pipeline(config)

    def produce() -> None:
        lsn = 10**9
        for n in range(files):
            name = f"t{n:06d}.jsonl"
            lines = []
            for i in range(per_file):
                lsn += 1
                key = rng.randrange(args.keys)
                record = {
                    "event_id": f"T-{n}-{i}",
                    "customer_id": f"C-{key}",
                    "operation": "UPDATE",
                    "event_timestamp": datetime.now(UTC).isoformat(),
                    "city": rng.choice(["Lyon", "Oslo", "Lima"]),
                    "metadata": {"source_table": "customers", "lsn": str(lsn)},
                }
                lines.append(json.dumps(record))
            part = landing / (name + ".part")
            part.write_text("\n".join(lines) + "\n", encoding="utf-8")
            os.replace(part, landing / name)
            landed[str((landing / name).resolve())] = time.time()
            time.sleep(args.interval)
        time.sleep(max(3.0, 5 * args.interval))  # the last files reach Silver
        pipeline.stop()

    producer = threading.Thread(target=produce, daemon=True)
    with PeakRss() as rss:
        producer.start()
        pipeline.run(Trigger.parse(f"processing-time={int(args.interval * 1000)}ms"))
        producer.join()
    checkpoint = Checkpoint(config.checkpoint.location)
    latencies: list[float] = []
    last = checkpoint.last_batch() or 0
    for batch in range(1, last + 1):
        if not checkpoint.is_committed(batch):
            continue
        commit = json.loads((checkpoint.commits_dir / f"{batch}.json").read_text("utf-8"))
        committed = datetime.fromisoformat(commit["committed_at"]).timestamp()
        for file in checkpoint.offsets(batch).files:
            if file.path in landed:
                latencies.append(committed - landed[file.path])
    latencies.sort()
    return {
        "kind": "trickle",
        "keys": args.keys,
        "rate_events_per_s": args.rate,
        "interval_s": args.interval,
        "files": len(latencies),
        "snapshot_load_s": round(load_s, 1),
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3)
        if latencies
        else None,
        "latency_max_s": round(latencies[-1], 3) if latencies else None,
        "micro_batches": last,
        "peak_rss_mib": round(rss.peak / 2**20),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    g = sub.add_parser("growth")
    g.add_argument("--batches", type=int, default=100)
    g.add_argument("--events-per-batch", type=int, default=2000)
    g.add_argument("--customers", type=int, default=20000)
    g.add_argument(
        "--in-order",
        action="store_true",
        help="deliver every event in sequence order (as a PostgreSQL slot or Debezium does): "
        "no out-of-order or late event, so no event lands inside a stored timeline",
    )
    t = sub.add_parser("trickle")
    t.add_argument("--keys", type=int, default=1_000_000)
    t.add_argument("--rate", type=float, default=1000.0)
    t.add_argument("--interval", type=float, default=1.0)
    t.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-") as tmp:
        result = (growth if args.kind == "growth" else trickle)(args, Path(tmp))
    result["machine"] = machine()
    result["measured_at"] = datetime.now(UTC).isoformat()
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"{stamp}-{args.kind}.json").write_text(json.dumps(result, indent=2))
    shown = {k: v for k, v in result.items() if k not in ("durations_s", "machine")}
    print(json.dumps(shown, indent=2))


if __name__ == "__main__":
    main()
