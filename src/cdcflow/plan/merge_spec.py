"""The sequence-guarded Silver MERGE, as SQL expression strings (target ``t``, source ``s``).

The source holds one row per customer_id — the micro-batch folded in sequence order
(:mod:`cdcflow.plan.fold`) — with the same columns as Silver plus ``_cdc_tomb``: the sequence of
the latest hard-mode tombstone known for the key ('' when none; always '' in soft mode). Its
sequence registers are already filtered to sequences above ``_cdc_tomb``; a source row whose
``_cdc_seq`` is NULL only carries a tombstone.

Every clause is gated on sequences, never on arrival:

1. ``DELETE`` when the whole target row is older than the tombstone and the source brings no
   newer event (hard mode).
2. ``UPDATE`` when the source has something newer: each attribute takes the source value when the
   source register is higher, keeps the target value when its register is still above the
   tombstone, else NULL; row-level columns (``last_*``, ``is_deleted``, ``deleted_at``) follow
   the higher row sequence; ``created_at`` follows the lower minimum sequence.
3. ``INSERT`` when the key is new and the source brings an event.

The expressions use only ``CASE``, ``COALESCE``, comparisons and boolean logic, so both delta-rs
(DataFusion SQL) and Spark SQL accept them. Sequences compare as strings (see
:mod:`cdcflow.model.events`); '' is below every sequence and '~' above.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdcflow.layers.tables import register
from cdcflow.model.contracts import CUSTOMERS, TableContract

TARGET = "t"
SOURCE = "s"
_ROW_LEVEL = (
    "is_deleted",
    "deleted_at",
    "last_updated_at",
    "last_event_id",
    "last_operation",
    "last_lsn",
    "_cdc_seq",
)


@dataclass(frozen=True)
class MergeSpec:
    """The Silver MERGE as SQL strings.

    Attributes:
        on: the join predicate (strictly on customer_id).
        delete_when: predicate of the WHEN MATCHED THEN DELETE clause.
        update_when: predicate of the WHEN MATCHED THEN UPDATE clause.
        update_set: column → SQL expression of the UPDATE clause.
        insert_when: predicate of the WHEN NOT MATCHED THEN INSERT clause.
        insert_values: column → SQL expression of the INSERT clause.
    """

    on: str
    delete_when: str
    update_when: str
    update_set: dict[str, str]
    insert_when: str
    insert_values: dict[str, str]


def _attr_value(name: str) -> tuple[str, str]:
    reg = register(name)
    s_newer = f"COALESCE(s.{reg}, '') > COALESCE(t.{reg}, '')"
    t_alive = f"COALESCE(t.{reg}, '') > s._cdc_tomb"
    value = f"CASE WHEN {s_newer} THEN s.{name} WHEN {t_alive} THEN t.{name} ELSE NULL END"
    reg_value = f"CASE WHEN {s_newer} THEN s.{reg} WHEN {t_alive} THEN t.{reg} ELSE NULL END"
    return value, reg_value


def silver_merge_spec(silver_columns: list[str], contract: TableContract = CUSTOMERS) -> MergeSpec:
    """Build the MERGE for the given Silver columns (public + ``_cdc_`` registers).

    Args:
        silver_columns: the Silver table's columns.
        contract: the table's contract (default: customers): the ON predicate joins on all its
            key columns; every non-key column has its register; ``is_active`` is derived when
            the contract declares ``derived_active``.

    Raises:
        ValueError: a Silver column the spec does not cover.
    """
    attributes = [c.name for c in contract.attributes]
    update: dict[str, str] = {}
    for name in attributes:
        update[name], update[register(name)] = _attr_value(name)
    s_row_newer = "COALESCE(s._cdc_seq, '') > t._cdc_seq"
    for name in _ROW_LEVEL:
        update[name] = f"CASE WHEN {s_row_newer} THEN s.{name} ELSE t.{name} END"
    s_min_wins = (
        "(t._cdc_min_seq <= s._cdc_tomb OR "
        "(s._cdc_min_seq IS NOT NULL AND s._cdc_min_seq < t._cdc_min_seq))"
    )
    for name in ("created_at", "_cdc_min_seq"):
        update[name] = f"CASE WHEN {s_min_wins} THEN s.{name} ELSE t.{name} END"
    if contract.derived_active is not None:
        column, value = contract.derived_active
        update["is_active"] = (
            f"CASE WHEN ({update['is_deleted']}) = false "
            f"AND COALESCE(({update[column]}), '') = '{value}' THEN true ELSE false END"
        )
    missing = set(silver_columns) - set(update) - set(contract.keys)
    if missing:  # pragma: no cover - guards schema drift between layers and plan
        raise ValueError(f"MERGE spec does not cover Silver columns {sorted(missing)}")

    # a table of keys only (a link table) has no column registers to compare
    update_when = " OR ".join(
        [
            s_row_newer,
            "COALESCE(s._cdc_min_seq, '~') < t._cdc_min_seq",
            "t._cdc_min_seq <= s._cdc_tomb",
            *(f"COALESCE(s.{register(n)}, '') > COALESCE(t.{register(n)}, '')" for n in attributes),
        ]
    )
    return MergeSpec(
        on=key_predicate(contract),
        delete_when="t._cdc_seq <= s._cdc_tomb AND s._cdc_seq IS NULL",
        update_when=update_when,
        update_set=update,
        insert_when="s._cdc_seq IS NOT NULL",
        insert_values={name: f"s.{name}" for name in silver_columns},
    )


def key_predicate(contract: TableContract = CUSTOMERS) -> str:
    """The MERGE's ON predicate: every key column equal (``t.k = s.k AND ...``)."""
    return " AND ".join(f"t.{key} = s.{key}" for key in contract.keys)


TOMBSTONE_MERGE_ON = key_predicate(CUSTOMERS)
TOMBSTONE_UPDATE_WHEN = "s._cdc_seq > t._cdc_seq"
