"""Spark rendering of the micro-batch fold (one row per customer_id, ready for the MERGE).

The same semantics as :mod:`cdcflow.engines.local.fold` and :mod:`cdcflow.plan.reference`,
written with Spark aggregate functions (``max_by``/``min_by`` over the sequence string), so the
fold runs on the executors with no collect to the driver:

* hard mode: the latest DELETE per key (max with the prior tombstone) resets the row; only
  events with a higher sequence contribute; a key whose events are all below it yields a
  tombstone-only row (``_cdc_seq`` null);
* each attribute takes the value of the highest-sequence INSERT/UPDATE that carries it (its
  register = that sequence); status also counts DELETEs (value ``DELETED``) in soft mode;
* row-level columns come from the highest-sequence event, ``created_at`` from the lowest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.layers.tables import SILVER, register
from cdcflow.model.events import ATTRIBUTE_BIT, ATTRIBUTES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Columns of the MERGE source: Silver's columns + ``_cdc_tomb``.
SOURCE_COLUMNS = [*SILVER.schema.names, "_cdc_tomb"]


def batch_tombstones(events: DataFrame) -> DataFrame:
    """Latest DELETE per customer_id: customer_id, _cdc_seq, deleted_at, last_event_id, last_lsn."""
    from pyspark.sql import functions as F

    seq = F.col("sequence")
    return (
        events.filter(F.col("operation") == "DELETE")
        .groupBy("customer_id")
        .agg(
            F.max(seq).alias("_cdc_seq"),
            F.max_by("event_timestamp", seq).alias("deleted_at"),
            F.max_by("event_id", seq).alias("last_event_id"),
            F.max_by("lsn", seq).alias("last_lsn"),
        )
    )


def fold_events(events: DataFrame, mode: str, prior_tombstones: DataFrame | None) -> DataFrame:
    """Fold de-duplicated events into one MERGE source row per customer_id.

    Args:
        events: accepted first-copy events (Bronze columns), any order.
        mode: ``soft`` or ``hard``.
        prior_tombstones: hard mode: customer_id, _cdc_seq of tombstones already stored.

    Returns:
        One row per customer_id of ``events`` with ``SOURCE_COLUMNS``.
    """
    from pyspark.sql import functions as F

    is_delete = F.col("operation") == "DELETE"
    keys = events.select("customer_id").distinct()
    if mode == "hard":
        tombs = batch_tombstones(events).select("customer_id", F.col("_cdc_seq").alias("_tb"))
        keys = keys.join(tombs, "customer_id", "left")
        if prior_tombstones is not None:
            prior = prior_tombstones.select("customer_id", F.col("_cdc_seq").alias("_tp"))
            keys = keys.join(prior, "customer_id", "left")
        else:
            keys = keys.withColumn("_tp", F.lit(None).cast("string"))
        keys = keys.select(
            "customer_id",
            F.greatest(F.coalesce("_tb", F.lit("")), F.coalesce("_tp", F.lit(""))).alias(
                "_cdc_tomb"
            ),
        )
        events = events.join(keys, "customer_id").filter(F.col("sequence") > F.col("_cdc_tomb"))
    else:
        keys = keys.withColumn("_cdc_tomb", F.lit(""))

    seq = F.col("sequence")
    aggs: list[Column] = [
        F.max(seq).alias("_cdc_seq"),
        F.min(seq).alias("_cdc_min_seq"),
        F.min_by("event_timestamp", seq).alias("created_at"),
        F.max_by("event_timestamp", seq).alias("last_updated_at"),
        F.max_by("event_id", seq).alias("last_event_id"),
        F.max_by("operation", seq).alias("last_operation"),
        F.max_by("lsn", seq).alias("last_lsn"),
    ]
    for name in ATTRIBUTES:
        carries = ~is_delete & ((F.col("present_mask").bitwiseAND(ATTRIBUTE_BIT[name])) != 0)
        value = F.col(name)
        if name == "status":
            carries = carries | is_delete
            value = F.when(is_delete, F.lit("DELETED")).otherwise(F.col("status"))
        carried_seq = F.when(carries, seq)
        # max_by skips rows whose ordering is NULL: only carrying events compete
        aggs.append(F.max_by(value, carried_seq).alias(name))
        aggs.append(F.max(carried_seq).alias(register(name)))

    folded = events.groupBy("customer_id").agg(*aggs)
    is_deleted = F.col("last_operation") == "DELETE"
    folded = folded.select(
        "*",
        is_deleted.alias("is_deleted"),
        (~is_deleted & (F.coalesce(F.col("status"), F.lit("")) == "ACTIVE")).alias("is_active"),
        F.when(is_deleted, F.col("last_updated_at")).alias("deleted_at"),
    )
    return keys.join(folded, "customer_id", "left").select(*SOURCE_COLUMNS)
