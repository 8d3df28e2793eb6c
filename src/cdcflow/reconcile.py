"""Reconciliation: compare a customer state (Silver, a replay's shadow) with an expected one.

Two comparisons, both keyed on ``customer_id`` and engine-neutral (Polars frames in, a typed
:class:`ReconcileReport` out):

* :func:`reconcile_state` — against an *expected Silver state*: one row per customer_id with
  Silver's public columns (``SILVER_COLUMNS``; deleted customers present with
  ``is_deleted = true`` in soft mode). Used by ``cdcflow reconcile --expected`` (the file the
  generator writes) and ``cdcflow replay --verify`` (shadow vs live Silver).
* :func:`reconcile_snapshot` — against a *snapshot of the source table*: one row per live
  customer_id with ``customer_id`` and any of the attribute columns; deleted customers are
  absent. Silver's non-deleted rows must match it exactly.

The report counts missing keys (expected, not found), extra keys (found, not expected),
field-level differences per column, rows/active/deleted on both sides, and a per-row hash check
(a hash of every compared column of a row, computed the same way on both sides). Sample values of
personal-data columns (``PII_ATTRIBUTES``) are masked in the report.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from cdcflow.errors import UsageError
from cdcflow.layers.tables import SILVER
from cdcflow.model.contracts import TableContract
from cdcflow.model.events import ATTRIBUTES, PII_ATTRIBUTES
from cdcflow.plan.reference import SILVER_COLUMNS, ContractState, ReferenceState

KEY = "customer_id"
#: How many example keys / differences a report keeps.
SAMPLE_SIZE = 10
_NULL = "\u2400"
_SEP = "\u241f"


class ReconcileError(UsageError):
    """An expected-state or snapshot file is missing, unreadable or lacks required columns."""


def silver_polars_schema() -> dict[str, pl.DataType]:
    """Polars dtypes of every Silver column (public columns and ``_cdc_`` registers)."""
    empty = pl.from_arrow(SILVER.schema.empty_table())
    assert isinstance(empty, pl.DataFrame)
    return dict(empty.schema)


def public_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """Rows of Silver's public columns (``SILVER_COLUMNS``) as a typed frame.

    Args:
        rows: one mapping per customer_id with (at least) the public columns.

    Returns:
        One row per customer_id, columns ``SILVER_COLUMNS`` with Silver's dtypes, sorted by key.
    """
    schema = {name: silver_polars_schema()[name] for name in SILVER_COLUMNS}
    data = {name: [row.get(name) for row in rows] for name in SILVER_COLUMNS}
    return pl.DataFrame(data, schema=schema).sort(KEY)


def frame_from_reference(state: ReferenceState) -> pl.DataFrame:
    """The reference fold's rows as a typed frame (one row per customer_id, public columns)."""
    return public_frame(list(state.rows.values()))


