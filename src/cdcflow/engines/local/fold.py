"""Polars rendering of the micro-batch fold (one row per key, ready for the MERGE).

Every function takes the table's contract (:mod:`cdcflow.model.contracts`, default customers).

Input frame (one row per accepted, de-duplicated event; the Bronze columns): the key columns
(customers: ``customer_id``), ``event_id``, ``operation``, ``event_timestamp``, the non-key
columns, ``present_mask``, ``lsn``, ``sequence``.

Output frame (one row per key): the contract's Silver columns plus ``_cdc_tomb`` — the same
semantics as :mod:`cdcflow.plan.reference`, expressed as per-column registers:

* hard mode: the latest DELETE per key (``max`` with the prior tombstone) resets the row; only
  events with a higher sequence contribute; a key whose events are all below it yields a
  tombstone-only row (``_cdc_seq`` null);
* each attribute takes the value of the highest-sequence INSERT/UPDATE that carries it (its
  register = that sequence); a column of the contract's ``soft_delete_values`` also counts
  DELETEs (customers: status ``DELETED``) in soft mode;
* row-level columns come from the highest-sequence event, ``created_at`` from the lowest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import polars as pl
import pyarrow as pa

from cdcflow.layers.contract_tables import contract_tables
from cdcflow.layers.tables import TS, register
from cdcflow.model.contracts import CUSTOMERS, TableContract
from cdcflow.plan.truncates import TRUNCATE_COLUMNS

if TYPE_CHECKING:
    from cdcflow.plan.contract_rules import ChangeEvent

DeleteMode = Literal["soft", "hard"]
_DELETE = pl.col("operation") == "DELETE"


def source_schema(contract: TableContract = CUSTOMERS) -> pa.Schema:
    """Arrow schema of the MERGE source: Silver's columns (all nullable) + ``_cdc_tomb``."""
    fields = [pa.field(f.name, f.type) for f in contract_tables(contract).silver.schema]
    return pa.schema([*fields, pa.field("_cdc_tomb", pa.string())])


def batch_tombstones(
    events: pl.DataFrame, carry: Sequence[str] = (), contract: TableContract = CUSTOMERS
) -> pl.DataFrame:
    """Latest DELETE per key in the events (hard mode's tombstone candidates).

    Args:
        events: fold input (see module doc).
        carry: further columns of ``events`` to take from that latest DELETE.
        contract: the table's contract (its key columns).

    Returns:
        One row per key with a DELETE: the key columns, _cdc_seq, deleted_at,
        last_event_id, last_lsn, then the ``carry`` columns.
    """
    return (
        events.filter(_DELETE)
        .sort("sequence")
        .group_by(list(contract.keys))
        .agg(
            pl.col("sequence").last().alias("_cdc_seq"),
            pl.col("event_timestamp").last().alias("deleted_at"),
            pl.col("event_id").last().alias("last_event_id"),
            pl.col("lsn").last().alias("last_lsn"),
            *(pl.col(name).last() for name in carry),
        )
    )


def fold_events(
    events: pl.DataFrame,
    mode: DeleteMode,
    prior_tombstones: pl.DataFrame | None = None,
    contract: TableContract = CUSTOMERS,
) -> pl.DataFrame:
    """Fold de-duplicated events into one MERGE source row per key.

    Args:
        events: accepted first-copy events (see module doc), any order.
        mode: ``soft`` or ``hard``.
        prior_tombstones: hard mode: the key columns and _cdc_seq of tombstones already stored.
        contract: the table's contract (default customers): key columns, non-key columns in
            ``present_mask`` bit order, soft-delete values, the derived ``is_active``.

    Returns:
        One row per key of ``events`` with ``source_schema(contract)`` columns.
    """
    key = list(contract.keys)
    df = events.sort("sequence")
    keys = df.select(key).unique()
    if mode == "hard":
        tombs = batch_tombstones(df, contract=contract).select(
            *key, pl.col("_cdc_seq").alias("_t_batch")
        )
        keys = keys.join(tombs, on=key, how="left")
        if prior_tombstones is not None and prior_tombstones.height:
            prior = prior_tombstones.select(*key, pl.col("_cdc_seq").alias("_t_prior"))
            keys = keys.join(prior, on=key, how="left")
        else:
            keys = keys.with_columns(pl.lit(None, pl.String).alias("_t_prior"))
        keys = keys.select(
            *key,
            pl.max_horizontal(
                pl.col("_t_batch").fill_null(""), pl.col("_t_prior").fill_null("")
            ).alias("_cdc_tomb"),
        )
        df = df.join(keys, on=key, how="left").filter(pl.col("sequence") > pl.col("_cdc_tomb"))
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
    for bit, spec in enumerate(contract.attributes):
        name = spec.name
        carries = ~_DELETE & ((pl.col("present_mask") & (1 << bit)) != 0)
        value = pl.col(name)
        if name in contract.soft_delete_values:  # a DELETE sets it (customers: DELETED)
            carries = carries | _DELETE
            deleted = pl.lit(contract.soft_delete_values[name])
            value = pl.when(_DELETE).then(deleted).otherwise(pl.col(name))
        aggs.append(value.filter(carries).last().alias(name))
        aggs.append(pl.col("sequence").filter(carries).last().alias(register(name)))

    folded = df.group_by(key).agg(aggs)
    is_deleted = pl.col("last_operation") == "DELETE"
    derived = [
        is_deleted.alias("is_deleted"),
        pl.when(is_deleted).then(pl.col("last_updated_at")).otherwise(None).alias("deleted_at"),
    ]
    if contract.derived_active is not None:
        column, active = contract.derived_active
        derived.append((~is_deleted & (pl.col(column).fill_null("") == active)).alias("is_active"))
    folded = folded.with_columns(derived)
    # keys whose every event fell below the tombstone keep a tombstone-only row
    out = keys.join(folded, on=key, how="left")
    return out.select(source_schema(contract).names)


