"""Spark engine for declared tables: every contract of a ``tables:`` section in one micro-batch.

The Spark counterpart of :mod:`cdcflow.engines.local.contracts`, with the same tables, rows,
reason codes, commit order and crash points; it continues (and is continued by) a lakehouse
the local engine wrote. The streaming loop, batch ids and checkpoint are those of
:class:`cdcflow.engines.spark.engine.SparkEngine`; per micro-batch:

1. **route** (``mapInArrow`` over the batch's files, :func:`route_files`): one row per non-blank
   line with the declared table its ``metadata.source_table`` names, or the ``UNKNOWN_TABLE`` /
   ``MALFORMED_JSON`` reason of a record that cannot be routed;
2. per table, in declared order: **validate** (``mapInArrow``, :func:`validate_lines`: the
   engine-neutral rules of :class:`cdcflow.plan.contract_rules.ContractValidator`, typed values
   in the table's Bronze types), duplicate classification against Bronze
   (:func:`cdcflow.engines.spark.engine.classify`), Bronze append — ``after_bronze``,
   quarantine append — ``after_quarantine``, the contract's fold and sequence-guarded Silver
   MERGE ON every key column (:mod:`cdcflow.engines.spark.fold`, :mod:`cdcflow.plan.merge_spec`)
   — ``after_silver_merge``, hard mode: tombstone MERGE and purge — ``after_silver``, the SCD2
   history MERGE of the touched keys (:mod:`cdcflow.engines.spark.history`) —
   ``after_history``, the outcome of each accepted delivery (``audit/<name>_event_outcomes``)
   — ``after_outcomes``;
3. (``snowflake.mode: inline``) each table's Silver to its Snowflake table;
   ``quarantine/unrouted_events``, ``audit/table_batch_log`` — ``after_outcomes`` — and
   ``audit/batch_log`` — ``after_audit``.

Every write carries the Delta app transaction ``cdcflow-<pipeline>`` with version = batch id and
is skipped when the table already holds it. The schema stop and compatible evolution of the
contracts happen before the stream starts (:func:`cdcflow.engines.local.contracts.open_tables`).
``unknown_fields: evolve``: the routing step reports each record's unknown fields and the JSON
kind of their values; one small job per such table collects them, and the new columns are
applied (:func:`cdcflow.engines.local.contracts.evolution`, the local engine's rule) before
the batch writes anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.contracts import (
    SKIPPED,
    TABLE_BATCH_LOG,
    TRUNCATES,
    UNKNOWN_TABLE,
    UNROUTED,
    TableReport,
    evolution,
    evolve_tables,
    files_rewritten,
    open_tables,
)
from cdcflow.engines.local.delta import merge_files_rewritten
from cdcflow.engines.spark.engine import (
    SparkEngine,
    check_source,
    classify,
    count_classes,
    count_outcomes,
    outcome_frame,
    quarantine_frame,
)
from cdcflow.engines.spark.fold import with_truncates
from cdcflow.layers.contract_tables import ContractTables, contract_tables, fold_columns
from cdcflow.layers.schema_log import infer_type
from cdcflow.layers.tables import BATCH_LOG
from cdcflow.logs import get_logger
from cdcflow.model.contracts import TableContract
from cdcflow.model.lsn import LSN_KEY_WIDTH
from cdcflow.plan.contract_rules import (
    ChangeEvent,
    ContractValidator,
    TruncateEvent,
    known_fields,
    route_name,
)
from cdcflow.plan.merge_spec import TOMBSTONE_UPDATE_WHEN, key_predicate, silver_merge_spec
from cdcflow.plan.routing import Route, Router
from cdcflow.plan.rules import Rejection, parse_record
from cdcflow.plan.truncates import TRUNCATE_COLUMNS
from cdcflow.report import BatchReport
from cdcflow.sources.files import content_lines
from cdcflow.sources.formats import Skipped
from cdcflow.state.checkpoint import BatchOffsets
from cdcflow.state.faults import crash_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = get_logger("engine.spark.tables")

#: Columns of one line of a landing file, as every step reads them.
LINE_FIELDS = [
    pa.field("source_file", pa.string()),
    pa.field("source_line", pa.int64()),
    pa.field("file_mtime_ms", pa.int64()),
    pa.field("file_name", pa.string()),
    pa.field("raw", pa.string()),
]
LINE_COLUMNS = [f.name for f in LINE_FIELDS]
#: :func:`route_files`' output: a line, its table (null: unrouted) and an unrouted line's
#: reason, detail, event id and ``source_table``.
ROUTED_SCHEMA = pa.schema(
    [
        *LINE_FIELDS,
        pa.field("table_name", pa.string()),
        pa.field("failure_reason", pa.string()),
        pa.field("failure_detail", pa.string()),
        pa.field("event_id", pa.string()),
        pa.field("source_table", pa.string()),
        pa.field("unknown_kinds", pa.string()),
        pa.field("skipped_kind", pa.string()),
        pa.field("skipped_detail", pa.string()),
    ]
)
#: A value of each JSON kind :func:`route_files` reports for an unknown field: the type
#: :func:`cdcflow.layers.schema_log.infer_type` gives depends only on the values' kinds.
KIND_VALUES: dict[str, Any] = {
    "null": None,
    "json": [],
    "boolean": True,
    "integer": 1,
    "double": 1.5,
    "string": "",
}


def _kind(value: Any) -> str:
    return "null" if value is None else infer_type([value])


def _spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _text(value: Any) -> str | None:
    """A JSON value as text for a quarantine column: strings as they are, else JSON."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _tx_id(record: dict[str, Any]) -> Any:
    metadata = record.get("metadata")
    return metadata.get("tx_id") if isinstance(metadata, dict) else None


