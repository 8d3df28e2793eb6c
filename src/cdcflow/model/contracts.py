"""Table contracts: what a table's change events carry, and how each value is typed.

A **contract** declares one table of the source: its key column(s), its typed columns with
constraints, where the sequence and the operation come from in a record, its delete mode and
the names of its Bronze / quarantine / Silver / history / Snowflake tables. The plan and the
engines read everything table-specific from it; the ``customers`` table of the product brief is
the shipped default contract (:data:`CUSTOMERS`), used when a config declares no ``tables:``.

Column types (``ColumnSpec.type``) and the values they accept (``coerce``):

============== =========================================================================
``string``     any JSON string as is; a JSON number or boolean as its JSON text
               (``34555024900``, ``true``) — the flat customers format's rule
``integer``    a 64-bit signed integer: a JSON integer, or a string of ASCII digits with an
               optional sign (surrounding spaces ignored; ``"007"`` is 7)
``decimal(p,s)`` precision ``p`` (1..38), scale ``s`` (0..p): a JSON number or a numeric
               string with at most ``s`` fraction digits and ``p - s`` integer digits
               (never rounded); stored as :class:`decimal.Decimal`
``double``     a JSON number, or a numeric string; finite
``boolean``    JSON ``true``/``false``, or the strings ``true``/``false`` (any case)
``date``       ``YYYY-MM-DD``, or an integer number of days since 1970-01-01 (Debezium
               ``io.debezium.time.Date``)
``timestamp``  an instant, UTC, microseconds: ISO-8601 text (offsets allowed, none = UTC) or
               integer epoch milliseconds — the rules of ``event_timestamp``
``json``       any JSON value, stored as its canonical JSON text (keys sorted)
============== =========================================================================

A value that cannot be represented in its column's type is ``SCHEMA_MISMATCH``; the detail
names the column and the type, never the value (``shared/SEMANTICS.md`` point 13). JSON
``null`` is null for every type (then ``nullable`` decides).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any, Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: The scalar column types (``decimal`` is written ``decimal(p,s)``).
SIMPLE_TYPES = ("string", "integer", "double", "boolean", "date", "timestamp", "json")
_DECIMAL_TYPE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
_INT_TEXT = re.compile(r"^[+-]?[0-9]+$")
_NUMBER_TEXT = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_DATE_TEXT = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
INT64 = (-(2**63), 2**63 - 1)
_EPOCH_DAY = date(1970, 1, 1)


class TypeMismatch(ValueError):
    """A value does not fit a column's type; the message names the type, never the value."""


def parse_type(text: str) -> tuple[str, int, int]:
    """``(kind, precision, scale)`` of a column type text (precision/scale 0 unless decimal).

    Raises:
        ValueError: not a known type, or a decimal with precision outside 1..38 or scale > p.
    """
    text = text.strip().lower()
    if text in SIMPLE_TYPES:
        return text, 0, 0
    match = _DECIMAL_TYPE.match(text)
    if not match:
        raise ValueError(
            f"unknown column type {text!r} (one of {', '.join(SIMPLE_TYPES)} or decimal(p,s))"
        )
    precision, scale = int(match.group(1)), int(match.group(2))
    if not 1 <= precision <= 38 or scale > precision:
        raise ValueError(f"{text}: precision must be 1..38 and scale at most the precision")
    return "decimal", precision, scale


