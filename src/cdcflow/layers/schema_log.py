"""Schema evolution and the drift stop of declared tables: ``audit/schema_log``.

Each declared table's tables are built for one contract. ``audit/schema_log`` records which
(one row per change: ``table_name``, ``version`` — the contract's ``version`` —, ``change``,
``contract`` — the contract as canonical JSON —, ``applied_at`` UTC); the latest row of a table
is the contract its Delta tables hold. When a run starts, each declared contract is compared
with that row (:func:`contract_changes`):

* **compatible** changes are applied and recorded: a new *nullable* column is added to Bronze,
  Silver (with its sequence register) and the history by a Delta schema change (old rows read
  null); a change of constraints, PII flags, patterns or the envelope fields only changes
  validation from the next micro-batch on;
* ``unknown_fields: evolve``: a top-level event field the contract does not know becomes a
  nullable column of the type its values in the micro-batch suggest (:func:`infer_type`),
  added like a declared one before the micro-batch is written and recorded as ``evolved
  column <name> (<type>) from an event field``; later runs keep it (:func:`evolved_columns`)
  even though the config does not declare it (declaring it later is no change). Its type is
  then fixed: a later value that does not fit it is ``SCHEMA_MISMATCH``. A field that cannot
  be a column (not an identifier, or a system column's name) stays in the raw payload only;
* **incompatible** changes stop the run before anything is written, in one line naming the
  table, the column and the change (:class:`SchemaDriftError`): a key column changed (name,
  order or type), a column's type changed, a declared column removed, a new column that is not
  nullable, a changed delete mode, a moved Delta table (a changed path under ``tables:``: the
  tables built so far would be left behind and the table restart empty). The run stays stopped
  until the contract is restored or the operator runs ``cdcflow schema accept --table T``,
  which moves the table's Delta tables aside (to ``_retired/<table>/v<version>-<UTC time>/``
  under ``storage.root``, nothing deleted) and records the new contract: the next run starts
  the table afresh under it.

The anchors: dlt schema contracts (evolve / freeze), Flink CDC ``schema.change.behavior``, and
the reference submissions' stop-the-line on incompatible drift.

**Type widening** of a non-key column is compatible (:func:`widens`: every stored value is
representable in the new type, unchanged): ``integer`` → ``decimal(p,s)`` with ``p - s >= 19``
(a 64-bit integer fits), ``decimal(p,s)`` → ``decimal(p',s')`` with ``s' >= s`` and
``p' - s' >= p - s`` (Delta Lake's type-widening rules for decimals). delta-rs has no
``ALTER COLUMN TYPE``: each of the table's Delta tables holding the column is rewritten once
with the column cast (a new table version; earlier versions keep the old type). A rewrite
interrupted by a crash is done again by the next run (the change is recorded after every
table), and a table already holding the new type is not rewritten again. Narrowing and any
other type change stay incompatible.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdcflow.engines.local.delta import read_arrow
from cdcflow.errors import ConfigError
from cdcflow.layers.contract_tables import arrow_type, contract_tables, mask_type
from cdcflow.layers.tables import TS, TableSpec, register
from cdcflow.model.contracts import ColumnSpec, TableContract, parse_type

SCHEMA_LOG = TableSpec(
    "audit/schema_log",
    pa.schema(
        [
            pa.field("table_name", pa.string(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("change", pa.string(), nullable=False),
            pa.field("contract", pa.string(), nullable=False),
            pa.field("applied_at", TS, nullable=False),
        ]
    ),
)


class SchemaDriftError(ConfigError):
    """A declared table's contract changed incompatibly with the tables built for it."""


@dataclass(frozen=True)
class Change:
    """One difference between the recorded contract of a table and its declared one.

    Attributes:
        text: what changed, naming the column (e.g. ``added column loyalty_tier (string)``).
        compatible: True when it is applied by itself (module doc).
        added: the column added (compatible additions only), else None.
        widened: the column whose type is widened (compatible widenings only), else None.
    """

    text: str
    compatible: bool
    added: str | None = None
    widened: str | None = None


