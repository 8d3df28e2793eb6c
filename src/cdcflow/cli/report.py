"""``cdcflow report``: one self-contained HTML page of plots (:mod:`cdcflow.layers.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.errors import ConfigError


def report(
    config: ConfigOption,
    out: Annotated[Path, typer.Option(help="the HTML file to write")] = Path("report.html"),
) -> None:
    """Write an HTML report (plotly.js inline: opens without a network) of the pipeline's
    history: throughput and duration, event lag, operations, quarantine reasons and stage
    seconds per micro-batch, Silver rows per Delta version, Snowflake sync lag."""
    from cdcflow.layers.report import PLOTS, render_report

    page = render_report(load(config, declared_tables=True))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {out} ({exc.strerror or exc})") from None
    console.print(
        f"report: {out} ({len(PLOTS)} plots, {len(page.encode()) // 1024} KiB)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