def truncate_deletes(
    firsts: pl.DataFrame, truncates: pl.DataFrame, like: pl.DataFrame, keys: Sequence[str]
) -> pl.DataFrame:
    """The DELETEs that truncates apply (:mod:`cdcflow.plan.truncates`): one row per key of
    ``firsts`` and truncate whose sequence is above the key's ``_first``.

    Args:
        firsts: one row per key: the key columns and ``_first`` (its lowest sequence).
        truncates: one row per accepted truncate: ``event_id``, ``event_timestamp``, ``lsn``,
            ``sequence``.
        like: a fold-input frame whose columns and types the result takes (no values, present
            mask 0, operation ``DELETE``).
        keys: the key columns.

    Returns:
        Fold-input rows (``like``'s columns and types).
    """
    if firsts.height == 0 or truncates.height == 0:
        return like.clear()
    pairs = firsts.join(truncates.select(*TRUNCATE_COLUMNS), how="cross").filter(
        pl.col("sequence") > pl.col("_first")
    )
    constant = {"operation": "DELETE", "present_mask": 0}  # every other column: null

    def column(name: str, dtype: pl.DataType) -> pl.Expr:
        if name in keys or name in TRUNCATE_COLUMNS:
            return pl.col(name).cast(dtype)
        return pl.lit(constant.get(name)).cast(dtype).alias(name)

    return pairs.select([column(name, dtype) for name, dtype in like.schema.items()])


def with_truncates(
    events: pl.DataFrame, truncates: pl.DataFrame, keys: Sequence[str]
) -> pl.DataFrame:
    """``events`` plus the DELETE of every truncate above each key's lowest sequence in them
    (:func:`cdcflow.plan.truncates.expand_changes`, in columns); one row per key and event id.

    Args:
        events: fold input (see module doc).
        truncates: the table's accepted truncates (``event_id``, ``event_timestamp``, ``lsn``,
            ``sequence``); an empty frame returns ``events`` unchanged.
        keys: the key columns.
    """
    if truncates.height == 0 or events.height == 0:
        return events
    firsts = events.group_by(list(keys)).agg(pl.col("sequence").min().alias("_first"))
    added = truncate_deletes(firsts, truncates, events, keys)
    return pl.concat([events, added], how="vertical").unique(
        [*keys, "event_id"], keep="first", maintain_order=True
    )


def to_source_table(frame: pl.DataFrame, contract: TableContract = CUSTOMERS) -> pa.Table:
    """The folded frame as an Arrow table with exactly ``source_schema(contract)``."""
    schema = source_schema(contract)
    return frame.select(schema.names).to_arrow().cast(schema)


def change_frame(events: Sequence[ChangeEvent], contract: TableContract) -> pl.DataFrame:
    """The fold input of a contract's table from typed events (one row per event).

    Args:
        events: accepted first copies of the contract's table.
        contract: the table's contract.

    Returns:
        Columns: the key columns and non-key columns (typed as in Bronze; a non-key column is
        null when absent), ``event_id``, ``operation``, ``event_timestamp``, ``present_mask``
        (bit i = the i-th non-key column is present), ``lsn``, ``sequence``.
    """
    bronze = contract_tables(contract).bronze.schema
    attributes = [c.name for c in contract.attributes]
    columns: dict[str, list[Any]] = {name: [] for name in (*contract.keys, *attributes)}
    for event in events:
        for name, value in zip(contract.keys, event.key, strict=True):
            columns[name].append(value)
        for name in attributes:
            columns[name].append(event.values.get(name))
    masks = [sum(1 << i for i, name in enumerate(attributes) if name in e.values) for e in events]
    table = pa.table(
        {
            **{name: pa.array(values, bronze.field(name).type) for name, values in columns.items()},
            "event_id": pa.array([e.event_id for e in events], pa.string()),
            "operation": pa.array([e.operation.value for e in events], pa.string()),
            "event_timestamp": pa.array([e.event_timestamp for e in events], TS),
            "present_mask": pa.array(masks, bronze.field("present_mask").type),
            "lsn": pa.array([e.lsn for e in events], pa.string()),
            "sequence": pa.array([e.sequence for e in events], pa.string()),
        }
    )
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame
