"""A micro-batch of the flat customers format as columns: read, validated, classified.

The columnar counterpart of reading records one by one (:func:`cdcflow.sources.files.read_records`),
:func:`cdcflow.plan.rules.validate_record` and :func:`cdcflow.plan.dedup.classify`, with the same
results: lines by :func:`cdcflow.sources.files.scan_lines`, validation by
:mod:`cdcflow.engines.local.vector_rules` (its ``UNDECIDED`` lines, and lines that are not valid
UTF-8, by the Python rules), duplicate classification by a window over event ids.

Positions (``pos``) number the batch's records in arrival order (file order, then line order),
as the record-at-a-time path does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl
import pyarrow as pa

from cdcflow.engines.local.vector_rules import UNDECIDED, validate_lines
from cdcflow.model.events import ATTRIBUTES, CdcEvent
from cdcflow.plan.replay import EVENT_COLUMNS, Revalidation
from cdcflow.plan.rules import CustomerIdPattern, Rejection, RuleSet, validate_record
from cdcflow.sources.files import LandingFile, RawRecord, scan_lines

#: Lines validated at a time (bounds the memory of the validation's intermediate columns).
CHUNK_ROWS = 1 << 15

#: Below this many lines a batch is validated by the Python rules line by line: the columnar
#: rendering has a fixed cost per call (tens of milliseconds: regex compilation, one DuckDB
#: query) that a handful of lines does not repay. The rest of the batch stays columnar.
COLUMNAR_MIN_LINES = 512

#: Schema of a validated batch (one row per record).
VALIDATED_SCHEMA: dict[str, pl.DataType] = {
    "pos": pl.Int64(),
    "source_file": pl.String(),
    "source_line": pl.Int64(),
    "raw": pl.String(),
    "reason": pl.String(),
    "detail": pl.String(),
    "reject_event_id": pl.String(),
    "reject_customer_id": pl.String(),
    "event_id": pl.String(),
    "customer_id": pl.String(),
    "operation": pl.String(),
    "event_timestamp": pl.Datetime("us", "UTC"),
    **{name: pl.String() for name in ATTRIBUTES},
    "present_mask": pl.Int32(),
    "source_table": pl.String(),
    "lsn": pl.String(),
    "lsn_key": pl.String(),
    "tx_id": pl.String(),
    "sequence": pl.String(),
    "content_hash": pl.String(),
}


def scan_batch(
    files: Sequence[LandingFile], batch_id: int
) -> tuple[pl.DataFrame, list[tuple[int, RawRecord]]]:
    """Every non-blank line of the batch's files.

    Returns:
        (``pos``, ``source_file``, ``source_line``, ``line`` — one row per line that is text;
        the other records, each with its ``pos``, as ``(pos, record)`` in :class:`RawRecord`
        form: lines that are not valid UTF-8 and unreadable gzip tails). Positions count both.

    Raises:
        LandingFileChangedError: a file changed since it was taken (see ``scan_lines``).
    """
    frames: list[pl.DataFrame] = []
    others: list[tuple[int, RawRecord]] = []
    count = 0
    for file in files:
        lines, records = scan_lines(file, batch_id)
        if lines.height:
            frames.append(
                lines.with_columns(
                    (pl.int_range(pl.len(), dtype=pl.Int64) + count).alias("pos"),
                    pl.lit(file.path).alias("source_file"),
                ).select("pos", "source_file", "source_line", "line")
            )
            count += lines.height
        for record in records:
            others.append((count, record))
            count += 1
    frame = (
        pl.concat(frames)
        if frames
        else pl.DataFrame(
            schema={
                "pos": pl.Int64,
                "source_file": pl.String,
                "source_line": pl.Int64,
                "line": pl.String,
            }
        )
    )
    return frame, others


def _python_rows(
    items: list[tuple[int, str, int, bytes | None, str | None, str]], rules: RuleSet
) -> pl.DataFrame:
    """The Python rules for the lines the columns leave (``UNDECIDED``) or cannot hold."""
    rows: list[dict[str, object]] = []
    for pos, source_file, source_line, data, error, raw in items:
        result: CdcEvent | Rejection
        if data is None:
            result = Rejection("MALFORMED_JSON", error or "unreadable")
        else:
            result = validate_record(data, rules)
        row: dict[str, object] = {
            "pos": pos,
            "source_file": source_file,
            "source_line": source_line,
            "raw": raw,
        }
        if isinstance(result, Rejection):
            row.update(
                reason=result.reason,
                detail=result.detail,
                reject_event_id=result.event_id,
                reject_customer_id=result.customer_id,
            )
        else:
            row.update(
                event_id=result.event_id,
                customer_id=result.customer_id,
                operation=result.operation.value,
                event_timestamp=result.event_timestamp,
                **{name: result.values.get(name) for name in ATTRIBUTES},
                present_mask=result.present_mask,
                source_table=result.source_table,
                lsn=result.lsn,
                lsn_key=result.sequence.split(".", 1)[0],
                tx_id=result.tx_id,
                sequence=result.sequence,
                content_hash=result.content_hash,
            )
        rows.append(row)
    return pl.DataFrame(rows, schema=VALIDATED_SCHEMA)


#: A line for the Python rules: pos, source_file, source_line, bytes (None: unreadable),
#: the reason it is unreadable, the text quarantine keeps.
_Item = tuple[int, str, int, bytes | None, str | None, str]


def _items(frame: pl.DataFrame) -> list[_Item]:
    """The frame's lines (``pos``, ``source_file``, ``source_line``, ``line``) as items."""
    return [
        (pos, source_file, source_line, line.encode("utf-8"), None, line)
        for pos, source_file, source_line, line in frame.select(
            "pos", "source_file", "source_line", "line"
        ).iter_rows()
    ]


