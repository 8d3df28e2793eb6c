"""Columnar rendering of the ``flat`` validation rules (:mod:`cdcflow.plan.rules`) for the local
engine: a grammar regex and Polars expressions over the lines, DuckDB for the SHA-256.

One rule set: the rules, their order, reason codes and detail texts are those of
:mod:`cdcflow.plan.rules` (read from there and from the customers contract, not restated), and
the pure-Python :func:`~cdcflow.plan.rules.validate_record` stays the reference. This rendering
decides exactly the lines whose outcome it can compute identically; every other line is
``UNDECIDED`` and goes to the Python rules, as in the Spark rendering
(:mod:`cdcflow.engines.spark.validate`). A line is decided only when all of these hold:

* it matches :data:`SHAPE`, a grammar of the JSON objects this rendering reads: spaces as the
  only whitespace, every field a JSON string without backslash or control character, or null;
  ``metadata`` null or an object whose ``source_table``, ``lsn``, ``tx_id`` are such strings,
  null or JSON integers of at most 18 digits (stored as their text); no other field;
* no key occurs twice;
* the fields that decide the outcome are in their common form: ``operation`` / ``status``
  ASCII (Python's ``upper`` of other letters differs), ``event_timestamp`` of the form
  ``YYYY-MM-DDTHH:MM:SS[.f{1,9}][Z|z|±HH:MM]`` with a valid date, years 0002-9998, the LSN
  PostgreSQL ``X/Y`` (8 hex digits each at most), SQL Server ``a:b:c`` or decimal of at most 18
  digits — unless an earlier rule already decided the line.

Without backslashes a JSON string has no escapes, so its canonical JSON text (orjson, sorted keys,
:func:`~cdcflow.plan.rules.content_hash`) is the value between double quotes, and the canonical
record is assembled from the fields' JSON texts. The customer_id pattern is matched by the same
RE2 object as the Python rules, once per distinct customer_id of the batch.

``tests/test_local_rules.py`` checks that every decided line agrees with the Python rules
(reason, detail, ids, every normalised value, sequence, content hash) on edge cases, messy
hypothesis records and a generated workload, of which only the unparseable lines are left.
"""

from __future__ import annotations

from datetime import UTC

import duckdb
import polars as pl
import pyarrow as pa

from cdcflow.model.events import (
    ATTRIBUTE_BIT,
    ATTRIBUTES,
    OPERATION_ALIASES,
    STATUS_REASON,
    STATUSES,
)
from cdcflow.model.lsn import DECIMAL_PATTERN, MSSQL_PATTERN, PG_PATTERN
from cdcflow.plan.rules import (
    _STATUS_NOT_ALLOWED,
    WHITESPACE,
    RuleSet,
    _later_than,
    _pattern_text,
)

#: The reason of a line this rendering leaves to the Python rules.
UNDECIDED = "UNDECIDED"

#: Top-level fields of the flat format (any other field: the line is left to Python).
FIELDS = ("customer_id", "event_id", "operation", "event_timestamp", *ATTRIBUTES, "metadata")
METADATA = ("source_table", "lsn", "tx_id")

#: Columns of :func:`validate_lines`' result, besides ``pos``.
RESULT_COLUMNS = (
    "reason",
    "detail",
    "reject_event_id",
    "reject_customer_id",
    "event_id",
    "customer_id",
    "operation",
    "event_timestamp",
    *ATTRIBUTES,
    "present_mask",
    "source_table",
    "lsn",
    "lsn_key",
    "tx_id",
    "sequence",
    "content_hash",
)

_ISO = (
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(\.([0-9]{1,9}))?([Zz]|([+-])([0-9]{2}):([0-9]{2}))?$"
)

