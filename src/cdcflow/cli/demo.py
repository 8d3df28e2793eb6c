"""``cdcflow demo``: the whole story on 10,000 events, in a fresh ``./demo`` folder.

Steps (:data:`STEPS`, run in order; a step is a name and a function of the
:class:`DemoContext` returning ``(ok, detail)`` — append to the list to extend the demo):

1. ``generate`` — sample landing files and the expected Silver state (reference fold);
2. ``run`` — the pipeline, trigger available-now, several micro-batches (a table per batch);
3. ``reconcile`` — Silver and quarantine against the expected state and counts;
4. ``replay --verify`` — rebuild Silver from Bronze alone and compare with the live Silver.

It ends with one summary table; the exit code is 1 when a step failed.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from cdcflow.cli.app import console
from cdcflow.config import CdcflowConfig, load_config
from cdcflow.errors import CdcflowError

DEMO_MARKER = "cdcflow.yaml"


@dataclass
class DemoContext:
    """State shared by the demo steps.

    Attributes:
        root: the demo folder.
        config_path: the demo's YAML config (written by :func:`prepare`).
        config: the loaded config.
        events: source changes to generate.
        seed: generator seed.
        data: what steps hand to later steps (e.g. ``expected`` path, ``counts``).
    """

    root: Path
    config_path: Path
    config: CdcflowConfig
    events: int = 10_000
    seed: int = 42
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """Outcome of one demo step."""

    step: str
    ok: bool
    detail: str
    seconds: float


StepFn = Callable[[DemoContext], tuple[bool, str]]


def step_generate(ctx: DemoContext) -> tuple[bool, str]:
    """Generate landing files and the expected state."""
    from cdcflow.cli.generate import write_expected
    from cdcflow.generator import GeneratorConfig, generate

    summary = generate(
        ctx.config.source.path,
        GeneratorConfig(
            events=ctx.events, customers=max(10, ctx.events // 10), files=20, seed=ctx.seed
        ),
    )
    expected = ctx.root / "expected" / "silver.parquet"
    counts = write_expected(summary, expected, delete_mode=ctx.config.processing.delete_mode)
    ctx.data.update(expected=expected, counts=counts)
    return True, (
        f"{summary.records} records in {len(summary.files)} files "
        f"({summary.duplicates} duplicates, {summary.invalid} invalid)"
    )


def step_run(ctx: DemoContext) -> tuple[bool, str]:
    """Run the pipeline until the landing folder is drained."""
    from cdcflow.cli.render import batch_table
    from cdcflow.pipeline import Pipeline, Trigger

    reports = Pipeline(ctx.config).run(Trigger.parse("available-now"))
    console.print(batch_table(reports))
    accepted = sum(r.accepted for r in reports)
    quarantined = sum(r.quarantined for r in reports)
    events = sum(r.records_received for r in reports)
    seconds = sum(r.duration_ms for r in reports) / 1000
    rate = events / seconds if seconds else 0.0
    ctx.data["reports"] = reports
    return bool(reports), (
        f"{len(reports)} micro-batches, {accepted} accepted, {quarantined} quarantined, "
        f"{rate:,.0f} records/s"
    )


def step_reconcile(ctx: DemoContext) -> tuple[bool, str]:
    """Silver vs the expected state; quarantine counts per reason vs the expected counts."""
    from deltalake import DeltaTable

    from cdcflow.cli.reconcile import print_report, run_reconcile
    from cdcflow.engines.local.delta import scan_table

    report = run_reconcile(ctx.config, expected=ctx.data["expected"])
    print_report(report)
    quarantine = scan_table(DeltaTable(ctx.config.table_uri("quarantine/customer_events"))).select(
        "failure_reason"
    )
    got = quarantine.group_by("failure_reason").len().collect()
    reasons = dict(zip(got["failure_reason"].to_list(), got["len"].to_list(), strict=True))
    quarantine_ok = reasons == ctx.data["counts"]["quarantine"]
    c = report.actual_counts
    return report.ok and quarantine_ok, (
        f"{c.rows} rows, {c.active} active, {c.deleted} deleted; "
        f"{report.matched_rows}/{report.expected_counts.rows} rows equal; "
        f"quarantine reasons {'match' if quarantine_ok else 'DIFFER'}"
    )


def step_replay(ctx: DemoContext) -> tuple[bool, str]:
    """Rebuild Silver from Bronze and compare with the live Silver."""
    from cdcflow.cli.replay import replay_table, run_replay

    result = run_replay(ctx.config, verify=True, bucket_rows=4_000)
    console.print(replay_table(result))
    report = result.silver_report
    assert report is not None
    return bool(result.verified), (
        f"{result.events} events in {result.buckets} buckets, {result.seconds:.1f}s; "
        f"{report.matched_rows}/{report.expected_counts.rows} rows equal"
    )


def step_gold(ctx: DemoContext) -> tuple[bool, str]:
    """Print the Gold tables refreshed by the run (active customers by geo, daily, status)."""
    from deltalake import DeltaTable

    from cdcflow.cli.maintenance import print_gold
    from cdcflow.engines.local.delta import arrow_dataset
    from cdcflow.layers.gold import GOLD_TABLES

    print_gold(ctx.config, console)
    rows = {
        spec.name: arrow_dataset(DeltaTable(ctx.config.table_uri(spec.name))).count_rows()
        for spec in GOLD_TABLES
    }
    return all(rows.values()), ", ".join(f"{name}: {n} rows" for name, n in rows.items())


def step_snowflake(ctx: DemoContext) -> tuple[bool, str]:
    """Sync Silver and Gold to Snowflake (the fakesnow emulator without credentials), reconcile."""
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    sync_snowflake(ctx.config)
    report = reconcile_snowflake(ctx.config)
    return report.equal, report.summary()


#: The demo's steps, in order (extend by appending ``(name, function)``).
STEPS: list[tuple[str, StepFn]] = [
    ("generate", step_generate),
    ("run", step_run),
    ("gold", step_gold),
    ("reconcile", step_reconcile),
    ("replay --verify", step_replay),
    ("snowflake", step_snowflake),
]


def prepare(root: Path, delete_mode: str = "soft") -> Path:
    """Create a fresh demo folder with its config; returns the config path.

    Raises:
        CdcflowError: the folder exists and is not a demo folder (no ``cdcflow.yaml``).
    """
    if root.exists():
        if any(root.iterdir()) and not (root / DEMO_MARKER).exists():
            raise CdcflowError(f"{root}: exists and is not a cdcflow demo folder; choose --dir")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    base = root.resolve()
    config = {
        "pipeline": {"name": "customers"},
        "storage": {"root": str(base / "lakehouse")},
        "source": {"path": str(base / "landing"), "max_files_per_trigger": 4},
        "checkpoint": {"location": str(base / "lakehouse" / "_checkpoints" / "customers")},
        "processing": {"delete_mode": delete_mode},
        "logging": {"level": "WARNING"},
    }
    path = root / DEMO_MARKER
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_demo(
    root: Path,
    events: int = 10_000,
    seed: int = 42,
    delete_mode: str = "soft",
    steps: list[tuple[str, StepFn]] | None = None,
) -> list[StepResult]:
    """Run the demo steps in a fresh folder; a failing step stops the demo.

    Returns:
        One result per step run.
    """
    from cdcflow.logs import setup_logging

    config_path = prepare(root, delete_mode)
    config = load_config(config_path)
    setup_logging(config.logging.level)
    ctx = DemoContext(root=root, config_path=config_path, config=config, events=events, seed=seed)
    results: list[StepResult] = []
    for name, fn in steps or STEPS:
        console.rule(f"[bold]{name}")
        started = time.perf_counter()
        try:
            ok, detail = fn(ctx)
        except CdcflowError as exc:
            ok, detail = False, f"error: {exc}"
        results.append(StepResult(name, ok, detail, time.perf_counter() - started))
        if not ok:
            break
    return results


def summary_table(results: list[StepResult]) -> Table:
    """One row per demo step."""
    table = Table(title="cdcflow demo")
    table.add_column("step")
    table.add_column("result", justify="center")
    table.add_column("detail")
    table.add_column("seconds", justify="right")
    for r in results:
        mark = "[green]PASS[/]" if r.ok else "[red]FAIL[/]"
        table.add_row(r.step, mark, r.detail, f"{r.seconds:.1f}")
    return table


def demo(
    folder: Annotated[Path, typer.Option("--dir", help="Demo folder (recreated).")] = Path("demo"),
    events: Annotated[int, typer.Option(min=100, help="Source changes to generate.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 42,
    delete_mode: Annotated[str, typer.Option(help="soft | hard")] = "soft",
    output: Annotated[str, typer.Option(help="text | json")] = "text",
) -> None:
    """Generate 10,000 events -> run -> reconcile against expected -> replay --verify."""
    if delete_mode not in ("soft", "hard"):
        raise CdcflowError(f"--delete-mode: expected soft or hard, got {delete_mode!r}")
    results = run_demo(folder, events, seed, delete_mode)
    console.print(summary_table(results))
    if output == "json":
        typer.echo(json.dumps([r.__dict__ for r in results], indent=1))
    passed = len(results) == len(STEPS) and all(r.ok for r in results)
    if passed and output != "json":
        console.print(f"next: cdcflow replay --config {folder / DEMO_MARKER} --verify")
    if not passed:
        raise typer.Exit(1)