def _other_items(others: list[tuple[int, RawRecord]]) -> list[_Item]:
    """The records that are not text (not UTF-8, an unreadable gzip tail) as items."""
    return [
        (
            pos,
            record.source_file,
            record.source_line,
            record.data,
            record.error,
            record.data.decode("utf-8", errors="backslashreplace") if record.data else "",
        )
        for pos, record in others
    ]


def validate_batch(
    frame: pl.DataFrame,
    others: list[tuple[int, RawRecord]],
    rules: RuleSet,
    columnar_min_lines: int = COLUMNAR_MIN_LINES,
) -> pl.DataFrame:
    """Validate every record of the batch (:data:`VALIDATED_SCHEMA`, sorted by ``pos``).

    ``raw`` is the record's text as quarantine keeps it (bytes that are not UTF-8 as
    backslash escapes; empty for an unreadable gzip tail). A batch of fewer than
    ``columnar_min_lines`` lines is validated by the Python rules (the same results).
    """
    if frame.height < columnar_min_lines:
        return _python_rows([*_items(frame), *_other_items(others)], rules).sort("pos")
    # in slices, so a large micro-batch holds one slice's intermediate columns at a time; each
    # slice's result is in the slice's row order
    checked = pl.concat(
        [
            validate_lines(part.select("pos", "line").to_arrow(), rules).drop("pos")
            for part in frame.iter_slices(CHUNK_ROWS)
        ]
        or [validate_lines(frame.select("pos", "line").to_arrow(), rules).drop("pos")]
    )
    checked = frame.rename({"line": "raw"}).hstack(checked)
    undecided = checked["reason"] == UNDECIDED
    items = [*_items(checked.filter(undecided).rename({"raw": "line"})), *_other_items(others)]
    decided = checked.filter(~undecided.fill_null(False)) if items else checked
    decided = decided.select(list(VALIDATED_SCHEMA)).cast(VALIDATED_SCHEMA)  # type: ignore[arg-type]
    if not items:
        return decided
    return pl.concat([decided, _python_rows(items, rules)]).sort("pos")