def _json_number_text(value: Any) -> str | None:
    """The JSON text of a number value (int, float, or the parser's exact text), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if type(value).__name__ == "JsonNumber":  # plan.rules keeps fractions as their JSON text
        return str(value)
    return None


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a parsed JSON value (a ``json`` column's stored value).

    Keys sorted, no spaces, non-ASCII kept; a number with a fraction or exponent that the
    parser kept as its exact text (``JsonNumber``) is written as that number (``2.50``), not
    as a string.
    """
    number = _json_number_text(value)
    if number is not None:
        return number
    if isinstance(value, dict):
        items = (
            json.dumps(str(k), ensure_ascii=False) + ":" + canonical_json(value[k])
            for k in sorted(value)
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def coerce(value: Any, type_text: str) -> Any:
    """Convert a parsed JSON value to the stored value of a column of type ``type_text``.

    Args:
        value: a value of a parsed record (``None`` for JSON null).
        type_text: the column's type (see the module table).

    Returns:
        ``None`` for null; else ``str`` (string, json), ``int`` (integer), ``Decimal``
        (decimal), ``float`` (double), ``bool``, ``date`` or an aware UTC ``datetime``.

    Raises:
        TypeMismatch: the value cannot be represented in the type.
    """
    if value is None:
        return None
    kind, precision, scale = parse_type(type_text)
    number = _json_number_text(value)
    if kind == "string":
        if isinstance(value, str) and type(value).__name__ != "JsonNumber":
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if number is not None:
            return number
    elif kind == "json":
        return canonical_json(value)
    elif kind == "integer":
        parsed: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            parsed = value
        elif isinstance(value, str) and number is None and _INT_TEXT.match(value.strip()):
            parsed = int(value.strip())
        if parsed is not None and INT64[0] <= parsed <= INT64[1]:
            return parsed
    elif kind == "decimal":
        text = number if number is not None else value.strip() if isinstance(value, str) else None
        if text is not None and _NUMBER_TEXT.match(text):
            return _decimal(text, precision, scale, type_text)
    elif kind == "double":
        text = number if number is not None else value.strip() if isinstance(value, str) else None
        if text is not None and _NUMBER_TEXT.match(text):
            parsed_float = float(text)
            if parsed_float not in (float("inf"), float("-inf")):
                return parsed_float
    elif kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif kind == "date":
        if isinstance(value, str) and _DATE_TEXT.match(value.strip()):
            try:
                return date.fromisoformat(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return _EPOCH_DAY + timedelta(days=value)
            except OverflowError:
                pass
    elif kind == "timestamp":
        from cdcflow.plan.rules import parse_event_timestamp

        try:
            return parse_event_timestamp(value)
        except ValueError:
            pass
    raise TypeMismatch(f"not a value of type {type_text}")


@functools.lru_cache(maxsize=256)
def compile_re2(pattern: str) -> Any:
    """``pattern`` compiled by RE2, once per pattern, without RE2 logging its own errors.

    Raises:
        re2.error: not an RE2 pattern.
    """
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def coerce_given(value: Any, type_text: str) -> Any:
    """:func:`coerce` for a value given by hand or as text (a CLI option, a stored key): as
    itself first (text trimmed), then as the JSON value its text spells, so that a date key
    may be given as epoch days and an instant as epoch milliseconds, as records may give them.

    Raises:
        TypeMismatch: neither reading is a value of the type.
    """
    try:
        return coerce(value.strip() if isinstance(value, str) else value, type_text)
    except TypeMismatch:
        if not isinstance(value, str):
            raise
    try:
        spelled = json.loads(value)
    except ValueError:
        raise TypeMismatch(f"not a value of type {type_text}") from None
    return coerce(spelled, type_text)


def _decimal(text: str, precision: int, scale: int, type_text: str) -> Decimal:
    """The exact decimal of ``text`` at ``scale``; never rounded (too many digits: mismatch)."""
    with localcontext() as context:
        context.prec = 80  # above any decimal(38, s) and its quantization
        try:
            parsed = Decimal(text)
            # an exponent beyond the context (1e100 at scale 2) cannot be quantized
            quantized = parsed.quantize(Decimal(1).scaleb(-scale))
        except InvalidOperation:
            raise TypeMismatch(f"not a value of type {type_text}") from None
        if (
            not parsed.is_finite()
            or quantized != parsed
            or len(quantized.as_tuple().digits) > precision
        ):
            raise TypeMismatch(f"not a value of type {type_text} (too many digits)")
        return quantized


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnSpec(_Strict):
    """One non-key or key column of a contract.

    Attributes:
        name: the column's name in Silver (an identifier).
        type: see the module table.
        nullable: False: a record of INSERT/UPDATE that sets it to null, or an INSERT that
            omits it, is quarantined (``required_reason``).
        pii: personal data: never logged nor quoted in errors or quarantine details; erasure
            targets it.
        source: the record field it is read from (default: ``name``).
        allowed_values: allowed stored values (strings compared after ``normalize``).
        pattern: an RE2 pattern the stored text must fully match.
        minimum / maximum: bounds for numbers, dates and timestamps (inclusive).
        normalize: ``none``, or ``upper`` (trimmed and upper-cased before checks: the customers
            ``status``).
        reason: the reason code of a constraint failure (default ``SCHEMA_MISMATCH``; the
            customers ``status`` uses ``INVALID_STATUS``).
        required_on_insert: an INSERT must carry it (customers ``status``).
        references: a foreign key, ``<table>.<key column>``: every live Silver row's non-null
            value must be a live key of that table (checked by ``cdcflow validate``, never at
            ingestion: the referenced row may arrive later).
    """

    name: str = Field(pattern=_IDENTIFIER)
    type: str = "string"
    nullable: bool = True
    pii: bool = False
    source: str | None = None
    allowed_values: tuple[str, ...] | None = None
    pattern: str | None = None
    minimum: int | float | str | None = None
    maximum: int | float | str | None = None
    normalize: Literal["none", "upper"] = "none"
    reason: Literal["SCHEMA_MISMATCH", "INVALID_STATUS"] = "SCHEMA_MISMATCH"
    required_on_insert: bool = False
    references: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$"
    )

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        parse_type(value)
        return value.strip().lower()

    @field_validator("pattern")
    @classmethod
    def _re2_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_re2(value)
            except re2.error as exc:
                raise ValueError(f"not an RE2 pattern: {exc}") from None
        return value

    @model_validator(mode="after")
    def _typed_bounds(self) -> ColumnSpec:
        for name in ("minimum", "maximum"):
            bound = getattr(self, name)
            if bound is not None:
                try:
                    coerce(bound, self.type)
                except TypeMismatch:
                    raise ValueError(f"{name} is not a value of type {self.type}") from None
        for allowed in self.allowed_values or ():
            try:
                coerce(allowed, self.type)
            except TypeMismatch:
                raise ValueError(
                    f"allowed_values: {allowed!r} is not a value of type {self.type}"
                ) from None
        return self

    @property
    def field(self) -> str:
        """The record field this column is read from."""
        return self.source or self.name


#: Column names of the tables cdcflow keeps beside a contract's own columns (Bronze, quarantine,
#: Silver, tombstones, history, outcomes) and of its engines' intermediate frames: a declared
#: or evolved column may not take one (compared case-insensitively, as Delta does), nor a name
#: starting with ``_`` (``_cdc_`` registers and the engines' working columns).
SYSTEM_COLUMNS = frozenset(
    {
        # Bronze
        "batch_id", "ingested_at", "ingestion_date", "source_file", "source_line",
        "raw_payload", "event_id", "operation", "event_timestamp", "present_mask",
        "source_table", "lsn", "lsn_key", "tx_id", "sequence", "content_hash", "is_duplicate",
        # quarantine
        "quarantined_at", "raw_line", "failure_reason", "failure_detail",
        # Silver, tombstones, history, outcomes
        "is_deleted", "is_active", "created_at", "last_updated_at", "deleted_at",
        "last_event_id", "last_operation", "last_lsn", "tombstoned_at", "valid_from",
        "valid_to", "is_current", "outcome", "is_late", "lag_s",
        # the Spark engine's record frames
        "ok", "raw", "file_name", "file_mtime_ms", "table_name", "unknown_kinds",
    }
)  # fmt: skip


def is_system_column(name: str) -> bool:
    """True for a name a contract's column may not take (:data:`SYSTEM_COLUMNS`, or ``_…``)."""
    return name.startswith("_") or name.lower() in SYSTEM_COLUMNS


class TableNames(_Strict):
    """Delta table paths (under ``storage.root``) and the Snowflake table of one contract.

    ``outcomes`` (the per-event outcomes) may be left out: ``audit/<name>_event_outcomes``
    (:meth:`TableContract.outcomes_table`).
    """

    bronze: str
    quarantine: str
    silver: str
    history: str
    tombstones: str
    snowflake: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_$]*$")
    outcomes: str = ""


