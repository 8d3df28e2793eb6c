"""``cdcflow demo``: the whole story on 10,000 events, in a fresh ``./demo`` folder.

Steps (:data:`STEPS`, run in order; a step is a name and a function of the
:class:`DemoContext` returning ``(ok, detail)`` — append to the list to extend the demo):

1. ``generate`` — sample landing files and the expected Silver state (reference fold);
2. ``run`` — the pipeline, trigger available-now, several micro-batches (a table per batch);
3. ``reconcile`` — Silver and quarantine against the expected state and counts;
4. ``replay --verify`` — rebuild Silver from Bronze alone and compare with the live Silver;
5. ``gold`` and ``snowflake`` — the Gold tables, then Silver and Gold synced to Snowflake;
6. ``tables v1 → v2`` — a second pipeline of two declared tables (``<demo>/shop``: an integer
   key, a composite key) whose accounts contract gains a column mid-stream.

It ends with one summary table; the exit code is 1 when a step failed. After a passing demo it
prints commands to try next (:func:`next_commands`): none of them a step the demo ran, each
working as pasted from the current folder (the program as it was started, the demo's config).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from cdcflow.cli.app import console
from cdcflow.config import CdcflowConfig, load_config
from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import CdcflowError, UsageError

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
    from cdcflow.cli.generate import summary_table, write_expected
    from cdcflow.cli.tables import output_width
    from cdcflow.generator import GeneratorConfig, generate

    summary = generate(
        ctx.config.source.path,
        GeneratorConfig(
            events=ctx.events, customers=max(10, ctx.events // 10), files=20, seed=ctx.seed
        ),
    )
    expected = ctx.root / "expected" / "silver.parquet"
    delete_mode = ctx.config.processing.delete_mode
    counts = write_expected(summary, expected, delete_mode=delete_mode)
    ctx.data.update(expected=expected, counts=counts)
    table = summary_table(summary, ctx.root / "landing", expected, None, counts, delete_mode)
    table.title = None  # the step's rule names it
    console.print(table, width=output_width(console))
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
    from cdcflow.cli.sync import sync_table
    from cdcflow.sinks.snowflake.inline import record_sync
    from cdcflow.sinks.snowflake.reconcile import reconcile_snowflake
    from cdcflow.sinks.snowflake.sync import sync_snowflake

    synced = sync_snowflake(ctx.config)
    record_sync(ctx.config, synced, None, "once")  # audit/snowflake_sync, as `sync snowflake`
    console.print(sync_table(synced))
    report = reconcile_snowflake(ctx.config)
    console.print(report.summary(), markup=False, highlight=False, soft_wrap=True)
    return report.equal, report.summary()


#: The declared tables of the demo's second pipeline (``<demo>/shop``): an integer key with
#: typed columns, and a composite key with hard deletes and a foreign key.
SHOP_TABLES: list[dict[str, Any]] = [
    {
        "name": "accounts",
        "keys": ["account_id"],
        "columns": [
            {"name": "account_id", "type": "integer"},
            {"name": "owner", "type": "string", "pii": True},
            {"name": "balance", "type": "decimal(12,2)", "minimum": 0},
            {"name": "opened_on", "type": "date"},
            {"name": "vip", "type": "boolean"},
        ],
    },
    {
        "name": "order_lines",
        "keys": ["order_id", "line_no"],
        "delete_mode": "hard",
        "columns": [
            {"name": "order_id", "type": "string"},
            {"name": "line_no", "type": "integer"},
            {"name": "account_id", "type": "integer", "references": "accounts.account_id"},
            {"name": "sku", "type": "string", "pattern": "[A-Z]{3}-[0-9]+"},
            {"name": "quantity", "type": "integer", "minimum": 1},
            {"name": "placed_at", "type": "timestamp"},
        ],
    },
]
#: The v2 contract's new nullable column of ``accounts`` (a backward-compatible change).
SHOP_V2_COLUMN = {"name": "tier", "type": "string", "allowed_values": ["BRONZE", "SILVER", "GOLD"]}


def write_shop_config(ctx: DemoContext, version: int) -> CdcflowConfig:
    """Write ``<demo>/shop/cdcflow.yaml`` with the v1 or v2 contracts; returns it loaded."""
    folder = (ctx.root / "shop").resolve()
    tables = json.loads(json.dumps(SHOP_TABLES))
    if version == 2:
        tables[0]["version"] = 2
        tables[0]["columns"].append(dict(SHOP_V2_COLUMN))
    config = {
        "pipeline": {"name": "shop"},
        "storage": {"root": str(folder / "lakehouse")},
        "source": {"path": str(folder / "landing"), "max_files_per_trigger": 2},
        "checkpoint": {"location": str(folder / "lakehouse" / "_checkpoints" / "shop")},
        "logging": {"level": "WARNING"},
        "tables": tables,
    }
    path = folder / DEMO_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    ctx.data["shop_config"] = path
    return load_config(path)


def step_tables(ctx: DemoContext) -> tuple[bool, str]:
    """Two declared tables in one pipeline; the accounts contract goes v1 → v2 mid-stream.

    Generates half the changes under v1 and runs; adds the nullable ``tier`` column (v2),
    generates the other half (with ``tier``) and runs again: the Delta tables evolve, earlier
    rows read null. Each table's Silver is then compared with the reference fold of every
    delivered record (:func:`cdcflow.table_generator.expected_tables`).
    """
    from datetime import UTC, datetime

    from deltalake import DeltaTable

    from cdcflow.cli.reconcile import print_report, reconcile_tables
    from cdcflow.cli.render import batch_table
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.reconcile import contract_state_frame
    from cdcflow.table_generator import TablesWorkload, expected_tables, generate_tables

    half = max(100, ctx.events // 20)
    now = datetime.now(UTC)
    lines: list[str] = []
    last_event, last_lsn, batches = 0, 10_000, 0
    source = None
    for version in (1, 2):
        config = write_shop_config(ctx, version)
        workload = TablesWorkload(
            events=half,
            keys=40,
            files=2,
            seed=ctx.seed + version,
            first_event=last_event + 1,
            first_lsn=last_lsn,
            now=now - timedelta(hours=6 * (2 - version)),
        )
        summary = generate_tables(config.source.path, config.contracts(), workload, source)
        lines += summary.lines
        last_event, last_lsn, source = summary.last_event, summary.last_lsn, summary.source
        reports = Pipeline(config).run(Trigger.parse("available-now"))
        console.print(batch_table(reports, title=f"shop, contract v{version}"))
        batches += len(reports)
    outcomes, _ = expected_tables(
        lines, config.contracts(), max_clock_skew=config.processing.max_clock_skew
    )
    expected = ctx.root / "shop" / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    for contract in config.contracts():
        frame = contract_state_frame(contract, outcomes[contract.name].state)
        frame.write_parquet(expected / f"{contract.name}.parquet")
    reports_by_table = reconcile_tables(config, expected)
    for name, report in reports_by_table.items():
        verdict = "[green]MATCH[/]" if report.ok else "[red]MISMATCH[/]"
        print_report(report, f"{name}: reconciliation ({report.kind}): {verdict}")
    log = read_arrow(DeltaTable(config.table_uri("audit/schema_log"))).to_pylist()
    evolved = any(r["table_name"] == "accounts" and "tier" in r["change"] for r in log)
    matched = sum(r.ok for r in reports_by_table.values())
    return evolved and matched == len(reports_by_table), (
        f"accounts + order_lines, {2 * half} changes in {batches} micro-batches; contract v2 "
        f"{'added accounts.tier' if evolved else 'NOT applied'}; "
        f"{matched}/{len(reports_by_table)} tables equal the reference fold"
    )


#: The demo's steps, in order (extend by appending ``(name, function)``).
STEPS: list[tuple[str, StepFn]] = [
    ("generate", step_generate),
    ("run", step_run),
    ("gold", step_gold),
    ("reconcile", step_reconcile),
    ("replay --verify", step_replay),
    ("snowflake", step_snowflake),
    ("tables v1 → v2", step_tables),
]


def prepare(root: Path, delete_mode: str = "soft", storage_root: str | None = None) -> Path:
    """Create a fresh demo folder with its config; returns the config path.

    Args:
        root: the demo folder (landing files, config, expected state).
        delete_mode: ``soft`` or ``hard``.
        storage_root: an object-store URI (``s3://bucket/prefix``…) for the customers
            lakehouse and its checkpoint instead of ``<root>/lakehouse`` (credentials and
            endpoint from the environment, e.g. ``AWS_ENDPOINT_URL``).

    Raises:
        UsageError: the folder exists and is not a demo folder (no ``cdcflow.yaml``).
    """
    if root.exists():
        if any(root.iterdir()) and not (root / DEMO_MARKER).exists():
            raise UsageError(f"{root}: exists and is not a cdcflow demo folder; choose --dir")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    base = root.resolve()
    lake = storage_root.rstrip("/") if storage_root else str(base / "lakehouse")
    if storage_root:
        _fresh_prefix(lake)
    config = {
        "pipeline": {"name": "customers"},
        "storage": {"root": lake},
        "source": {"path": str(base / "landing"), "max_files_per_trigger": 4},
        "checkpoint": {"location": f"{lake}/_checkpoints/customers"},
        "processing": {"delete_mode": delete_mode},
        "logging": {"level": "WARNING"},
    }
    path = root / DEMO_MARKER
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


#: the object a demo leaves under its object-store root, so that a next demo may empty it
OBJECT_MARKER = "cdcflow-demo.marker"


def _fresh_prefix(uri: str) -> None:
    """Empty an object-store prefix for the demo: allowed when it is empty or an earlier demo
    left its marker there (as a local demo folder is recreated).

    Raises:
        UsageError: the prefix holds objects but no demo marker.
    """
    import obstore

    from cdcflow.state.storage import ObjectStorage

    storage = ObjectStorage(uri)
    paths = [meta["path"] for chunk in obstore.list(storage.store) for meta in chunk]
    if paths and OBJECT_MARKER not in paths:
        raise UsageError(
            f"--storage-root {uri}: holds objects and is not a cdcflow demo root; choose another"
        )
    for start in range(0, len(paths), 1000):
        obstore.delete(storage.store, paths[start : start + 1000])
    storage.replace(OBJECT_MARKER, b"cdcflow demo\n")


def run_demo(
    root: Path,
    events: int = 10_000,
    seed: int = 42,
    delete_mode: str = "soft",
    steps: list[tuple[str, StepFn]] | None = None,
    next_out: list[str] | None = None,
    storage_root: str | None = None,
) -> list[StepResult]:
    """Run the demo steps in a fresh folder; a failing step stops the demo.

    Args:
        root: the demo folder (recreated).
        events: source changes to generate.
        seed: generator seed.
        delete_mode: ``soft`` or ``hard``.
        steps: the steps (default :data:`STEPS`).
        next_out: when given and every step passed, :func:`next_commands` are appended to it.
        storage_root: an object-store URI for the customers lakehouse (:func:`prepare`).

    Returns:
        One result per step run.
    """
    from cdcflow.logs import setup_logging

    config_path = prepare(root, delete_mode, storage_root)
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
    if next_out is not None and all(r.ok for r in results):
        next_out.extend(next_commands(ctx))
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


def program() -> str:
    """This program as a command to paste in the current folder.

    The path it was started by (``.venv/bin/cdcflow`` under ``uv run cdcflow`` or ``make demo``:
    ``uv run`` puts the virtual environment on PATH only while it runs, so a bare ``cdcflow``
    would not be found afterwards), relative to the current folder when inside it; or
    ``<python> -m cdcflow`` when started as a module.
    """
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if started.name in ("cdcflow", "cdcflow.exe") and started.is_file():
        return _pasteable(started)
    return f"{_pasteable(Path(sys.executable))} -m cdcflow"


def _pasteable(path: Path) -> str:
    """``path`` as typed in a shell of the current folder (relative inside it, quoted)."""
    absolute = Path(os.path.abspath(path))  # not resolve(): a venv's python is a symlink
    try:
        shown = str(absolute.relative_to(Path.cwd()))
        if os.sep not in shown:
            shown = f".{os.sep}{shown}"
    except ValueError:
        shown = str(absolute)
    return shlex.quote(shown)


def next_commands(ctx: DemoContext) -> list[str]:
    """Commands to try after the demo, on its lakehouse; none of them is one of its steps.

    * ``status``: how the pipeline stands (latest micro-batch, lag, backlog, reasons);
    * ``report``: the HTML report with its plots, beside the demo's config;
    * ``as-of --version``: a customer of the first micro-batch as Silver held it then;
    * ``as-of --timestamp``: the same customer at an instant of its history;
    * ``optimize``: compact, Z-order and vacuum the demo's tables;
    * ``validate``: the declared tables' Silver against their contracts.

    Returns:
        Command lines, each working as pasted from the current folder.
    """
    import polars as pl
    from deltalake import DeltaTable

    from cdcflow.engines.local.delta import scan_table
    from cdcflow.layers.asof import silver_at_version

    prog = program()
    config = shlex.quote(str(ctx.config_path))
    report = shlex.quote(str(ctx.config_path.parent / "report.html"))
    commands = [
        f"{prog} status --config {config}",
        f"{prog} report --config {config} --out {report}",
    ]
    reports = ctx.data.get("reports") or []
    version = reports[0].silver_version if reports else None
    if version is not None:
        first = silver_at_version(ctx.config, version)
        if first.height:
            customer = str(first["customer_id"][0])
            base = f"{prog} as-of --config {config} --customer {shlex.quote(customer)}"
            commands.append(f"{base} --version {version}")
            history = DeltaTable(ctx.config.table_uri("silver/customer_history"))
            starts = (
                scan_table(history)
                .filter(pl.col("customer_id") == customer)
                .select("valid_from")
                .sort("valid_from")
                .collect()["valid_from"]
            )
            if len(starts):
                instant = starts[len(starts) // 2].replace(microsecond=0) + timedelta(seconds=1)
                commands.append(f"{base} --timestamp {instant:%Y-%m-%dT%H:%M:%SZ}")
    commands.append(f"{prog} optimize --config {config}")
    shop = ctx.data.get("shop_config")
    if shop is not None:
        commands.append(f"{prog} validate --config {_pasteable(shop)}")
    return commands


def demo(
    folder: Annotated[Path, typer.Option("--dir", help="Demo folder (recreated).")] = Path("demo"),
    events: Annotated[int, typer.Option(min=100, help="Source changes to generate.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 42,
    delete_mode: Annotated[str, typer.Option(help="soft | hard")] = "soft",
    output: Annotated[str, typer.Option(help="text | json")] = "text",
    storage_root: Annotated[
        str | None,
        typer.Option(
            help="object-store URI of the customers lakehouse and checkpoint (e.g. "
            "s3://bucket/demo; endpoint and credentials from AWS_* / AZURE_* variables; "
            "make demo-s3 starts a local S3 server)"
        ),
    ] = None,
) -> None:
    """The whole story on generated data: generate -> run -> Gold -> reconcile -> replay
    --verify -> Snowflake -> declared tables (contract v1 -> v2); one summary table at the end."""
    if delete_mode not in ("soft", "hard"):
        raise UsageError(f"--delete-mode: expected soft or hard, got {delete_mode!r}")
    hints: list[str] = []
    results = run_demo(folder, events, seed, delete_mode, next_out=hints, storage_root=storage_root)
    from cdcflow.cli.tables import output_width

    console.print(summary_table(results), width=output_width(console))
    if output == "json":
        typer.echo(json.dumps([r.__dict__ for r in results], indent=1))
    passed = len(results) == len(STEPS) and all(r.ok for r in results)
    if passed and output != "json":
        console.print("next, from this folder:", highlight=False)
        for command in hints:
            console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)
    if not passed:
        raise typer.Exit(1)