def classify_batch(
    validated: pl.DataFrame, prior: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split the accepted records into deliveries and ``DUPLICATE_EVENT_CONFLICT`` rejections.

    The rule of :func:`cdcflow.plan.dedup.classify`: the first accepted copy of an event id
    (earlier batches first, then arrival order) is the delivery; a later copy with the same
    content hash is a duplicate (``is_duplicate``), with another hash a conflict.

    Args:
        validated: :func:`validate_batch`'s result.
        prior: ``event_id``, ``content_hash`` of the copies earlier batches accepted.

    Returns:
        (accepted deliveries with ``is_duplicate``, in arrival order; every rejected record —
        validation and conflicts — in arrival order, with ``reason``/``detail`` and ids).
    """
    accepted = validated.filter(pl.col("reason").is_null())
    accepted = accepted.join(
        prior.select("event_id", pl.col("content_hash").alias("_prior")), on="event_id", how="left"
    )
    first = pl.col("pos") == pl.col("pos").min().over("event_id")
    known = pl.coalesce("_prior", pl.col("content_hash").first().over("event_id"))
    accepted = accepted.with_columns(
        (pl.col("_prior").is_null() & first).alias("_new"),
        (known == pl.col("content_hash")).alias("_same"),
    )
    deliveries = accepted.filter(pl.col("_new") | pl.col("_same")).with_columns(
        (~pl.col("_new")).alias("is_duplicate")
    )
    conflicts = accepted.filter(~(pl.col("_new") | pl.col("_same"))).with_columns(
        pl.lit("DUPLICATE_EVENT_CONFLICT").alias("reason"),
        pl.lit("event_id already received with different content").alias("detail"),
        pl.col("event_id").alias("reject_event_id"),
        pl.col("customer_id").alias("reject_customer_id"),
    )
    rejected = pl.concat(
        [
            validated.filter(pl.col("reason").is_not_null()),
            conflicts.select(validated.columns),
        ]
    ).sort("pos")
    return deliveries.drop("_prior", "_new", "_same").sort("pos"), rejected


def bronze_rows(
    deliveries: pl.DataFrame, batch_id: int, now: datetime, schema: pa.Schema
) -> pa.Table:
    """The Bronze rows of a batch's deliveries (``schema``: Bronze's), in arrival order."""
    frame = deliveries.with_columns(
        pl.lit(batch_id, pl.Int64).alias("batch_id"),
        pl.lit(now, pl.Datetime("us", "UTC")).alias("ingested_at"),
        pl.lit(now.date(), pl.Date).alias("ingestion_date"),
        pl.col("raw").alias("raw_payload"),
    )
    return frame.select(schema.names).to_arrow().cast(schema)


def quarantine_rows(
    rejected: pl.DataFrame, batch_id: int, now: datetime, schema: pa.Schema
) -> pa.Table:
    """The quarantine rows of a batch's rejected records (``schema``: quarantine's)."""
    frame = rejected.select(
        pl.lit(batch_id, pl.Int64).alias("batch_id"),
        pl.lit(now, pl.Datetime("us", "UTC")).alias("quarantined_at"),
        "source_file",
        "source_line",
        pl.col("raw").alias("raw_line"),
        pl.col("reason").alias("failure_reason"),
        pl.col("detail").alias("failure_detail"),
        pl.col("reject_event_id").alias("event_id"),
        pl.col("reject_customer_id").alias("customer_id"),
    )
    return frame.select(schema.names).to_arrow().cast(schema)


__all__ = [
    "VALIDATED_SCHEMA",
    "bronze_rows",
    "classify_batch",
    "quarantine_rows",
    "revalidate_frame",
    "scan_batch",
    "validate_batch",
]


def revalidate_frame(
    rows: pl.DataFrame,
    pattern: CustomerIdPattern,
    max_clock_skew: timedelta,
    columnar_min_lines: int = COLUMNAR_MIN_LINES,
) -> Revalidation:
    """Re-validate Bronze first copies in columns: :func:`cdcflow.plan.replay.revalidate`.

    The same result as the record-at-a-time function: each row is validated at its
    ``ingested_at`` (its micro-batch's processing time), by :func:`validate_lines` and, for its
    ``UNDECIDED`` lines, the Python rules; the first accepted copy of an event id is kept.

    Args:
        rows: ``raw_payload``, ``ingested_at``, ``sequence`` (the stored one) per Bronze first
            copy, in arrival order (batch, then position).
        pattern: ``processing.customer_id_pattern``, compiled.
        max_clock_skew: ``processing.max_clock_skew``.
        columnar_min_lines: see :func:`validate_batch`.

    Returns:
        The accepted events as columns (Polars series), plus what no longer validates.
    """
    frame = rows.with_row_index("pos").with_columns(pl.col("pos").cast(pl.Int64))
    parts: list[pl.DataFrame] = []
    for (ingested_at,), group in frame.group_by("ingested_at", maintain_order=True):
        assert isinstance(ingested_at, datetime)
        rules = RuleSet(pattern, ingested_at, max_clock_skew)
        lines = group.select(
            "pos",
            pl.lit("").alias("source_file"),
            pl.lit(0, pl.Int64).alias("source_line"),
            pl.col("raw_payload").alias("line"),
        )
        checked = validate_batch(lines, [], rules, columnar_min_lines)
        parts.append(
            checked.join(group.select("pos", "ingested_at", "sequence"), on="pos", suffix="_stored")
        )
    out = Revalidation()
    if not parts:
        out.columns = {name: [] for name in EVENT_COLUMNS}
        return out
    checked = pl.concat(parts).sort("pos")
    rejected = checked.filter(pl.col("reason").is_not_null())["reason"].value_counts()
    out.rejected.update(dict(zip(rejected["reason"], rejected["count"], strict=True)))
    accepted = checked.filter(pl.col("reason").is_null())
    first = accepted.filter(pl.col("pos") == pl.col("pos").min().over("event_id"))
    out.duplicate_ids = accepted.height - first.height
    out.sequence_mismatches = int((first["sequence"] != first["sequence_stored"]).sum())
    out.columns = {name: first[name] for name in EVENT_COLUMNS}
    return out