class TableContract(_Strict):
    """The contract of one source table.

    Attributes:
        name: the table's name (routing: ``metadata.source_table`` or a landing sub-folder).
        version: the contract's version (schema evolution is recorded per version).
        keys: the key columns (one or several), in order; each also in ``columns``.
        columns: every column: keys first is not required; names unique.
        key_patterns: key column → RE2 pattern its trimmed text must fully match
            (``INVALID_<KEY>_FORMAT``... for customers ``INVALID_CUSTOMER_ID_FORMAT``).
        delete_mode: ``soft`` or ``hard``.
        tombstone_retention_days: how long hard-mode tombstones are kept.
        lsn_field / operation_field / event_id_field / timestamp_field: dotted paths of the
            record fields carrying them (defaults: the flat format).
        unknown_fields: a record field the contract does not know: ``ignore`` (kept in
            Bronze's raw payload), ``quarantine`` (``SCHEMA_MISMATCH``) or ``evolve``.
        tables: Delta tables and the Snowflake table.
        derived_active: the customers rule ``is_active = not deleted and status = 'ACTIVE'``
            as (column, value), or None for a table without an ``is_active`` column.
        soft_delete_values: non-key column → the value a soft DELETE sets (customers:
            ``status`` → ``DELETED``, ``shared/SEMANTICS.md`` point 1); other columns keep
            their values.
        format: the format of this table's records where it differs from ``source.format``
            (``flat``, ``debezium``, ``dms``: :mod:`cdcflow.sources.formats`); None = the
            source's.
        truncate: what a source TRUNCATE of the table does (Debezium ``op: t``): ``quarantine``
            (reason ``SOURCE_TRUNCATE``, the default: nothing dropped silently), ``ignore``
            (skipped and counted in ``audit/skipped_records``) or ``apply``: every key with an
            event before the truncate's sequence is deleted at that sequence (soft or hard per
            ``delete_mode``; :mod:`cdcflow.plan.truncates`). A flat record whose operation is
            ``TRUNCATE`` is a truncate too under ``apply``.
    """

    name: str = Field(pattern=_IDENTIFIER)
    version: int = Field(default=1, ge=1)
    keys: tuple[str, ...] = Field(min_length=1)
    columns: tuple[ColumnSpec, ...] = Field(min_length=1)
    key_patterns: dict[str, str] = Field(default_factory=dict)
    delete_mode: Literal["soft", "hard"] = "soft"
    tombstone_retention_days: int = Field(default=30, ge=0)
    lsn_field: str = "metadata.lsn"
    operation_field: str = "operation"
    event_id_field: str = "event_id"
    timestamp_field: str = "event_timestamp"
    unknown_fields: Literal["ignore", "quarantine", "evolve"] = "ignore"
    tables: TableNames | None = None
    derived_active: tuple[str, str] | None = None
    soft_delete_values: dict[str, str] = Field(default_factory=dict)
    format: Literal["flat", "debezium", "dms"] | None = None
    truncate: Literal["quarantine", "ignore", "apply"] = "quarantine"

    @model_validator(mode="after")
    def _consistent(self) -> TableContract:
        names = [c.name for c in self.columns]
        folded = [n.lower() for n in names]  # Delta column names are case-insensitive
        duplicated = sorted({n for n in names if folded.count(n.lower()) > 1})
        if duplicated:
            raise ValueError(f"columns declared twice: {', '.join(duplicated)}")
        system = sorted(n for n in names if is_system_column(n))
        if system:
            raise ValueError(
                f"column {', '.join(system)}: a name cdcflow's own columns use (or starting "
                f"with _): name the column otherwise and read it with source: {system[0]}"
            )
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise ValueError(f"key column(s) not declared in columns: {', '.join(missing)}")
        for key in self.keys:
            spec = self.column(key)
            if spec.type == "json" or spec.type == "double":
                raise ValueError(f"key column {key}: type {spec.type} cannot be a key")
        for name in (*self.soft_delete_values, *(self.derived_active or ())[:1]):
            if name not in names or name in self.keys:
                raise ValueError(f"{name} is not a non-key column of the table")
        unknown = [k for k in self.key_patterns if k not in self.keys]
        if unknown:
            raise ValueError(f"key_patterns names non-key column(s): {', '.join(unknown)}")
        if len(self.attributes) > 62:  # present_mask: one bit per non-key column in an int64
            raise ValueError(f"at most 62 non-key columns (has {len(self.attributes)})")
        for name, pattern in self.key_patterns.items():
            try:
                compile_re2(pattern)
            except re2.error as exc:
                raise ValueError(f"key_patterns.{name}: not an RE2 pattern: {exc}") from None
        return self

    def column(self, name: str) -> ColumnSpec:
        """The column called ``name``.

        Raises:
            KeyError: no such column.
        """
        for spec in self.columns:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def attributes(self) -> tuple[ColumnSpec, ...]:
        """The non-key columns, in declared order (each has its own sequence register)."""
        return tuple(c for c in self.columns if c.name not in self.keys)

    @property
    def table_names(self) -> TableNames:
        """The declared table names, or the defaults derived from the table's name."""
        if self.tables is not None:
            return self.tables
        return TableNames(
            bronze=f"bronze/{self.name}_events",
            quarantine=f"quarantine/{self.name}_events",
            silver=f"silver/{self.name}",
            history=f"silver/{self.name}_history",
            tombstones=f"silver/{self.name}_tombstones",
            snowflake=f"{self.name.upper()}_CURRENT",
        )

    @property
    def outcomes_table(self) -> str:
        """The Delta path of the table's per-event outcomes (default
        ``audit/<name>_event_outcomes``; customers: ``audit/event_outcomes``)."""
        return self.table_names.outcomes or f"audit/{self.name}_event_outcomes"


