"""Polars rendering of the micro-batch fold (one row per customer_id, ready for the MERGE).

Input frame (one row per accepted, de-duplicated event; the Bronze columns): ``customer_id``,
``event_id``, ``operation``, ``event_timestamp``, the attributes, ``present_mask``, ``lsn``,
``sequence``.

Output frame (one row per customer_id): the Silver columns (``SILVER.schema``) plus ``_cdc_tomb``
— the same semantics as :mod:`cdcflow.plan.reference`, expressed as per-column registers:

* hard mode: the latest DELETE per key (``max`` with the prior tombstone) resets the row; only
  events with a higher sequence contribute; a key whose events are all below it yields a
  tombstone-only row (``_cdc_seq`` null);
* each attribute takes the value of the highest-sequence INSERT/UPDATE that carries it (its
  register = that sequence); status also counts DELETEs (value ``DELETED``) in soft mode;
* row-level columns come from the highest-sequence event, ``created_at`` from the lowest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import polars as pl
import pyarrow as pa

from cdcflow.layers.tables import SILVER, register
from cdcflow.model.events import ATTRIBUTE_BIT, ATTRIBUTES

DeleteMode = Literal["soft", "hard"]
_DELETE = pl.col("operation") == "DELETE"


def source_schema() -> pa.Schema:
    """Arrow schema of the MERGE source: Silver's columns (all nullable) + ``_cdc_tomb``."""
    fields = [pa.field(f.name, f.type) for f in SILVER.schema]
    return pa.schema([*fields, pa.field("_cdc_tomb", pa.string())])


def batch_tombstones(events: pl.DataFrame, carry: Sequence[str] = ()) -> pl.DataFrame:
    """Latest DELETE per customer_id in the events (hard mode's tombstone candidates).

    Args:
        events: fold input (see module doc).
        carry: further columns of ``events`` to take from that latest DELETE.

    Returns:
        One row per customer_id with a DELETE: customer_id, _cdc_seq, deleted_at,
        last_event_id, last_lsn, then the ``carry`` columns.
    """
    return (
        events.filter(_DELETE)
        .sort("sequence")
        .group_by("customer_id")
        .agg(
            pl.col("sequence").last().alias("_cdc_seq"),
            pl.col("event_timestamp").last().alias("deleted_at"),
            pl.col("event_id").last().alias("last_event_id"),
            pl.col("lsn").last().alias("last_lsn"),
            *(pl.col(name).last() for name in carry),
        )
    )


def fold_events(
    events: pl.DataFrame, mode: DeleteMode, prior_tombstones: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Fold de-duplicated events into one MERGE source row per customer_id.

    Args:
        events: accepted first-copy events (see module doc), any order.
        mode: ``soft`` or ``hard``.
        prior_tombstones: hard mode: customer_id, _cdc_seq of tombstones already stored.

    Returns:
        One row per customer_id of ``events`` with ``source_schema()`` columns.
    """
    df = events.sort("sequence")
    keys = df.select("customer_id").unique()
    if mode == "hard":
        tombs = batch_tombstones(df).select("customer_id", pl.col("_cdc_seq").alias("_t_batch"))
        keys = keys.join(tombs, on="customer_id", how="left")
        if prior_tombstones is not None and prior_tombstones.height:
            prior = prior_tombstones.select("customer_id", pl.col("_cdc_seq").alias("_t_prior"))
            keys = keys.join(prior, on="customer_id", how="left")
        else:
            keys = keys.with_columns(pl.lit(None, pl.String).alias("_t_prior"))
        keys = keys.select(
            "customer_id",
            pl.max_horizontal(
                pl.col("_t_batch").fill_null(""), pl.col("_t_prior").fill_null("")
            ).alias("_cdc_tomb"),
        )
        df = df.join(keys, on="customer_id", how="left").filter(
            pl.col("sequence") > pl.col("_cdc_tomb")
        )
    else:
        keys = keys.with_columns(pl.lit("").alias("_cdc_tomb"))

    aggs: list[pl.Expr] = [
        pl.col("sequence").last().alias("_cdc_seq"),
        pl.col("sequence").first().alias("_cdc_min_seq"),
        pl.col("event_timestamp").first().alias("created_at"),
        pl.col("event_timestamp").last().alias("last_updated_at"),
        pl.col("event_id").last().alias("last_event_id"),
        pl.col("operation").last().alias("last_operation"),
        pl.col("lsn").last().alias("last_lsn"),
    ]
    for name in ATTRIBUTES:
        carries = ~_DELETE & ((pl.col("present_mask") & ATTRIBUTE_BIT[name]) != 0)
        value = pl.col(name)
        if name == "status":
            carries = carries | _DELETE
            value = pl.when(_DELETE).then(pl.lit("DELETED")).otherwise(pl.col("status"))
        aggs.append(value.filter(carries).last().alias(name))
        aggs.append(pl.col("sequence").filter(carries).last().alias(register(name)))

    folded = df.group_by("customer_id").agg(aggs)
    is_deleted = pl.col("last_operation") == "DELETE"
    folded = folded.with_columns(
        is_deleted.alias("is_deleted"),
        (~is_deleted & (pl.col("status").fill_null("") == "ACTIVE")).alias("is_active"),
        pl.when(is_deleted).then(pl.col("last_updated_at")).otherwise(None).alias("deleted_at"),
    )
    # keys whose every event fell below the tombstone keep a tombstone-only row
    out = keys.join(folded, on="customer_id", how="left")
    names = source_schema().names
    return out.select(names)


def to_source_table(frame: pl.DataFrame) -> pa.Table:
    """The folded frame as an Arrow table with exactly ``source_schema()``."""
    return frame.select(source_schema().names).to_arrow().cast(source_schema())
