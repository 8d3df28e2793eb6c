"""Throughput benchmark of the local engine (not a test): landing -> Silver committed, then replay.

Usage::

    uv run python bench/bench_pipeline.py   # 1,000,000 events over 100,000 customers
    uv run python bench/bench_pipeline.py --events 10000000 --customers 1000000
    uv run python bench/bench_pipeline.py --events 200000 --customers 20000

Steps: generate the landing files in a child process (so its memory is not counted), run the
pipeline (trigger available-now, ``--max-files-per-trigger`` files per micro-batch), then rebuild
Silver from Bronze (``replay``, shadow tables) and verify it against the live Silver.

Prints and writes to ``bench/results/<UTC time>-<events>.json``: events/s end to end (source
changes / wall seconds of the run, from the first offset write to the last commit marker),
records/s, per-stage seconds (sum of ``BatchReport.stage_seconds``), peak RSS of the run and of
the replay (psutil, sampled every 50 ms), replay seconds, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"


class PeakRss:
    """Samples this process's resident set size in a thread; ``peak`` in bytes."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _generate(landing: Path, args: argparse.Namespace) -> dict[str, Any]:
    code = (
        "import json, sys\n"
        "from cdcflow.generator import GeneratorConfig, generate\n"
        f"s = generate({str(landing)!r}, GeneratorConfig(events={args.events}, "
        f"customers={args.customers}, files={args.files}, seed={args.seed}))\n"
        "print(json.dumps({'records': s.records, 'files': len(s.files), "
        "'duplicates': s.duplicates, 'invalid': s.invalid}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    """Where the benchmark ran."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from cdcflow.config import CdcflowConfig
    from cdcflow.engines.local import replay
    from cdcflow.pipeline import Pipeline, Trigger

    console = Console(stderr=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cdcflow-bench-"))
    if work.exists():
        shutil.rmtree(work)
    landing = work / "landing"
    console.print(f"generating {args.events:,} events over {args.customers:,} customers in {work}")
    started = time.perf_counter()
    generated = _generate(landing, args)
    generate_s = time.perf_counter() - started

    config = CdcflowConfig(
        storage={"root": str(work / "lake")},
        source={"path": str(landing), "max_files_per_trigger": args.max_files_per_trigger},
        checkpoint={"location": str(work / "lake" / "_checkpoints" / "customers")},
        processing={"delete_mode": args.delete_mode},
    )
    batches = -(-generated["files"] // args.max_files_per_trigger)
    stages: dict[str, float] = {}
    with (
        Progress(BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar,
        PeakRss() as run_rss,
    ):
        task = bar.add_task("micro-batches", total=batches)
        started = time.perf_counter()
        reports = Pipeline(config).run(
            Trigger.parse("available-now"), on_batch=lambda _: bar.advance(task)
        )
        run_s = time.perf_counter() - started
    for report in reports:
        for stage, seconds in report.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds

    with PeakRss() as replay_rss:
        started = time.perf_counter()
        result = replay.rebuild_shadow(config, bucket_rows=args.bucket_rows)
        rebuild_s = time.perf_counter() - started
        replay.verify(config, result)
        replay_s = time.perf_counter() - started

    records = sum(r.records_received for r in reports)
    out = {
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine(),
        "params": {
            "events": args.events,
            "customers": args.customers,
            "files": generated["files"],
            "max_files_per_trigger": args.max_files_per_trigger,
            "delete_mode": args.delete_mode,
            "bucket_rows": args.bucket_rows,
            "seed": args.seed,
        },
        "generate_s": round(generate_s, 2),
        "records": records,
        "micro_batches": len(reports),
        "run_s": round(run_s, 2),
        "events_per_s": round(args.events / run_s, 1),
        "records_per_s": round(records / run_s, 1),
        "stage_seconds": {k: round(v, 2) for k, v in stages.items()},
        "run_peak_rss_mib": round(run_rss.peak / 2**20, 1),
        "replay_rebuild_s": round(rebuild_s, 2),
        "replay_verify_s": round(replay_s - rebuild_s, 2),
        "replay_events_per_s": round(result.events / rebuild_s, 1),
        "replay_buckets": result.buckets,
        "replay_verified": result.verified,
        "replay_peak_rss_mib": round(replay_rss.peak / 2**20, 1),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=100, help="landing files")
    parser.add_argument("--max-files-per-trigger", type=int, default=10)
    parser.add_argument("--delete-mode", choices=["soft", "hard"], default="soft")
    parser.add_argument("--bucket-rows", type=int, default=250_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workdir", help="working folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    args = parser.parse_args(argv)
    result = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{stamp}-{args.events}.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