def write_state_file(frame: pl.DataFrame, path: str | Path) -> Path:
    """Write a state frame as Parquet (``.parquet``), CSV (``.csv``) or JSON lines (other).

    Timestamps are written as ISO-8601 UTC in CSV and JSON lines.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    suffix = target.suffix.lower()
    if suffix == ".parquet":
        frame.write_parquet(target)
        return target
    text = frame.with_columns(
        pl.col(pl.Datetime).dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
    )
    if suffix == ".csv":
        text.write_csv(target)
    else:
        text.write_ndjson(target)
    return target


def _cast_column(frame: pl.DataFrame, name: str, target: pl.DataType | None) -> pl.Expr:
    col = pl.col(name)
    if target is None or frame.schema[name] == target:
        return col
    if isinstance(target, pl.Datetime) and frame.schema[name] == pl.String:
        return col.str.to_datetime(time_zone="UTC", time_unit="us", strict=True).alias(name)
    if target == pl.Date and frame.schema[name] == pl.String:
        return col.str.to_date(format="%Y-%m-%d", strict=True).alias(name)
    if target == pl.Boolean and frame.schema[name] == pl.String:
        return col.str.to_lowercase().replace_strict({"true": True, "false": False}).alias(name)
    if isinstance(target, pl.Datetime):
        return col.cast(pl.Datetime("us", "UTC")).alias(name)
    return col.cast(target).alias(name)


def _expected_kind(target: pl.DataType | None) -> str:
    if isinstance(target, pl.Datetime):
        return "an ISO-8601 timestamp"
    if target == pl.Boolean:
        return "true or false"
    return f"of type {target}"


def _cast(frame: pl.DataFrame, schema: dict[str, pl.DataType], source: Path) -> pl.DataFrame:
    """Cast each known column to Silver's dtype.

    Raises:
        ReconcileError: a value does not convert; names the file and the column, never the
            value (it may be personal data).
    """
    columns = []
    for name in frame.columns:
        try:
            columns.append(frame.select(_cast_column(frame, name, schema.get(name))).to_series())
        except pl.exceptions.PolarsError:
            raise ReconcileError(
                f"{source}: column '{name}' has a value that is not "
                f"{_expected_kind(schema.get(name))}"
            ) from None
    return pl.DataFrame(columns)


def read_state_file(path: str | Path, required: Sequence[str] = (KEY,)) -> pl.DataFrame:
    """Read an expected state or snapshot file and cast its columns to Silver's dtypes.

    Args:
        path: ``.parquet``, ``.csv`` or JSON lines (``.jsonl``/``.ndjson``/``.json``). In CSV
            and JSON lines, timestamps are ISO-8601 text and booleans ``true``/``false``.
        required: columns the file must have.

    Returns:
        The file's rows; known columns have Silver's dtypes, other columns are dropped.

    Raises:
        ReconcileError: missing or unreadable file, or a required column is absent. Messages
            name the file and the column, never a row's values (they may be personal data):
            the reader's own messages, which quote rows, are not passed on.
    """
    source = Path(path)
    if not source.is_file():
        raise ReconcileError(f"{source}: file not found")
    suffix = source.suffix.lower()
    kind = {".parquet": "Parquet", ".csv": "CSV"}.get(suffix, "JSON lines")
    try:
        if suffix == ".parquet":
            frame = pl.read_parquet(source)
        elif suffix == ".csv":
            frame = pl.read_csv(source, infer_schema=False)
        else:
            frame = pl.read_ndjson(source, infer_schema_length=None)
    except OSError as exc:
        raise ReconcileError(
            f"{source}: cannot read ({exc.strerror or type(exc).__name__})"
        ) from None
    except pl.exceptions.PolarsError as exc:
        hint = (
            " (check quoting and that every row has the header's fields)" if kind == "CSV" else ""
        )
        raise ReconcileError(
            f"{source}: not a well-formed {kind} file ({type(exc).__name__}){hint}"
        ) from None
    schema = silver_polars_schema()
    missing = [name for name in required if name not in frame.columns]
    if missing:
        raise ReconcileError(f"{source}: missing column(s) {missing}")
    frame = frame.select([name for name in frame.columns if name in schema])
    return _cast(frame, schema, source)


@dataclass
class SideCounts:
    """Counts of one side of a comparison.

    Attributes:
        rows: rows (one per customer_id).
        active: rows with ``is_active`` true (snapshot: status ``ACTIVE``); None if unknown.
        deleted: rows with ``is_deleted`` true; None when the side cannot say (a snapshot).
    """

    rows: int
    active: int | None
    deleted: int | None


@dataclass
class FieldDifference:
    """One differing value (a sample; personal-data values are masked)."""

    customer_id: str
    column: str
    expected: str | None
    actual: str | None


@dataclass
class ReconcileReport:
    """Result of a reconciliation.

    Attributes:
        kind: ``expected`` (vs an expected state), ``source-snapshot`` or ``replay``.
        expected_label / actual_label: what was compared (e.g. a file, ``silver``).
        columns: the compared columns (besides the key).
        expected_counts / actual_counts: rows, active and deleted per side.
        missing_keys / extra_keys: how many keys only the expected / actual side has.
        duplicate_keys: keys that occur more than once on either side.
        matched_rows: keys on both sides whose compared columns are all equal.
        rows_with_differences: keys on both sides with at least one differing column.
        field_differences: column → number of keys whose value differs (nulls compare equal).
        hash_mismatches: keys on both sides whose per-row hashes differ.
        missing_sample / extra_sample / difference_sample: up to ``SAMPLE_SIZE`` examples.
    """

    kind: str
    expected_label: str
    actual_label: str
    columns: list[str]
    expected_counts: SideCounts
    actual_counts: SideCounts
    missing_keys: int = 0
    extra_keys: int = 0
    duplicate_keys: int = 0
    matched_rows: int = 0
    rows_with_differences: int = 0
    field_differences: dict[str, int] = field(default_factory=dict)
    hash_mismatches: int = 0
    missing_sample: list[str] = field(default_factory=list)
    extra_sample: list[str] = field(default_factory=list)
    difference_sample: list[FieldDifference] = field(default_factory=list)

    @property
    def counts_match(self) -> bool:
        """True when rows, active and deleted agree (where both sides know them)."""
        e, a = self.expected_counts, self.actual_counts
        pairs = [(e.rows, a.rows), (e.active, a.active), (e.deleted, a.deleted)]
        return all(x == y for x, y in pairs if x is not None and y is not None)

    @property
    def ok(self) -> bool:
        """True when everything matches: no missing, extra or duplicate key, no difference."""
        return (
            self.missing_keys == 0
            and self.extra_keys == 0
            and self.duplicate_keys == 0
            and self.rows_with_differences == 0
            and self.hash_mismatches == 0
            and self.counts_match
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form (with ``ok`` and ``counts_match``)."""
        data = asdict(self)
        data["ok"] = self.ok
        data["counts_match"] = self.counts_match
        return data


