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


__all__ = ["merge_silver", "merge_tombstones"]
