"""Spark rendering of ``silver/customer_history`` and of every declared table's history (SCD2),
from the table's contract, the same as the local engine's.

Semantics: :mod:`cdcflow.plan.history`; the local rendering is
:mod:`cdcflow.engines.local.history`, whose steps this follows with window functions:

* per key in sequence order (hard mode: per segment that a DELETE closes), each attribute
  of the image is the value of the latest event carrying it so far (``last`` of a one-field
  struct, so a carried JSON null stays null rather than being skipped);
* ``created_at`` = first event of the row (segment), ``valid_to`` = the next version's
  ``valid_from``, ``is_current`` = last version of the key.

Per micro-batch the touched keys' timelines are recomputed from Bronze and the difference is
written with one guarded Delta MERGE on (key columns, sequence), like the local engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.engines.spark.fold import soft_delete_literal
from cdcflow.layers.contract_tables import contract_tables
from cdcflow.model.contracts import CUSTOMERS, TableContract
from cdcflow.plan.reference import DeleteMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Flag column of the MERGE source: True = the stored version is no longer in the timeline.
_FLAG = "_cdc_delete"


def history_frame(
    events: DataFrame, mode: DeleteMode, contract: TableContract = CUSTOMERS
) -> DataFrame:
    """Timeline of every key in ``events``: one row per event (version).

    Args:
        events: every accepted first-copy event of the keys (Bronze's fold columns), any order.
        mode: ``soft`` or ``hard`` delete mode.
        contract: the table's contract (default customers): keys, non-key columns
            (``present_mask`` bit i = the i-th), ``soft_delete_values``, ``derived_active``.

    Returns:
        One row per (key, sequence) with the history table's columns.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = list(contract.keys)
    is_delete = F.col("operation") == "DELETE"
    by_key = Window.partitionBy(*keys).orderBy("sequence")
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
        Window.partitionBy(*keys, "_seg")
        .orderBy("sequence")
        .rowsBetween(Window.unboundedPreceding, 0)
    )
    on_delete = {name: soft_delete_literal(contract, name) for name in contract.soft_delete_values}
    for name, value in on_delete.items():
        df = df.withColumn(name, F.when(is_delete, value).otherwise(F.col(name)))
    attributes = [spec.name for spec in contract.attributes]
    images = []
    for bit, name in enumerate(attributes):
        carrier = ((F.col("present_mask").bitwiseAND(F.lit(1 << bit))) != 0) & ~is_delete
        if name in on_delete and mode == "soft":
            carrier = carrier | is_delete
        held = F.last(F.when(carrier, F.struct(F.col(name).alias("v"))), ignorenulls=True)
        value = held.over(so_far).getField("v")
        if mode == "hard":
            value = F.when(is_delete, on_delete.get(name)).otherwise(value)
        images.append(value.alias(name))
    df = df.select(*[c for c in df.columns if c not in attributes], *images)

    created = F.first("event_timestamp").over(so_far)
    if mode == "hard":
        created = F.when(~is_delete, created)
    following = F.lead("event_timestamp").over(by_key)
    is_last = F.lead("sequence").over(by_key).isNull()
    derived = []
    if contract.derived_active is not None:
        column, active = contract.derived_active
        matches = F.coalesce(F.col(column).cast("string") == active, F.lit(False))
        derived.append((~is_delete & matches).alias("is_active"))
    df = df.select(
        "*",
        is_delete.alias("is_deleted"),
        *derived,
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
    return df.select(*contract_tables(contract).history.schema.names)


def history_changes(
    fresh: DataFrame, stored: DataFrame, contract: TableContract = CUSTOMERS
) -> DataFrame:
    """MERGE source: new/changed versions (``_cdc_delete`` false) and vanished ones (true).

    Args:
        fresh: the recomputed timelines of the touched keys (``history_frame``).
        stored: the stored versions of the same keys.
        contract: the table's contract (default customers).
    """
    from functools import reduce

    from pyspark.sql import functions as F

    names = contract_tables(contract).history.schema.names
    same = reduce(
        lambda acc, cond: acc & cond,
        [fresh[name].eqNullSafe(stored[name]) for name in names],
    )
    changed = fresh.join(stored, same, "left_anti")
    gone = stored.join(fresh, [*contract.keys, "sequence"], "left_anti")
    return changed.withColumn(_FLAG, F.lit(False)).unionByName(gone.withColumn(_FLAG, F.lit(True)))


def history_merge_on(contract: TableContract = CUSTOMERS) -> str:
    """The history MERGE's ON predicate: every key column and the sequence equal."""
    return " AND ".join(f"t.{name} = s.{name}" for name in (*contract.keys, "sequence"))


#: MERGE clauses of the history table (same as the local engine's).
HISTORY_MERGE_ON = history_merge_on(CUSTOMERS)
HISTORY_DELETE_WHEN = f"s.{_FLAG}"
HISTORY_UPSERT_WHEN = f"NOT s.{_FLAG}"
