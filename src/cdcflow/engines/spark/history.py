"""Spark rendering of ``silver/customer_history`` (SCD2), the same as the local engine's.

Semantics: :mod:`cdcflow.plan.history`; the local rendering is
:mod:`cdcflow.engines.local.history`, whose steps this follows with window functions:

* per customer_id in sequence order (hard mode: per segment that a DELETE closes), each attribute
  of the image is the value of the latest event carrying it so far (``last`` of a one-field
  struct, so a carried JSON null stays null rather than being skipped);
* ``created_at`` = first event of the row (segment), ``valid_to`` = the next version's
  ``valid_from``, ``is_current`` = last version of the key.

Per micro-batch the touched keys' timelines are recomputed from Bronze and the difference is
written with one guarded Delta MERGE on (customer_id, sequence), like the local engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.layers.tables import HISTORY
from cdcflow.model.events import ATTRIBUTE_BIT, ATTRIBUTES
from cdcflow.plan.reference import DeleteMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Flag column of the MERGE source: True = the stored version is no longer in the timeline.
_FLAG = "_cdc_delete"


def history_frame(events: DataFrame, mode: DeleteMode) -> DataFrame:
    """Timeline of every customer in ``events``: one row per event (version).

    Args:
        events: every accepted first-copy event of the customers (``FOLD_COLUMNS``), any order.
        mode: ``soft`` or ``hard`` delete mode.

    Returns:
        One row per (customer_id, sequence) with the ``silver/customer_history`` columns.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    is_delete = F.col("operation") == "DELETE"
    by_key = Window.partitionBy("customer_id").orderBy("sequence")
    df = events
    if mode == "hard":
        # a hard DELETE ends the row: later events start a fresh one (segment = DELETEs before)
        deletes = is_delete.cast("int")
        df = df.withColumn(
            "_seg",
            F.sum(deletes).over(by_key.rowsBetween(Window.unboundedPreceding, 0)) - deletes,
        )
    else:
        df = df.withColumn("_seg", F.lit(0))
    so_far = (
        Window.partitionBy("customer_id", "_seg")
        .orderBy("sequence")
        .rowsBetween(Window.unboundedPreceding, 0)
    )
    df = df.withColumn("status", F.when(is_delete, F.lit("DELETED")).otherwise(F.col("status")))
    images = []
    for name in ATTRIBUTES:
        carrier = ((F.col("present_mask").bitwiseAND(ATTRIBUTE_BIT[name])) != 0) & ~is_delete
        if name == "status" and mode == "soft":
            carrier = carrier | is_delete
        held = F.last(F.when(carrier, F.struct(F.col(name).alias("v"))), ignorenulls=True)
        value = held.over(so_far).getField("v")
        if mode == "hard":
            value = F.when(is_delete, F.lit("DELETED") if name == "status" else None).otherwise(
                value
            )
        images.append(value.alias(name))
    df = df.select(*[c for c in df.columns if c not in ATTRIBUTES], *images)

    created = F.first("event_timestamp").over(so_far)
    if mode == "hard":
        created = F.when(~is_delete, created)
    following = F.lead("event_timestamp").over(by_key)
    is_last = F.lead("sequence").over(by_key).isNull()
    df = df.select(
        "*",
        is_delete.alias("is_deleted"),
        (~is_delete & F.coalesce(F.col("status") == "ACTIVE", F.lit(False))).alias("is_active"),
        created.alias("created_at"),
        F.col("event_timestamp").alias("last_updated_at"),
        F.when(is_delete, F.col("event_timestamp")).alias("deleted_at"),
        F.col("event_id").alias("last_event_id"),
        F.col("operation").alias("last_operation"),
        F.col("lsn").alias("last_lsn"),
        F.col("event_timestamp").alias("valid_from"),
        F.when(~is_last, following).alias("valid_to"),
        is_last.alias("is_current"),
    )
    return df.select(*HISTORY.schema.names)


def history_changes(fresh: DataFrame, stored: DataFrame) -> DataFrame:
    """MERGE source: new/changed versions (``_cdc_delete`` false) and vanished ones (true).

    Args:
        fresh: the recomputed timelines of the touched keys (``history_frame``).
        stored: the stored versions of the same keys.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    names = HISTORY.schema.names
    same = reduce(
        lambda acc, cond: acc & cond,
        [fresh[name].eqNullSafe(stored[name]) for name in names],
    )
    changed = fresh.join(stored, same, "left_anti")
    gone = stored.join(fresh, ["customer_id", "sequence"], "left_anti")
    return changed.withColumn(_FLAG, F.lit(False)).unionByName(gone.withColumn(_FLAG, F.lit(True)))


#: MERGE clauses of the history table (same as the local engine's).
HISTORY_MERGE_ON = "t.customer_id = s.customer_id AND t.sequence = s.sequence"
HISTORY_DELETE_WHEN = f"s.{_FLAG}"
HISTORY_UPSERT_WHEN = f"NOT s.{_FLAG}"