def _side_counts(frame: pl.DataFrame, snapshot: bool = False) -> SideCounts:
    if snapshot:
        active = (
            int((frame["status"].str.strip_chars().str.to_uppercase() == "ACTIVE").sum())
            if "status" in frame.columns
            else None
        )
        return SideCounts(frame.height, active, None)
    active = int(frame["is_active"].sum()) if "is_active" in frame.columns else None
    deleted = int(frame["is_deleted"].sum()) if "is_deleted" in frame.columns else None
    return SideCounts(frame.height, active, deleted)


def _row_hash(columns: Sequence[str]) -> pl.Expr:
    parts = [pl.col(name).cast(pl.String).fill_null(_NULL) for name in columns]
    return pl.concat_str(parts, separator=_SEP).hash(seed=0)


def _show(value: Any, column: str, pii: Collection[str] = PII_ATTRIBUTES) -> str | None:
    if value is None:
        return None
    if column in pii:
        return "<masked>"
    return str(value)


def compare(
    actual: pl.DataFrame,
    expected: pl.DataFrame,
    columns: Sequence[str],
    report: ReconcileReport,
    key: str = KEY,
    pii: Collection[str] = PII_ATTRIBUTES,
    pii_key: bool = False,
) -> ReconcileReport:
    """Fill ``report`` with the key and field comparison of two frames keyed on ``key``.

    Args:
        actual: one row per key (the state being checked).
        expected: one row per key (the reference).
        columns: the columns to compare (both frames must have them, with equal dtypes).
        report: the report to fill (counts already set).
        key: the key column (text; a composite key is joined into one column first).
        pii: columns whose sample values are masked.
        pii_key: a key column is personal data: the samples' keys are masked too.

    Returns:
        ``report``.
    """
    report.columns = list(columns)
    report.duplicate_keys = (actual.height - actual[key].n_unique()) + (
        expected.height - expected[key].n_unique()
    )
    a = actual.select(key, *columns).with_columns(_row_hash(columns).alias("_hash"))
    e = expected.select(key, *columns).with_columns(_row_hash(columns).alias("_hash"))
    missing = e.join(a, on=key, how="anti").sort(key)
    extra = a.join(e, on=key, how="anti").sort(key)
    report.missing_keys = missing.height
    report.extra_keys = extra.height

    def shown_key(value: Any) -> Any:
        return "<masked>" if pii_key else value

    report.missing_sample = [shown_key(k) for k in missing[key].head(SAMPLE_SIZE).to_list()]
    report.extra_sample = [shown_key(k) for k in extra[key].head(SAMPLE_SIZE).to_list()]

    both = a.join(e, on=key, how="inner", suffix="_exp").sort(key)
    diff_flags = [pl.col(name).ne_missing(pl.col(f"{name}_exp")).alias(name) for name in columns]
    flags = both.select(key, *diff_flags, (pl.col("_hash") != pl.col("_hash_exp")).alias("_h"))
    report.field_differences = {name: n for name in columns if (n := int(flags[name].sum())) > 0}
    any_diff = pl.any_horizontal([pl.col(name) for name in columns]) if columns else pl.lit(False)
    report.rows_with_differences = int(flags.select(any_diff.sum()).item())
    report.matched_rows = both.height - report.rows_with_differences
    report.hash_mismatches = int(flags["_h"].sum())

    sample: list[FieldDifference] = []
    differing = both.filter(flags.select(any_diff).to_series()).head(SAMPLE_SIZE)
    for row in differing.iter_rows(named=True):
        for name in columns:
            if row[name] != row[f"{name}_exp"]:
                sample.append(
                    FieldDifference(
                        shown_key(row[key]),
                        name,
                        _show(row[f"{name}_exp"], name, pii),
                        _show(row[name], name, pii),
                    )
                )
    report.difference_sample = sample[:SAMPLE_SIZE]
    return report