def _route_columns(route: Route, evolving: dict[str, frozenset[str]]) -> tuple[Any, ...]:
    """A :class:`cdcflow.plan.routing.Route` as the ``ROUTED_SCHEMA`` values ``table_name``,
    ``failure_reason``, ``failure_detail``, ``event_id``, ``source_table`` (before the
    unrouted-only rule), ``unknown_kinds``, ``skipped_kind``, ``skipped_detail``."""
    reason = detail = event_id = source = kinds = skip_kind = skip_detail = None
    table = route.table
    if route.skipped is not None:
        skip_kind, skip_detail = route.skipped.kind, route.skipped.detail
        source, table = route.table, None
    elif table is None:
        assert route.rejection is not None
        reason, detail = route.rejection.reason, route.rejection.detail
        event_id, source = route.rejection.event_id, route.source_table
    elif route.record is not None and table in evolving:
        fields = evolving[table]
        unknown = {k: _kind(v) for k, v in route.record.items() if k not in fields}
        kinds = json.dumps(unknown) if unknown else None
    return table, reason, detail, event_id, source, kinds, skip_kind, skip_detail


def route_files(
    batches: Iterator[pa.RecordBatch],
    names: tuple[str, ...],
    evolving: dict[str, frozenset[str]] | None = None,
    router: Router | None = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: landing files → routed lines (``ROUTED_SCHEMA``).

    Input columns: ``source_file`` (local path), ``file_mtime_ms``, ``content`` (the bytes the
    batch takes). Lines are split as :func:`cdcflow.sources.files.read_records` does; a record
    is routed by ``metadata.source_table`` (:func:`cdcflow.plan.contract_rules.route_name`) to
    one of ``names``, else unrouted as ``MALFORMED_JSON`` or ``UNKNOWN_TABLE``, exactly as the
    local engine decides. For a record of a table of ``evolving`` (table → the fields its
    contract knows: ``unknown_fields: evolve``), ``unknown_kinds`` is a JSON object of its
    other top-level fields and the kind of each one's value (a key of :data:`KIND_VALUES`).

    With a ``router`` whose formats decode (``source.format`` / a table's ``format``), records
    are routed and decoded by :class:`cdcflow.plan.routing.Router`, as the local engine does: a
    skipped record has ``skipped_kind`` / ``skipped_detail`` (its table, if any, in
    ``source_table``) and no ``table_name``.
    """
    declared = set(names)
    evolving = evolving or {}
    for batch in batches:
        rows = zip(
            batch.column("source_file").to_pylist(),
            batch.column("file_mtime_ms").to_pylist(),
            batch.column("content").to_pylist(),
            strict=True,
        )
        for file, mtime, content in rows:
            cols: dict[str, list[Any]] = {name: [] for name in ROUTED_SCHEMA.names}
            for line, data, error in content_lines(file, content or b""):
                cols["source_file"].append(file)
                cols["source_line"].append(line)
                cols["file_mtime_ms"].append(mtime)
                cols["file_name"].append(PurePosixPath(file).name)
                cols["raw"].append((data or b"").decode("utf-8", "backslashreplace"))
                table = reason = detail = event_id = source = kinds = None
                skip_kind = skip_detail = None
                if router is not None and router.decodes:
                    routed = _route_columns(router.route(data, error), evolving)
                    table, reason, detail, event_id, source, kinds, skip_kind, skip_detail = routed
                elif data is None:
                    reason, detail = "MALFORMED_JSON", error or "unreadable"
                else:
                    parsed = parse_record(data)
                    if isinstance(parsed, Rejection):
                        reason, detail = parsed.reason, parsed.detail
                    else:
                        source = route_name(parsed)
                        if source is not None and source in declared:
                            table = source
                            known = evolving.get(table)
                            if known is not None:
                                unknown = {k: _kind(v) for k, v in parsed.items() if k not in known}
                                kinds = json.dumps(unknown) if unknown else None
                        else:
                            raw_eid = parsed.get("event_id")
                            event_id = raw_eid.strip() if isinstance(raw_eid, str) else None
                            reason = UNKNOWN_TABLE
                            detail = (
                                "metadata.source_table is missing, null or blank"
                                if source is None
                                else "metadata.source_table names no declared table "
                                f"(declared: {', '.join(names)})"
                            )
                cols["table_name"].append(table)
                cols["failure_reason"].append(reason)
                cols["failure_detail"].append(detail)
                cols["event_id"].append(event_id)
                cols["source_table"].append(source if table is None else None)
                cols["unknown_kinds"].append(kinds)
                cols["skipped_kind"].append(skip_kind)
                cols["skipped_detail"].append(skip_detail)
            yield pa.RecordBatch.from_pydict(cols, schema=ROUTED_SCHEMA)


def route_kafka(
    batches: Iterator[pa.RecordBatch],
    router: Router,
    evolving: dict[str, frozenset[str]] | None = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: Kafka records (``topic``, ``partition``, ``offset``,
    ``timestamp_ms``, ``value``) → routed lines (``ROUTED_SCHEMA``), as the local Kafka source
    stages and routes them: each record in its envelope (:func:`cdcflow.sources.kafka.
    envelope_line`, so Bronze's ``raw_payload`` is the same on both engines), routed and decoded
    by ``router``. A line's ``source_file`` is ``kafka:<topic>[<partition>]`` and its
    ``source_line`` the record's offset."""
    from cdcflow.sources.kafka import envelope_line

    evolving = evolving or {}
    for batch in batches:
        cols: dict[str, list[Any]] = {name: [] for name in ROUTED_SCHEMA.names}
        rows = zip(
            *(
                batch.column(n).to_pylist()
                for n in ("topic", "partition", "offset", "timestamp_ms", "value")
            ),
            strict=True,
        )
        for topic, partition, offset, stamp, value in rows:
            line = envelope_line(topic, partition, offset, stamp, value)
            routed = _route_columns(router.route(line.encode("utf-8")), evolving)
            table, reason, detail, event_id, source, kinds, skip_kind, skip_detail = routed
            name = f"kafka:{topic}[{partition}]"
            for column, item in (
                ("source_file", name),
                ("source_line", offset),
                ("file_mtime_ms", stamp),
                ("file_name", name),
                ("raw", line),
                ("table_name", table),
                ("failure_reason", reason),
                ("failure_detail", detail),
                ("event_id", event_id),
                ("source_table", source if table is None else None),
                ("unknown_kinds", kinds),
                ("skipped_kind", skip_kind),
                ("skipped_detail", skip_detail),
            ):
                cols[column].append(item)
        yield pa.RecordBatch.from_pydict(cols, schema=ROUTED_SCHEMA)


def record_schema(contract: TableContract) -> pa.Schema:
    """:func:`validate_lines`' output for a table: a line, ``ok``, the rejection's reason and
    detail, the Bronze columns from ``event_id`` to ``content_hash`` (typed as in Bronze, null
    for a rejected record) and ``_q_<key>``: each key column as quarantine text."""
    bronze = contract_tables(contract).bronze.schema
    names = bronze.names
    typed = [bronze.field(n).with_nullable(True) for n in names[names.index("event_id") : -1]]
    return pa.schema(
        [
            *LINE_FIELDS,
            pa.field("ok", pa.bool_()),
            pa.field("failure_reason", pa.string()),
            pa.field("failure_detail", pa.string()),
            *typed,
            *[pa.field(f"_q_{k}", pa.string()) for k in contract.keys],
        ]
    )


def _truncate_row(
    cols: dict[str, list[Any]], truncate: TruncateEvent, contract: TableContract, names: list[str]
) -> None:
    """A truncate's :func:`record_schema` row: accepted, operation ``TRUNCATE``, the key and
    column values null, present mask 0."""
    values = {
        "ok": True,
        "event_id": truncate.event_id,
        "operation": "TRUNCATE",
        "event_timestamp": truncate.event_timestamp,
        "present_mask": 0,
        "source_table": contract.name,
        "lsn": truncate.lsn,
        "lsn_key": truncate.sequence[:LSN_KEY_WIDTH],
        "sequence": truncate.sequence,
        "content_hash": truncate.content_hash,
    }
    start = names.index("ok")
    for name in names[start:]:
        if not name.startswith("_q_"):
            cols[name].append(values.get(name))


def validate_lines(
    batches: Iterator[pa.RecordBatch],
    contract: TableContract,
    processing_time: datetime,
    max_clock_skew: timedelta,
    router: Router | None = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: one table's routed lines → validated records
    (:func:`record_schema`), by the contract's rules (the local engine's validator); a
    ``router`` that decodes gives each line's flat record first (its decode rejection is the
    line's)."""
    schema = record_schema(contract)
    validator = ContractValidator(contract, processing_time, max_clock_skew)
    attributes = [c.name for c in contract.attributes]
    keys = list(contract.keys)
    for batch in batches:
        cols: dict[str, list[Any]] = {name: [] for name in schema.names}
        for row in batch.select(LINE_COLUMNS).to_pylist():
            for name in LINE_COLUMNS:
                cols[name].append(row[name])
            result: ChangeEvent | TruncateEvent | Rejection
            if router is not None and router.decodes:
                decoded = router.decode_raw(contract.name, row["raw"])
                assert not isinstance(decoded, Skipped)  # skipped lines are not routed
                parsed = decoded if isinstance(decoded, dict) else {}
                result = (
                    decoded if isinstance(decoded, Rejection) else validator.validate_object(parsed)
                )
            else:
                parsed_line = parse_record(row["raw"])
                assert not isinstance(parsed_line, Rejection)  # routed lines are JSON objects
                parsed = parsed_line
                result = validator.validate_object(parsed)
            for key in keys:
                cols[f"_q_{key}"].append(_text(parsed.get(contract.column(key).field)))
            if isinstance(result, Rejection):
                cols["ok"].append(False)
                cols["failure_reason"].append(result.reason)
                cols["failure_detail"].append(result.detail)
                cols["event_id"].append(result.event_id)
                for name in schema.names[schema.names.index("event_id") + 1 :]:
                    if not name.startswith("_q_"):
                        cols[name].append(None)
                continue
            if isinstance(result, TruncateEvent):  # truncate: apply (no key, no values)
                _truncate_row(cols, result, contract, schema.names)
                continue
            event: ChangeEvent = result
            cols["ok"].append(True)
            cols["failure_reason"].append(None)
            cols["failure_detail"].append(None)
            cols["event_id"].append(event.event_id)
            for i, key in enumerate(keys):
                cols[key].append(event.key[i])
            cols["operation"].append(event.operation.value)
            cols["event_timestamp"].append(event.event_timestamp)
            for name in attributes:
                cols[name].append(event.values.get(name))
            cols["present_mask"].append(
                sum(1 << i for i, a in enumerate(attributes) if a in event.values)
            )
            cols["source_table"].append(contract.name)
            cols["lsn"].append(event.lsn)
            cols["lsn_key"].append(event.sequence[:LSN_KEY_WIDTH])
            cols["tx_id"].append(_text(_tx_id(parsed)))
            cols["sequence"].append(event.sequence)
            cols["content_hash"].append(event.content_hash)
        yield pa.RecordBatch.from_pydict(cols, schema=schema)


class SparkContractsEngine(SparkEngine):
    """The Spark engine of a config with a ``tables:`` section (see module doc).

    Args:
        config: the pipeline's config; ``config.tables`` is not empty.

    Raises:
        ConfigError: a source the Spark engine cannot read.
        SchemaDriftError: a contract changed incompatibly (nothing is written).
    """

    def __init__(self, config: CdcflowConfig) -> None:
        check_source(config, kafka=True)
        self.store, self.contracts, changes = open_tables(config)
        #: the contract changes this run recorded (``table <name>: <change>``), for the CLI
        self.schema_changes: list[str] = changes
        self._modes = ",".join(sorted({c.delete_mode for c in self.contracts}))
        #: the table being written's accepted truncates (truncate: apply), None when none
        self._truncates: DataFrame | None = None
        # the declared contracts: a decoded value never depends on a column evolved later
        self.router = Router.of(config)
        self._start(config)

    # ------------------------------------------------------------------ one micro-batch
    def _run_files(
        self, frame: DataFrame, meta: list[Any], offsets: BatchOffsets, started: float
    ) -> BatchReport:
        """Write one micro-batch of every declared table (every commit up to ``after_audit``).

        Returns:
            The batch's totals (also appended to ``audit/batch_log``).
        """
        from pyspark.sql import functions as F

        batch_id = offsets.batch_id
        report = BatchReport(
            batch_id=batch_id,
            pipeline=self.config.pipeline.name,
            kind="stream",
            started_at=offsets.processing_time,
            files=len(offsets.files),
            delete_mode=self._modes,
        )
        with report.stage("parse"):
            names = tuple(c.name for c in self.contracts)
            evolving = {
                c.name: frozenset(known_fields(c))
                for c in self.contracts
                if c.unknown_fields == "evolve"
            }
            if self.config.source.type == "kafka":
                routed = self._route_kafka(frame, evolving)
            else:
                routed = self._route_files(frame, meta, offsets, names, evolving)
            self._cached.append(routed)
            if evolving:
                self._evolve_fields(routed, batch_id)
        reports = [TableReport(batch_id, c.name) for c in self.contracts]
        with report.stage("tables"):
            for contract, table_report in zip(self.contracts, reports, strict=True):
                self._run_table(contract, routed, offsets, table_report, report)
        if self.config.snowflake.mode == "inline":  # each table's Silver -> Snowflake
            from cdcflow.engines.spark.snowflake import SparkSyncFiles
            from cdcflow.sinks.snowflake.inline import inline_sync

            # the change set computed by Spark, written as Parquet by the executors
            inline_sync(self.config, report, SparkSyncFiles(self.spark, self.config))
        with report.stage("audit"):
            pt = F.lit(offsets.processing_time).cast("timestamp")
            unrouted = routed.filter(
                F.col("table_name").isNull() & F.col("skipped_kind").isNull()
            ).select(
                F.lit(batch_id).alias("batch_id"),
                pt.alias("quarantined_at"),
                "source_file",
                "source_line",
                F.col("raw").alias("raw_line"),
                "failure_reason",
                "failure_detail",
                "event_id",
                "source_table",
            )
            counted = routed.agg(
                F.count("*").alias("received"),
                F.count(
                    F.when(F.col("table_name").isNull() & F.col("skipped_kind").isNull(), 1)
                ).alias("unrouted"),
                F.count(F.when(F.col("skipped_kind").isNotNull(), 1)).alias("skipped"),
            ).first()
            assert counted is not None
            if counted["unrouted"]:
                self._append(unrouted, UNROUTED, batch_id)
            if self.router.decodes:
                skipped = routed.filter(F.col("skipped_kind").isNotNull()).select(
                    F.lit(batch_id).alias("batch_id"),
                    pt.alias("skipped_at"),
                    "source_file",
                    "source_line",
                    F.col("source_table").alias("table_name"),
                    F.col("skipped_kind").alias("kind"),
                    F.col("skipped_detail").alias("detail"),
                )
                self._append(skipped, SKIPPED, batch_id)
            self._append_rows([vars(r) for r in reports], TABLE_BATCH_LOG, batch_id)
            crash_point("after_outcomes", batch_id)
            report.records_received = counted["received"]
            report.accepted = sum(r.accepted for r in reports)
            report.quarantined = sum(r.quarantined for r in reports) + counted["unrouted"]
            report.duplicates = sum(r.duplicates for r in reports)
            report.inserts = sum(r.inserts for r in reports)
            report.updates = sum(r.updates for r in reports)
            report.deletes = sum(r.deletes for r in reports)
            report.silver_files_rewritten = files_rewritten(reports)
            report.duration_ms = int((time.perf_counter() - started) * 1000)
            report.spark_jobs = self._jobs_so_far()
            self._append_rows([report.row()], BATCH_LOG, batch_id)
        crash_point("after_audit", batch_id)
        for cached in self._cached:
            cached.unpersist()
        self._cached.clear()
        log.info(
            "micro-batch committed",
            extra={"batch": report.log_fields(), "tables": [vars(r) for r in reports]},
        )
        return report

    def _route_files(
        self,
        frame: DataFrame,
        meta: list[Any],
        offsets: BatchOffsets,
        names: tuple[str, ...],
        evolving: dict[str, frozenset[str]],
    ) -> DataFrame:
        """The batch's landing files split into routed lines (:func:`route_files`), cached."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        sources, batch_files = self._sources(meta, offsets)
        wanted, content = self._content(frame, sources, batch_files)
        return (
            content.join(wanted.select("path", "source_file"), "path")
            .select(
                "source_file",
                F.unix_millis("modificationTime").alias("file_mtime_ms"),
                "content",
            )
            .mapInArrow(
                partial(route_files, names=names, evolving=evolving, router=self.router),
                _spark_schema(ROUTED_SCHEMA),
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )

    def _route_kafka(self, frame: DataFrame, evolving: dict[str, frozenset[str]]) -> DataFrame:
        """The batch's Kafka records as routed lines (:func:`route_kafka`), cached."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        return (
            frame.select(
                "topic",
                "partition",
                "offset",
                F.unix_millis("timestamp").alias("timestamp_ms"),
                "value",
            )
            .mapInArrow(
                partial(route_kafka, router=self.router, evolving=evolving),
                _spark_schema(ROUTED_SCHEMA),
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )

    # ------------------------------------------------------------------ Kafka
    def _source_stream(self) -> DataFrame:
        """Landing files, or (``source.type: kafka``) Structured Streaming's Kafka source.

        Kafka: ``subscribe`` / ``subscribePattern`` from ``source.kafka`` (new topics and
        partitions are picked up), ``startingOffsets`` / ``startingTimestamp`` from
        ``starting_offsets``, ``maxOffsetsPerTrigger`` = ``source.max_records_per_trigger``,
        read-committed, ``failOnDataLoss``; ``source.kafka.options`` and the secret options
        are passed as ``kafka.<option>`` (the Java client's names). The offsets of each
        micro-batch are Spark's write-ahead offset log (``<checkpoint>/spark/stream``); the
        Delta app transactions make a re-run write nothing twice.
        """
        if self.config.source.type != "kafka":
            return super()._source_stream()
        from cdcflow.sources.kafka import client_settings

        settings = self.config.source.kafka
        conf = client_settings(settings, self.config.file)
        reader = self.spark.readStream.format("kafka")
        for option, value in conf.items():
            reader = reader.option(f"kafka.{option}", value)
        reader = reader.option("kafka.isolation.level", "read_committed")
        if settings.topic_pattern and not settings.topics:
            reader = reader.option("subscribePattern", settings.topic_pattern)
        elif settings.topic_pattern:
            import re

            listed = "|".join(re.escape(t) for t in settings.topics)
            reader = reader.option("subscribePattern", f"(?:{settings.topic_pattern})|{listed}")
        else:
            reader = reader.option("subscribe", ",".join(settings.topics))
        start = settings.starting_offsets
        if start in ("earliest", "latest"):
            reader = reader.option("startingOffsets", start)
        else:
            instant = datetime.fromisoformat(start.replace("Z", "+00:00"))
            reader = reader.option("startingTimestamp", str(int(instant.timestamp() * 1000)))
        if self.config.source.max_records_per_trigger is not None:
            reader = reader.option(
                "maxOffsetsPerTrigger", str(self.config.source.max_records_per_trigger)
            )
        return reader.option("failOnDataLoss", "true").load()

    def _take(self, frame: DataFrame, spark_batch_id: int) -> tuple[BatchOffsets, list[Any]] | None:
        """Kafka: the pipeline's micro-batch of this Spark micro-batch (no landing files), its
        offsets written (the processing time a first attempt recorded is kept on a re-run)."""
        if self.config.source.type != "kafka":
            return super()._take(frame, spark_batch_id)
        batch_id = self._batch_ids().get(str(spark_batch_id))
        recorded = None
        if batch_id is not None and self.checkpoint.has_batch(batch_id):
            recorded = self.checkpoint.offsets(batch_id)
        first = frame.select("_processing_time").limit(1).collect()
        if not first and recorded is None:
            return None
        if batch_id is None:
            batch_id = self._allocate_batch_id(spark_batch_id)
        processing_time = (
            recorded.processing_time
            if recorded is not None
            else first[0]["_processing_time"].replace(tzinfo=UTC)
        )
        offsets = BatchOffsets(batch_id, processing_time, ())
        if not self.checkpoint.is_committed(batch_id):
            self.checkpoint.write_offsets(offsets)
        crash_point("after_offsets", batch_id)
        return offsets, []

    def _evolve_fields(self, routed: DataFrame, batch_id: int) -> None:
        """``unknown_fields: evolve``: add each such table's unknown fields of the batch as
        nullable columns (:func:`cdcflow.engines.local.contracts.evolution`, as the local
        engine) before anything of the batch is written; one small job per such table."""
        from pyspark.sql import functions as F

        for i, contract in enumerate(self.contracts):
            if contract.unknown_fields != "evolve":
                continue
            kinds = (
                routed.filter(
                    (F.col("table_name") == contract.name) & F.col("unknown_kinds").isNotNull()
                )
                .select(F.explode(F.from_json("unknown_kinds", "map<string,string>")))
                .distinct()
                .collect()
            )
            values: dict[str, list[Any]] = {}
            for row in kinds:
                values.setdefault(row["key"], []).append(KIND_VALUES[row["value"]])
            evolved = evolution(contract, values, batch_id)
            if evolved is None:
                continue
            self.schema_changes += evolve_tables(self.store, [evolved])
            self.contracts[i] = evolved[0]
            for spec in vars(contract_tables(contract)).values():
                self._schemas.pop(spec.name, None)  # its Delta schema changed

    def _run_table(
        self,
        contract: TableContract,
        routed: DataFrame,
        offsets: BatchOffsets,
        report: TableReport,
        totals: BatchReport,
    ) -> None:
        """Validate, de-duplicate and write one table's records of the micro-batch (its
        outcomes counted into ``totals``)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        batch_id = offsets.batch_id
        tables = contract_tables(contract)
        rules = self.config.processing
        validate = partial(
            validate_lines,
            contract=contract,
            processing_time=offsets.processing_time,
            max_clock_skew=rules.max_clock_skew,
            router=self.router,
        )
        records = (
            routed.filter(F.col("table_name") == contract.name)
            .select(*LINE_COLUMNS)
            .mapInArrow(validate, _spark_schema(record_schema(contract)))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self._cached.append(records)
        # Bronze as before this batch's append (a recomputed cache must not see its own rows)
        before = self._read(tables.bronze, self.store.table(tables.bronze).version())
        applies = contract.truncate == "apply"
        if applies:  # a truncate's earlier copies are kept beside Bronze
            prior = self._read(TRUNCATES, self.store.table(TRUNCATES).version()).filter(
                F.col("table_name") == contract.name
            )
            before = before.select("batch_id", "event_id", "content_hash").unionByName(
                prior.select("batch_id", "event_id", "content_hash")
            )
        classified = classify(records.filter("ok"), before, batch_id).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        self._cached.append(classified)
        count_classes(classified, records, report)

        pt = F.lit(offsets.processing_time).cast("timestamp")
        bronze_names = tables.bronze.schema.names
        is_truncate = F.col("operation") == "TRUNCATE"
        bronze = classified.filter((F.col("_class") != "conflict") & ~is_truncate).select(
            F.lit(batch_id).alias("batch_id"),
            pt.alias("ingested_at"),
            F.lit(offsets.processing_time.date()).alias("ingestion_date"),
            "source_file",
            "source_line",
            F.col("raw").alias("raw_payload"),
            *bronze_names[bronze_names.index("event_id") : -1],
            (F.col("_class") == "duplicate").alias("is_duplicate"),
        )
        if report.accepted:
            self._append(bronze, tables.bronze, batch_id)
        crash_point("after_bronze", batch_id)
        rejected = records.filter(~F.col("ok")).select(
            *LINE_COLUMNS,
            F.col("raw").alias("raw_line"),
            "failure_reason",
            "failure_detail",
            "event_id",
            *[F.col(f"_q_{k}").alias(k) for k in contract.keys],
        )
        conflicting = classified.drop(*contract.keys)
        for key in contract.keys:  # a conflict's key as quarantine text
            conflicting = conflicting.withColumnRenamed(f"_q_{key}", key)
        quarantine = quarantine_frame(
            rejected, conflicting, batch_id, offsets.processing_time, list(contract.keys)
        )
        if report.quarantined:
            self._append(quarantine, tables.quarantine, batch_id)
        crash_point("after_quarantine", batch_id)

        self._truncates = None
        arrived: list[Any] = []
        if applies:
            arrived = self._table_truncates(contract, classified, offsets)
        firsts = report.accepted - report.duplicates
        changes: DataFrame | None = None  # the batch's fold input (truncate DELETEs included)
        if firsts:
            events = classified.filter((F.col("_class") == "first") & ~is_truncate).select(
                *fold_columns(contract)
            )
            if arrived:  # a new truncate: every key with an event before it (plan.truncates)
                events = events.unionByName(
                    self._truncated_keys(contract, tables, arrived, events, batch_id)
                )
            events = with_truncates(events, self._truncates, list(contract.keys))
            changes = events.select(*contract.keys, "sequence")
            keys = events.select(*contract.keys).distinct()
            self._table_silver(contract, tables, events, keys, batch_id)
            crash_point("after_silver_merge", batch_id)
            if contract.delete_mode == "hard":
                self._table_tombstones(contract, tables, events, offsets)
            crash_point("after_silver", batch_id)
            self._table_history(contract, tables, keys, batch_id)
            crash_point("after_history", batch_id)
        silver = self.store.table(tables.silver)
        report.silver_version = silver.version()
        report.silver_files_rewritten = merge_files_rewritten(silver, self.app_id, batch_id)
        if report.accepted:
            self._table_outcomes(contract, tables, bronze, offsets, totals, changes)
        crash_point("after_outcomes", batch_id)

    def _table_truncates(
        self, contract: TableContract, classified: DataFrame, offsets: BatchOffsets
    ) -> list[Any]:
        """``truncate: apply``: append the batch's truncate deliveries to
        ``audit/source_truncates`` (own app transaction per table), keep the table's accepted
        truncates in ``self._truncates`` (None when it has none) and return the rows of the
        batch's new ones (``event_id``, ``event_timestamp``, ``lsn``, ``sequence``)."""
        from pyspark.sql import functions as F

        batch_id = offsets.batch_id
        delivered = (
            classified.filter((F.col("operation") == "TRUNCATE") & (F.col("_class") != "conflict"))
            .select(
                "source_file",
                "source_line",
                "raw",
                *TRUNCATE_COLUMNS,
                "content_hash",
                (F.col("_class") == "duplicate").alias("is_duplicate"),
            )
            .collect()  # truncates are rare: a few rows
        )
        rows = [
            {
                "batch_id": batch_id,
                "ingested_at": offsets.processing_time,
                "table_name": contract.name,
                "raw_payload": row["raw"],
                **{name: row[name] for name in row.asDict() if name != "raw"},
            }
            for row in delivered
        ]
        self._append_rows(rows, TRUNCATES, batch_id, f"{self.app_id}-truncates-{contract.name}")
        stored = self._read(TRUNCATES).filter(
            (F.col("table_name") == contract.name)
            & (F.col("batch_id") <= batch_id)
            & ~F.col("is_duplicate")
        )
        kept = stored.select(*TRUNCATE_COLUMNS).collect()
        if kept:
            self._truncates = self.spark.createDataFrame(
                kept, stored.select(*TRUNCATE_COLUMNS).schema
            )
        return [row for row in delivered if not row["is_duplicate"]]

    def _truncated_keys(
        self,
        contract: TableContract,
        tables: ContractTables,
        arrived: list[Any],
        like: DataFrame,
        batch_id: int,
    ) -> DataFrame:
        """The DELETEs of newly accepted truncates: every key whose first event in Bronze (up
        to this batch) is below a truncate's sequence."""
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.fold import truncate_deletes

        key = list(contract.keys)
        firsts = (
            self._read(tables.bronze)
            .filter((F.col("batch_id") <= batch_id) & ~F.col("is_duplicate"))
            .groupBy(*key)
            .agg(F.min("sequence").alias("_first"))
        )
        assert self._truncates is not None  # the arrived ones are stored
        schema = self._truncates.schema
        frame = self.spark.createDataFrame(
            [tuple(row[name] for name in TRUNCATE_COLUMNS) for row in arrived], schema
        )
        return truncate_deletes(firsts, frame, like, key)

    def _table_outcomes(
        self,
        contract: TableContract,
        tables: ContractTables,
        bronze: DataFrame,
        offsets: BatchOffsets,
        totals: BatchReport,
        changes: DataFrame | None,
    ) -> None:
        """The outcome of each accepted delivery (:func:`cdcflow.engines.spark.engine.
        outcome_frame`; ``changes``: the batch's fold input, truncate DELETEs included; Silver
        and the tombstones read as they are now: the batch's own commits do not change an
        outcome), appended to the table's outcomes table and counted into
        ``totals``."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        key = list(contract.keys)
        targets = self._read(tables.silver).select(*key, F.col("_cdc_seq").alias("_t_seq"))
        tombstones = None
        if contract.delete_mode == "hard":
            tombstones = self._read(tables.tombstones).select(*key, "_cdc_seq")
        outcomes = outcome_frame(
            bronze,
            key,
            targets,
            tombstones,
            offsets.processing_time,
            self.config.processing.late_event_threshold.total_seconds(),
            tables.outcomes.schema.names,
            changes,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        self._cached.append(outcomes)
        count_outcomes(outcomes, totals)
        self._append(outcomes, tables.outcomes, offsets.batch_id)

    def _table_silver(
        self,
        contract: TableContract,
        tables: ContractTables,
        events: DataFrame,
        keys: DataFrame,
        batch_id: int,
    ) -> None:
        if self._txn(tables.silver, batch_id):
            return
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.fold import batch_tombstones, fold_events

        key = list(contract.keys)
        mode = contract.delete_mode
        if mode == "soft":  # no tombstones to read in soft mode
            source = fold_events(events, mode, None, contract)
        else:
            prior = (
                self._read(tables.tombstones, self.store.table(tables.tombstones).version())
                .join(keys, key, "left_semi")
                .select(*key, "_cdc_seq")
            )
            source = fold_events(events, mode, prior, contract)
            targets = (
                self._read(tables.silver, self.store.table(tables.silver).version())
                .join(keys, key, "left_semi")
                .select(
                    *key,
                    F.col("_cdc_seq").alias("_t_seq"),
                    F.col("_cdc_min_seq").alias("_t_min_seq"),
                )
            )
            # a DELETE between a row's first and last events: refold the key's whole history
            tombs = batch_tombstones(events, contract).select(*key, F.col("_cdc_seq").alias("_tb"))
            split = (
                targets.join(tombs, key)
                .filter((F.col("_t_min_seq") <= F.col("_tb")) & (F.col("_tb") < F.col("_t_seq")))
                .select(*key)
            )
            if not split.isEmpty():  # rare: one small job to find out
                history = with_truncates(
                    self._read(tables.bronze)
                    .filter((F.col("batch_id") <= batch_id) & ~F.col("is_duplicate"))
                    .join(split, key, "left_semi")
                    .select(*events.columns),
                    self._truncates,
                    key,
                )
                exact = fold_events(history, "hard", None, contract)
                source = source.join(split, key, "left_anti").unionByName(exact)
            # a tombstone-only row matters only where a Silver row exists
            source = (
                source.join(targets.select(*key, F.lit(True).alias("_has_target")), key, "left")
                .filter(F.col("_cdc_seq").isNotNull() | F.col("_has_target").isNotNull())
                .drop("_has_target")
            )
        spec = silver_merge_spec(tables.silver.schema.names, contract)
        table = DeltaTable.forPath(self.spark, self.config.table_uri(tables.silver.name))
        with self._txn_conf(self.app_id, batch_id):
            (
                table.alias("t")
                .merge(source.alias("s"), spec.on)
                .whenMatchedDelete(spec.delete_when)
                .whenMatchedUpdate(spec.update_when, dict(spec.update_set))
                .whenNotMatchedInsert(spec.insert_when, dict(spec.insert_values))
                .execute()
            )

    def _table_tombstones(
        self,
        contract: TableContract,
        tables: ContractTables,
        events: DataFrame,
        offsets: BatchOffsets,
    ) -> None:
        """Hard mode: MERGE the batch's tombstones, then purge those past the contract's
        ``tombstone_retention_days`` (own app transaction ``<app_id>-tombstone-purge``)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.local.delta import nothing_expired
        from cdcflow.engines.spark.fold import batch_tombstones

        batch_id = offsets.batch_id
        spec = tables.tombstones
        uri = self.config.table_uri(spec.name)
        if not self._txn(spec, batch_id):
            source = batch_tombstones(events, contract).withColumn(
                "tombstoned_at", F.lit(offsets.processing_time).cast("timestamp")
            )
            with self._txn_conf(self.app_id, batch_id):
                (
                    DeltaTable.forPath(self.spark, uri)
                    .alias("t")
                    .merge(source.alias("s"), key_predicate(contract))
                    .whenMatchedUpdateAll(TOMBSTONE_UPDATE_WHEN)
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        purge_app = f"{self.app_id}-tombstone-purge"
        if self._txn(spec, batch_id, purge_app):
            return
        cutoff = offsets.processing_time - timedelta(days=contract.tombstone_retention_days)
        if nothing_expired(self.store.table(spec), cutoff):  # no Spark job
            return
        expired = F.col("tombstoned_at") < F.lit(cutoff).cast("timestamp")
        if self._read(spec).filter(expired).limit(1).count() == 0:
            return
        with self._txn_conf(purge_app, batch_id):
            DeltaTable.forPath(self.spark, uri).delete(expired)

    def _table_history(
        self,
        contract: TableContract,
        tables: ContractTables,
        keys: DataFrame,
        batch_id: int,
    ) -> None:
        """Recompute the touched keys' SCD2 timelines from Bronze; MERGE the difference."""
        spec = tables.history
        if self._txn(spec, batch_id):
            return
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdcflow.engines.spark.history import (
            HISTORY_DELETE_WHEN,
            HISTORY_UPSERT_WHEN,
            history_changes,
            history_frame,
            history_merge_on,
        )

        key = list(contract.keys)
        events = with_truncates(
            self._read(tables.bronze)
            .filter((F.col("batch_id") <= batch_id) & ~F.col("is_duplicate"))
            .join(keys, key, "left_semi")
            .select(*fold_columns(contract)),
            self._truncates,
            key,
        )
        stored = self._read(spec, self.store.table(spec).version()).join(keys, key, "left_semi")
        fresh = history_frame(events, contract.delete_mode, contract)
        source = history_changes(fresh, stored, contract)
        columns = {name: f"s.{name}" for name in spec.schema.names}
        table = DeltaTable.forPath(self.spark, self.config.table_uri(spec.name))
        with self._txn_conf(self.app_id, batch_id):
            (
                table.alias("t")
                .merge(source.alias("s"), history_merge_on(contract))
                .whenMatchedDelete(HISTORY_DELETE_WHEN)
                .whenMatchedUpdate(HISTORY_UPSERT_WHEN, dict(columns))
                .whenNotMatchedInsert(HISTORY_UPSERT_WHEN, dict(columns))
                .execute()
            )


__all__ = [
    "ROUTED_SCHEMA",
    "SparkContractsEngine",
    "record_schema",
    "route_files",
    "validate_lines",
]
