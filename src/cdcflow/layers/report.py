"""``cdcflow report``: one self-contained HTML page of plots of a pipeline's history.

The page embeds plotly.js (no network needed to open it) and holds, from the audit tables
(``audit/batch_log``, the outcomes and quarantine tables of every table, ``audit/
snowflake_sync``) and the Silver tables' Delta versions:

1. throughput (records/s) and duration (s) per micro-batch;
2. event lag per micro-batch: p50 / p95 / max seconds from event time to processing time of the
   accepted first copies;
3. operations per micro-batch: INSERT / UPDATE / DELETE first copies;
4. quarantined records per micro-batch, by reason code;
5. seconds per stage per micro-batch (``audit/batch_log.stage_seconds``: where the time goes);
6. Silver rows per Delta version, live and soft-deleted (the last :data:`VERSIONS` versions of
   each Silver table);
7. Snowflake sync lag (Silver commit → Snowflake commit, seconds) per sync and table.

A plot without data yet shows a "no data yet" note instead of traces. Only counts, reason codes,
times and table names are drawn: no record values.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import arrow_dataset, read_arrow
from cdcflow.errors import MissingDependencyError
from cdcflow.layers.status import read_table

#: The plots whose x axis is the micro-batch id.
BY_BATCH = ("throughput", "lag", "operations", "quarantine", "stages")
#: How many of each Silver table's latest versions plot 6 counts.
VERSIONS = 30
#: The plots, in page order: (HTML id, title).
PLOTS = (
    ("throughput", "Throughput and duration per micro-batch"),
    ("lag", "Event lag per micro-batch: event time → processing time (seconds)"),
    ("operations", "Operations per micro-batch (accepted first copies)"),
    ("quarantine", "Quarantined records per micro-batch, by reason"),
    ("stages", "Seconds per stage per micro-batch (where the time goes)"),
    ("silver", "Silver rows per Delta version (live / deleted)"),
    ("snowflake", "Snowflake sync lag: Silver commit → Snowflake commit (seconds)"),
)


def _read(config: CdcflowConfig, name: str, columns: list[str] | None = None) -> pl.DataFrame:
    """Table ``name`` (only ``columns``), or an empty frame when it does not exist."""
    frame = read_table(config, name, columns)
    return pl.DataFrame() if frame is None else frame


def _empty(go: Any, title: str) -> Any:
    figure = go.Figure()
    figure.add_annotation(text="no data yet", showarrow=False, font={"size": 16})
    figure.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False})
    return figure


def _figures(config: CdcflowConfig) -> dict[str, Any]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figures: dict[str, Any] = {}
    log = _read(config, "audit/batch_log")
    if "kind" in log.columns:  # micro-batches only: a replay's row is not one
        log = log.filter(pl.col("kind").fill_null("stream") == "stream")
    if log.height:
        log = log.sort("batch_id")
        batch = log["batch_id"].to_list()
        seconds = (log["duration_ms"] / 1000).to_list()
        rate = [r / s if s else None for r, s in zip(log["records_received"], seconds, strict=True)]
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        fig.add_trace(go.Bar(x=batch, y=rate, name="records/s"), secondary_y=False)
        fig.add_trace(
            go.Scatter(x=batch, y=seconds, name="duration (s)", mode="lines+markers"),
            secondary_y=True,
        )
        fig.update_yaxes(title_text="records/s", secondary_y=False)
        fig.update_yaxes(title_text="seconds", secondary_y=True)
        figures["throughput"] = fig
        fig = go.Figure()
        for column, name in (("inserts", "INSERT"), ("updates", "UPDATE"), ("deletes", "DELETE")):
            fig.add_trace(go.Bar(x=batch, y=log[column].to_list(), name=name))
        fig.update_layout(barmode="stack")
        figures["operations"] = fig
        if "stage_seconds" in log.columns and log["stage_seconds"].drop_nulls().len():
            stages = [json.loads(s) if s else {} for s in log["stage_seconds"].to_list()]
            names = list(dict.fromkeys(name for stage in stages for name in stage))
            fig = go.Figure()
            for name in names:
                fig.add_trace(go.Bar(x=batch, y=[s.get(name, 0.0) for s in stages], name=name))
            fig.update_layout(barmode="stack", yaxis_title="seconds")
            figures["stages"] = fig
    lags, reasons = [], []
    for contract in config.contracts():
        outcomes = _read(config, contract.outcomes_table, ["batch_id", "outcome", "lag_s"])
        if outcomes.height:
            lags.append(outcomes.filter(pl.col("outcome") != "DUPLICATE"))
        rows = _read(config, contract.table_names.quarantine, ["batch_id", "failure_reason"])
        if rows.height:
            reasons.append(rows)
    if lags:
        per_batch = (
            pl.concat(lags)
            .group_by("batch_id")
            .agg(
                pl.col("lag_s").quantile(0.5, "nearest").alias("p50"),
                pl.col("lag_s").quantile(0.95, "nearest").alias("p95"),
                pl.col("lag_s").max().alias("max"),
            )
            .sort("batch_id")
        )
        if per_batch.height:
            fig = go.Figure()
            for column in ("p50", "p95", "max"):
                fig.add_trace(
                    go.Scatter(
                        x=per_batch["batch_id"].to_list(),
                        y=per_batch[column].to_list(),
                        name=column,
                        mode="lines+markers",
                    )
                )
            fig.update_layout(yaxis_title="seconds")
            figures["lag"] = fig
    if reasons:
        counts = pl.concat(reasons).group_by("batch_id", "failure_reason").len().sort("batch_id")
        fig = go.Figure()
        for reason in sorted(counts["failure_reason"].unique().to_list()):
            rows = counts.filter(pl.col("failure_reason") == reason)
            x, y = rows["batch_id"].to_list(), rows["len"].to_list()
            fig.add_trace(go.Bar(x=x, y=y, name=reason))
        fig.update_layout(barmode="stack", yaxis_title="records")
        figures["quarantine"] = fig
    silver = _silver_versions(config, go)
    if silver is not None:
        figures["silver"] = silver
    syncs = _read(config, "audit/snowflake_sync", ["target_table", "synced_at", "lag_s"])
    if syncs.height and syncs["lag_s"].drop_nulls().len():
        fig = go.Figure()
        for target in sorted(syncs["target_table"].unique().to_list()):
            rows = syncs.filter(pl.col("target_table") == target).sort("synced_at")
            fig.add_trace(
                go.Scatter(
                    x=rows["synced_at"].to_list(),
                    y=rows["lag_s"].to_list(),
                    name=target,
                    mode="lines+markers",
                )
            )
        fig.update_layout(yaxis_title="seconds")
        figures["snowflake"] = fig
    for key, title in PLOTS:
        if key not in figures:
            figures[key] = _empty(go, title)
        else:
            figures[key].update_layout(title=title, legend={"orientation": "h", "y": -0.22})
            if key in BY_BATCH or key == "silver":  # whole ids on the x axis, at most ~20 ticks
                xs = [x for trace in figures[key].data for x in (trace.x or ())]
                step = max(1, -(-(max(xs) - min(xs) + 1) // 20)) if xs else 1
                figures[key].update_xaxes(tick0=0, dtick=step, tickformat="d")
            if key in BY_BATCH:
                figures[key].update_xaxes(title_text="micro-batch")
        figures[key].update_layout(height=380, margin={"l": 60, "r": 30, "t": 60, "b": 40})
    return figures


def _silver_versions(config: CdcflowConfig, go: Any) -> Any:
    """Plot 6: per Silver table, live and deleted rows at each of its last versions."""
    options = config.storage.options or None
    fig = go.Figure()
    drawn = False
    for contract in config.contracts():
        uri = config.table_uri(contract.table_names.silver)
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            continue
        latest = DeltaTable(uri, storage_options=options).version()
        versions, live, deleted = [], [], []
        for version in range(max(0, latest - VERSIONS + 1), latest + 1):
            try:
                table = DeltaTable(uri, version=version, storage_options=options)
                names = table.schema().to_arrow().names
                if "is_deleted" in names:
                    flags = read_arrow(table, columns=["is_deleted"]).column(0).to_pylist()
                    gone = sum(1 for f in flags if f)
                    rows = len(flags)
                else:  # hard deletes remove the row: nothing deleted stays
                    rows, gone = arrow_dataset(table).count_rows(), 0
            except (DeltaError, OSError, pa.ArrowException):
                # an earlier version a vacuum removed (e.g. an erasure ended time travel there)
                continue
            versions.append(version)
            live.append(rows - gone)
            deleted.append(gone)
        label = contract.name
        fig.add_trace(go.Scatter(x=versions, y=live, name=f"{label} live", mode="lines+markers"))
        fig.add_trace(
            go.Scatter(x=versions, y=deleted, name=f"{label} deleted", mode="lines+markers")
        )
        drawn = True
    if not drawn:
        return None
    fig.update_layout(xaxis_title="Delta version", yaxis_title="rows")
    return fig


def render_report(config: CdcflowConfig, now: datetime | None = None) -> str:
    """The report page of ``config``'s pipeline (module doc) as HTML text.

    Raises:
        MissingDependencyError: plotly is not installed.
    """
    try:
        import plotly  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            "cdcflow report needs plotly: pip install 'cdcflow[report]' (or plotly)"
        ) from exc
    now = now or datetime.now(UTC)
    figures = _figures(config)
    parts = []
    for index, (key, _title) in enumerate(PLOTS):
        parts.append(
            figures[key].to_html(
                full_html=False,
                include_plotlyjs=index == 0,  # plotly.js once, inline: no network needed
                div_id=f"plot-{key}",
                config={"displaylogo": False, "responsive": True},
            )
        )
    title = html.escape(f"cdcflow report: {config.pipeline.name}")
    body = "\n".join(f'<section class="plot">{part}</section>' for part in parts)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1100px; }}
section.plot {{ margin-bottom: 1rem; border-bottom: 1px solid #ddd; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>Engine {html.escape(config.pipeline.engine)}; generated {now:%Y-%m-%d %H:%M:%S} UTC.</p>
{body}
</body>
</html>
"""


__all__ = ["PLOTS", "VERSIONS", "render_report"]
