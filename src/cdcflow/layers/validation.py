"""Validation parity: re-check Silver against its table contract (``cdcflow validate``).

Ingestion quarantines a record that breaks its contract, so a Silver that came from cdcflow
alone holds none; this re-check proves it downstream ("validation parity" with the source's own
constraints) and catches what ingestion cannot see: a table written or edited by another tool,
a contract tightened after the data arrived, a foreign key whose referenced row never came.

Rules, per table (one row per key in Silver):

* ``KEY_NULL`` / ``KEY_DUPLICATE``: every key column is non-null; no two rows share a key
  (all rows, deleted ones too).
* ``KEY_PATTERN``: a key column with a ``key_patterns`` entry fully matches it (RE2).
* ``NOT_NULL``, ``ALLOWED_VALUES``, ``PATTERN``, ``MINIMUM``, ``MAXIMUM``: the column's
  constraints (:class:`cdcflow.model.contracts.ColumnSpec`), on live rows (``is_deleted``
  false; a soft-deleted row keeps its last values but is no longer the source's row). A null
  that no event has set is not a ``NOT_NULL`` violation: a key first seen in a partial UPDATE
  (its INSERT late, or from before the capture began) has its other columns unknown, not null
  (shared/SEMANTICS.md point 3); when Silver holds the column's sequence register
  (``_cdc_seq_<column>``), only a null whose register is set breaks the rule (a table edited
  by another tool, a contract tightened after the data arrived).
* ``FOREIGN_KEY``: a column with ``references: <table>.<column>``: every live row's non-null
  value is a live key of that table.

A violation names the table, the column, the rule and how many rows break it, with up to five
example keys — never a value of a column the contract marks PII (an example key of a PII key
column is left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from cdcflow.layers.tables import register
from cdcflow.model.contracts import (
    CONSTRAINT_RULES,
    ColumnSpec,
    TableContract,
    compile_re2,
    constraint_violations,
)

#: How many example keys a violation carries.
EXAMPLES = 5


@dataclass(frozen=True)
class Violation:
    """Rows of one table breaking one rule of one column.

    Attributes:
        table: the contract's table name.
        column: the column checked (a key column for the ``KEY_*`` rules).
        rule: one of the module's rule names.
        rows: how many rows break it (for ``KEY_DUPLICATE``: the rows sharing a key).
        detail: the rule in words (never a value).
        examples: up to :data:`EXAMPLES` keys of breaking rows (``"k1|k2"`` for a composite
            key); empty when a key column is PII.
    """

    table: str
    column: str
    rule: str
    rows: int
    detail: str
    examples: tuple[str, ...] = ()


@dataclass
class ValidationReport:
    """The outcome of :func:`validate_silver` over one or more tables.

    Attributes:
        tables: table name → (rows, live rows) checked.
        violations: every rule broken, in table, column, rule order.
    """

    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no rule is broken."""
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        """JSON form: ``ok``, ``tables`` (rows, live_rows) and ``violations``."""
        return {
            "ok": self.ok,
            "tables": {
                name: {"rows": rows, "live_rows": live}
                for name, (rows, live) in self.tables.items()
            },
            "violations": [{**asdict(v), "examples": list(v.examples)} for v in self.violations],
        }


def _key_text(contract: TableContract) -> pl.Expr:
    return pl.concat_str([pl.col(k).cast(pl.String) for k in contract.keys], separator="|")


def _re2_misses(values: pl.Series, pattern: str) -> set[Any]:
    """The distinct non-null values of ``values`` that do not fully match ``pattern``."""
    compiled = compile_re2(pattern)
    return {v for v in values.drop_nulls().unique() if compiled.fullmatch(str(v)) is None}


