"""``cdcflow report`` opened in a real headless browser (Debian's Chromium, driven by
Playwright; installed by scripts/browser/install.sh, path in ``CDCFLOW_CHROMIUM``): the page
loads from a file with the network off and no console error, and every plot renders with data
that matches the audit tables."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.test_cli import cdcflow

CONFIG = """
pipeline: {name: customers, engine: local}
storage: {root: ./lakehouse}
source: {type: files, format: flat, path: ./landing, max_files_per_trigger: 1}
checkpoint: {location: ./lakehouse/_checkpoints/customers}
snowflake: {mode: inline}
"""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the working folder, report.html) after three micro-batches with inline Snowflake sync
    and a replay."""
    root = tmp_path_factory.mktemp("report")
    (root / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "500", "--files", "3", cwd=root)
    assert gen.returncode == 0, gen.stderr
    run = cdcflow("run", "--config", "cdcflow.yaml", cwd=root)
    assert run.returncode == 0, run.stderr
    # a replay's batch_log row is not a micro-batch: the plots leave it out (a trial saw a
    # replay drawn as a second batch 0)
    replayed = cdcflow("replay", "--config", "cdcflow.yaml", "--apply", cwd=root)
    assert replayed.returncode == 0, replayed.stderr
    made = cdcflow("report", "--config", "cdcflow.yaml", "--out", "out/report.html", cwd=root)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("report: out/report.html (7 plots, ")
    return root, root / "out" / "report.html"


@pytest.fixture(scope="module")
def page(report: tuple[Path, Path]) -> Iterator[tuple[Any, list[str]]]:
    """The report open in headless Chromium: (the page, console errors and page errors)."""
    from playwright.sync_api import sync_playwright

    browser_path = os.environ.get("CDCFLOW_CHROMIUM", "/usr/bin/chromium")
    assert Path(browser_path).exists(), (
        f"{browser_path} missing: run scripts/browser/install.sh (make test does)"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=CHROMIUM_ARGS)
        context = browser.new_context(offline=True)  # everything the page needs is inline
        tab = context.new_page()
        errors: list[str] = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(report[1].as_uri(), wait_until="load")
        tab.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 7")
        yield tab, errors
        browser.close()


def test_the_page_loads_offline_without_errors_and_every_plot_renders(
    page: tuple[Any, list[str]],
) -> None:
    tab, errors = page
    assert errors == []
    plots = tab.evaluate(
        """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => ({
            id: gd.id,
            traces: gd.data.length,
            points: gd.data.map(t => (t.y || []).length).reduce((a, b) => a + b, 0),
            drawn: gd.querySelectorAll('.plot .trace, .plot .point, .plot path').length,
        }))"""
    )
    ids = [p["id"] for p in plots]
    assert ids == [
        "plot-throughput",
        "plot-lag",
        "plot-operations",
        "plot-quarantine",
        "plot-stages",
        "plot-silver",
        "plot-snowflake",
    ]
    for plot in plots:  # every plot has data, drawn as SVG
        assert plot["traces"] > 0 and plot["points"] > 0 and plot["drawn"] > 0, plot


def test_the_plotted_values_are_the_audit_tables(
    report: tuple[Path, Path], page: tuple[Any, list[str]]
) -> None:
    root, _ = report
    tab, _ = page
    data = tab.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(
            gd => [gd.id, gd.data.map(t => ({name: t.name, x: t.x, y: t.y}))]))"""
    )
    lake = root / "lakehouse"
    log = pl.read_delta(str(lake / "audit" / "batch_log")).sort("batch_id")
    assert log["kind"].to_list().count("replay") == 1
    log = log.filter(pl.col("kind") == "stream")
    assert log.height == 3
    operations = {t["name"]: t["y"] for t in data["plot-operations"]}
    assert operations == {
        "INSERT": log["inserts"].to_list(),
        "UPDATE": log["updates"].to_list(),
        "DELETE": log["deletes"].to_list(),
    }
    duration = next(t for t in data["plot-throughput"] if t["name"] == "duration (s)")
    assert duration["y"] == pytest.approx((log["duration_ms"] / 1000).to_list())
    stages = {t["name"]: t["y"] for t in data["plot-stages"]}
    recorded = [json.loads(s) for s in log["stage_seconds"]]
    assert stages["silver"] == pytest.approx([s["silver"] for s in recorded])
    quarantine = pl.read_delta(str(lake / "quarantine" / "customer_events"))
    plotted = sum(sum(t["y"]) for t in data["plot-quarantine"])
    assert plotted == quarantine.height == log["quarantined"].sum() > 0
    silver = {t["name"]: t["y"] for t in data["plot-silver"]}
    rows = pl.read_delta(str(lake / "silver" / "customers"))
    live = rows.filter(~pl.col("is_deleted")).height
    assert silver["customers live"][-1] == live and silver["customers deleted"][-1] == (
        rows.height - live
    )
    syncs = pl.read_delta(str(lake / "audit" / "snowflake_sync"))
    assert sum(len(t["y"]) for t in data["plot-snowflake"]) == syncs.height > 0
