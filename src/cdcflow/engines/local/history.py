"""Polars / delta-rs rendering of ``silver/customer_history`` (SCD2).

Semantics: :mod:`cdcflow.plan.history` (one version per first-copy event, in sequence order, the
row image after it, ``valid_from`` / ``valid_to`` / ``is_current``).

Maintenance per micro-batch: for the customer_ids the batch touches, the whole timeline is
recomputed from Bronze's first-copy events (so a late event lands in the middle of the timeline and
every later image and both neighbours' windows are corrected), compared with the stored versions,
and the difference is written with **one** Delta MERGE on (customer_id, sequence):

* new or changed versions → insert / update;
* stored versions that are no longer in the timeline → delete (cannot happen for an append-only
  Bronze, kept so the table always equals the recomputation).

The MERGE carries the app transaction (``app_id``, batch id): a re-run of a committed batch skips
itself, and a re-run that did not commit recomputes the same timeline, so duplicates and replays
add nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl
from deltalake import DeltaTable

from cdcflow.engines.local.delta import commit_props, read_where_in, txn_done
from cdcflow.layers.tables import HISTORY
from cdcflow.model.events import ATTRIBUTE_BIT, ATTRIBUTES
from cdcflow.plan.reference import DeleteMode

_DELETE = pl.col("operation") == "DELETE"
_KEY = ("customer_id", "sequence")
_FLAG = "_cdc_delete"


def history_frame(events: pl.DataFrame, mode: DeleteMode) -> pl.DataFrame:
    """Timeline of every customer in ``events``: one row per event (version).

    Args:
        events: every accepted first-copy event of the customers (Bronze columns
            ``FOLD_COLUMNS``: customer_id, event_id, operation, event_timestamp, the attributes,
            present_mask, lsn, sequence), any order.
        mode: ``soft`` or ``hard`` delete mode.

    Returns:
        One row per (customer_id, sequence) with the ``silver/customer_history`` columns, sorted by
        customer_id, sequence.
    """
    df = events.sort("customer_id", "sequence").with_row_index("_i")
    if mode == "hard":
        # a hard DELETE ends the row: later events start a fresh one (segment = DELETEs before)
        dels = _DELETE.cast(pl.Int32)
        df = df.with_columns((dels.cum_sum().over("customer_id") - dels).alias("_seg"))
        group = ["customer_id", "_seg"]
    else:
        df = df.with_columns(pl.lit(0, pl.Int32).alias("_seg"))
        group = ["customer_id"]

    # each attribute = the value of the latest carrier (an INSERT/UPDATE holding it) so far
    carriers = []
    for name in ATTRIBUTES:
        carrier = ((pl.col("present_mask") & ATTRIBUTE_BIT[name]) != 0) & ~_DELETE
        if name == "status" and mode == "soft":
            carrier = carrier | _DELETE
        carriers.append(
            pl.when(carrier).then(pl.col("_i")).forward_fill().over(group).alias(f"_at_{name}")
        )
    df = df.with_columns(
        pl.when(_DELETE).then(pl.lit("DELETED")).otherwise(pl.col("status")).alias("status"),
        *carriers,
    )
    images = []
    for name in ATTRIBUTES:
        value = pl.col(name).gather(pl.col(f"_at_{name}"))
        if mode == "hard":
            value = pl.when(_DELETE).then(None).otherwise(value)
            if name == "status":
                value = pl.when(_DELETE).then(pl.lit("DELETED")).otherwise(value)
        images.append(value.alias(name))
    df = df.with_columns(images)

    created = pl.col("event_timestamp").first().over(group)
    if mode == "hard":
        created = pl.when(_DELETE).then(None).otherwise(created)
    last = pl.col("_i") == pl.col("_i").max().over("customer_id")
    df = df.with_columns(
        _DELETE.alias("is_deleted"),
        (~_DELETE & (pl.col("status") == "ACTIVE").fill_null(False)).alias("is_active"),
        created.alias("created_at"),
        pl.col("event_timestamp").alias("last_updated_at"),
        pl.when(_DELETE).then(pl.col("event_timestamp")).alias("deleted_at"),
        pl.col("event_id").alias("last_event_id"),
        pl.col("operation").alias("last_operation"),
        pl.col("lsn").alias("last_lsn"),
        pl.col("event_timestamp").alias("valid_from"),
        pl.when(~last)
        .then(pl.col("event_timestamp").shift(-1).over("customer_id"))
        .alias("valid_to"),
        last.alias("is_current"),
    )
    return df.select([pl.col(f.name) for f in HISTORY.schema]).with_columns(
        pl.col("created_at", "deleted_at", "valid_to").cast(pl.Datetime("us", "UTC"))
    )


def merge_history(
    table: DeltaTable,
    load_events: Callable[[], pl.DataFrame],
    keys: Sequence[str],
    mode: DeleteMode,
    app_id: str,
    batch_id: int,
) -> int:
    """Replace the history of ``keys`` by their recomputed timeline (one guarded MERGE).

    Args:
        table: the ``silver/customer_history`` table.
        load_events: returns every first-copy Bronze event of ``keys`` up to this batch.
        keys: customer_ids touched by the micro-batch.
        mode: delete mode.
        app_id: Delta app-transaction id of the pipeline.
        batch_id: micro-batch id (app-transaction version).

    Returns:
        Number of history rows inserted, updated or deleted (0 when skipped).
    """
    if not keys or txn_done(table, app_id, batch_id):
        return 0
    fresh = history_frame(load_events(), mode)
    stored = read_where_in(table, "customer_id", keys, HISTORY.schema.names)
    changed = fresh.join(stored, on=HISTORY.schema.names, how="anti", nulls_equal=True)
    gone = stored.join(fresh, on=list(_KEY), how="anti")
    if changed.height == 0 and gone.height == 0:
        return 0
    source = pl.concat(
        [
            changed.with_columns(pl.lit(False).alias(_FLAG)),
            gone.with_columns(pl.lit(True).alias(_FLAG)),
        ]
    )
    columns = {name: f"s.{name}" for name in HISTORY.schema.names}
    (
        table.merge(
            source.to_arrow(),
            predicate="t.customer_id = s.customer_id AND t.sequence = s.sequence",
            source_alias="s",
            target_alias="t",
            commit_properties=commit_props(app_id, batch_id),
        )
        .when_matched_delete(predicate=f"s.{_FLAG}")
        .when_matched_update(updates=columns, predicate=f"NOT s.{_FLAG}")
        .when_not_matched_insert(updates=columns, predicate=f"NOT s.{_FLAG}")
        .execute()
    )
    return source.height


__all__ = ["history_frame", "merge_history"]
