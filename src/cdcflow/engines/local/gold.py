"""Polars / delta-rs refresh of the Gold tables (:mod:`cdcflow.layers.gold`) by recomputation.

Every refresh reads ``silver/customer_history`` once and overwrites each Gold table with its
recomputed content (one Delta commit per table). Recomputation was chosen over incremental
maintenance because ``daily_customer_metrics`` depends on whole timelines (a late event changes
the counts and the active totals of every later day) and the computation is a few vectorised
group-bys; after a micro-batch the refresh carries the app transaction
(``cdcflow-<pipeline>-gold``, batch id) so a re-run of a committed batch skips it.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
from deltalake import DeltaTable, write_deltalake

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import DeltaStore, commit_props, scan_table, txn_done
from cdcflow.layers.gold import (
    ACTIVE_BY_GEO,
    ACTIVE_CUSTOMERS,
    DAILY_METRICS,
    GOLD_TABLES,
    MAX_FILLED_GAP_DAYS,
    PCT_DECIMALS,
    STATUS_DISTRIBUTION,
)
from cdcflow.layers.tables import HISTORY, TableSpec
from cdcflow.logs import get_logger
from cdcflow.model.events import STATUSES
from cdcflow.state.faults import crash_point, gold_point

log = get_logger("engine.local.gold")

_INACTIVE = ("INACTIVE", "SUSPENDED")


def percent(part: pl.Expr, whole: pl.Expr) -> pl.Expr:
    """``100 * part / whole`` rounded half to even to ``PCT_DECIMALS`` decimals; null when
    ``whole`` is 0.

    The rounding is taken on the scaled quotient (``10**(2 + PCT_DECIMALS) * part / whole``,
    one correctly rounded division of integers), so a value exactly halfway is rounded as the
    exact fraction would be: 1 of 800 is 0.12, 3 of 800 is 0.38.

    Args:
        part: integer numerator.
        whole: integer denominator.

    Returns:
        A Float64 expression.
    """
    scale = 10**PCT_DECIMALS
    scaled = (part.cast(pl.Float64) * (100 * scale)) / whole.cast(pl.Float64)
    # Polars divides by a constant as a product with its inverse (1429 / 100 would be
    # 14.290000000000001): the final round gives the float nearest to the decimal value
    value = (scaled.round(0) / scale).round(PCT_DECIMALS)
    return pl.when(whole > 0).then(value).otherwise(pl.lit(None, pl.Float64))


def current_versions(history: pl.DataFrame) -> pl.DataFrame:
    """Current version of every customer (one row per customer_id; hard deletes included)."""
    return history.filter(pl.col("is_current"))


def active_customers(history: pl.DataFrame) -> pl.DataFrame:
    """``gold/active_customers``: one row per active customer_id, public Silver columns."""
    names = ACTIVE_CUSTOMERS.schema.names
    return current_versions(history).filter(pl.col("is_active")).select(names).sort("customer_id")


def active_by_geo(history: pl.DataFrame) -> pl.DataFrame:
    """``gold/active_customers_by_geo``: one row per (country, city) with active customers."""
    return (
        current_versions(history)
        .filter(pl.col("is_active"))
        .group_by("country", "city")
        .agg(pl.len().cast(pl.Int64).alias("active_customers"))
        .sort("country", "city", nulls_last=True)
    )


def status_distribution(history: pl.DataFrame) -> pl.DataFrame:
    """``gold/status_distribution``: one row per status (the four always), customers,
    share_pct."""
    current = current_versions(history)
    total = current.height
    counts = current.group_by("status").agg(pl.len().cast(pl.Int64).alias("customers"))
    known = pl.DataFrame({"status": list(STATUSES)}, schema={"status": pl.String})
    frame = known.join(counts, on="status", how="full", coalesce=True, nulls_equal=True)
    order = {s: i for i, s in enumerate(STATUSES)}
    return (
        frame.with_columns(
            pl.col("customers").fill_null(0),
            pl.col("status").replace_strict(order, default=len(order)).alias("_o"),
        )
        .with_columns(percent(pl.col("customers"), pl.lit(total, pl.Int64)).alias("share_pct"))
        .sort("_o", "status", nulls_last=True)
        .select(STATUS_DISTRIBUTION.schema.names)
    )


#: The history columns ``daily_metrics`` reads (of every version; the other Gold tables read
#: the current versions only).
_TIMELINE_COLUMNS = (
    "customer_id",
    "sequence",
    "operation",
    "valid_from",
    "status",
    "is_deleted",
    "is_active",
)


def daily_metrics(history: pl.DataFrame) -> pl.DataFrame:
    """``gold/daily_customer_metrics``: one row per UTC date (see :mod:`cdcflow.layers.gold`)."""
    if history.height == 0:
        return pl.DataFrame(schema=pl.Schema(DAILY_METRICS.schema))
    # sorted by (customer_id, sequence), a row's previous version is the row above it when both
    # have the same key; the global row index orders versions within a key (no window functions)
    h = (
        history.select(_TIMELINE_COLUMNS)
        .sort("customer_id", "sequence")
        .with_columns(
            pl.int_range(pl.len()).alias("_i"),
            pl.col("valid_from").dt.date().alias("date"),
            (pl.col("customer_id") == pl.col("customer_id").shift(1))
            .fill_null(False)
            .alias("_same"),
        )
    )
    same = pl.col("_same")
    prev_status = pl.when(same).then(pl.col("status").shift(1))
    prev_active = (same & pl.col("is_active").shift(1)).fill_null(False)
    prev_alive = (same & ~pl.col("is_deleted").shift(1)).fill_null(False)
    alive = ~pl.col("is_deleted")
    h = h.with_columns(
        (pl.col("is_deleted") & prev_alive).alias("_del"),
        (prev_active & alive & pl.col("status").is_in(_INACTIVE)).alias("_deact"),
        (prev_alive & prev_status.is_in(_INACTIVE) & pl.col("is_active"))
        .fill_null(False)
        .alias("_react"),
    )
    registrations = (
        h.filter(pl.col("operation") == "INSERT")
        .group_by("customer_id")
        .agg(pl.col("date").first())  # rows keep their (sequence) order inside a group
        .group_by("date")
        .agg(pl.len().alias("new_registrations"))
    )
    counts = h.group_by("date").agg(
        pl.col("_del").sum().alias("deletions"),
        pl.col("_deact").sum().alias("deactivations"),
        pl.col("_react").sum().alias("reactivations"),
    )
    # state at the end of each date a customer changed: its highest version up to that date
    # (_i grows with the key, so a global running max sorted by (key, date) is per key); its
    # state at the start of that date is its state at the end of its previous change date
    ends = (
        h.group_by("customer_id", "date")
        .agg(pl.col("_i").max())
        .sort("customer_id", "date")
        .with_columns(pl.col("_i").cum_max())
        .join(h.select("_i", "is_active"), on="_i")
        .sort("customer_id", "date")
        .with_columns(
            pl.col("is_active").cast(pl.Int64),
            (pl.col("customer_id") == pl.col("customer_id").shift(1))
            .fill_null(False)
            .alias("_same"),
        )
        .with_columns(
            pl.when(same).then(pl.col("is_active").shift(1)).otherwise(0).alias("_was_active")
        )
        .group_by("date")
        .agg(
            (pl.col("is_active") - pl.col("_was_active")).sum().alias("_delta"),
            ((pl.col("_was_active") == 1) & (pl.col("is_active") == 0)).sum().alias("_lost"),
        )
    )
    days = calendar(h["date"])
    frame = (
        days.join(registrations, on="date", how="left")
        .join(counts, on="date", how="left")
        .join(ends, on="date", how="left")
        .fill_null(0)
        .sort("date")
        .with_columns(pl.col("_delta").cum_sum().alias("active_at_end_of_day"))
        .with_columns(pl.col("active_at_end_of_day").shift(1).fill_null(0).alias("_start"))
    )
    frame = frame.with_columns(percent(pl.col("_lost"), pl.col("_start")).alias("churn_pct"))
    return frame.select(DAILY_METRICS.schema.names)


def calendar(dates: pl.Series) -> pl.DataFrame:
    """The dates of ``daily_customer_metrics``: every change date, plus the days without
    changes between two change dates at most ``MAX_FILLED_GAP_DAYS`` apart.

    The row count is bounded by the number of change dates (times the gap limit), never by the
    time span: one event dated 1900 adds one row, not 45,000.
    """
    changed = dates.unique().sort().to_frame("date")
    gap = (pl.col("date").shift(-1) - pl.col("date")).dt.total_days()
    span = pl.when(gap <= MAX_FILLED_GAP_DAYS).then(gap - 1).otherwise(0).fill_null(0)
    return (
        changed.with_columns(span.alias("_fill"))
        .select(
            pl.date_ranges(
                pl.col("date"), pl.col("date") + pl.duration(days=pl.col("_fill")), "1d"
            ).alias("date")
        )
        .explode("date")
        .sort("date")
    )


def compute_gold(
    history: pl.DataFrame, current: pl.DataFrame | None = None
) -> dict[str, pl.DataFrame]:
    """Every Gold table's content from the history table (table name → frame).

    Args:
        history: every version (at least the ``daily_metrics`` columns; every column when
            ``current`` is None).
        current: the current versions, every column (default: taken from ``history``).
    """
    now = current_versions(history) if current is None else current
    return {
        ACTIVE_CUSTOMERS.name: active_customers(now),
        ACTIVE_BY_GEO.name: active_by_geo(now),
        STATUS_DISTRIBUTION.name: status_distribution(now),
        DAILY_METRICS.name: daily_metrics(history),
    }


def gold_store(config: CdcflowConfig) -> DeltaStore:
    specs: tuple[TableSpec, ...] = (HISTORY, *GOLD_TABLES)
    return DeltaStore({s.name: config.table_uri(s.name) for s in specs}, config.storage.options)


def schema_differs(table: DeltaTable, spec: TableSpec) -> bool:
    """True when the Delta table's column names are not those of ``spec``."""
    return [f.name for f in table.schema().fields] != spec.schema.names


