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

import polars as pl
from deltalake import DeltaTable

from cdcflow.engines.local.delta import commit_props, txn_done
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


def _continued(
    new: pl.DataFrame, base: pl.DataFrame, mode: DeleteMode, contract: TableContract
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The versions of keys whose new events all follow their stored versions.

    Each key's timeline continues from its stored current version (``base``): the events are
    folded on top of that image, as if it were one event carrying every column, dated at the
    row's ``created_at`` (so ``created_at`` carries on). In hard mode a stored DELETE version
    ended the row, and the new events start a fresh one.

    Args:
        new: the keys' new first-copy events (Bronze fold columns).
        base: the keys' stored current versions (history columns); a key without one is new.
        mode: delete mode.
        contract: the table's contract.

    Returns:
        (the new versions; the base versions with ``valid_to`` and ``is_current`` closed).
    """
    keys = list(contract.keys)
    carry = base
    if mode == "hard":
        carry = carry.filter(pl.col("operation") != "DELETE")
    all_bits = (1 << len(contract.attributes)) - 1
    pseudo = carry.select(
        *keys,
        pl.col("event_id"),
        pl.lit("UPDATE").alias("operation"),
        pl.col("created_at").alias("event_timestamp"),
        *(pl.col(c.name) for c in contract.attributes),
        pl.lit(all_bits).cast(new.schema["present_mask"]).alias("present_mask"),
        pl.col("lsn"),
        pl.col("sequence"),
    )
    events = pl.concat([pseudo, new.select(pseudo.columns)], how="vertical_relaxed")
    timeline = history_frame(events, mode, contract)
    marks = base.select(*keys, "sequence")
    fresh = timeline.join(marks, on=[*keys, "sequence"], how="anti")
    closed_at = timeline.join(marks, on=[*keys, "sequence"], how="semi").select(
        *keys, pl.col("valid_to").alias("_closed")
    )
    # a hard-mode DELETE base is not carried: it closes at the first new version in sequence
    # order (not the earliest valid_from: event times need not follow the sequence)
    first_new = fresh.group_by(keys).agg(
        pl.col("valid_from").sort_by("sequence").first().alias("_first")
    )
    closed = (
        base.join(closed_at, on=keys, how="left")
        .join(first_new, on=keys, how="left")
        .with_columns(
            pl.coalesce("_closed", "_first").alias("valid_to"), pl.lit(False).alias("is_current")
        )
        .drop("_closed", "_first")
        .select(timeline.columns)
    )
    return fresh, closed


def merge_history(
    table: DeltaTable,
    load_events: Callable[[pl.DataFrame], pl.DataFrame],
    keys: pl.DataFrame,
    mode: DeleteMode,
    app_id: str,
    batch_id: int,
    load_stored: Callable[[Sequence[str]], pl.DataFrame],
    new_events: pl.DataFrame,
    contract: TableContract = CUSTOMERS,
) -> int:
    """Bring the history of ``keys`` up to date with the batch (one guarded MERGE).

    Incremental: a key whose new events all follow its stored versions (the common case)
    continues from its stored current version (:func:`_continued`), without reading Bronze;
    only a key an event lands *inside* of (a late event) has its timeline recomputed from its
    Bronze events (``load_events``), as the full recomputation does.

    Args:
        table: the history table (``silver/customer_history`` for customers).
        load_events: a frame of keys → every first-copy Bronze event of those keys up to this
            batch (Bronze fold columns).
        keys: the keys the micro-batch touched (the contract's key columns, one row per key).
        mode: delete mode.
        app_id: Delta app-transaction id of the pipeline.
        batch_id: micro-batch id (app-transaction version).
        load_stored: columns → the stored history rows of ``keys``.
        new_events: the batch's first-copy events of ``keys`` (Bronze fold columns).
        contract: the table's contract (default: customers).

    Returns:
        Number of history rows inserted, updated or deleted (0 when skipped).
    """
    if keys.height == 0 or txn_done(table, app_id, batch_id):
        return 0
    key_names = list(contract.keys)
    names = contract_tables(contract).history.schema.names
    stored = load_stored(names)
    first = new_events.group_by(key_names).agg(pl.col("sequence").min().alias("_first"))
    last = stored.group_by(key_names).agg(pl.col("sequence").max().alias("_last"))
    late = first.join(last, on=key_names).filter(pl.col("_last") >= pl.col("_first"))
    late = late.select(key_names)
    on = [*key_names, "sequence"]
    parts: list[pl.DataFrame] = []
    if late.height:  # an event inside a timeline: recompute the key's timeline from Bronze
        late_stored = stored.join(late, on=key_names, how="semi")
        recomputed = history_frame(load_events(late), mode, contract)
        changed = recomputed.join(late_stored, on=names, how="anti", nulls_equal=True)
        gone = late_stored.join(recomputed, on=on, how="anti")
        parts += [
            changed.with_columns(pl.lit(False).alias(_FLAG)),
            gone.with_columns(pl.lit(True).alias(_FLAG)),
        ]
    ahead = new_events.join(late, on=key_names, how="anti")
    if ahead.height:
        base = stored.filter(pl.col("is_current")).join(
            ahead.select(key_names), on=key_names, how="semi"
        )
        fresh, closed = _continued(ahead, base, mode, contract)
        parts += [
            fresh.with_columns(pl.lit(False).alias(_FLAG)),
            closed.with_columns(pl.lit(False).alias(_FLAG)),
        ]
    source = pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame()
    if source.height == 0:
        return 0
    columns = {name: f"s.{name}" for name in names}
    (
        table.merge(
            source.select(*names, _FLAG).to_arrow(),
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
