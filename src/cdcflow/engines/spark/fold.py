"""Spark rendering of the micro-batch fold (one row per key, ready for the MERGE).

Every function takes the table's contract (:mod:`cdcflow.model.contracts`, default customers).
The same semantics as :mod:`cdcflow.engines.local.fold` and :mod:`cdcflow.plan.reference`,
written with Spark aggregate functions (``max_by``/``min_by`` over the sequence string), so the
fold runs on the executors with no collect to the driver:

* hard mode: the latest DELETE per key (max with the prior tombstone) resets the row; only
  events with a higher sequence contribute; a key whose events are all below it yields a
  tombstone-only row (``_cdc_seq`` null);
* each non-key column takes the value of the highest-sequence INSERT/UPDATE that carries it
  (its register = that sequence; ``present_mask`` bit i = the contract's i-th non-key column);
  a column of the contract's ``soft_delete_values`` also counts DELETEs (customers: status
  ``DELETED``);
* row-level columns come from the highest-sequence event, ``created_at`` from the lowest;
  ``is_active`` (the contract's ``derived_active``) = not deleted and the column equals the
  value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.layers.contract_tables import contract_tables
from cdcflow.layers.tables import register
from cdcflow.model.contracts import CUSTOMERS, TableContract, coerce

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def source_columns(contract: TableContract = CUSTOMERS) -> list[str]:
    """Columns of the MERGE source: the contract's Silver columns + ``_cdc_tomb``."""
    return [*contract_tables(contract).silver.schema.names, "_cdc_tomb"]


#: Columns of the customers MERGE source.
SOURCE_COLUMNS = source_columns(CUSTOMERS)


def soft_delete_literal(contract: TableContract, name: str) -> Column:
    """The value a DELETE sets in column ``name`` (``soft_delete_values``), typed."""
    from pyspark.sql import functions as F

    spec = contract.column(name)
    return F.lit(coerce(contract.soft_delete_values[name], spec.type))


def batch_tombstones(events: DataFrame, contract: TableContract = CUSTOMERS) -> DataFrame:
    """Latest DELETE per key: the key columns, _cdc_seq, deleted_at, last_event_id, last_lsn."""
    from pyspark.sql import functions as F

    seq = F.col("sequence")
    return (
        events.filter(F.col("operation") == "DELETE")
        .groupBy(*contract.keys)
        .agg(
            F.max(seq).alias("_cdc_seq"),
            F.max_by("event_timestamp", seq).alias("deleted_at"),
            F.max_by("event_id", seq).alias("last_event_id"),
            F.max_by("lsn", seq).alias("last_lsn"),
        )
    )


def fold_events(
    events: DataFrame,
    mode: str,
    prior_tombstones: DataFrame | None,
    contract: TableContract = CUSTOMERS,
) -> DataFrame:
    """Fold de-duplicated events into one MERGE source row per key.

    Args:
        events: accepted first-copy events (Bronze columns), any order.
        mode: ``soft`` or ``hard``.
        prior_tombstones: hard mode: the key columns and _cdc_seq of tombstones already stored.
        contract: the table's contract (default customers).

    Returns:
        One row per key of ``events`` with :func:`source_columns` of the contract.
    """
    from pyspark.sql import functions as F

    key = list(contract.keys)
    is_delete = F.col("operation") == "DELETE"
    keys = events.select(*key).distinct()
    if mode == "hard":
        tombs = batch_tombstones(events, contract).select(*key, F.col("_cdc_seq").alias("_tb"))
        keys = keys.join(tombs, key, "left")
        if prior_tombstones is not None:
            prior = prior_tombstones.select(*key, F.col("_cdc_seq").alias("_tp"))
            keys = keys.join(prior, key, "left")
        else:
            keys = keys.withColumn("_tp", F.lit(None).cast("string"))
        keys = keys.select(
            *key,
            F.greatest(F.coalesce("_tb", F.lit("")), F.coalesce("_tp", F.lit(""))).alias(
                "_cdc_tomb"
            ),
        )
        events = events.join(keys, key).filter(F.col("sequence") > F.col("_cdc_tomb"))
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
    for bit, spec in enumerate(contract.attributes):
        name = spec.name
        carries = ~is_delete & ((F.col("present_mask").bitwiseAND(F.lit(1 << bit))) != 0)
        value = F.col(name)
        if name in contract.soft_delete_values:
            carries = carries | is_delete
            value = F.when(is_delete, soft_delete_literal(contract, name)).otherwise(value)
        carried_seq = F.when(carries, seq)
        # max_by skips rows whose ordering is NULL: only carrying events compete
        aggs.append(F.max_by(value, carried_seq).alias(name))
        aggs.append(F.max(carried_seq).alias(register(name)))

    folded = events.groupBy(*key).agg(*aggs)
    is_deleted = F.col("last_operation") == "DELETE"
    derived = [is_deleted.alias("is_deleted")]
    if contract.derived_active is not None:
        column, active = contract.derived_active
        matches = F.coalesce(F.col(column).cast("string"), F.lit("")) == active
        derived.append((~is_deleted & matches).alias("is_active"))
    derived.append(F.when(is_deleted, F.col("last_updated_at")).alias("deleted_at"))
    folded = folded.select("*", *derived)
    return keys.join(folded, key, "left").select(*source_columns(contract))


def truncate_deletes(
    firsts: DataFrame, truncates: DataFrame, like: DataFrame, keys: list[str]
) -> DataFrame:
    """The DELETEs that truncates apply (:mod:`cdcflow.plan.truncates`; the local engine's
    :func:`cdcflow.engines.local.fold.truncate_deletes`): one row per key of ``firsts`` and
    truncate whose sequence is above the key's ``_first``.

    Args:
        firsts: one row per key: the key columns and ``_first`` (its lowest sequence).
        truncates: one row per accepted truncate: ``event_id``, ``event_timestamp``, ``lsn``,
            ``sequence`` (a few rows: broadcast).
        like: a fold-input frame whose columns and types the result takes (no values, present
            mask 0, operation ``DELETE``).
        keys: the key columns.
    """
    from pyspark.sql import functions as F

    from cdcflow.plan.truncates import TRUNCATE_COLUMNS

    pairs = firsts.crossJoin(F.broadcast(truncates.select(*TRUNCATE_COLUMNS))).filter(
        F.col("sequence") > F.col("_first")
    )
    constant = {"operation": "DELETE", "present_mask": 0}  # every other column: null
    columns = [
        (
            F.col(f.name)
            if f.name in keys or f.name in TRUNCATE_COLUMNS
            else F.lit(constant.get(f.name))
        )
        .cast(f.dataType)
        .alias(f.name)
        for f in like.schema.fields
    ]
    return pairs.select(*columns)


def with_truncates(events: DataFrame, truncates: DataFrame | None, keys: list[str]) -> DataFrame:
    """``events`` plus the DELETE of every truncate above each key's lowest sequence in them
    (:func:`cdcflow.plan.truncates.expand_changes`); one row per key and event id. ``None``
    (the table applies no truncates, or has none) returns ``events``."""
    if truncates is None:
        return events
    from pyspark.sql import functions as F

    firsts = events.groupBy(*keys).agg(F.min("sequence").alias("_first"))
    added = truncate_deletes(firsts, truncates, events, keys)
    return events.unionByName(added).dropDuplicates([*keys, "event_id"])
