"""The validation rules of :mod:`cdcflow.plan.rules`, rendered as Spark column expressions.

The hot path of the Spark engine runs no Python: landing files are split into lines with
``split``/``posexplode``, each line is parsed with ``try_parse_json`` (Spark's VARIANT) and
checked by one ``CASE`` chain that follows ``REASONS`` in order, built from the same definitions
the local engine uses (operation aliases and statuses of :mod:`cdcflow.model.events`, the LSN
notations of :mod:`cdcflow.model.lsn`, the whitespace set and customer_id pattern of
:mod:`cdcflow.plan.rules`). An accepted line is normalised here too: trimmed ids, operation,
UTC timestamp, attribute JSON text, present mask, LSN key, sequence and the SHA-256 content hash
of the canonical JSON (keys sorted, no whitespace; Spark's variant ``to_json``).

The rendering is conservative: it accepts a line only when it can reproduce the shared rules
exactly. Every other line gets a reason, and the engine hands it to the shared Python rules
(:func:`cdcflow.plan.rules.validate_record`) for the final reason and detail. These are the
exceptions, not the hot path: rejected lines (quarantine), and lines this rendering does not decide
(reason ``UNDECIDED``): numbers with a fraction or exponent or wider than 64 bits, escaped control
characters or surrogates, characters both in U+E000..U+FFFF and above U+FFFF (key order),
timestamps outside the ``YYYY-MM-DD[T ]hh:mm:ss[.f*][Z|z|±hh:mm]`` / epoch-milliseconds shapes
(a leap second ``:60``, a leading byte order mark) or outside years 1000..9999 (epoch
milliseconds beyond 9999 are decided here: ``FUTURE_EVENT_TIMESTAMP``), and LSNs beyond 64 bits.

Line splitting follows :func:`cdcflow.sources.files.read_records`: lines end at ``\\n``, trailing
``\\r``/``\\n`` are removed, lines holding only ASCII whitespace are skipped, numbering is 1-based.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from cdcflow.errors import ConfigError
from cdcflow.model.events import (
    ATTRIBUTE_BIT,
    ATTRIBUTES,
    OPERATION_ALIASES,
    STATUS_REASON,
    STATUSES,
)
from cdcflow.model.lsn import DECIMAL_PATTERN, LSN_KEY_WIDTH, MSSQL_PATTERN, PG_PATTERN
from cdcflow.plan.rules import WHITESPACE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Reason of a line this rendering leaves to the shared Python rules.
UNDECIDED = "UNDECIDED"

_WS = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]"
_STRIP = f"^{_WS}+|{_WS}+\\z"
_ISO = (
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2})[T ]([0-9]{2}:[0-9]{2}:[0-5][0-9])"
    r"(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})?$"
)
_EPOCH_TEXT = r"^-?[0-9]{10,15}$"
#: JSON escapes whose canonical form differs between JSON writers (control characters) or that
#: Spark decodes lossily (surrogates).
_HARD_ESCAPES = r"\\u(00[01]|[dD][89a-fA-F])"
#: Variant types whose canonical JSON text may differ between writers: fractions/exponents,
#: integers beyond 64 bits, and VARIANT (a mixed array, whose elements the schema does not show).
_INEXACT_NUMBERS = "DOUBLE|FLOAT|DECIMAL|VARIANT"
#: Nesting depth (``<`` in the schema) above which the Python parser's recursion limit may apply.
_MAX_DEPTH = 64
#: Characters U+E000..U+FFFF and above U+FFFF in one line: object keys might then sort
#: differently in UTF-16 (Spark's variant) and in code points (the canonical JSON of the hash).
_MIXED_PLANES = (
    "[\\x{E000}-\\x{FFFF}]|\\\\u[eEfF][0-9a-fA-F]{3}",  # the character, or its JSON escape
    "[\\x{10000}-\\x{10FFFF}]",
)
#: Epoch-millisecond range decided here: years 1000 to 9999.
_MIN_MS, _MAX_MS = -30_610_224_000_000, 253_402_300_799_999


def _lit(value: object) -> Column:
    from pyspark.sql import functions as F

    return F.lit(value)


def strip(column: Column) -> Column:
    """``str.strip()``: remove leading/trailing ``WHITESPACE``."""
    from pyspark.sql import functions as F

    return F.regexp_replace(column, _STRIP, "")


class _Field:
    """One JSON field of the record (a variant path), materialised as columns ``_<tag>_*``.

    ``type`` is the variant type name (``STRING``, ``BIGINT``, ``BOOLEAN``, ``VOID`` for JSON
    null, ``OBJECT<…>``, ``ARRAY<…>``, ``DOUBLE``, ``DECIMAL(p,s)``), null when the field is
    missing; ``text`` is the value as text (JSON text for numbers and booleans); ``trimmed`` is
    ``text`` after ``str.strip()``.
    """

    def __init__(self, tag: str, path: str) -> None:
        self.tag, self.path = tag, path

    def extract(self, record: Column) -> list[Column]:
        """The columns ``_<tag>_t`` (type) and ``_<tag>_s`` (text) from the record."""
        from pyspark.sql import functions as F

        value = F.variant_get(record, self.path, "variant")
        kind = F.when(value.isNotNull(), F.coalesce(F.schema_of_variant(value), _lit("VOID")))
        return [
            kind.alias(f"_{self.tag}_t"),
            F.try_variant_get(record, self.path, "string").alias(f"_{self.tag}_s"),
        ]

    def trim(self) -> Column:
        """The column ``_<tag>_x`` (trimmed text)."""
        return strip(self.text).alias(f"_{self.tag}_x")

    @property
    def type(self) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"_{self.tag}_t")

    @property
    def text(self) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"_{self.tag}_s")

    @property
    def trimmed(self) -> Column:
        from pyspark.sql import functions as F

        return F.col(f"_{self.tag}_x")

    @property
    def missing(self) -> Column:
        return self.type.isNull()

    @property
    def null(self) -> Column:
        return self.missing | (self.type == "VOID")

    @property
    def is_string(self) -> Column:
        return self.type == "STRING"

    @property
    def is_int(self) -> Column:
        return self.type == "BIGINT"

    @property
    def structured(self) -> Column:
        from pyspark.sql import functions as F

        return F.coalesce(
            self.type.startswith("OBJECT") | self.type.startswith("ARRAY"), _lit(False)
        )

    @property
    def blank(self) -> Column:
        return self.null | (self.is_string & (self.trimmed == ""))


def java_pattern(customer_id_pattern: str) -> str:
    """``processing.customer_id_pattern`` as a Java regex that must match the whole value.

    Flags make Java read the common syntax as RE2 does (:class:`cdcflow.plan.rules.
    CustomerIdPattern`): ``(?d)`` — only ``\\n`` ends a line, so ``.`` matches U+0085, U+2028 and
    U+2029; ``(?u)`` — ``(?i)`` folds case by Unicode. ``\\d``, ``\\w``, ``\\s`` stay ASCII in
    both (no ``(?U)``).
    """
    return f"(?du)^(?:{customer_id_pattern})\\z"


#: A quantifier: ``*``, ``+``, ``?`` or ``{n}``, ``{n,}``, ``{n,m}`` (then an optional ``?``/``+``).
_QUANTIFIER = re.compile(r"[*+?]|\{(\d+)(,(\d*))?\}")


def backtracking_risk(pattern: str) -> str | None:
    """Why Java's backtracking regex could take exponential time on ``pattern``, or None.

    The shapes that do it are a repeated group holding a variable repetition or an alternation
    (``(a+)+``, ``(a|a)*``, ``(\\w+\\s?)+``, ``(a{1,3}){5}``), and several unbounded
    repetitions in a row (``a*a*a*…``, ``(a+)(a+)…``): on a near-miss input Java tries every way
    to split the text between them. A pattern may therefore hold at most one unbounded
    repetition (``*``, ``+``, ``{n,}``): bound the others (``[A-Z]{1,10}-[0-9]+``). The check
    reads the pattern text (groups, classes, escapes, ``\\Q…\\E``, quantifiers) and errs on the
    safe side: ``(a|b)+`` is refused although it is harmless — write ``[ab]+``.
    """
    # one frame per open group: does it (or a group inside it) vary in length?
    frames: list[bool] = [False]
    unbounded: list[int] = []  # positions of *, + and {n,}: two of them can overlap
    last_group_varies: bool | None = None  # the atom just closed was a group: did it vary?
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        atom_group: bool | None = None
        if c == "\\":
            if pattern.startswith("\\Q", i):
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
            else:
                i += 2
        elif c == "[":
            i = _class_end(pattern, i)
        elif c == "(":
            frames.append(False)
            i += 1
            if pattern.startswith("?", i):  # (?:…), (?i), (?P<n>…), (?<n>…): skip the prefix
                i += 1
                while (
                    i < n
                    and pattern[i] not in ":)"
                    and not (pattern[i] == ">" and pattern[i - 1] != "?")
                ):
                    i += 1
                if i < n and pattern[i] in ":>":
                    i += 1
            continue
        elif c == ")":
            varies = frames.pop() if len(frames) > 1 else False
            frames[-1] = frames[-1] or varies
            atom_group = varies
            i += 1
        elif c == "|":
            frames[-1] = True
            i += 1
        else:
            match = _QUANTIFIER.match(pattern, i)
            if match:
                low, comma, high = match.group(1), match.group(2), match.group(3)
                if match.group(0) in "*+":
                    at_most: int | None = None
                elif match.group(0) == "?":
                    at_most = 1
                else:
                    at_most = int(high) if comma and high else None if comma else int(low)
                variable = match.group(0) in "*+?" or (comma is not None and high != low)
                if at_most is None:
                    unbounded.append(i)
                if last_group_varies and (at_most is None or at_most > 1):
                    return (
                        "a repeated group holds a variable repetition or an alternation "
                        f"(near {pattern[max(0, i - 12) : i + len(match.group(0))]!r})"
                    )
                if variable:
                    frames[-1] = True
                i = match.end()
                if i < n and pattern[i] in "?+":  # lazy / possessive suffix
                    i += 1
                last_group_varies = None
                continue
            i += 1
        last_group_varies = atom_group
    if len(unbounded) > 1:
        near = pattern[max(0, unbounded[1] - 12) : unbounded[1] + 1]
        return (
            "two unbounded repetitions (*, +, {n,}) can split one run of characters between "
            f"them (near {near!r}; a*a*…a*$ takes exponential-like time on 30 characters)"
        )
    return None


def _class_end(pattern: str, start: int) -> int:
    """Index after the character class opening at ``start`` (nested ``[...]`` and ``[:alpha:]``)."""
    i, n, depth = start + 1, len(pattern), 1
    if i < n and pattern[i] == "^":
        i += 1
    if i < n and pattern[i] == "]":  # a leading ] is a literal
        i += 1
    while i < n and depth:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        i += 1
    return i


def check_pattern(spark: SparkSession, customer_id_pattern: str) -> None:
    """Fail early when Java regex cannot compile the customer_id pattern, or could take
    exponential time on it (:func:`backtracking_risk`).

    The local engine matches the pattern with RE2, in linear time whatever the pattern; Java's
    engine backtracks, so a pattern like ``^(a+)+$`` against ``"a" * 40 + "!"`` would hang a
    micro-batch (and every re-run of it). Such patterns are refused at engine start.

    Raises:
        ConfigError: the pattern uses Python-only syntax (e.g. ``(?P<name>…)``) or risks
            catastrophic backtracking; names the key.
    """
    risk = backtracking_risk(customer_id_pattern)
    if risk:
        raise ConfigError(
            f"processing.customer_id_pattern: {risk}, which can make Java's backtracking regex "
            "(the spark engine) take exponential time on one record; rewrite it without a "
            "repeated variable group and with at most one unbounded repetition (e.g. a+ for "
            "(a+)+, [ab]+ for (a|b)+, [A-Z]{1,10}-[0-9]+ for [A-Z]+-[0-9]+)"
        )
    try:
        spark.range(1).select(_lit("C-1").rlike(java_pattern(customer_id_pattern))).collect()
    except Exception as exc:
        raise ConfigError(
            "processing.customer_id_pattern: not a valid Java regular expression for the spark "
            f"engine ({str(exc).splitlines()[0][:160]})"
        ) from exc


def split_lines(files: DataFrame) -> DataFrame:
    """Landing files → one row per non-blank line.

    Args:
        files: one row per UTF-8 landing file: ``source_file`` (local path), ``file_mtime_ms``
            (epoch milliseconds), ``content`` (binary, not compressed).

    Returns:
        One row per non-blank line: source_file, source_line (1-based), file_mtime_ms,
        file_name, raw (the line without its end-of-line characters).
    """
    from pyspark.sql import functions as F

    lines = files.select(
        "source_file",
        "file_mtime_ms",
        F.posexplode(F.split(F.col("content").cast("string"), "\n", -1)).alias("pos", "line"),
    )
    # \z, not $: Java's $ also matches before a final \u0085/\u2028/\u2029
    return lines.filter(~F.col("line").rlike(r"^[ \t\n\r\x0B\f]*\z")).select(
        "source_file",
        (F.col("pos") + 1).cast("long").alias("source_line"),
        "file_mtime_ms",
        F.element_at(F.split("source_file", "/"), -1).alias("file_name"),
        F.regexp_replace("line", "[\r\n]+\\z", "").alias("raw"),
    )


def _timestamp(ts: _Field) -> tuple[Column, Column, Column, Column]:
    """(UTC timestamp or null, sub-microsecond nanos as 3 digits, shape recognised, epoch
    milliseconds beyond year 9999)."""
    from pyspark.sql import functions as F

    text = ts.trimmed
    iso = text.rlike(_ISO)
    fraction = F.coalesce(F.regexp_extract(text, _ISO, 3), _lit(""))
    offset = F.regexp_extract(text, _ISO, 4)
    stamp = F.concat(
        F.regexp_extract(text, _ISO, 1),
        _lit(" "),
        F.regexp_extract(text, _ISO, 2),
        _lit("."),
        F.rpad(F.substring(fraction, 1, 6), 6, "0"),
        F.when(offset.isin("", "Z", "z"), _lit("+00:00")).otherwise(offset),
    )
    epoch_text = ts.is_string & text.rlike(_EPOCH_TEXT)
    millis = F.when(ts.is_int, ts.text).when(epoch_text, text).cast("long")
    in_range = millis.between(_MIN_MS, _MAX_MS)
    value = (
        F.when(ts.is_string & iso, F.try_to_timestamp(stamp, _lit("yyyy-MM-dd HH:mm:ss.SSSSSSXXX")))
        .when(in_range, F.timestamp_millis(F.when(in_range, millis)))
        .otherwise(None)
    )
    nanos = F.when(ts.is_string & iso, F.rpad(F.substring(fraction, 7, 3), 3, "0")).otherwise(
        _lit("000")
    )
    value = F.when(F.year(value).between(1000, 9999), value)  # else left to Python
    beyond = F.coalesce(millis > _MAX_MS, _lit(False))
    return value, nanos, (ts.is_string & (iso | epoch_text)) | ts.is_int, beyond


def _hex(decimal_text: Column) -> Column:
    from pyspark.sql import functions as F

    return F.lower(F.conv(decimal_text, 10, 16))


def _lsn_key(lsn: _Field) -> tuple[Column, Column]:
    """(32-hex-digit LSN key or null when not decided here, notation recognised)."""
    from pyspark.sql import functions as F

    text = lsn.trimmed
    pg, mssql, decimal = (
        text.rlike(PG_PATTERN),
        text.rlike(MSSQL_PATTERN),
        text.rlike(DECIMAL_PATTERN),
    )
    high = F.regexp_replace(F.regexp_extract(text, PG_PATTERN, 1), "^0+", "")
    low = F.regexp_replace(F.regexp_extract(text, PG_PATTERN, 2), "^0+", "")
    pg_value = F.coalesce(F.conv(F.when(high == "", "0").otherwise(high), 16, 10), _lit("0")).cast(
        "decimal(38,0)"
    ) * 4294967296 + F.conv(F.when(low == "", "0").otherwise(low), 16, 10).cast("decimal(38,0)")
    pg_key = F.when((F.length(high) <= 8) & (F.length(low) <= 8), _hex(pg_value.cast("string")))
    mssql_key = F.concat(
        *[
            F.lpad(F.lower(F.regexp_extract(text, MSSQL_PATTERN, i)), width, "0")
            for i, width in ((1, 20), (2, 8), (3, 4))
        ]
    )
    digits = F.regexp_replace(text, "^0+", "")
    decimal_key = F.when(F.length(digits) <= 18, _hex(F.when(digits == "", "0").otherwise(digits)))
    int_key = F.when(lsn.text.try_cast("long") >= 0, _hex(lsn.text))
    key = (
        F.when(lsn.is_int, int_key)
        .when(lsn.is_string & pg, pg_key)
        .when(lsn.is_string & mssql, mssql_key)
        .when(lsn.is_string & decimal, decimal_key)
    )
    recognised = (lsn.is_int & (lsn.text.try_cast("long") >= 0)) | (
        lsn.is_string & (pg | mssql | decimal)
    )
    return F.lpad(key, LSN_KEY_WIDTH, "0"), recognised


def validate_lines(
    lines: DataFrame,
    customer_id_pattern: str,
    processing_time: datetime,
    max_clock_skew: timedelta,
) -> DataFrame:
    """Apply the rules to lines; see the module doc.

    Args:
        lines: one row per line (columns of :func:`split_lines`; ``raw`` is the line text).
        customer_id_pattern: ``processing.customer_id_pattern`` (Python ``re`` syntax; rendered
            for Java regex, which matches a subset of the same strings for the usual patterns).
        processing_time: the micro-batch's processing time (UTC).
        max_clock_skew: ``processing.max_clock_skew``.

    Returns:
        The input columns plus ``reason`` (null = accepted, else a ``REASONS`` code or
        ``UNDECIDED``) and, for accepted lines, the normalised columns of
        :data:`cdcflow.engines.spark.parse.RECORD_FIELDS`.
    """
    from pyspark.sql import functions as F

    raw = F.col("raw")
    as_array = F.try_parse_json(F.concat(_lit("["), raw, _lit("]")))
    # a record is exactly one JSON value: both wrappers parse only when nothing follows it
    as_member = F.try_parse_json(F.concat(_lit('{"x":'), raw, _lit("}")))
    parsed = lines.withColumn(
        "_record",
        F.when(as_member.isNotNull(), F.variant_get(as_array, "$[0]", "variant")),
    )
    record = F.col("_record")
    cid, eid = _Field("cid", "$.customer_id"), _Field("eid", "$.event_id")
    op, ts = _Field("op", "$.operation"), _Field("ts", "$.event_timestamp")
    lsn, status = _Field("lsn", "$.metadata.lsn"), _Field("status", "$.status")
    meta = {name: _Field(name, f"$.metadata.{name}") for name in ("source_table", "tx_id")}
    attrs = {name: _Field(name, f"$.{name}") for name in ATTRIBUTES[:-1]}
    attrs["status"] = status
    trimmed = (cid, eid, op, ts, lsn, status)
    every = {f.tag: f for f in (*trimmed, *meta.values(), *attrs.values())}.values()
    fields = parsed.select(
        *lines.columns,
        "_record",
        F.schema_of_variant(record).alias("_schema"),
        *[column for field in every for column in field.extract(record)],
    ).select("*", *[field.trim() for field in trimmed])

    aliases = F.create_map(*[_lit(x) for kv in OPERATION_ALIASES.items() for x in kv])
    operation = F.when(op.is_string, F.element_at(aliases, F.upper(op.trimmed)))
    event_ts, nanos, ts_shape, beyond = _timestamp(ts)
    key, lsn_shape = _lsn_key(lsn)
    derived = fields.select(
        "*",
        operation.alias("_operation"),
        event_ts.alias("_event_ts"),
        nanos.alias("_nanos"),
        ts_shape.alias("_ts_shape"),
        beyond.alias("_ts_beyond"),
        key.alias("_lsn_key"),
        lsn_shape.alias("_lsn_shape"),
    )
    operation, event_ts, key = F.col("_operation"), F.col("_event_ts"), F.col("_lsn_key")
    limit = _lit(processing_time + max_clock_skew).cast("timestamp")
    pattern = java_pattern(customer_id_pattern)
    norm_status = F.upper(status.trimmed)
    upsert = operation != "DELETE"

    def structured(group: list[_Field]) -> Column:
        found = _lit(False)
        for field in group:
            found = found | field.structured
        return found

    # SCHEMA_MISMATCH looks at event_id and metadata.source_table/tx_id, plus the attributes of
    # an INSERT/UPDATE (a DELETE's attribute values are ignored)
    shape_error = structured([eid, *meta.values()]) | (upsert & structured(list(attrs.values())))

    reason = (
        F.when(record.isNull(), _lit(UNDECIDED))  # invalid, or valid with duplicate keys
        .when(~F.col("_schema").startswith("OBJECT"), _lit("MALFORMED_JSON"))
        .when(
            F.col("_schema").rlike(_INEXACT_NUMBERS)
            | raw.rlike(_HARD_ESCAPES)
            | (raw.rlike(_MIXED_PLANES[0]) & raw.rlike(_MIXED_PLANES[1]))
            | (
                F.length("_schema") - F.length(F.regexp_replace("_schema", "<", ""))
                > _lit(_MAX_DEPTH)
            ),
            _lit(UNDECIDED),
        )
        .when(cid.blank, _lit("NULL_CUSTOMER_ID"))
        .when(~cid.is_string | ~cid.trimmed.rlike(pattern), _lit("INVALID_CUSTOMER_ID_FORMAT"))
        .when(eid.blank, _lit("NULL_EVENT_ID"))
        .when(operation.isNull(), _lit("INVALID_OPERATION"))
        .when(ts.blank, _lit("NULL_EVENT_TIMESTAMP"))
        .when(~F.col("_ts_shape") & ~ts.is_string, _lit("INVALID_EVENT_TIMESTAMP"))
        .when(F.col("_ts_beyond"), _lit("FUTURE_EVENT_TIMESTAMP"))  # after year 9999
        .when(event_ts.isNull(), _lit(UNDECIDED))
        .when(event_ts > limit, _lit("FUTURE_EVENT_TIMESTAMP"))
        .when(lsn.blank, _lit("NULL_LSN"))
        .when(~F.col("_lsn_shape") & (lsn.is_string | lsn.is_int), _lit("INVALID_LSN"))
        .when((lsn.type == "BOOLEAN") | lsn.structured, _lit("INVALID_LSN"))
        .when(key.isNull(), _lit(UNDECIDED))
        .when(
            upsert
            & F.when(status.missing, operation == "INSERT").otherwise(
                ~status.is_string | ~norm_status.isin(*STATUSES)
            ),
            _lit(STATUS_REASON),
        )
        .when(shape_error, _lit("SCHEMA_MISMATCH"))
    )
    event_id = F.when(eid.is_string, eid.trimmed).otherwise(eid.text)
    values = {name: F.when(upsert & ~field.missing, field.text) for name, field in attrs.items()}
    values["status"] = F.when(upsert & ~status.missing, norm_status)
    mask = _lit(0)
    for name, field in attrs.items():
        mask = mask + F.when(upsert & ~field.missing, _lit(ATTRIBUTE_BIT[name])).otherwise(0)
    sequence = F.concat_ws(
        ".",
        key,
        F.concat(F.date_format(event_ts, "yyyyMMddHHmmssSSSSSS"), F.col("_nanos")),
        event_id,
    )
    return derived.select(
        *lines.columns,
        reason.alias("reason"),
        event_id.alias("event_id"),
        cid.trimmed.alias("customer_id"),
        operation.alias("operation"),
        event_ts.alias("event_timestamp"),
        *[values[name].alias(name) for name in ATTRIBUTES],
        mask.cast("int").alias("present_mask"),
        meta["source_table"].text.alias("source_table"),
        F.when(lsn.is_string, lsn.trimmed).otherwise(lsn.text).alias("lsn"),
        key.alias("lsn_key"),
        meta["tx_id"].text.alias("tx_id"),
        sequence.alias("sequence"),
        F.sha2(F.to_json(record).cast("binary"), 256).alias("content_hash"),
    )