#: The shipped contract of the brief's customers table: the default when a config declares no
#: ``tables:`` (same table paths, columns, reason codes as before contracts existed).
CUSTOMERS = TableContract(
    name="customers",
    keys=("customer_id",),
    columns=(
        ColumnSpec(name="customer_id", nullable=False),
        ColumnSpec(name="customer_name", pii=True),
        ColumnSpec(name="email", pii=True),
        ColumnSpec(name="phone", pii=True),
        ColumnSpec(name="city"),
        ColumnSpec(name="country"),
        ColumnSpec(
            name="status",
            nullable=False,
            allowed_values=("ACTIVE", "INACTIVE", "SUSPENDED", "DELETED"),
            normalize="upper",
            reason="INVALID_STATUS",
            required_on_insert=True,
        ),
    ),
    key_patterns={"customer_id": r"^C-[0-9]+$"},
    tables=TableNames(
        bronze="bronze/customer_events",
        quarantine="quarantine/customer_events",
        silver="silver/customers",
        history="silver/customer_history",
        tombstones="silver/customer_tombstones",
        snowflake="DIM_CUSTOMER_CURRENT",
        outcomes="audit/event_outcomes",
    ),
    derived_active=("status", "ACTIVE"),
    soft_delete_values={"status": "DELETED"},
)