# The decided shape as a grammar (Rust regex, linear time): a JSON object of known fields whose
# values are strings without escapes or null, and ``metadata`` null or an object of known
# members (strings, null, or integers of at most 18 digits). Whitespace: spaces.
_STRING = r'"[^"\\\x00-\x1f]*"'
_INTEGER = r"(?:0|[1-9][0-9]{0,17})"
_TOP_KEY = '"(?:' + "|".join(n for n in FIELDS if n != "metadata") + ')"'
_META_KEY = '"(?:' + "|".join(METADATA) + ')"'
_META_VALUE = f"(?:{_STRING}|null|{_INTEGER})"
_META_MEMBER = f"{_META_KEY} *: *{_META_VALUE}"
_META = f'"metadata" *: *(?:null|\\{{ *(?:{_META_MEMBER}(?: *, *{_META_MEMBER})*)? *\\}})'
_MEMBER = f"(?:{_TOP_KEY} *: *(?:{_STRING}|null)|{_META})"
SHAPE = f"^ *\\{{ *(?:{_MEMBER}(?: *, *{_MEMBER})*)? *\\}} *$"


def _fragment(name: str, values: str) -> pl.Expr:
    """The JSON text of field ``name`` (a string with its quotes, ``null``, a number), or null
    when the line has no such field (the line has the decided shape: each key at most once)."""
    return pl.col("line").str.extract(f'"{name}" *: *({values})', 1)


def _value(frag: str) -> pl.Expr:
    """A string fragment's value (no escapes: the text between the quotes), else null."""
    col = pl.col(frag)
    return pl.when(col.str.starts_with('"')).then(col.str.slice(1, col.str.len_chars() - 2))


def _json_text(frag: str) -> pl.Expr:
    """A scalar's stored text (``plan.rules._json_text``): a string's value, a number's JSON
    text (the fragment), null for null or a missing field."""
    col = pl.col(frag)
    return pl.when(col.str.starts_with('"')).then(_value(frag)).when(col != "null").then(col)


def _trim(expr: pl.Expr) -> pl.Expr:
    """``str.strip()`` of Python: the characters of ``WHITESPACE``."""
    return expr.str.strip_chars(WHITESPACE)


def _canonical() -> pl.Expr:
    """The record's canonical JSON (orjson, sorted keys, no spaces) from its fragments."""

    def obj(fields: dict[str, pl.Expr]) -> pl.Expr:
        parts = [
            pl.when(expr.is_not_null()).then(pl.lit(f'"{name}":') + expr)
            for name, expr in sorted(fields.items())
        ]
        return pl.lit("{") + pl.concat_str(parts, separator=",", ignore_nulls=True) + pl.lit("}")

    meta = obj({n: pl.col(f"m_{n}") for n in METADATA})
    fields = {n: pl.col(f"f_{n}") for n in FIELDS if n != "metadata"}
    fields["metadata"] = (
        pl.when(pl.col("f_metadata") == "null")
        .then(pl.lit("null"))
        .when(pl.col("f_metadata") == "{")
        .then(meta)
    )
    return obj(fields)


