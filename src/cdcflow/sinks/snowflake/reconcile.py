"""Reconciliation of Silver with ``DIM_CUSTOMER_CURRENT`` (and Gold with the ``AGG_*`` tables).

Compares row counts, active and deleted counts, the key sets, every public attribute value and a
per-key hash (SHA-256 of the row's normalized public columns). Timestamps are compared as
microseconds since the epoch (read from Snowflake with ``DATE_PART(EPOCH_MICROSECOND, ...)``),
so time-zone rendering cannot cause a false difference. The report names keys and columns,
never attribute values.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import polars as pl

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow
from cdcflow.logs import get_logger
from cdcflow.sinks.snowflake.connection import connect
from cdcflow.sinks.snowflake.sync import ensure_tables, gold_table_exists, open_delta, to_polars
from cdcflow.sinks.snowflake.tables import (
    DIM_TABLE,
    GOLD_TABLES,
    PUBLIC_COLUMNS,
    SILVER_TABLE,
    STATE_TABLE,
    TIMESTAMP_COLUMNS,
    SyncTarget,
    sf_type,
)

log = get_logger("snowflake.reconcile")
_SAMPLE = 10


@dataclass
class TableComparison:
    """Differences between one Delta table and its Snowflake copy.

    Attributes:
        source / target: Delta table name and Snowflake table name.
        source_rows / target_rows: row counts.
        missing: number of keys (rows, for Gold) in the source but not in the target.
        extra: number of keys in the target but not in the source.
        mismatched: number of keys present on both sides with different values.
        mismatched_columns: column → number of keys whose value differs.
        sample_keys: up to 10 differing customer_ids (missing, extra or mismatched).
    """

    source: str
    target: str
    source_rows: int = 0
    target_rows: int = 0
    missing: int = 0
    extra: int = 0
    mismatched: int = 0
    mismatched_columns: dict[str, int] = field(default_factory=dict)
    sample_keys: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        """True when both sides hold the same rows."""
        return (
            self.source_rows == self.target_rows
            and self.missing == 0
            and self.extra == 0
            and self.mismatched == 0
        )


@dataclass
class SnowflakeReconcileReport:
    """Result of :func:`reconcile_snowflake`.

    Attributes:
        dim: Silver vs ``DIM_CUSTOMER_CURRENT``.
        silver_active / target_active: rows with ``is_active`` true.
        silver_deleted / target_deleted: rows with ``is_deleted`` true (soft deletes).
        silver_version: current Silver Delta version.
        synced_version: Silver version recorded in ``CDC_SYNC_STATE`` (None: never synced).
        silver_hash / target_hash: SHA-256 over the sorted per-key hashes of each side.
        gold: one comparison per Gold table that exists.
    """

    dim: TableComparison
    silver_active: int = 0
    target_active: int = 0
    silver_deleted: int = 0
    target_deleted: int = 0
    silver_version: int | None = None
    synced_version: int | None = None
    silver_hash: str = ""
    target_hash: str = ""
    gold: list[TableComparison] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        """True when Silver and every Gold table equal their Snowflake copies."""
        return (
            self.dim.equal
            and self.silver_active == self.target_active
            and self.silver_deleted == self.target_deleted
            and self.silver_hash == self.target_hash
            and all(g.equal for g in self.gold)
        )

    def summary(self) -> str:
        """One line for the CLI and the demo (counts only)."""
        verdict = "EQUAL" if self.equal else "DIFFERENT"
        line = (
            f"snowflake reconciliation: {verdict} — silver {self.dim.source_rows} rows "
            f"({self.silver_active} active, {self.silver_deleted} deleted) vs "
            f"{DIM_TABLE} {self.dim.target_rows} rows ({self.target_active} active, "
            f"{self.target_deleted} deleted); missing {self.dim.missing}, extra {self.dim.extra}, "
            f"mismatched {self.dim.mismatched}; silver v{self.silver_version}, "
            f"synced v{self.synced_version}"
        )
        if self.gold:
            gold_ok = sum(g.equal for g in self.gold)
            line += f"; gold {gold_ok}/{len(self.gold)} tables equal"
        return line

    def log_fields(self) -> dict[str, Any]:
        """Counts, versions, column names and keys only."""
        return {
            "equal": self.equal,
            "silver_rows": self.dim.source_rows,
            "target_rows": self.dim.target_rows,
            "silver_active": self.silver_active,
            "target_active": self.target_active,
            "missing": self.dim.missing,
            "extra": self.dim.extra,
            "mismatched": self.dim.mismatched,
            "mismatched_columns": self.dim.mismatched_columns,
            "silver_version": self.silver_version,
            "synced_version": self.synced_version,
            "gold_unequal": [g.target for g in self.gold if not g.equal],
        }


def _norm(value: Any) -> Any:
    """JSON-stable form: timestamps → epoch microseconds, dates → ISO, decimals → str."""
    if isinstance(value, datetime):
        delta = value - datetime(1970, 1, 1, tzinfo=value.tzinfo)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else str(value.normalize())
    if isinstance(value, float):
        return repr(round(value, 9))
    return value


def row_hash(row: dict[str, Any], columns: tuple[str, ...] | list[str]) -> str:
    """SHA-256 of the normalized values of ``columns`` (hex)."""
    payload = json.dumps([_norm(row[c]) for c in columns], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _combined(hashes: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for key in sorted(hashes):
        digest.update(f"{key}:{hashes[key]};".encode())
    return digest.hexdigest()


def _silver_rows(config: CdcflowConfig) -> tuple[int, dict[str, dict[str, Any]]]:
    table = open_delta(config, SILVER_TABLE)
    frame = to_polars(read_arrow(table, PUBLIC_COLUMNS))
    rows = {
        r["customer_id"]: {c: _norm(r[c]) for c in PUBLIC_COLUMNS}
        for r in frame.iter_rows(named=True)
    }
    return table.version(), rows


def _select_list() -> str:
    parts = []
    for col in PUBLIC_COLUMNS:
        name = col.upper()
        # fakesnow returns NULL TIMESTAMP_TZ values as 1970-01-01; the epoch number is exact on both
        parts.append(f"DATE_PART(EPOCH_MICROSECOND, {name})" if col in TIMESTAMP_COLUMNS else name)
    return ", ".join(parts)


def compare_rows(
    comparison: TableComparison,
    source: dict[str, dict[str, Any]],
    target: dict[str, dict[str, Any]],
    columns: tuple[str, ...] | list[str],
) -> None:
    """Fill ``comparison`` with the differences of two keyed row maps."""
    comparison.source_rows, comparison.target_rows = len(source), len(target)
    missing = sorted(source.keys() - target.keys())
    extra = sorted(target.keys() - source.keys())
    comparison.missing, comparison.extra = len(missing), len(extra)
    mismatched: list[str] = []
    for key in sorted(source.keys() & target.keys()):
        diff = [c for c in columns if source[key][c] != target[key][c]]
        if diff:
            mismatched.append(key)
            for col in diff:
                comparison.mismatched_columns[col] = comparison.mismatched_columns.get(col, 0) + 1
    comparison.mismatched = len(mismatched)
    comparison.sample_keys = (missing + extra + mismatched)[:_SAMPLE]


def _compare_gold(config: CdcflowConfig, cur: Any, name: str, target: str) -> TableComparison:
    comparison = TableComparison(name, target)
    data = read_arrow(open_delta(config, name))
    columns = [f.name for f in data.schema]
    ts_cols = {f.name for f in data.schema if str(f.type).startswith("timestamp")}
    select = ", ".join(
        f"DATE_PART(EPOCH_MICROSECOND, {c.upper()})" if c in ts_cols else c.upper() for c in columns
    )
    try:
        fetched = cur.execute(f"SELECT {select} FROM {target}").fetchall()
    except Exception:  # table not created yet: everything is missing
        fetched = []

    def keyed(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # Gold rows have no single key: the row hash is the key, duplicates numbered
        out: dict[str, dict[str, Any]] = {}
        for row in rows:
            normal = {c: _norm(row[c]) for c in columns}
            base = row_hash(normal, columns)
            n = 0
            while f"{base}#{n}" in out:
                n += 1
            out[f"{base}#{n}"] = normal
        return out

    source = keyed(data.to_pylist())
    target_rows = keyed([dict(zip(columns, r, strict=True)) for r in fetched])
    compare_rows(comparison, source, target_rows, columns)
    comparison.sample_keys = []  # row hashes say nothing useful
    return comparison


def read_state(config: CdcflowConfig) -> pl.DataFrame:
    """``DIM_CUSTOMER_CURRENT`` as a frame shaped like Silver's public columns.

    Returns:
        One row per customer_id; columns ``SILVER_COLUMNS`` in lower case with Silver's types
        (timestamps ``Datetime(us, UTC)``).

    Raises:
        MissingDependencyError: the ``snowflake`` extra is not installed.
    """
    with connect(config) as conn:
        cur = conn.cursor()
        ensure_tables(config, cur)
        fetched = cur.execute(f"SELECT {_select_list()} FROM {DIM_TABLE}").fetchall()
    schema: dict[str, Any] = {
        c: pl.Int64
        if c in TIMESTAMP_COLUMNS
        else (pl.Boolean if sf_type(c) == "BOOLEAN" else pl.String)
        for c in PUBLIC_COLUMNS
    }
    frame = pl.DataFrame(
        [tuple(_norm(v) for v in row) for row in fetched], schema=schema, orient="row"
    )
    return frame.with_columns(
        pl.from_epoch(pl.col(c), time_unit="us").dt.replace_time_zone("UTC")
        for c in TIMESTAMP_COLUMNS
    )


def reconcile_target(config: CdcflowConfig, target: SyncTarget) -> TableComparison:
    """Compare a declared table's Silver with its Snowflake table (one row per key).

    Keys are the key column's value as text (a composite key: the JSON list of its columns'
    values as text); values compare normalized
    (:func:`_norm`; VARIANT and JSON text as parsed JSON).

    Raises:
        TableError: Silver does not exist.
        MissingDependencyError: the ``snowflake`` extra is not installed.
    """
    columns = list(target.names)
    variant = {c for c in columns if target.sf_type(c) == "VARIANT"}
    stamps = {c for c in columns if target.sf_type(c).startswith("TIMESTAMP")}

    def normal(column: str, value: Any) -> Any:
        if column in variant and isinstance(value, str):
            return json.loads(value)
        if column in stamps and isinstance(value, int):
            return value  # epoch microseconds from DATE_PART
        return _norm(value)

    def key_of(row: dict[str, Any]) -> str:
        if len(target.keys) == 1:
            return str(row[target.keys[0]])
        # a JSON list: ("x|y", "z") and ("x", "y|z") stay two keys (joined by "|" they were one)
        return json.dumps([str(row[k]) for k in target.keys], ensure_ascii=False)

    table = open_delta(config, target.silver)
    frame = to_polars(read_arrow(table, columns))
    source = {key_of(r): {c: normal(c, r[c]) for c in columns} for r in frame.iter_rows(named=True)}
    select = ", ".join(
        f"DATE_PART(EPOCH_MICROSECOND, {c.upper()})" if c in stamps else c.upper() for c in columns
    )
    with connect(config) as conn:
        cur = conn.cursor()
        ensure_tables(config, cur, target)
        fetched = cur.execute(f"SELECT {select} FROM {target.table}").fetchall()
    rows = [dict(zip(columns, r, strict=True)) for r in fetched]
    stored = {key_of(r): {c: normal(c, r[c]) for c in columns} for r in rows}
    comparison = TableComparison(target.silver, target.table)
    compare_rows(comparison, source, stored, columns)
    log.info(
        "snowflake reconciliation",
        extra={
            "target": target.table,
            "equal": comparison.equal,
            "missing": comparison.missing,
            "extra": comparison.extra,
            "mismatched": comparison.mismatched,
        },
    )
    return comparison


def reconcile_snowflake(config: CdcflowConfig) -> SnowflakeReconcileReport:
    """Compare Silver with ``DIM_CUSTOMER_CURRENT`` and each Gold table with its ``AGG_*`` copy.

    Args:
        config: the pipeline configuration.

    Returns:
        The report; ``report.equal`` is True only when every count, key, value and hash match.

    Raises:
        TableError: Silver does not exist.
        MissingDependencyError: the ``snowflake`` extra is not installed.
    """
    silver_version, silver = _silver_rows(config)
    with connect(config) as conn:
        cur = conn.cursor()
        ensure_tables(config, cur)
        fetched = cur.execute(f"SELECT {_select_list()} FROM {DIM_TABLE}").fetchall()
        state = cur.execute(
            f"SELECT DELTA_VERSION FROM {STATE_TABLE} WHERE TARGET_TABLE = %s", (DIM_TABLE,)
        ).fetchone()
        gold = [
            _compare_gold(config, cur, name, target)
            for name, target in GOLD_TABLES.items()
            if gold_table_exists(config, name)
        ]
    target = {r[0]: {c: _norm(v) for c, v in zip(PUBLIC_COLUMNS, r, strict=True)} for r in fetched}
    report = SnowflakeReconcileReport(
        dim=TableComparison(SILVER_TABLE, DIM_TABLE),
        silver_version=silver_version,
        synced_version=None if state is None else int(state[0]),
        gold=gold,
    )
    compare_rows(report.dim, silver, target, PUBLIC_COLUMNS)
    report.silver_active = sum(bool(r["is_active"]) for r in silver.values())
    report.target_active = sum(bool(r["is_active"]) for r in target.values())
    report.silver_deleted = sum(bool(r["is_deleted"]) for r in silver.values())
    report.target_deleted = sum(bool(r["is_deleted"]) for r in target.values())
    report.silver_hash = _combined({k: row_hash(v, PUBLIC_COLUMNS) for k, v in silver.items()})
    report.target_hash = _combined({k: row_hash(v, PUBLIC_COLUMNS) for k, v in target.items()})
    log.info("snowflake reconciliation", extra=report.log_fields())
    return report
