"""The exception path of Spark validation: the shared Python rules, in ``mapInArrow`` steps.

The hot path is :mod:`cdcflow.engines.spark.validate` (column expressions). These vectorised
Python steps (Arrow batches in, Arrow batches out) take what it leaves:

* :func:`check_lines` — lines the column rules rejected or did not decide: the shared
  :func:`cdcflow.plan.rules.validate_record` gives their exact reason and detail (or accepts them);
* :func:`parse_files` — whole files Spark SQL cannot split exactly: gzip files (Spark SQL has no
  gunzip function; a corrupt gzip tail becomes one ``MALFORMED_JSON`` record) and files that are
  not valid UTF-8. Lines are split as :func:`cdcflow.sources.files.read_records` does (1-based
  line numbers, blank lines skipped).

Output (``RECORD_DDL``): one row per non-blank line, with the local engine's line numbers,
reasons and normalised values.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa

from cdcflow.layers.tables import TS
from cdcflow.model.events import ATTRIBUTES, CdcEvent
from cdcflow.model.lsn import LSN_KEY_WIDTH
from cdcflow.plan.rules import Rejection, RuleSet, validate_record
from cdcflow.sources.files import content_lines

#: Schema of the parsed records (Spark DDL); ``ok`` = accepted by validation.
RECORD_FIELDS = [
    pa.field("source_file", pa.string()),
    pa.field("source_line", pa.int64()),
    pa.field("file_mtime_ms", pa.int64()),
    pa.field("file_name", pa.string()),
    pa.field("raw", pa.string()),
    pa.field("ok", pa.bool_()),
    pa.field("failure_reason", pa.string()),
    pa.field("failure_detail", pa.string()),
    pa.field("event_id", pa.string()),
    pa.field("customer_id", pa.string()),
    pa.field("operation", pa.string()),
    pa.field("event_timestamp", TS),
    *[pa.field(name, pa.string()) for name in ATTRIBUTES],
    pa.field("present_mask", pa.int32()),
    pa.field("source_table", pa.string()),
    pa.field("lsn", pa.string()),
    pa.field("lsn_key", pa.string()),
    pa.field("tx_id", pa.string()),
    pa.field("sequence", pa.string()),
    pa.field("content_hash", pa.string()),
]
RECORD_SCHEMA = pa.schema(RECORD_FIELDS)
_SPARK_TYPES = {"string": "string", "int64": "bigint", "int32": "int", "bool": "boolean"}
RECORD_DDL = ", ".join(
    f"{f.name} {'timestamp' if f.type == TS else _SPARK_TYPES[str(f.type)]}" for f in RECORD_FIELDS
)


def local_path(path: str) -> str:
    """A Hadoop path (``file:/a/b%20c``) as the local engine writes it (``/a/b c``)."""
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    return path


def _row(cols: dict[str, list[Any]], file: str, mtime: int, line: int, data: bytes | None) -> None:
    cols["source_file"].append(file)
    cols["source_line"].append(line)
    cols["file_mtime_ms"].append(mtime)
    cols["file_name"].append(PurePosixPath(file).name)
    cols["raw"].append(data.decode("utf-8", errors="backslashreplace") if data else "")


def _validated(cols: dict[str, list[Any]], raw: bytes | str, rules: RuleSet) -> None:
    result = validate_record(raw, rules)
    if isinstance(result, Rejection):
        _reject(cols, result)
    else:
        _accept(cols, result)


def _reject(cols: dict[str, list[Any]], rejection: Rejection) -> None:
    cols["ok"].append(False)
    cols["failure_reason"].append(rejection.reason)
    cols["failure_detail"].append(rejection.detail)
    cols["event_id"].append(rejection.event_id)
    cols["customer_id"].append(rejection.customer_id)
    for name in RECORD_SCHEMA.names[RECORD_SCHEMA.names.index("operation") :]:
        cols[name].append(None)


def _accept(cols: dict[str, list[Any]], event: CdcEvent) -> None:
    cols["ok"].append(True)
    cols["failure_reason"].append(None)
    cols["failure_detail"].append(None)
    cols["event_id"].append(event.event_id)
    cols["customer_id"].append(event.customer_id)
    cols["operation"].append(event.operation.value)
    cols["event_timestamp"].append(event.event_timestamp)
    for name in ATTRIBUTES:
        cols[name].append(event.values.get(name))
    cols["present_mask"].append(event.present_mask)
    cols["source_table"].append(event.source_table)
    cols["lsn"].append(event.lsn)
    cols["lsn_key"].append(event.sequence[:LSN_KEY_WIDTH])
    cols["tx_id"].append(event.tx_id)
    cols["sequence"].append(event.sequence)
    cols["content_hash"].append(event.content_hash)


def parse_files(
    batches: Iterator[pa.RecordBatch],
    pattern: str,
    processing_time: datetime,
    max_clock_skew: timedelta,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: landing files → validated records (``RECORD_SCHEMA``)."""
    rules = RuleSet(pattern, processing_time, max_clock_skew)  # RE2 matching
    for batch in batches:
        paths = batch.column("path").to_pylist()
        mtimes = batch.column("modificationTime").cast(pa.int64()).to_pylist()
        contents = batch.column("content").to_pylist()
        for path, mtime, content in zip(paths, mtimes, contents, strict=True):
            file = local_path(path)
            cols: dict[str, list[Any]] = {name: [] for name in RECORD_SCHEMA.names}
            for line, data, error in content_lines(file, content or b""):
                _row(cols, file, mtime // 1000, line, data)
                if data is None:
                    _reject(cols, Rejection("MALFORMED_JSON", error or "unreadable"))
                    continue
                _validated(cols, data, rules)
            yield pa.RecordBatch.from_pydict(cols, schema=RECORD_SCHEMA)


#: Columns :func:`check_lines` reads (those of :func:`cdcflow.engines.spark.validate.split_lines`).
LINE_COLUMNS = ("source_file", "source_line", "file_mtime_ms", "file_name", "raw")


def check_lines(
    batches: Iterator[pa.RecordBatch],
    pattern: str,
    processing_time: datetime,
    max_clock_skew: timedelta,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: lines (``LINE_COLUMNS``) → validated records (``RECORD_SCHEMA``)."""
    rules = RuleSet(pattern, processing_time, max_clock_skew)  # RE2 matching
    for batch in batches:
        cols: dict[str, list[Any]] = {name: [] for name in RECORD_SCHEMA.names}
        for row in batch.select(list(LINE_COLUMNS)).to_pylist():
            for name in LINE_COLUMNS:
                cols[name].append(row[name])
            _validated(cols, row["raw"], rules)
        yield pa.RecordBatch.from_pydict(cols, schema=RECORD_SCHEMA)