def contract_json(contract: TableContract) -> str:
    """The contract as canonical JSON (sorted keys): what ``audit/schema_log`` records.

    ``format`` and ``truncate`` are left out at their defaults, so a contract recorded before
    they existed reads as unchanged.
    """
    data = contract.model_dump(mode="json")
    for name, default in (("format", None), ("truncate", "quarantine")):
        if data.get(name) == default:
            data.pop(name, None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def widens(old: str, new: str) -> bool:
    """Whether column type ``new`` holds every value of ``old`` unchanged (module doc).

    Args:
        old / new: contract column types (``integer``, ``decimal(p,s)``, …).

    Returns:
        True for integer → decimal(p,s) with p - s >= 19, and decimal(p,s) → decimal(p',s')
        with s' >= s and p' - s' >= p - s (other than the same type).
    """
    old_kind, old_p, old_s = parse_type(old)
    new_kind, new_p, new_s = parse_type(new)
    if new_kind != "decimal" or (old_kind, old_p, old_s) == (new_kind, new_p, new_s):
        return False
    if old_kind == "integer":
        return new_p - new_s >= 19
    return old_kind == "decimal" and new_s >= old_s and new_p - new_s >= old_p - old_s


def contract_changes(old: TableContract, new: TableContract) -> list[Change]:
    """The changes from the recorded contract ``old`` to the declared ``new`` (module doc).

    Returns:
        The changes, incompatible ones first; empty when the contracts are equal.
    """
    changes: list[Change] = []
    old_keys = [(k, old.column(k).type) for k in old.keys]
    new_keys = [(k, new.column(k).type) for k in new.keys]
    if old_keys != new_keys:
        shown = lambda keys: ", ".join(f"{k} {t}" for k, t in keys)  # noqa: E731
        changes.append(
            Change(f"key columns changed from ({shown(old_keys)}) to ({shown(new_keys)})", False)
        )
    new_columns = {c.name: c for c in new.columns}
    old_columns = {c.name: c for c in old.columns}
    for name, spec in old_columns.items():
        if name not in new_columns:
            changes.append(Change(f"column {name} removed from the contract", False))
        elif new_columns[name].type != spec.type and name not in new.keys:
            new_type = new_columns[name].type
            if widens(spec.type, new_type):
                text = f"widened column {name} from {spec.type} to {new_type}"
                changes.append(Change(text, True, widened=name))
            else:
                changes.append(
                    Change(f"column {name} changed type from {spec.type} to {new_type}", False)
                )
    if old.delete_mode != new.delete_mode:
        changes.append(
            Change(f"delete_mode changed from {old.delete_mode} to {new.delete_mode}", False)
        )
    for name, spec in new_columns.items():
        if name in old_columns or name in new.keys:
            continue
        if spec.nullable:
            changes.append(Change(f"added column {name} ({spec.type})", True, added=name))
        else:
            changes.append(Change(f"added column {name} is not nullable", False))
    moved = [
        f"{kind} from {before} to {after}"
        for kind, before, after in _table_paths(old, new)
        if before != after
    ]
    if moved:
        changes.append(
            Change(
                f"Delta table paths changed ({'; '.join(moved)}), leaving the tables built so "
                "far behind",
                False,
            )
        )
    if mask_type(old) == pa.int32() != mask_type(new):  # Bronze's mask keeps its first width
        changes.append(
            Change(
                f"non-key columns grow from {len(old.attributes)} to {len(new.attributes)}, past "
                "31: Bronze's present_mask is a 32-bit integer (declare the table anew)",
                False,
            )
        )
    if not changes and contract_json(old) != contract_json(new):
        changes.append(Change("constraints or envelope fields changed", True))
    return sorted(changes, key=lambda change: change.compatible)


def _table_paths(old: TableContract, new: TableContract) -> list[tuple[str, str, str]]:
    """(kind, old path, new path) of each Delta table of the two contracts (the Snowflake
    table is not a Delta table: a new name is only a new sync target)."""
    before, after = old.table_names, new.table_names
    pairs = [
        (kind, getattr(before, kind), getattr(after, kind))
        for kind in ("bronze", "quarantine", "silver", "history", "tombstones")
    ]
    return [*pairs, ("outcomes", old.outcomes_table, new.outcomes_table)]


#: The ``change`` text of a column added from an event field (``unknown_fields: evolve``).
EVOLVED = "evolved column"


def infer_type(values: list[Any]) -> str:
    """The column type of an event field first seen in a micro-batch (``unknown_fields:
    evolve``), from its non-null parsed JSON values.

    Returns:
        ``json`` when any value is an object or array; ``boolean`` when all are booleans;
        ``integer`` when all are integers; ``double`` when all are numbers; else ``string``
        (numbers then keep their JSON text), also when every value is null: the column exists
        from the field's first appearance, so no event's value of it is ever skipped (a later
        number then keeps its JSON text).
    """
    present = [v for v in values if v is not None]
    if not present:
        return "string"
    if any(isinstance(v, dict | list) for v in present):
        return "json"
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "integer"
    numbers = all(
        (isinstance(v, int | float) and not isinstance(v, bool)) or type(v).__name__ == "JsonNumber"
        for v in present
    )
    return "double" if numbers else "string"


def evolved_columns(log_table: DeltaTable) -> dict[str, list[ColumnSpec]]:
    """Table name → the columns added from event fields (``EVOLVED`` rows of the log), as the
    table's latest recorded contract declares them, in the order they were added."""
    rows = read_arrow(log_table, columns=["table_name", "change", "applied_at"]).to_pylist()
    recorded = recorded_contracts(log_table)
    out: dict[str, list[ColumnSpec]] = {}
    for row in sorted(rows, key=lambda r: r["applied_at"]):
        if not row["change"].startswith(EVOLVED + " "):
            continue
        name = row["change"].split()[2]
        contract = recorded.get(row["table_name"])
        if contract is None or name not in {c.name for c in contract.columns}:
            continue
        columns = out.setdefault(row["table_name"], [])
        if name not in {c.name for c in columns}:
            columns.append(contract.column(name))
    return out


def with_columns(contract: TableContract, columns: list[ColumnSpec]) -> TableContract:
    """``contract`` with ``columns`` appended (those it does not declare already)."""
    declared = {c.name for c in contract.columns}
    extra = tuple(c for c in columns if c.name not in declared)
    if not extra:
        return contract
    return contract.model_copy(update={"columns": (*contract.columns, *extra)})


def reserved_names(contract: TableContract) -> set[str]:
    """Column names a field cannot be evolved into: the key and system columns of the table's
    Bronze, Silver and history (``batch_id``, ``is_deleted``, ``_cdc_seq``…)."""
    tables = contract_tables(contract)
    names = {*tables.bronze.schema.names, *tables.silver.schema.names}
    names |= set(tables.history.schema.names)
    return (names - {c.name for c in contract.attributes}) | {"_cdc_"}


def widened_tables(contract: TableContract, column: str) -> list[str]:
    """The Delta tables (paths under ``storage.root``) holding a non-key column: Bronze,
    Silver and the history."""
    tables = contract_tables(contract)
    return [tables.bronze.name, tables.silver.name, tables.history.name]


def widen_column(table: DeltaTable, column: str, target: pa.DataType) -> bool:
    """Rewrite a Delta table with ``column`` cast to the wider ``target`` type (module doc).

    Args:
        table: the table (its partitioning and properties are kept).
        column: the column to widen.
        target: the new Arrow type (every stored value is representable in it).

    Returns:
        True when the table was rewritten; False when it already holds ``target`` (or has no
        such column).
    """
    schema = table.schema().to_arrow()
    arrow_schema = pa.schema(schema)  # arro3 → pyarrow
    if column not in arrow_schema.names or arrow_schema.field(column).type == target:
        return False
    data = read_arrow(table)
    index = data.schema.get_field_index(column)
    cast = data.column(index).cast(target)
    data = data.set_column(index, data.schema.field(index).with_type(target), cast)
    write_deltalake(
        table,
        data,
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=table.metadata().partition_columns or None,
    )
    return True


def drift_message(contract: TableContract, changes: list[Change], config_file: str) -> str:
    """The one line of a stopped run (names the table, the column and the change)."""
    incompatible = "; ".join(c.text for c in changes if not c.compatible)
    return (
        f"table {contract.name}: {incompatible}: incompatible with its Delta tables, the run "
        f"is stopped; restore the contract, or run `cdcflow schema accept --config "
        f"{config_file} --table {contract.name}` to start the table afresh under it (its "
        "tables are moved aside, nothing is deleted)"
    )


def added_fields(contract: TableContract, column: str) -> dict[str, list[pa.Field]]:
    """Table name → the fields to add for a new nullable column: Bronze and history (the
    column), Silver (the column and its sequence register)."""
    tables = contract_tables(contract)
    field = pa.field(column, arrow_type(contract.column(column).type), nullable=True)
    return {
        tables.bronze.name: [field],
        tables.silver.name: [field, pa.field(register(column), pa.string(), nullable=True)],
        tables.history.name: [field],
    }


def retire(root: Path, contract: TableContract, old: TableContract, now: datetime) -> Path:
    """Move the Delta tables built for ``old`` under ``_retired/<table>/v<version>-<time>/``.

    Args:
        root: the local ``storage.root``.
        contract: the declared (new) contract: its table paths are moved too, when they exist.
        old: the recorded contract.
        now: the acceptance time (UTC), in the folder's name.

    Returns:
        The folder the tables were moved to.

    Raises:
        ConfigError: ``storage.root`` is not a local folder.
    """
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    target = root / "_retired" / old.name / f"v{old.version}-{stamp}"
    names = {old.table_names, contract.table_names}
    for tables in names:
        for path in (
            tables.bronze,
            tables.quarantine,
            tables.silver,
            tables.tombstones,
            tables.history,
            tables.outcomes or f"audit/{old.name}_event_outcomes",
        ):
            source = root / path
            if source.exists():
                destination = target / path
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(source), str(destination))
    return target