def reconcile_state(
    actual: pl.DataFrame,
    expected: pl.DataFrame,
    columns: Sequence[str] | None = None,
    kind: str = "expected",
    expected_label: str = "expected",
    actual_label: str = "silver",
) -> ReconcileReport:
    """Compare a Silver-like state with an expected Silver state.

    Args:
        actual: one row per customer_id with (at least) the compared columns.
        expected: one row per customer_id with the same columns (Silver's dtypes).
        columns: columns to compare; default: every public Silver column the expected side has
            (except the key).
        kind: report kind (``expected`` or ``replay``).
        expected_label / actual_label: names shown in the report.

    Returns:
        The report; ``report.ok`` is True only when everything matches.

    Raises:
        ReconcileError: a compared column is missing from the actual side.
    """
    if columns is None:
        columns = [c for c in SILVER_COLUMNS if c != KEY and c in expected.columns]
    absent = [c for c in columns if c not in actual.columns]
    if absent:
        raise ReconcileError(f"{actual_label}: missing column(s) {absent}")
    report = ReconcileReport(
        kind=kind,
        expected_label=expected_label,
        actual_label=actual_label,
        columns=[],
        expected_counts=_side_counts(expected),
        actual_counts=_side_counts(actual),
    )
    return compare(actual, expected, columns, report)


def reconcile_snapshot(
    silver: pl.DataFrame, snapshot: pl.DataFrame, snapshot_label: str = "source snapshot"
) -> ReconcileReport:
    """Compare Silver with a snapshot of the source table.

    Silver's non-deleted rows must equal the snapshot's rows on the attribute columns the
    snapshot has (deleted customers are absent from the snapshot; a customer deleted in Silver
    but present in the snapshot is a missing key, the reverse an extra key).

    Args:
        silver: Silver's rows (one per customer_id) with ``is_deleted`` and the attributes.
        snapshot: one row per live source customer_id: ``customer_id`` and any of
            ``ATTRIBUTES``.

    Returns:
        The report (actual counts: Silver's live rows; ``deleted`` is Silver's deleted rows).
    """
    columns = [c for c in ATTRIBUTES if c in snapshot.columns]
    live = silver.filter(~pl.col("is_deleted"))
    report = ReconcileReport(
        kind="source-snapshot",
        expected_label=snapshot_label,
        actual_label="silver (its deleted rows not compared)",
        columns=[],
        expected_counts=_side_counts(snapshot, snapshot=True),
        actual_counts=SideCounts(
            live.height, int(live["is_active"].sum()), int(silver["is_deleted"].sum())
        ),
    )
    return compare(live, snapshot, columns, report)