def refresh_gold(
    config: CdcflowConfig,
    app_id: str | None = None,
    batch_id: int | None = None,
    store: DeltaStore | None = None,
) -> dict[str, int]:
    """Recompute and overwrite every Gold table from ``silver/customer_history``.

    Args:
        config: the pipeline configuration.
        app_id: pipeline app id; with ``batch_id``, the refresh carries the app transaction
            (``<app_id>-gold``, batch_id) and is skipped for a table that already holds it.
        batch_id: micro-batch id, or None for a manual refresh (always written).
        store: the local engine's store, inside its :meth:`DeltaStore.pinned` block (the
            micro-batch's table objects); None opens the tables.

    Returns:
        Table name → number of rows written (skipped tables are absent).
    """
    specs = (HISTORY, *GOLD_TABLES)
    if store is None:
        opened = gold_store(config)
        tables = {spec.name: opened.open(spec) for spec in specs}
    else:
        tables = {spec.name: store.table(spec) for spec in specs}
    gold_app = f"{app_id}-gold" if app_id is not None else None
    todo = [
        spec
        for spec in GOLD_TABLES
        if gold_app is None
        or batch_id is None
        or not txn_done(tables[spec.name], gold_app, batch_id)
    ]
    if not todo:
        return {}
    scan = scan_table(tables[HISTORY.name])  # every version's timeline columns; current rows whole
    history = scan.select(_TIMELINE_COLUMNS).collect()
    frames = compute_gold(history, scan.filter(pl.col("is_current")).collect())
    written = {}
    for spec in todo:
        table: DeltaTable = tables[spec.name]
        props = (
            commit_props(gold_app, batch_id)
            if gold_app is not None and batch_id is not None
            else None
        )
        write_deltalake(
            table,
            frames[spec.name].to_arrow().cast(spec.schema),
            mode="overwrite",
            # a table written by an earlier release (e.g. share/churn_rate as fractions, before
            # the *_pct columns) takes the current schema: its content is recomputed anyway
            schema_mode="overwrite" if schema_differs(table, spec) else None,
            commit_properties=props,
        )
        written[spec.name] = frames[spec.name].height
        if batch_id is not None:
            crash_point(gold_point(spec.name), batch_id)
    log.info("gold refreshed", extra={"tables": written, "batch_id": batch_id})
    return written


def after_batch(
    config: CdcflowConfig,
    app_id: str,
    batch_id: int,
    store: DeltaStore | None = None,
    refresh: Callable[[], object] | None = None,
) -> None:
    """Post-batch hook: Gold refresh and automatic optimize, per the configured policies.

    Args:
        config: the pipeline configuration.
        app_id: the pipeline's app id (Gold commits carry ``<app_id>-gold``, ``batch_id``).
        batch_id: the micro-batch just written.
        store: the local engine's store inside its pinned block (see :func:`refresh_gold`).
        refresh: the engine's Gold refresh of this micro-batch (default: :func:`refresh_gold`
            with Polars and delta-rs; the Spark engine computes Gold with Spark).
    """
    every = config.gold.refresh_every_batches
    if every and (batch_id + 1) % every == 0:
        if refresh is None:
            refresh_gold(config, app_id, batch_id, store)
        else:
            refresh()
    every = config.maintenance.optimize_every_batches
    if every and (batch_id + 1) % every == 0:
        from cdcflow.engines.local.maintenance import optimize

        if store is not None:
            store.forget()  # optimize commits through table objects of its own
        optimize(config)


__all__ = ["after_batch", "compute_gold", "refresh_gold"]