def _front(lines: pl.DataFrame) -> pl.DataFrame:
    """Per line: ``decided`` (the shape), the fragments and the trimmed texts the rules read."""
    shaped = pl.col("line").str.contains(SHAPE)
    # in the shape, ``"name" :`` is a key (a string value holds no quote and is never followed
    # by a colon): more keys than distinct known keys found means a key occurs twice
    df = lines.with_columns(
        shaped.alias("_shaped"), pl.col("line").str.count_matches('" *:').alias("_keys")
    )
    shape = pl.col("_shaped")
    df = df.with_columns(
        *(
            pl.when(shape).then(_fragment(n, f"{_STRING}|null")).alias(f"f_{n}")
            for n in FIELDS
            if n != "metadata"
        ),
        pl.when(shape).then(_fragment("metadata", r"null|\{")).alias("f_metadata"),
        *(pl.when(shape).then(_fragment(n, _META_VALUE)).alias(f"m_{n}") for n in METADATA),
    ).drop("line")
    found = pl.sum_horizontal(
        *(pl.col(f"f_{n}").is_not_null() for n in FIELDS),
        *(pl.col(f"m_{n}").is_not_null() for n in METADATA),
    )
    df = df.with_columns((shape & (pl.col("_keys") == found)).alias("decided")).drop(
        "_shaped", "_keys"
    )
    lsn_frag = pl.col("m_lsn")
    df = df.with_columns(
        _trim(_value("f_customer_id")).alias("cid"),
        _trim(_value("f_event_id")).alias("eid"),
        _value("f_operation").alias("v_op"),
        _trim(_value("f_event_timestamp")).alias("t_ts"),
        pl.when(lsn_frag.str.starts_with('"'))
        .then(_trim(_value("m_lsn")))
        .otherwise(lsn_frag)
        .alias("lsn_text"),
        _value("f_status").alias("v_st"),
        _json_text("m_source_table").alias("source_table"),
        _json_text("m_tx_id").alias("tx_id"),
        _canonical().alias("canonical"),
        *(_value(f"f_{n}").alias(f"v_{n}") for n in ATTRIBUTES),
        *(pl.col(f"f_{n}").is_not_null().alias(f"p_{n}") for n in ATTRIBUTES),
    )
    return df.with_columns(
        pl.col("v_op").str.contains(r"[^\x00-\x7f]").alias("op_wide"),
        _trim(pl.col("v_op")).str.to_uppercase().alias("op_norm"),
        pl.col("v_st").str.contains(r"[^\x00-\x7f]").alias("status_wide"),
        _trim(pl.col("v_st")).str.to_uppercase().alias("status_norm"),
        pl.col("t_ts").alias("ts_text"),
        pl.col("f_customer_id").alias("f_cid"),
        pl.col("f_event_id").alias("f_eid"),
        pl.col("f_operation").alias("f_op"),
        pl.col("f_event_timestamp").alias("f_ts"),
        pl.col("f_metadata").alias("f_meta"),
        pl.col("m_lsn").alias("f_lsn"),
    )


def _timestamps(df: pl.DataFrame) -> pl.DataFrame:
    """``ts_utc`` (naive UTC, microseconds) and ``nanos`` for the common ISO-8601 form, else
    ``ts_utc`` null (the line is left to Python unless an earlier rule decides it)."""
    parts = pl.col("t_ts").str.extract_groups(_ISO)
    df = df.with_columns(parts.alias("_iso"))
    g = {i: pl.col("_iso").struct.field(str(i)) for i in range(1, 13)}
    as_int = {i: g[i].cast(pl.Int32, strict=False) for i in g}
    ok = (
        as_int[1].is_between(2, 9998)
        & (as_int[4] <= 23)
        & (as_int[5] <= 59)
        & (as_int[6] <= 59)
        & (g[10].is_null() | ((as_int[11] <= 23) & (as_int[12] <= 59)))
    )
    base = pl.concat_str(
        g[1],
        pl.lit("-"),
        g[2],
        pl.lit("-"),
        g[3],
        pl.lit(" "),
        g[4],
        pl.lit(":"),
        g[5],
        pl.lit(":"),
        g[6],
    )
    naive = base.str.strptime(pl.Datetime("us"), "%Y-%m-%d %H:%M:%S", strict=False)
    micros = g[8].fill_null("").str.slice(0, 6).str.pad_end(6, "0").cast(pl.Int64)
    sign = pl.when(g[10] == "-").then(-1).otherwise(1)
    offset = pl.when(g[10].is_null()).then(0).otherwise((as_int[11] * 60 + as_int[12]) * sign)
    utc = naive + pl.duration(microseconds=micros) - pl.duration(minutes=offset)
    nanos = (
        pl.when(g[8].str.len_chars() > 6)
        .then(g[8].str.slice(6, 3).str.pad_end(3, "0"))
        .otherwise(pl.lit("000"))
    )
    return df.with_columns(
        pl.when(ok).then(utc).alias("ts_utc"), nanos.fill_null("000").alias("nanos")
    ).drop("_iso")