#: The rules of a column's constraints, in the order they are checked (``cdcflow validate``
#: reports them under these names; ingestion quarantines on the first one broken).
CONSTRAINT_RULES = ("NOT_NULL", "ALLOWED_VALUES", "PATTERN", "MINIMUM", "MAXIMUM")


def constraint_violations(spec: ColumnSpec, stored: Any) -> Iterator[tuple[str, str]]:
    """Every constraint of ``spec`` that a stored value breaks, in :data:`CONSTRAINT_RULES` order.

    The one definition of the column rules: ingestion (:func:`check_constraints`, which stops at
    the first) and ``cdcflow validate`` (:mod:`cdcflow.layers.validation`, every rule, over the
    distinct values of a Silver column) both call it, so the two cannot drift.

    Args:
        spec: the column's contract.
        stored: the value as stored: coerced to the column's type and normalised (None = null).

    Yields:
        (rule, detail) pairs, lazily; the detail names the column and the constraint, never the
        value. Nothing when the value is valid.
    """
    if stored is None:
        if not spec.nullable:
            yield "NOT_NULL", f"{spec.name} must not be null"
        return
    if spec.allowed_values is not None and stored not in typed_allowed(
        spec.allowed_values, spec.type
    ):
        yield "ALLOWED_VALUES", f"{spec.name} is not one of {', '.join(spec.allowed_values)}"
    if spec.pattern is not None and compile_re2(spec.pattern).fullmatch(str(stored)) is None:
        yield "PATTERN", f"{spec.name} does not match its pattern {spec.pattern!r}"
    for rule, bound, outside in (
        ("MINIMUM", spec.minimum, lambda v, b: v < b),
        ("MAXIMUM", spec.maximum, lambda v, b: v > b),
    ):
        if bound is None:
            continue
        limit = coerce(bound, spec.type)  # checked when the contract was loaded
        if outside(stored, limit):
            yield rule, f"{spec.name} is outside its {rule.lower()} {bound}"


@functools.lru_cache(maxsize=256)
def typed_allowed(allowed: tuple[str, ...], type_text: str) -> frozenset[Any]:
    """A column's ``allowed_values`` as stored values of its type, once per column.

    A stored value is compared as a value of the column's type, not as text: ``"1.50"`` allows
    the decimal 1.5 of a ``decimal(5,2)`` column, ``"true"`` the boolean True (whose text would
    be ``"True"``). Strings compare as they are (after the column's ``normalize``).

    Raises:
        TypeMismatch: a value is not of the type (refused when the contract is loaded).
    """
    return frozenset(coerce(value, type_text) for value in allowed)


def check_constraints(spec: ColumnSpec, stored: Any) -> str | None:
    """The first constraint a stored (coerced, normalised) value breaks, as a detail, or None.

    The detail names the column and the constraint, never the value
    (:func:`constraint_violations`).
    """
    first = next(constraint_violations(spec, stored), None)
    return first[1] if first is not None else None


def normalise(spec: ColumnSpec, stored: Any) -> Any:
    """Apply the column's ``normalize`` (``upper``: trimmed and upper-cased text)."""
    if spec.normalize == "upper" and isinstance(stored, str):
        return stored.strip().upper()
    return stored


__all__ = [
    "CONSTRAINT_RULES",
    "CUSTOMERS",
    "SYSTEM_COLUMNS",
    "ColumnSpec",
    "TableContract",
    "TableNames",
    "TypeMismatch",
    "check_constraints",
    "coerce",
    "coerce_given",
    "compile_re2",
    "constraint_violations",
    "is_system_column",
    "normalise",
    "parse_type",
]