def _column_violations(spec: ColumnSpec, values: pl.Series) -> list[tuple[str, str, pl.Expr]]:
    """(rule, detail, expression true on a breaking row) of every rule the column's distinct
    values break, in :data:`~cdcflow.model.contracts.CONSTRAINT_RULES` order.

    Each distinct value is judged by :func:`~cdcflow.model.contracts.constraint_violations`, the
    rule set ingestion quarantines by, so validate and ingestion cannot disagree on a value.
    """
    broken: dict[tuple[str, str], list[Any]] = {}
    for value in values.unique().to_list():
        for rule, detail in constraint_violations(spec, value):
            broken.setdefault((rule, detail), []).append(value)
    col = pl.col(spec.name)
    found = []
    for (rule, detail), bad in broken.items():
        if rule == "NOT_NULL":
            found.append((rule, detail, col.is_null()))
        else:
            found.append((rule, detail, col.is_in(pl.Series(bad, dtype=values.dtype).implode())))
    return sorted(found, key=lambda item: CONSTRAINT_RULES.index(item[0]))


def validate_silver(
    contract: TableContract,
    silver: pl.DataFrame,
    others: Mapping[str, pl.DataFrame] | None = None,
) -> ValidationReport:
    """Check one table's Silver rows against its contract.

    Args:
        contract: the table's contract.
        silver: the table's Silver rows (one per key; its key columns, its declared columns,
            ``is_deleted``, optionally the sequence registers ``_cdc_seq_<column>`` of its
            not-null columns).
        others: Silver of the tables that ``references`` name (table name → rows), for the
            foreign keys; a referenced table missing here counts every reference as broken.

    Returns:
        The report (tables: ``contract.name`` → rows, live rows).
    """
    report = ValidationReport()
    key = _key_text(contract)
    live = silver.filter(~pl.col("is_deleted").fill_null(False))
    report.tables[contract.name] = (silver.height, live.height)
    pii_key = any(contract.column(k).pii for k in contract.keys)

    def add(column: str, rule: str, detail: str, broken: pl.DataFrame) -> None:
        if broken.height == 0:
            return
        examples: tuple[str, ...] = ()
        if not pii_key:
            keys = broken.select(key.alias("_k"))["_k"].drop_nulls().unique().sort()
            examples = tuple(keys.head(EXAMPLES).to_list())
        report.violations.append(
            Violation(contract.name, column, rule, broken.height, detail, examples)
        )

    for name in contract.keys:
        add(
            name,
            "KEY_NULL",
            f"key column {name} must not be null",
            silver.filter(pl.col(name).is_null()),
        )
    whole_key = pl.struct(list(contract.keys))
    shared = silver.filter(
        whole_key.is_duplicated()
        & pl.all_horizontal([pl.col(k).is_not_null() for k in contract.keys])
    )
    add(", ".join(contract.keys), "KEY_DUPLICATE", "two or more rows share a key", shared)
    for name, pattern in contract.key_patterns.items():
        misses = _re2_misses(silver[name], pattern)
        detail = f"key column {name} does not match its pattern {pattern!r}"
        add(name, "KEY_PATTERN", detail, silver.filter(pl.col(name).is_in(list(misses))))

    for spec in contract.attributes:
        if spec.name not in live.columns:
            continue
        for rule, detail, expr in _column_violations(spec, live[spec.name]):
            if rule == "NOT_NULL" and register(spec.name) in live.columns:
                expr = expr & pl.col(register(spec.name)).is_not_null()  # set by an event
            add(spec.name, rule, detail, live.filter(expr.fill_null(False)))
        if spec.references is not None:
            table, column = spec.references.split(".", 1)
            target = (others or {}).get(table)
            known: list[Any] = []
            if target is not None and column in target.columns:
                alive = target.filter(~pl.col("is_deleted").fill_null(False))
                known = alive[column].drop_nulls().unique().to_list()
            value = pl.col(spec.name)
            broken = live.filter(value.is_not_null() & ~value.is_in(known))
            add(spec.name, "FOREIGN_KEY", f"{spec.name} is not a live {spec.references}", broken)
    return report


__all__ = ["EXAMPLES", "ValidationReport", "Violation", "validate_silver"]