def _lsn(df: pl.DataFrame) -> pl.DataFrame:
    """``lsn_key`` (32 hex digits) for the narrow notations, ``lsn_bad`` for a string that is
    no notation at all (``INVALID_LSN``); any other LSN leaves ``lsn_key`` null."""
    text = pl.col("lsn_text")
    is_str = pl.col("f_lsn").str.starts_with('"')
    pg = text.str.extract_groups(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
    ms = text.str.extract_groups(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,4})$")
    df = df.with_columns(pg.alias("_pg"), ms.alias("_ms"))
    pad = lambda e, n: e.str.to_lowercase().str.pad_start(n, "0")  # noqa: E731
    pg_key = pl.lit("0" * 16) + pad(pl.col("_pg").struct[0], 8) + pad(pl.col("_pg").struct[1], 8)
    ms_key = (
        pl.lit("0" * 12)
        + pad(pl.col("_ms").struct[0], 8)
        + pad(pl.col("_ms").struct[1], 8)
        + pad(pl.col("_ms").struct[2], 4)
    )
    decimal = text.str.contains(r"^[0-9]{1,18}$") & (is_str | pl.col("f_lsn").is_not_null())
    return df.with_columns(
        pl.when(pl.col("_pg").struct[0].is_not_null())
        .then(pg_key)
        .when(pl.col("_ms").struct[0].is_not_null())
        .then(ms_key)
        .alias("lsn_key"),
        pl.when(decimal).then(text).alias("_decimal"),
        (
            is_str
            & ~text.str.contains(PG_PATTERN)
            & ~text.str.contains(MSSQL_PATTERN)
            & ~text.str.contains(DECIMAL_PATTERN)
        ).alias("lsn_bad"),
    ).drop("_pg", "_ms")


_HASH_SQL = (
    "SELECT sha256(canonical) AS content_hash, "
    "format('{:032x}', TRY_CAST(_decimal AS UBIGINT)) AS _decimal_key FROM t"
)


def _hashes(df: pl.DataFrame) -> pl.DataFrame:
    """The content hash (SHA-256 of the canonical JSON) and the decimal LSNs' keys, by DuckDB."""
    con = _connection().cursor()
    try:
        con.register("t", df.select("canonical", "_decimal").to_arrow())
        out = con.sql(_HASH_SQL).to_arrow_table()
    finally:
        con.close()
    found = pl.from_arrow(out)
    assert isinstance(found, pl.DataFrame)
    return df.with_columns(
        found["content_hash"],
        pl.coalesce("lsn_key", found["_decimal_key"]).alias("lsn_key"),
    ).drop("canonical", "_decimal")


_CONNECTION: list[duckdb.DuckDBPyConnection] = []