def recorded_contracts(log_table: DeltaTable) -> dict[str, TableContract]:
    """Table name → the contract its Delta tables hold: the latest ``audit/schema_log`` row."""
    rows = read_arrow(log_table, columns=["table_name", "contract", "applied_at"]).to_pylist()
    latest: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r["applied_at"]):
        latest[row["table_name"]] = row
    return {
        name: TableContract.model_validate_json(row["contract"]) for name, row in latest.items()
    }


@dataclass(frozen=True)
class Acceptance:
    """What ``cdcflow schema accept`` did for one table.

    Attributes:
        table: the table's name.
        changes: the changes acknowledged (empty: nothing to accept).
        retired_to: where the earlier Delta tables were moved, or None when nothing moved.
    """

    table: str
    changes: tuple[str, ...]
    retired_to: Path | None


def accept(log_table: DeltaTable, root: str, declared: TableContract, now: datetime) -> Acceptance:
    """Acknowledge an incompatible contract change of one table (module doc).

    Args:
        log_table: ``audit/schema_log``.
        root: ``storage.root`` (a local folder).
        declared: the table's contract in the config.
        now: the acceptance time (UTC).

    Returns:
        The acceptance; ``changes`` is empty when the recorded contract has no incompatible
        change (compatible ones are applied by the next run), and nothing is written then.

    Raises:
        ConfigError: ``storage.root`` is an object store (tables are moved on a local disk).
    """
    old = recorded_contracts(log_table).get(declared.name)
    if old is None:
        return Acceptance(declared.name, (), None)
    incompatible = tuple(c.text for c in contract_changes(old, declared) if not c.compatible)
    if not incompatible:
        return Acceptance(declared.name, (), None)
    if "://" in root:
        raise ConfigError(
            f"storage.root: schema accept moves a table's Delta tables aside on a local disk; "
            f"{root} is an object store"
        )
    target = retire(Path(root), declared, old, now)
    row = {
        "table_name": declared.name,
        "version": declared.version,
        "change": f"accepted: {'; '.join(incompatible)}; earlier tables moved to {target}",
        "contract": contract_json(declared),
        "applied_at": now,
    }
    write_deltalake(log_table, pa.Table.from_pylist([row], schema=SCHEMA_LOG.schema), mode="append")
    return Acceptance(declared.name, incompatible, target)


def utc_now() -> datetime:
    """The current UTC time (a function so that tests may fix it)."""
    return datetime.now(UTC)


__all__ = [
    "EVOLVED",
    "SCHEMA_LOG",
    "Acceptance",
    "Change",
    "SchemaDriftError",
    "accept",
    "added_fields",
    "contract_changes",
    "contract_json",
    "drift_message",
    "evolved_columns",
    "infer_type",
    "recorded_contracts",
    "reserved_names",
    "retire",
    "widen_column",
    "widened_tables",
    "widens",
    "with_columns",
]
