"""The guarded Delta MERGEs of a micro-batch on the local engine, shared by the customers
engine (:mod:`cdcflow.engines.local.engine`) and the declared-tables engine
(:mod:`cdcflow.engines.local.contracts`).

Each write carries the app transaction (``app_id``, batch id) and is skipped when the table
already holds it, so a re-run after a crash writes nothing twice.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pyarrow as pa

from cdcflow.engines.local.delta import (
    DeltaStore,
    commit_props,
    nothing_expired,
    scan_table,
    txn_done,
)
from cdcflow.layers.tables import TableSpec
from cdcflow.plan.merge_spec import TOMBSTONE_UPDATE_WHEN, MergeSpec
from cdcflow.report import BatchReport
from cdcflow.state.checkpoint import BatchOffsets


def merge_silver(
    store: DeltaStore, spec: TableSpec, source: pa.Table, merge: MergeSpec, app_id: str, batch: int
) -> None:
    """The sequence-guarded Silver MERGE of one micro-batch (:mod:`cdcflow.plan.merge_spec`).

    Args:
        store: the pipeline's tables; ``spec`` names the Silver table.
        spec: the Silver table.
        source: the folded micro-batch, one row per key (``source_schema`` of the contract).
        merge: the MERGE clauses.
        app_id: the app transaction id.
        batch: the micro-batch id (the app transaction's version).
    """
    (
        store.table(spec)
        .merge(
            source,
            predicate=merge.on,
            source_alias="s",
            target_alias="t",
            commit_properties=commit_props(app_id, batch),
        )
        .when_matched_delete(predicate=merge.delete_when)
        .when_matched_update(updates=merge.update_set, predicate=merge.update_when)
        .when_not_matched_insert(updates=merge.insert_values, predicate=merge.insert_when)
        .execute()
    )


def merge_tombstones(
    store: DeltaStore,
    spec: TableSpec,
    tombs: pl.DataFrame,
    on: str,
    app_id: str,
    offsets: BatchOffsets,
    retention: timedelta,
) -> None:
    """Hard mode: MERGE the micro-batch's tombstones, then purge those past their retention.

    Args:
        store: the pipeline's tables.
        spec: the tombstone table (key columns, ``_cdc_seq``, ``deleted_at``,
            ``last_event_id``, ``last_lsn``, ``tombstoned_at``).
        tombs: the latest DELETE per key of the micro-batch (``batch_tombstones``).
        on: the MERGE's ON predicate (every key column).
        app_id: the app transaction id (the purge uses ``<app_id>-tombstone-purge``).
        offsets: the micro-batch: its id and processing time (``tombstoned_at``, and the purge
            cutoff = processing time − ``retention``).
        retention: how long a tombstone is kept.
    """
    table = store.table(spec)
    batch_id = offsets.batch_id
    if tombs.height and not txn_done(table, app_id, batch_id):
        source = tombs.with_columns(
            pl.lit(offsets.processing_time).dt.cast_time_unit("us").alias("tombstoned_at")
        ).select(spec.schema.names)
        (
            table.merge(
                source.to_arrow().cast(spec.schema),
                predicate=on,
                source_alias="s",
                target_alias="t",
                commit_properties=commit_props(app_id, batch_id),
            )
            .when_matched_update_all(predicate=TOMBSTONE_UPDATE_WHEN)
            .when_not_matched_insert_all()
            .execute()
        )
    # purge tombstones past their retention (relative to the batch's processing time)
    purge_app = f"{app_id}-tombstone-purge"
    table = store.table(spec)
    cutoff = offsets.processing_time - retention
    if txn_done(table, purge_app, batch_id) or nothing_expired(table, cutoff):
        return
    expired = scan_table(table).filter(pl.col("tombstoned_at") < cutoff).select(pl.len())
    if expired.collect().item():
        table.delete(
            f"tombstoned_at < '{cutoff.isoformat()}'",
            commit_properties=commit_props(purge_app, batch_id),
        )


def event_outcomes(
    deliveries: pl.DataFrame,
    keys: list[str],
    targets: pl.DataFrame,
    tombstones: pl.DataFrame,
    late_after_s: float,
    changes: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """What became of each accepted delivery of a micro-batch (``audit/event_outcomes``).

    The first rule that holds: ``DUPLICATE`` (a re-delivery), ``SUPERSEDED_IN_BATCH`` (a
    higher sequence of the key among the batch's changes — with ``truncate: apply``, the
    DELETEs of truncates folded with them too), ``TOMBSTONED`` (below the key's stored
    hard-mode tombstone), ``STALE`` (below the sequence Silver holds), else ``APPLIED``. The
    batch's own Silver and tombstone commits do not change the answer (they only raise the
    stored sequences to the batch's maximum, which the earlier rules already cover), so a
    re-run after a crash gives the same outcomes.

    Args:
        deliveries: one row per accepted delivery: the key columns, ``sequence``,
            ``is_duplicate``, ``lag_s`` (seconds from the event time to the batch's processing
            time), anything else is kept.
        keys: the key columns.
        targets: the key columns and ``_t_seq`` (Silver's ``_cdc_seq``) of the touched keys.
        tombstones: the key columns and ``_cdc_seq`` of the touched keys' stored tombstones.
        late_after_s: ``processing.late_event_threshold`` in seconds (``is_late``: above it).
        changes: the key columns and ``sequence`` of the changes the batch folded (its first
            copies and the DELETEs of truncates, :mod:`cdcflow.plan.truncates`); None: the
            deliveries that are not duplicates.

    Returns:
        ``deliveries`` with ``outcome`` and ``is_late``.
    """
    if changes is None:
        changes = deliveries.filter(~pl.col("is_duplicate"))
    batch_max = changes.group_by(keys).agg(pl.col("sequence").max().alias("_b_max"))
    prior = tombstones.select(*keys, pl.col("_cdc_seq").alias("_t_tomb"))
    frame = (
        deliveries.join(batch_max, on=keys, how="left")
        .join(targets.select(*keys, "_t_seq"), on=keys, how="left")
        .join(prior, on=keys, how="left")
    )
    outcome = (
        pl.when(pl.col("is_duplicate"))
        .then(pl.lit("DUPLICATE"))
        .when(pl.col("sequence") < pl.col("_b_max"))
        .then(pl.lit("SUPERSEDED_IN_BATCH"))
        .when(pl.col("sequence") < pl.col("_t_tomb").fill_null(""))
        .then(pl.lit("TOMBSTONED"))
        .when(pl.col("sequence") < pl.col("_t_seq").fill_null(""))
        .then(pl.lit("STALE"))
        .otherwise(pl.lit("APPLIED"))
    )
    return frame.with_columns(
        outcome.alias("outcome"), (pl.col("lag_s") > late_after_s).alias("is_late")
    )


def count_outcomes(outcomes: pl.DataFrame, report: BatchReport) -> None:
    """Add a batch's (or one table's) outcomes to the report: ``stale_ignored``,
    ``tombstoned``, ``late_events`` and ``max_event_lag_s`` (the largest so far)."""
    counts = outcomes.group_by("outcome").len()
    by_outcome = dict(zip(counts["outcome"].to_list(), counts["len"].to_list(), strict=True))
    report.stale_ignored += by_outcome.get("STALE", 0)
    report.tombstoned += by_outcome.get("TOMBSTONED", 0)
    report.late_events += int(outcomes["is_late"].sum())
    if outcomes.height:
        lag = float(outcomes["lag_s"].max())  # type: ignore[arg-type]
        if report.max_event_lag_s is None or lag > report.max_event_lag_s:
            report.max_event_lag_s = lag


__all__ = ["count_outcomes", "event_outcomes", "merge_silver", "merge_tombstones"]