def _connection() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB database per process (a cursor per call: its own connection)."""
    if not _CONNECTION:
        _CONNECTION.append(duckdb.connect())
    return _CONNECTION[0]


def _blank(frag: str, value: str) -> pl.Expr:
    """Missing, null or (a string) blank after trimming."""
    return pl.col(frag).is_null() | (pl.col(frag) == "null") | (pl.col(value) == "")


def validate_lines(lines: pa.Table, rules: RuleSet) -> pl.DataFrame:
    """Validate a batch's lines by the flat rules, in columns.

    Args:
        lines: one row per non-blank line: ``pos`` (int64, unique) and ``line`` (the text,
            valid UTF-8, without its line terminator).
        rules: the batch's rule parameters (customer_id pattern, processing time, clock skew).

    Returns:
        One row per line: ``pos`` and :data:`RESULT_COLUMNS`. ``reason`` is null for an
        accepted line, a reason code of :data:`cdcflow.plan.rules.REASONS` for a rejected one
        (with ``detail`` and the ``reject_*`` ids of its :class:`~cdcflow.plan.rules.Rejection`),
        or :data:`UNDECIDED`. The event columns are set for accepted lines only:
        ``event_timestamp`` timestamp[us, UTC], ``present_mask`` int32, ``sequence`` the
        total-order sequence (:func:`cdcflow.model.events.sequence_of`).
    """
    df = pl.from_arrow(lines)
    assert isinstance(df, pl.DataFrame)
    df = _hashes(_lsn(_timestamps(_front(df))))
    return _cascade(df, rules)


def _cascade(df: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    cids = df.filter(pl.col("decided") & pl.col("cid").is_not_null() & (pl.col("cid") != ""))
    unique = cids["cid"].unique().to_list()
    matches = pl.DataFrame(
        {"cid": unique, "cid_ok": [rules.customer_id_matches(c) for c in unique]},
        schema={"cid": pl.String, "cid_ok": pl.Boolean},
    )
    df = df.join(matches, on="cid", how="left")
    aliases = pl.DataFrame(
        {
            "op_norm": list(OPERATION_ALIASES),
            "operation": [o.value for o in OPERATION_ALIASES.values()],
        }
    )
    df = df.join(aliases, on="op_norm", how="left")
    latest = (rules.processing_time + rules.max_clock_skew).astimezone(UTC).replace(tzinfo=None)
    later = _later_than(rules)
    is_delete = pl.col("operation") == "DELETE"
    status_present = pl.col("f_status").is_not_null()
    status_ok = pl.col("status_norm").is_in(list(STATUSES)) & (pl.col("f_status") != "null")
    eid = pl.col("eid")
    cid = pl.col("cid")

    # (condition, reason, detail, event_id, customer_id) in the rules' order; UNDECIDED marks a
    # rule this rendering cannot decide for the line
    steps: list[tuple[pl.Expr, str, str | None, pl.Expr, pl.Expr]] = [
        (~pl.col("decided"), UNDECIDED, None, pl.lit(None), pl.lit(None)),
        (
            _blank("f_cid", "cid"),
            "NULL_CUSTOMER_ID",
            "customer_id is missing, null or blank",
            pl.lit(None),
            pl.lit(None),
        ),
        (
            ~pl.col("cid_ok"),
            "INVALID_CUSTOMER_ID_FORMAT",
            f"customer_id does not match processing.customer_id_pattern {_pattern_text(rules)!r}",
            pl.lit(None),
            pl.lit(None),
        ),
        (
            _blank("f_eid", "eid"),
            "NULL_EVENT_ID",
            "event_id is missing, null or blank",
            pl.lit(None),
            cid,
        ),
        (
            pl.col("f_op").is_not_null() & (pl.col("f_op") != "null") & pl.col("op_wide"),
            UNDECIDED,
            None,
            pl.lit(None),
            pl.lit(None),
        ),
        (pl.col("f_op").is_null(), "INVALID_OPERATION", "operation is missing", eid, cid),
        (
            pl.col("f_op") == "null",
            "INVALID_OPERATION",
            "operation is null, not a string",
            eid,
            cid,
        ),
        (
            pl.col("operation").is_null(),
            "INVALID_OPERATION",
            "operation is not INSERT, UPDATE, DELETE or an alias (C, R, I, U, D)",
            eid,
            cid,
        ),
        (
            _blank("f_ts", "ts_text"),
            "NULL_EVENT_TIMESTAMP",
            "event_timestamp is missing, null or blank",
            eid,
            cid,
        ),
        (pl.col("ts_utc").is_null(), UNDECIDED, None, pl.lit(None), pl.lit(None)),
        (
            pl.col("ts_utc") > latest,
            "FUTURE_EVENT_TIMESTAMP",
            f"event_timestamp is {later}",
            eid,
            cid,
        ),
        (
            pl.col("f_meta").is_null() | (pl.col("f_meta") == "null") | _blank("f_lsn", "lsn_text"),
            "NULL_LSN",
            "metadata.lsn is missing, null or blank",
            eid,
            cid,
        ),
        (
            pl.col("lsn_bad"),
            "INVALID_LSN",
            "metadata.lsn: not a supported LSN notation (PostgreSQL X/Y, SQL Server "
            "xxxxxxxx:xxxxxxxx:xxxx or a decimal integer)",
            eid,
            cid,
        ),
        (pl.col("lsn_key").is_null(), UNDECIDED, None, pl.lit(None), pl.lit(None)),
        (
            ~is_delete & status_present & (pl.col("f_status") != "null") & pl.col("status_wide"),
            UNDECIDED,
            None,
            pl.lit(None),
            pl.lit(None),
        ),
        (~is_delete & status_present & ~status_ok, STATUS_REASON, _STATUS_NOT_ALLOWED, eid, cid),
        (
            (pl.col("operation") == "INSERT") & ~status_present,
            STATUS_REASON,
            "an INSERT must carry a status",
            eid,
            cid,
        ),
    ]
    reason: pl.Expr = pl.lit(None, pl.String)
    detail: pl.Expr = pl.lit(None, pl.String)
    r_eid: pl.Expr = pl.lit(None, pl.String)
    r_cid: pl.Expr = pl.lit(None, pl.String)
    for cond, code, text, ev, cu in reversed(steps):
        hit = cond.fill_null(False)
        reason = pl.when(hit).then(pl.lit(code)).otherwise(reason)
        detail = pl.when(hit).then(pl.lit(text, pl.String)).otherwise(detail)
        r_eid = pl.when(hit).then(ev.cast(pl.String)).otherwise(r_eid)
        r_cid = pl.when(hit).then(cu.cast(pl.String)).otherwise(r_cid)
    df = df.with_columns(
        reason.alias("reason"),
        detail.alias("detail"),
        r_eid.alias("reject_event_id"),
        r_cid.alias("reject_customer_id"),
    )
    ok = pl.col("reason").is_null()
    keep = ok & ~is_delete
    values = []
    mask: pl.Expr = pl.lit(0, pl.Int32)
    for name in ATTRIBUTES:
        present = keep & pl.col(f"p_{name}")
        value = pl.col("status_norm") if name == "status" else pl.col(f"v_{name}")
        values.append(pl.when(present).then(value).alias(name))
        mask = mask + pl.when(present).then(pl.lit(ATTRIBUTE_BIT[name], pl.Int32)).otherwise(0)
    ts = pl.col("ts_utc").dt.replace_time_zone("UTC").dt.cast_time_unit("us")
    sequence = pl.concat_str(
        pl.col("lsn_key"),
        pl.lit("."),
        ts.dt.strftime("%Y%m%d%H%M%S%6f"),
        pl.col("nanos"),
        pl.lit("."),
        eid,
    )
    return df.select(
        "pos",
        "reason",
        "detail",
        "reject_event_id",
        "reject_customer_id",
        pl.when(ok).then(eid).alias("event_id"),
        pl.when(ok).then(cid).alias("customer_id"),
        pl.when(ok).then(pl.col("operation")).alias("operation"),
        pl.when(ok).then(ts).alias("event_timestamp"),
        *values,
        pl.when(ok).then(mask).cast(pl.Int32).alias("present_mask"),
        pl.when(ok).then(pl.col("source_table")).alias("source_table"),
        pl.when(ok).then(pl.col("lsn_text")).alias("lsn"),
        pl.when(ok).then(pl.col("lsn_key")).alias("lsn_key"),
        pl.when(ok).then(pl.col("tx_id")).alias("tx_id"),
        pl.when(ok).then(sequence).alias("sequence"),
        pl.when(ok).then(pl.col("content_hash")).alias("content_hash"),
    )


__all__ = ["FIELDS", "RESULT_COLUMNS", "UNDECIDED", "validate_lines"]
