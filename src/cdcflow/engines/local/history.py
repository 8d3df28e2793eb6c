"""Polars / delta-rs rendering of ``silver/customer_history`` and of every declared table's
history (SCD2), from the table's contract.

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
from typing import Any

import polars as pl
from deltalake import DeltaTable

from cdcflow.engines.local.delta import commit_props, read_where_in, txn_done
from cdcflow.layers.contract_tables import contract_tables
from cdcflow.model.contracts import CUSTOMERS, TableContract, coerce
from cdcflow.plan.reference import DeleteMode

_DELETE = pl.col("operation") == "DELETE"
_FLAG = "_cdc_delete"


def history_frame(
    events: pl.DataFrame, mode: DeleteMode, contract: TableContract = CUSTOMERS
) -> pl.DataFrame:
    """Timeline of every key in ``events``: one row per event (version).

    Args:
        events: every accepted first-copy event of the keys (Bronze columns: the key columns,
            event_id, operation, event_timestamp, the contract's non-key columns, present_mask,
            lsn, sequence), any order.
        mode: ``soft`` or ``hard`` delete mode.
        contract: the table's contract (default: the shipped customers contract): its keys,
            non-key columns (``present_mask`` bit i = the i-th), ``soft_delete_values`` and
            ``derived_active``.

    Returns:
        One row per (key, sequence) with the history table's columns, sorted by key, sequence.
    """
    keys = list(contract.keys)
    schema = contract_tables(contract).history.schema
    df = events.sort(*keys, "sequence").with_row_index("_i")
    if mode == "hard":
        # a hard DELETE ends the row: later events start a fresh one (segment = DELETEs before)
        dels = _DELETE.cast(pl.Int32)
        df = df.with_columns((dels.cum_sum().over(keys) - dels).alias("_seg"))
        group = [*keys, "_seg"]
    else:
        df = df.with_columns(pl.lit(0, pl.Int32).alias("_seg"))
        group = keys

    # each column = the value of the latest carrier (an INSERT/UPDATE holding it) so far; in
    # soft mode a DELETE carries the soft-delete values (customers: status DELETED)
    specs = contract.attributes
    on_delete = {
        name: pl.lit(coerce(value, contract.column(name).type), df.schema[name])
        for name, value in contract.soft_delete_values.items()
    }
    carriers = []
    for bit, spec in enumerate(specs):
        carrier = ((pl.col("present_mask") & (1 << bit)) != 0) & ~_DELETE
        if spec.name in on_delete and mode == "soft":
            carrier = carrier | _DELETE
        carriers.append(
            pl.when(carrier).then(pl.col("_i")).forward_fill().over(group).alias(f"_at_{spec.name}")
        )
    df = df.with_columns(
        *(pl.when(_DELETE).then(v).otherwise(pl.col(n)).alias(n) for n, v in on_delete.items()),
        *carriers,
    )
    images = []
    for spec in specs:
        value = pl.col(spec.name).gather(pl.col(f"_at_{spec.name}"))
        if mode == "hard":
            value = pl.when(_DELETE).then(None).otherwise(value)
            if spec.name in on_delete:
                value = pl.when(_DELETE).then(on_delete[spec.name]).otherwise(value)
        images.append(value.alias(spec.name))
    df = df.with_columns(images)

    created = pl.col("event_timestamp").first().over(group)
    if mode == "hard":
        created = pl.when(_DELETE).then(None).otherwise(created)
    last = pl.col("_i") == pl.col("_i").max().over(keys)
    derived = []
    if contract.derived_active is not None:
        column, active = contract.derived_active
        derived.append((~_DELETE & (pl.col(column) == active).fill_null(False)).alias("is_active"))
    df = df.with_columns(
        _DELETE.alias("is_deleted"),
        *derived,
        created.alias("created_at"),
        pl.col("event_timestamp").alias("last_updated_at"),
        pl.when(_DELETE).then(pl.col("event_timestamp")).alias("deleted_at"),
        pl.col("event_id").alias("last_event_id"),
        pl.col("operation").alias("last_operation"),
        pl.col("lsn").alias("last_lsn"),
        pl.col("event_timestamp").alias("valid_from"),
        pl.when(~last).then(pl.col("event_timestamp").shift(-1).over(keys)).alias("valid_to"),
        last.alias("is_current"),
    )
    return df.select([pl.col(f.name) for f in schema]).with_columns(
        pl.col("created_at", "deleted_at", "valid_to").cast(pl.Datetime("us", "UTC"))
    )


def merge_history(
    table: DeltaTable,
    load_events: Callable[[], pl.DataFrame],
    keys: Sequence[Any],
    mode: DeleteMode,
    app_id: str,
    batch_id: int,
    contract: TableContract = CUSTOMERS,
    load_stored: Callable[[Sequence[str]], pl.DataFrame] | None = None,
) -> int:
    """Replace the history of ``keys`` by their recomputed timeline (one guarded MERGE).

    Args:
        table: the history table (``silver/customer_history`` for customers).
        load_events: returns every first-copy Bronze event of ``keys`` up to this batch.
        keys: the keys touched by the micro-batch (customer_ids; any non-empty sequence for a
            declared table, whose rows ``load_stored`` reads).
        mode: delete mode.
        app_id: Delta app-transaction id of the pipeline.
        batch_id: micro-batch id (app-transaction version).
        contract: the table's contract (default: customers).
        load_stored: columns → the stored history rows of ``keys`` (default: by customer_id).

    Returns:
        Number of history rows inserted, updated or deleted (0 when skipped).
    """
    if not keys or txn_done(table, app_id, batch_id):
        return 0
    names = contract_tables(contract).history.schema.names
    fresh = history_frame(load_events(), mode, contract)
    if load_stored is None:
        stored = read_where_in(table, "customer_id", keys, names)
    else:
        stored = load_stored(names)
    on = [*contract.keys, "sequence"]
    changed = fresh.join(stored, on=names, how="anti", nulls_equal=True)
    gone = stored.join(fresh, on=on, how="anti")
    if changed.height == 0 and gone.height == 0:
        return 0
    source = pl.concat(
        [
            changed.with_columns(pl.lit(False).alias(_FLAG)),
            gone.with_columns(pl.lit(True).alias(_FLAG)),
        ]
    )
    columns = {name: f"s.{name}" for name in names}
    (
        table.merge(
            source.to_arrow(),
            predicate=" AND ".join(f"t.{name} = s.{name}" for name in on),
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