# ----------------------------------------------------------------------------- declared tables
#: The text form of a declared table's key in a comparison: its key columns joined by ``|``.
KEY_TEXT = "_key"


def contract_public_schema(contract: TableContract) -> pa.Schema:
    """Arrow schema of a declared table's public Silver columns (Silver without the ``_cdc_``
    registers: the keys, the columns, ``is_deleted``, ``is_active`` when derived, timestamps and
    ``last_*``)."""
    from cdcflow.layers.contract_tables import contract_tables

    silver = contract_tables(contract).silver.schema
    return pa.schema([f for f in silver if not f.name.startswith("_cdc_")])


def contract_state_frame(contract: TableContract, state: ContractState) -> pl.DataFrame:
    """The reference fold's rows of a declared table as a frame of its public Silver columns
    (one row per key, Silver's types), sorted by key."""
    schema = contract_public_schema(contract)
    table = pa.Table.from_pylist(list(state.rows.values()), schema=schema)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame.sort(list(contract.keys))


def reconcile_table(
    actual: pl.DataFrame,
    expected: pl.DataFrame,
    contract: TableContract,
    expected_label: str = "expected",
    actual_label: str = "silver",
) -> ReconcileReport:
    """Compare a declared table's Silver with its expected state, keyed on its key columns.

    Args:
        actual / expected: one row per key with the table's public Silver columns (the
            expected side may have fewer columns: only those are compared).
        contract: the table's contract (keys; ``pii`` columns are masked in samples, the
            samples' keys too when a key column is ``pii``).
        expected_label / actual_label: names shown in the report.

    Returns:
        The report; its samples name a composite key as its values joined by ``|``.

    Raises:
        ReconcileError: a key column is missing on either side, or a compared column on the
            actual side, or an expected column does not convert to the actual one's type.
    """
    keys = list(contract.keys)
    for label, frame in ((expected_label, expected), (actual_label, actual)):
        absent = [k for k in keys if k not in frame.columns]
        if absent:
            raise ReconcileError(f"{label}: missing key column(s) {absent}")
    names = contract_public_schema(contract).names
    columns = [c for c in names if c not in keys and c in expected.columns]
    absent = [c for c in columns if c not in actual.columns]
    if absent:
        raise ReconcileError(f"{actual_label}: missing column(s) {absent}")
    for c in columns:
        if expected.schema[c] == actual.schema[c]:
            continue
        try:
            expected = expected.with_columns(_cast_column(expected, c, actual.schema[c]))
        except pl.exceptions.PolarsError:  # never the value: it may be personal data
            raise ReconcileError(
                f"{expected_label}: column '{c}' is {expected.schema[c]} and does not convert "
                f"to the table's type {actual.schema[c]} (write it as that type)"
            ) from None
    text = pl.concat_str([pl.col(k).cast(pl.String) for k in keys], separator="|").alias(KEY_TEXT)
    report = ReconcileReport(
        kind="expected",
        expected_label=expected_label,
        actual_label=actual_label,
        columns=[],
        expected_counts=_side_counts(expected),
        actual_counts=_side_counts(actual),
    )
    pii = frozenset(c.name for c in contract.columns if c.pii)
    return compare(
        actual.with_columns(text),
        expected.with_columns(text),
        columns,
        report,
        KEY_TEXT,
        pii,
        pii_key=any(contract.column(k).pii for k in keys),
    )


__all__ = [
    "KEY_TEXT",
    "FieldDifference",
    "ReconcileError",
    "ReconcileReport",
    "SideCounts",
    "contract_public_schema",
    "contract_state_frame",
    "frame_from_reference",
    "public_frame",
    "read_state_file",
    "reconcile_snapshot",
    "reconcile_state",
    "reconcile_table",
    "silver_polars_schema",
    "write_state_file",
]
