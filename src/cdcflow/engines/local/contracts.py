"""Local engine for declared tables: every contract of a ``tables:`` section in one micro-batch.

A config with a ``tables:`` section (:mod:`cdcflow.model.contracts`) runs this engine instead of
:class:`cdcflow.engines.local.engine.LocalEngine` (the shipped customers tables). One
``cdcflow run`` processes every table's records in the same micro-batch loop, with one
checkpoint (the pipeline's offsets and commit markers).

Routing: every landing file lives in ``source.path``; each record names its table in
``metadata.source_table`` (the flat format's field; a schema-qualified ``public.accounts``
routes by its last part), or — ``source.format`` / a table's ``format`` ``debezium`` or ``dms``
— in its format's own field, and is decoded to the table's flat record
(:mod:`cdcflow.plan.routing`, :mod:`cdcflow.sources.formats`). A record of a decoding format that
is not a row change (a Kafka tombstone, an ignored truncate, a control record) is skipped and
counted in ``audit/skipped_records`` (``batch_id``, ``skipped_at``, ``source_file``,
``source_line``, ``table_name``, ``kind``, ``detail``; written with the audit, only when a
format decodes). A record that cannot be routed goes to ``quarantine/unrouted_events``
(one row per record: ``batch_id``, ``quarantined_at``, ``source_file``, ``source_line``,
``raw_line``, ``failure_reason``, ``failure_detail``, ``event_id``, ``source_table``) with
``MALFORMED_JSON`` (not a JSON object: its table cannot be read) or ``UNKNOWN_TABLE`` (no
``metadata.source_table``, or one that names no declared table). One table's bad records never
block another's.

Per table, in declared order, each commit guarded by the Delta app transaction
``cdcflow-<pipeline>`` with version = batch id (a re-run after a crash writes nothing twice) and
followed by its crash point (:mod:`cdcflow.state.faults`):

1. Bronze append (typed columns, duplicates included) — ``after_bronze``
2. quarantine append (the contract's reason codes, :mod:`cdcflow.plan.contract_rules`) —
   ``after_quarantine``
3. Silver MERGE (the contract's fold and MERGE spec, ON every key column) —
   ``after_silver_merge``; hard mode: the tombstone MERGE and purge — ``after_silver``
4. SCD2 history MERGE of the touched keys (their timelines recomputed from Bronze, the same
   rendering as customers', :mod:`cdcflow.engines.local.history`) — ``after_history``
5. the outcome of each accepted delivery (``audit/<name>_event_outcomes``, the rules of
   :func:`cdcflow.engines.local.merges.event_outcomes`) — ``after_outcomes``

then (``snowflake.mode: inline``) each table's Silver to its Snowflake table, then
``quarantine/unrouted_events``, ``audit/table_batch_log`` (one row per table per
micro-batch: ``batch_id``, ``table_name``, ``records_received``, ``accepted``, ``quarantined``,
``duplicates``, ``inserts``, ``updates``, ``deletes``, ``silver_version``) — ``after_outcomes``
— and ``audit/batch_log`` (one row per micro-batch, the totals) — ``after_audit``.

Not yet for declared tables (the customers tables have them): Gold. The Spark counterpart is
:mod:`cdcflow.engines.spark.contracts`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field as DeltaField

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import (
    DeltaStore,
    append_once,
    merge_files_rewritten,
    read_where_in,
    scan_table,
    txn_done,
)
from cdcflow.engines.local.fold import (
    batch_tombstones,
    fold_events,
    to_source_table,
    truncate_deletes,
    with_truncates,
)
from cdcflow.engines.local.history import merge_history
from cdcflow.engines.local.merges import (
    count_outcomes,
    event_outcomes,
    merge_silver,
    merge_tombstones,
)
from cdcflow.errors import ConfigError
from cdcflow.layers.contract_tables import (
    ContractTables,
    arrow_type,
    contract_tables,
    fold_columns,
)
from cdcflow.layers.schema_log import (
    EVOLVED,
    SCHEMA_LOG,
    Change,
    SchemaDriftError,
    added_fields,
    contract_changes,
    contract_json,
    drift_message,
    evolved_columns,
    infer_type,
    recorded_contracts,
    reserved_names,
    utc_now,
    widen_column,
    widened_tables,
    with_columns,
)
from cdcflow.layers.tables import BATCH_LOG, QUARANTINE, TS, TableSpec
from cdcflow.logs import get_logger
from cdcflow.model.contracts import ColumnSpec, TableContract, is_system_column
from cdcflow.model.events import Operation
from cdcflow.model.lsn import LSN_KEY_WIDTH
from cdcflow.plan.contract_rules import (
    ChangeEvent,
    ContractValidator,
    TruncateEvent,
    known_fields,
    route_name,
)
from cdcflow.plan.dedup import classify
from cdcflow.plan.merge_spec import key_predicate, silver_merge_spec
from cdcflow.plan.routing import UNKNOWN_TABLE, Router
from cdcflow.plan.rules import Rejection
from cdcflow.plan.truncates import TRUNCATE_COLUMNS
from cdcflow.report import BatchReport
from cdcflow.sources.files import RawRecord, read_records
from cdcflow.sources.formats import Skipped
from cdcflow.state.checkpoint import BatchOffsets
from cdcflow.state.faults import crash_point

log = get_logger("engine.local.tables")

#: A field name that can be a column (``unknown_fields: evolve``).
_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: The records of a decoding format that are not row changes (:class:`cdcflow.sources.formats.
#: Skipped`): one row per skipped record — Kafka tombstones, ignored truncates, control records.
SKIPPED = TableSpec(
    "audit/skipped_records",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("skipped_at", TS, nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("table_name", pa.string()),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("detail", pa.string()),
        ]
    ),
)

#: The accepted source truncates of the tables under ``truncate: apply`` (:mod:`cdcflow.plan.
#: truncates`): one row per delivery, like Bronze (``is_duplicate`` for a redelivery).
TRUNCATES = TableSpec(
    "audit/source_truncates",
    pa.schema(
        [
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("ingested_at", TS, nullable=False),
            pa.field("table_name", pa.string(), nullable=False),
            pa.field("source_file", pa.string(), nullable=False),
            pa.field("source_line", pa.int64(), nullable=False),
            pa.field("raw_payload", pa.string(), nullable=False),
            pa.field("event_id", pa.string(), nullable=False),
            pa.field("event_timestamp", TS, nullable=False),
            pa.field("lsn", pa.string(), nullable=False),
            pa.field("sequence", pa.string(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("is_duplicate", pa.bool_(), nullable=False),
        ]
    ),
)

UNROUTED = TableSpec(
    "quarantine/unrouted_events",
    pa.schema(
        [
            *(field for field in QUARANTINE.schema if field.name != "customer_id"),
            pa.field("source_table", pa.string()),
        ]
    ),
)

TABLE_BATCH_LOG = TableSpec(
    "audit/table_batch_log",
    pa.schema(
        [
            BATCH_LOG.schema.field("batch_id"),
            pa.field("table_name", pa.string(), nullable=False),
            *(
                BATCH_LOG.schema.field(name)
                for name in (
                    "records_received",
                    "accepted",
                    "quarantined",
                    "duplicates",
                    "inserts",
                    "updates",
                    "deletes",
                    "silver_version",
                    "silver_files_rewritten",
                )
            ),
        ]
    ),
)


@dataclass
class TableReport:
    """Counts of one declared table in one micro-batch (one ``audit/table_batch_log`` row)."""

    batch_id: int
    table_name: str
    records_received: int = 0
    accepted: int = 0
    quarantined: int = 0
    duplicates: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    silver_version: int | None = None
    silver_files_rewritten: int | None = None


def files_rewritten(reports: Sequence[TableReport]) -> int | None:
    """The micro-batch's ``audit/batch_log.silver_files_rewritten``: the sum over its declared
    tables (None when a table's count is unknown)."""
    counts = [r.silver_files_rewritten for r in reports]
    return None if None in counts else sum(c for c in counts if c is not None)


@dataclass
class _Routed:
    """The records of one table in a micro-batch: (record, parsed object) in arrival order."""

    records: list[RawRecord] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    #: position → the rejection of a record its format could not decode (its object is {})
    rejections: dict[int, Rejection] = field(default_factory=dict)


def _text(value: Any) -> str | None:
    """A JSON value as text for a quarantine column: strings as they are, else JSON."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str)


class ContractTable:
    """One declared table's share of a local micro-batch.

    Args:
        contract: the table's contract.
        store: the pipeline's Delta tables (this table's five among them).
        app_id: the app transaction id of the pipeline's writes.
        config: the pipeline's config (``processing.max_clock_skew``).
    """

    def __init__(
        self,
        contract: TableContract,
        store: DeltaStore,
        app_id: str,
        config: CdcflowConfig,
        evolve: Callable[[list[tuple[TableContract, list[Change]]]], None] | None = None,
    ) -> None:
        self.store = store
        self.app_id = app_id
        self.config = config
        self.evolve = evolve
        self._use(contract)

    def _use(self, contract: TableContract) -> None:
        """Work under ``contract`` from now on (at start, and after a column evolved)."""
        self.contract = contract
        self.tables: ContractTables = contract_tables(contract)
        self.keys = list(contract.keys)
        self.fold_columns = fold_columns(contract)

    def _evolve_fields(self, objects: list[dict[str, Any]], batch_id: int) -> None:
        """``unknown_fields: evolve``: add the batch's unknown top-level fields as nullable
        columns (:func:`evolution`) before anything is written."""
        known = known_fields(self.contract)
        values: dict[str, list[Any]] = {}
        for obj in objects:
            for name, value in obj.items():
                if name not in known:
                    values.setdefault(name, []).append(value)
        evolved = evolution(self.contract, values, batch_id)
        if evolved is None or self.evolve is None:
            return
        self.evolve([evolved])
        self._use(evolved[0])

    # ------------------------------------------------------------------ rows
    def _bronze_rows(
        self, offsets: BatchOffsets, routed: _Routed, deliveries: Sequence[Any]
    ) -> pa.Table:
        schema = self.tables.bronze.schema
        now = offsets.processing_time
        events: list[ChangeEvent] = [d.event for d in deliveries]
        sources = [routed.records[d.position] for d in deliveries]
        attributes = [c.name for c in self.contract.attributes]
        n = len(events)
        columns: dict[str, list[Any]] = {
            "batch_id": [offsets.batch_id] * n,
            "ingested_at": [now] * n,
            "ingestion_date": [now.date()] * n,
            "source_file": [r.source_file for r in sources],
            "source_line": [r.source_line for r in sources],
            "raw_payload": [(r.data or b"").decode("utf-8") for r in sources],
            "event_id": [e.event_id for e in events],
            **{k: [e.key[i] for e in events] for i, k in enumerate(self.keys)},
            "operation": [e.operation.value for e in events],
            "event_timestamp": [e.event_timestamp for e in events],
            **{a: [e.values.get(a) for e in events] for a in attributes},
            "present_mask": [
                sum(1 << i for i, a in enumerate(attributes) if a in e.values) for e in events
            ],
            "source_table": [self.contract.name] * n,
            "lsn": [e.lsn for e in events],
            "lsn_key": [e.sequence[:LSN_KEY_WIDTH] for e in events],
            "tx_id": [_text(_tx_id(routed.objects[d.position])) for d in deliveries],
            "sequence": [e.sequence for e in events],
            "content_hash": [e.content_hash for e in events],
            "is_duplicate": [d.is_duplicate for d in deliveries],
        }
        return pa.Table.from_pydict(columns, schema=schema)

    def _quarantine_rows(
        self, offsets: BatchOffsets, routed: _Routed, rejected: list[tuple[int, Rejection]]
    ) -> pa.Table:
        schema = self.tables.quarantine.schema
        columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        for position, rejection in rejected:
            record = routed.records[position]
            obj = routed.objects[position]
            columns["batch_id"].append(offsets.batch_id)
            columns["quarantined_at"].append(offsets.processing_time)
            columns["source_file"].append(record.source_file)
            columns["source_line"].append(record.source_line)
            columns["raw_line"].append((record.data or b"").decode("utf-8", "backslashreplace"))
            columns["failure_reason"].append(rejection.reason)
            columns["failure_detail"].append(rejection.detail)
            columns["event_id"].append(rejection.event_id)
            for key in self.keys:
                columns[key].append(_text(obj.get(self.contract.column(key).field)))
        return pa.Table.from_pydict(columns, schema=schema)

    # ------------------------------------------------------------------ reads
    def _read_keys(
        self, spec: TableSpec, keys: pl.DataFrame, columns: Sequence[str], extra: pl.Expr | None
    ) -> pl.DataFrame:
        """``columns`` of the rows of ``spec`` whose key is in ``keys`` (and ``extra`` holds)."""
        frame = scan_table(self.store.table(spec))
        if extra is not None:
            frame = frame.filter(extra)
        return frame.join(keys.lazy(), on=self.keys, how="semi").select(columns).collect()

    def _prior_hashes(
        self,
        event_ids: set[str],
        batch_id: int,
        spec: TableSpec | None = None,
        extra: pl.Expr | None = None,
    ) -> dict[str, str]:
        """event_id → content hash of ``event_ids`` that earlier batches kept in ``spec``
        (default: the table's Bronze; ``extra``: a further filter)."""
        if not event_ids:
            return {}
        earlier = pl.col("batch_id") < batch_id
        found = read_where_in(
            self.store.table(spec or self.tables.bronze),
            "event_id",
            event_ids,
            ["event_id", "content_hash"],
            extra=earlier if extra is None else earlier & extra,
        )
        return dict(zip(found["event_id"].to_list(), found["content_hash"].to_list(), strict=True))

    def _key_history(self, keys: pl.DataFrame, batch_id: int) -> pl.DataFrame:
        """Every first copy of ``keys`` in Bronze up to ``batch_id`` (fold input), with the
        DELETEs of the table's truncates (:func:`cdcflow.engines.local.fold.with_truncates`)."""
        until = (pl.col("batch_id") <= batch_id) & ~pl.col("is_duplicate")
        events = self._read_keys(self.tables.bronze, keys, self.fold_columns, until)
        return with_truncates(events, self._truncates, self.keys)

    # ------------------------------------------------------------------ truncates
    def _append_truncates(
        self, offsets: BatchOffsets, routed: _Routed, truncates: Sequence[Any]
    ) -> None:
        """The batch's truncate deliveries → ``audit/source_truncates`` (own app transaction
        per table, before Silver: a re-run after a crash finds them)."""
        now = offsets.processing_time
        rows = [
            {
                "batch_id": offsets.batch_id,
                "ingested_at": now,
                "table_name": self.contract.name,
                "source_file": routed.records[d.position].source_file,
                "source_line": routed.records[d.position].source_line,
                "raw_payload": (routed.records[d.position].data or b"").decode("utf-8"),
                "event_id": d.event.event_id,
                "event_timestamp": d.event.event_timestamp,
                "lsn": d.event.lsn,
                "sequence": d.event.sequence,
                "content_hash": d.event.content_hash,
                "is_duplicate": d.is_duplicate,
            }
            for d in truncates
        ]
        table = pa.Table.from_pylist(rows, schema=TRUNCATES.schema)
        app_id = f"{self.app_id}-truncates-{self.contract.name}"
        append_once(self.store.table(TRUNCATES), table, app_id, offsets.batch_id, TRUNCATES)
        if rows:
            log.info(
                "source truncate applied",
                extra={"table": self.contract.name, "truncates": len(rows)},
            )

    def _stored_truncates(self, batch_id: int) -> pl.DataFrame:
        """The table's accepted truncates up to ``batch_id`` (first copies), or an empty frame
        when the table does not apply truncates."""
        if self.contract.truncate != "apply":
            return self._empty(TRUNCATES, list(TRUNCATE_COLUMNS))
        return (
            scan_table(self.store.table(TRUNCATES))
            .filter(
                (pl.col("table_name") == self.contract.name)
                & (pl.col("batch_id") <= batch_id)
                & ~pl.col("is_duplicate")
            )
            .select(*TRUNCATE_COLUMNS)
            .collect()
        )

    def _truncated_keys(
        self, arrived: Sequence[TruncateEvent], like: pl.DataFrame, batch_id: int
    ) -> pl.DataFrame:
        """The DELETEs of newly accepted truncates: every key whose first event in Bronze (up
        to this batch) is below a truncate's sequence (one Bronze scan of the keys and
        sequences; truncates are rare)."""
        firsts = (
            scan_table(self.store.table(self.tables.bronze))
            .filter((pl.col("batch_id") <= batch_id) & ~pl.col("is_duplicate"))
            .group_by(self.keys)
            .agg(pl.col("sequence").min().alias("_first"))
            .collect()
        )
        frame = pl.DataFrame(
            {name: [getattr(t, name) for t in arrived] for name in TRUNCATE_COLUMNS},
            schema={name: self._truncates.schema[name] for name in TRUNCATE_COLUMNS},
        )
        return truncate_deletes(firsts, frame, like, self.keys)

    # ------------------------------------------------------------------ batch
    def run(
        self, offsets: BatchOffsets, routed: _Routed, report: TableReport, totals: BatchReport
    ) -> None:
        """Validate, de-duplicate and write this table's records of the micro-batch.

        Args:
            offsets: the micro-batch (id, processing time).
            routed: the records routed to this table, in arrival order.
            report: filled with this table's counts and Silver version.
            totals: the batch's report: this table's outcomes are counted into it (stale,
                tombstoned, late, largest lag).
        """
        batch_id = offsets.batch_id
        if self.contract.unknown_fields == "evolve":
            self._evolve_fields(routed.objects, batch_id)
        validator = ContractValidator(
            self.contract, offsets.processing_time, self.config.processing.max_clock_skew
        )
        candidates: list[tuple[int, ChangeEvent | TruncateEvent]] = []
        rejected: list[tuple[int, Rejection]] = []
        for position, obj in enumerate(routed.objects):
            undecoded = routed.rejections.get(position)
            result = undecoded if undecoded is not None else validator.validate_object(obj)
            if isinstance(result, Rejection):
                rejected.append((position, result))
            else:
                candidates.append((position, result))
        ids = {e.event_id for _, e in candidates}
        prior = self._prior_hashes(ids, batch_id)
        if self.contract.truncate == "apply":  # a truncate's copies are kept beside Bronze
            mine = pl.col("table_name") == self.contract.name
            prior.update(self._prior_hashes(ids, batch_id, TRUNCATES, mine))
        classified, conflicts = classify(candidates, prior)  # type: ignore[arg-type]
        truncates = [d for d in classified if isinstance(d.event, TruncateEvent)]
        deliveries = [d for d in classified if not isinstance(d.event, TruncateEvent)]
        rejected = sorted([*rejected, *conflicts], key=lambda item: item[0])

        report.records_received = len(routed.records)
        report.accepted = len(deliveries) + len(truncates)
        report.quarantined = len(rejected)
        report.duplicates = sum(d.is_duplicate for d in [*deliveries, *truncates])
        firsts: list[ChangeEvent] = [d.event for d in deliveries if not d.is_duplicate]  # type: ignore[misc]
        report.inserts = sum(e.operation is Operation.INSERT for e in firsts)
        report.updates = sum(e.operation is Operation.UPDATE for e in firsts)
        report.deletes = sum(e.operation is Operation.DELETE for e in firsts)

        bronze = self._bronze_rows(offsets, routed, deliveries)
        table = self.store.table(self.tables.bronze)
        ordered = in_table_order(self.tables.bronze, table)
        append_once(table, bronze.select(ordered.schema.names), self.app_id, batch_id, ordered)
        crash_point("after_bronze", batch_id)
        quarantine = self._quarantine_rows(offsets, routed, rejected)
        spec = self.tables.quarantine
        append_once(self.store.table(spec), quarantine, self.app_id, batch_id, spec)
        crash_point("after_quarantine", batch_id)

        if self.contract.truncate == "apply":
            self._append_truncates(offsets, routed, truncates)
        self._truncates = self._stored_truncates(batch_id)

        targets = self._empty(self.tables.silver, [*self.keys, "_cdc_seq", "_cdc_min_seq"])
        tombstones = self._empty(self.tables.tombstones, [*self.keys, "_cdc_seq"])
        # the fold input: this batch's first copies, as Bronze holds them, and the DELETEs of
        # the table's truncates (plan.truncates): a new truncate's keys, and late events' keys
        events = pl.from_arrow(
            bronze.filter(pc.invert(bronze["is_duplicate"])).select(self.fold_columns)
        )
        assert isinstance(events, pl.DataFrame)
        arrived: list[Any] = [d.event for d in truncates if not d.is_duplicate]
        if arrived:
            events = pl.concat([events, self._truncated_keys(arrived, events, batch_id)])
        events = with_truncates(events, self._truncates, self.keys)
        if events.height:
            keys = events.select(self.keys).unique()
            targets = self._read_keys(self.tables.silver, keys, targets.columns, None)
            if self.contract.delete_mode == "hard":
                tombstones = self._read_keys(self.tables.tombstones, keys, tombstones.columns, None)
            self._merge_silver(events, batch_id, targets, tombstones)
            crash_point("after_silver_merge", batch_id)
            if self.contract.delete_mode == "hard":
                self._merge_tombstones(events, offsets)
            crash_point("after_silver", batch_id)
            self._merge_history(events, batch_id)
            crash_point("after_history", batch_id)
        silver = self.store.table(self.tables.silver)
        report.silver_version = silver.version()
        report.silver_files_rewritten = merge_files_rewritten(silver, self.app_id, batch_id)
        self._write_outcomes(offsets, bronze, targets, tombstones, totals, events)
        crash_point("after_outcomes", batch_id)

    def _empty(self, spec: TableSpec, names: list[str]) -> pl.DataFrame:
        frame = pl.from_arrow(spec.schema.empty_table().select(names))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _write_outcomes(
        self,
        offsets: BatchOffsets,
        bronze: pa.Table,
        targets: pl.DataFrame,
        tombstones: pl.DataFrame,
        totals: BatchReport,
        changes: pl.DataFrame,
    ) -> None:
        """The outcome of each accepted delivery (:func:`cdcflow.engines.local.merges.
        event_outcomes`; ``changes``: the batch's fold input, truncate DELETEs included)
        appended to the table's outcomes table; counted into ``totals``."""
        spec = self.tables.outcomes
        frame = pl.from_arrow(
            bronze.select(
                [
                    "event_id",
                    *self.keys,
                    "operation",
                    "lsn",
                    "sequence",
                    "is_duplicate",
                    "event_timestamp",
                    "source_file",
                    "source_line",
                ]
            )
        )
        assert isinstance(frame, pl.DataFrame)
        now = offsets.processing_time
        frame = frame.with_columns(
            pl.lit(offsets.batch_id, pl.Int64).alias("batch_id"),
            ((pl.lit(now) - pl.col("event_timestamp")).dt.total_microseconds() / 1e6).alias(
                "lag_s"
            ),
        )
        late_after = self.config.processing.late_event_threshold.total_seconds()
        outcomes = event_outcomes(
            frame,
            self.keys,
            targets.rename({"_cdc_seq": "_t_seq"}),
            tombstones,
            late_after,
            changes.select(*self.keys, "sequence"),
        )
        count_outcomes(outcomes, totals)
        table = outcomes.select(spec.schema.names).to_arrow().cast(spec.schema)
        append_once(self.store.table(spec), table, self.app_id, offsets.batch_id, spec)

    def _merge_history(self, events: pl.DataFrame, batch_id: int) -> None:
        """The SCD2 history of the keys the batch touched, recomputed from Bronze (one MERGE;
        :mod:`cdcflow.engines.local.history`)."""
        keys = events.select(self.keys).unique()
        merge_history(
            self.store.table(self.tables.history),
            lambda late: self._key_history(late, batch_id),
            keys,
            self.contract.delete_mode,
            self.app_id,
            batch_id,
            lambda names: self._read_keys(self.tables.history, keys, names, None),
            events,
            self.contract,
        )

    def _merge_silver(
        self, events: pl.DataFrame, batch_id: int, targets: pl.DataFrame, prior: pl.DataFrame
    ) -> None:
        """The sequence-guarded Silver MERGE of the batch's first copies (``targets``: the
        touched keys' Silver ``_cdc_seq`` / ``_cdc_min_seq``; ``prior``: their stored
        tombstones, hard mode)."""
        silver = self.store.table(self.tables.silver)
        if txn_done(silver, self.app_id, batch_id):
            return
        mode = self.contract.delete_mode
        if mode == "soft":  # no tombstones in soft mode
            source = fold_events(events, mode, None, self.contract)
        else:
            source = fold_events(events, mode, prior, self.contract)
            # a DELETE slotted between a row's first and last events: the row's created_at (and
            # which events survive) needs the key's whole history, so fold it from Bronze
            tombs = batch_tombstones(events, contract=self.contract).select(
                *self.keys, pl.col("_cdc_seq").alias("_tb")
            )
            split = (
                targets.join(tombs, on=self.keys)
                .filter(
                    (pl.col("_cdc_min_seq") <= pl.col("_tb")) & (pl.col("_tb") < pl.col("_cdc_seq"))
                )
                .select(self.keys)
            )
            if split.height:
                history = self._key_history(split, batch_id)
                exact = fold_events(history, "hard", None, self.contract)
                source = pl.concat(
                    [source.join(split, on=self.keys, how="anti"), exact], how="vertical"
                )
            # a tombstone-only row matters only where a Silver row exists
            existing = targets.select(self.keys).with_columns(pl.lit(True).alias("_exists"))
            source = (
                source.join(existing, on=self.keys, how="left")
                .filter(pl.col("_cdc_seq").is_not_null() | pl.col("_exists").is_not_null())
                .drop("_exists")
            )
        if source.height == 0:
            return
        merge = silver_merge_spec(self.tables.silver.schema.names, self.contract)
        source_table = to_source_table(source, self.contract)
        merge_silver(self.store, self.tables.silver, source_table, merge, self.app_id, batch_id)

    def _merge_tombstones(self, events: pl.DataFrame, offsets: BatchOffsets) -> None:
        merge_tombstones(
            self.store,
            self.tables.tombstones,
            batch_tombstones(events, contract=self.contract),
            key_predicate(self.contract),
            self.app_id,
            offsets,
            timedelta(days=self.contract.tombstone_retention_days),
        )


def evolution(
    contract: TableContract, values: dict[str, list[Any]], batch_id: int
) -> tuple[TableContract, list[Change]] | None:
    """``unknown_fields: evolve``: the contract with a micro-batch's unknown fields as nullable
    columns, and its changes (one per column), or None when no field becomes a column.

    Args:
        contract: the table's contract.
        values: unknown top-level field → its parsed values in the batch (nulls included; any
            values of the same JSON kinds give the same type).
        batch_id: the micro-batch (logged).

    Returns:
        Each usable field (an identifier, not a system column's name) as a column of the type
        :func:`cdcflow.layers.schema_log.infer_type` gives, in name order, as far as
        ``present_mask`` has room (31 or 62 non-key columns); the others are logged and stay
        in the raw payload only.
    """
    reserved = {n.lower() for n in reserved_names(contract)}
    taken = {c.name.lower() for c in contract.columns}  # Delta names are case-insensitive
    added: list[ColumnSpec] = []
    for name in sorted(values):
        kind = infer_type(values[name])
        usable = _COLUMN_NAME.match(name) and not is_system_column(name)
        if not usable or name.lower() in reserved or name.lower() in taken:
            log.warning(  # a field's name, never its value
                "event field not evolved into a column: not a usable column name (a system "
                "column's, or a column's but for case)",
                extra={"table": contract.name, "batch": batch_id, "field": name},
            )
            continue
        taken.add(name.lower())
        added.append(ColumnSpec(name=name, type=kind))
    room = (31 if len(contract.attributes) <= 31 else 62) - len(contract.attributes)
    if len(added) > room:  # present_mask's width is fixed when Bronze is created
        log.warning(
            "event fields not evolved into columns: the table has no room for more",
            extra={"table": contract.name, "batch": batch_id, "fields": len(added) - room},
        )
        added = added[: max(room, 0)]
    if not added:
        return None
    changes = [
        Change(f"{EVOLVED} {c.name} ({c.type}) from an event field", True, added=c.name)
        for c in added
    ]
    return with_columns(contract, added), changes


def in_table_order(spec: TableSpec, table: DeltaTable) -> TableSpec:
    """``spec`` with its columns in the Delta table's order: a column added by schema evolution
    (:mod:`cdcflow.layers.schema_log`) comes last in the table, wherever the contract declares
    it."""
    names = table.schema().to_arrow().names
    if list(names) == spec.schema.names:
        return spec
    return TableSpec(spec.name, pa.schema([spec.schema.field(name) for name in names]))


def _tx_id(record: dict[str, Any]) -> Any:
    metadata = record.get("metadata")
    return metadata.get("tx_id") if isinstance(metadata, dict) else None


def open_tables(config: CdcflowConfig) -> tuple[DeltaStore, list[TableContract], list[str]]:
    """The declared tables' lakehouse, ready for a run of either engine.

    Checks every declared contract against ``audit/schema_log`` (the drift stop raises before
    anything is written), creates missing tables, applies and records the compatible changes
    (:func:`evolve_tables`).

    Args:
        config: the pipeline's config; ``config.tables`` is not empty.

    Returns:
        (the store of every table of the pipeline, the contracts in declared order, with the
        columns earlier runs evolved from event fields, the changes recorded now: one
        ``table <name>: <change>`` line each, e.g. ``table accounts: added column tier
        (string)``).

    Raises:
        ConfigError: two tables write the same Delta table.
        SchemaDriftError: a contract changed incompatibly.
        ReplayError: a ``replay --apply`` of the tables did not finish.
        TableError: a table the checkpoint's micro-batches wrote is missing.
    """
    from cdcflow.engines.local.contract_replay import check_replays
    from cdcflow.engines.local.replay import check_tables_kept

    check_replays(config)  # an unfinished replay --apply: refuse before anything is written
    contracts = config.contracts()
    specs: list[TableSpec] = [UNROUTED, TABLE_BATCH_LOG, BATCH_LOG, SCHEMA_LOG]
    decodes = Router.of(config, contracts).decodes
    if decodes:  # a decoding format: its skipped records are counted
        specs.append(SKIPPED)
    truncating = any(c.truncate == "apply" for c in contracts)
    if truncating:
        specs.append(TRUNCATES)
    for contract in contracts:
        specs += list(vars(contract_tables(contract)).values())
    paths = [spec.name for spec in specs]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise ConfigError(f"key 'tables': two tables write the same Delta table: {twice}")
    store = DeltaStore(
        {spec.name: config.table_uri(spec.name) for spec in specs}, config.storage.options
    )
    declared = contracts
    # the drift stop first: a contract that moved its tables is named as such, not as lost
    logged = DeltaTable.is_deltatable(
        store.uri_of[SCHEMA_LOG.name], storage_options=store.storage_options
    )
    checked = _drift_checked(store, declared, config) if logged else None
    # a lost table is refused before it is recreated empty; a table declared since the last
    # run (all of its tables missing) starts empty
    check_tables_kept(
        config,
        [UNROUTED, TABLE_BATCH_LOG, BATCH_LOG, SCHEMA_LOG],
        [list(vars(contract_tables(c)).values()) for c in contracts],
    )
    store.ensure(SCHEMA_LOG)
    # a new lakehouse: every table is recorded as created
    contracts, evolutions = checked or _drift_checked(store, declared, config)
    for contract in contracts:
        for spec in vars(contract_tables(contract)).values():
            store.ensure(spec)
    optional = [*([SKIPPED] if decodes else []), *([TRUNCATES] if truncating else [])]
    for spec in (UNROUTED, TABLE_BATCH_LOG, BATCH_LOG, *optional):
        store.ensure(spec)
    erased: list[str] = []
    if checked is not None and evolutions:
        # a column marked pii since an erasure: its subjects are erased again before the
        # change is recorded (a crash in between does it again)
        from cdcflow.layers.erasure import erase_newly_pii

        for report in erase_newly_pii(config, recorded_contracts(store.table(SCHEMA_LOG))):
            erased.append(
                f"table {report.table}: {report.subjects} erased subject(s) erased again for "
                "the columns now marked pii"
            )
    return store, contracts, evolve_tables(store, evolutions) + erased


def _drift_checked(
    store: DeltaStore, declared: list[TableContract], config: CdcflowConfig
) -> tuple[list[TableContract], list[tuple[TableContract, list[Change]]]]:
    """The declared contracts with the columns earlier runs evolved from event fields, and
    their changes since the recorded ones (:func:`schema_changes`; ``audit/schema_log``
    exists).

    Raises:
        SchemaDriftError: a contract changed incompatibly.
    """
    evolved = evolved_columns(store.table(SCHEMA_LOG))
    contracts = [with_columns(c, evolved.get(c.name, [])) for c in declared]
    return contracts, schema_changes(store, contracts, config)


def schema_changes(
    store: DeltaStore, contracts: list[TableContract], config: CdcflowConfig
) -> list[tuple[TableContract, list[Change]]]:
    """Each declared contract with its changes since the recorded one (``[]`` when the
    table is new: recorded as created).

    Raises:
        SchemaDriftError: a contract changed incompatibly (:mod:`cdcflow.layers.schema_log`).
    """
    recorded = recorded_contracts(store.table(SCHEMA_LOG))
    out: list[tuple[TableContract, list[Change]]] = []
    for contract in contracts:
        old = recorded.get(contract.name)
        if old is None:
            out.append((contract, [Change("created", True)]))
            continue
        changes = contract_changes(old, contract)
        if any(not change.compatible for change in changes):
            raise SchemaDriftError(drift_message(contract, changes, config.file))
        if changes:
            out.append((contract, changes))
    return out


def evolve_tables(
    store: DeltaStore, evolutions: list[tuple[TableContract, list[Change]]]
) -> list[str]:
    """Apply the compatible changes (new nullable columns, widened types) and record every
    change in ``audit/schema_log`` (after its tables: a crash in between applies it again,
    idempotently).

    Returns:
        One ``table <name>: <change>`` line per change recorded (``created (contract v1)``
        for a new table).
    """
    now = utc_now()
    rows = []
    lines: list[str] = []
    for contract, changes in evolutions:
        for change in changes:
            specs = {spec.name: spec for spec in vars(contract_tables(contract)).values()}
            if change.added is not None:
                for name, fields in added_fields(contract, change.added).items():
                    table = store.table(specs[name])
                    present = set(pa.schema(table.schema().to_arrow()).names)
                    missing = [f for f in fields if f.name not in present]
                    if missing:
                        table.alter.add_columns([DeltaField.from_arrow(f) for f in missing])
            if change.widened is not None:
                target = arrow_type(contract.column(change.widened).type)
                for name in widened_tables(contract, change.widened):
                    widen_column(store.table(specs[name]), change.widened, target)
            rows.append(
                {
                    "table_name": contract.name,
                    "version": contract.version,
                    "change": change.text,
                    "contract": contract_json(contract),
                    "applied_at": now,
                }
            )
            about = {"table": contract.name, "version": contract.version}
            log.info("table contract recorded", extra={**about, "change": change.text})
            text = change.text
            if text == "created":
                text = f"created (contract v{contract.version})"
            lines.append(f"table {contract.name}: {text}")
    if rows:
        write_deltalake(
            store.table(SCHEMA_LOG),
            pa.Table.from_pylist(rows, schema=SCHEMA_LOG.schema),
            mode="append",
        )
    return lines


class LocalContractsEngine:
    """The local engine of a config with a ``tables:`` section (see module doc).

    Args:
        config: the pipeline's config; ``config.tables`` is not empty.
    """

    def __init__(self, config: CdcflowConfig) -> None:
        self.config = config
        self.app_id = f"cdcflow-{config.pipeline.name}"
        self.store, contracts, changes = open_tables(config)
        #: the contract changes this run recorded (``table <name>: <change>``), for the CLI
        self.schema_changes: list[str] = changes
        self.tables = {
            c.name: ContractTable(c, self.store, self.app_id, config, self._evolve)
            for c in contracts
        }
        # the declared contracts: a decoded value never depends on a column evolved later
        self.router = Router.of(config)
        self._skipped: list[tuple[RawRecord, str | None, Skipped]] = []

    def _evolve(self, evolutions: list[tuple[TableContract, list[Change]]]) -> None:
        self.schema_changes += evolve_tables(self.store, evolutions)

    def _route(
        self, offsets: BatchOffsets
    ) -> tuple[dict[str, _Routed], list[tuple[RawRecord, Rejection, str | None]], int]:
        """Every record of the batch routed to its table and decoded (:mod:`cdcflow.plan.
        routing`); the skipped ones are kept in ``self._skipped`` for ``audit/skipped_records``."""
        routed = {name: _Routed() for name in self.tables}
        unrouted: list[tuple[RawRecord, Rejection, str | None]] = []
        self._skipped = []
        count = 0
        for file in offsets.files:
            for record in read_records(file, offsets.batch_id):
                count += 1
                route = self.router.route(record.data, record.error)
                if route.skipped is not None:
                    self._skipped.append((record, route.table, route.skipped))
                    continue
                if route.table is None:
                    assert route.rejection is not None
                    unrouted.append((record, route.rejection, route.source_table))
                    continue
                target = routed[route.table]
                if route.rejection is not None:
                    target.rejections[len(target.objects)] = route.rejection
                target.records.append(record)
                target.objects.append(route.record if route.record is not None else {})
        return routed, unrouted, count

    def _skipped_rows(self, offsets: BatchOffsets) -> pa.Table:
        return pa.Table.from_pylist(
            [
                {
                    "batch_id": offsets.batch_id,
                    "skipped_at": offsets.processing_time,
                    "source_file": record.source_file,
                    "source_line": record.source_line,
                    "table_name": table,
                    "kind": skipped.kind,
                    "detail": skipped.detail,
                }
                for record, table, skipped in self._skipped
            ],
            schema=SKIPPED.schema,
        )

    def _unrouted_rows(
        self, offsets: BatchOffsets, unrouted: list[tuple[RawRecord, Rejection, str | None]]
    ) -> pa.Table:
        return pa.Table.from_pylist(
            [
                {
                    "batch_id": offsets.batch_id,
                    "quarantined_at": offsets.processing_time,
                    "source_file": record.source_file,
                    "source_line": record.source_line,
                    "raw_line": (record.data or b"").decode("utf-8", "backslashreplace"),
                    "failure_reason": rejection.reason,
                    "failure_detail": rejection.detail,
                    "event_id": rejection.event_id,
                    "source_table": name,
                }
                for record, rejection, name in unrouted
            ],
            schema=UNROUTED.schema,
        )

    def run_batch(self, offsets: BatchOffsets) -> BatchReport:
        """Process one micro-batch for every declared table (idempotent: a re-run after a
        crash writes nothing twice).

        Args:
            offsets: the batch's files and processing time, from the checkpoint's offset log.

        Returns:
            The batch's totals (also appended to ``audit/batch_log``).
        """
        with self.store.pinned():
            return self._run_batch(offsets)

    def _run_batch(self, offsets: BatchOffsets) -> BatchReport:
        batch_id = offsets.batch_id
        started = time.perf_counter()
        report = BatchReport(
            batch_id=batch_id,
            pipeline=self.config.pipeline.name,
            kind="stream",
            started_at=offsets.processing_time,
            files=len(offsets.files),
            delete_mode=",".join(sorted({t.contract.delete_mode for t in self.tables.values()})),
        )
        with report.stage("parse"):
            routed, unrouted, count = self._route(offsets)  # every record read before a write
        reports = [TableReport(batch_id, name) for name in self.tables]
        with report.stage("tables"):
            for table, table_report in zip(self.tables.values(), reports, strict=True):
                table.run(offsets, routed[table.contract.name], table_report, report)
        if self.config.snowflake.mode == "inline":  # each table's Silver -> Snowflake
            from cdcflow.sinks.snowflake.inline import inline_sync

            inline_sync(self.config, report)
        with report.stage("audit"):
            append_once(
                self.store.table(UNROUTED),
                self._unrouted_rows(offsets, unrouted),
                self.app_id,
                batch_id,
                UNROUTED,
            )
            rows = pa.Table.from_pylist([vars(r) for r in reports], schema=TABLE_BATCH_LOG.schema)
            append_once(
                self.store.table(TABLE_BATCH_LOG), rows, self.app_id, batch_id, TABLE_BATCH_LOG
            )
            if self.router.decodes:
                append_once(
                    self.store.table(SKIPPED),
                    self._skipped_rows(offsets),
                    self.app_id,
                    batch_id,
                    SKIPPED,
                )
            crash_point("after_outcomes", batch_id)
            report.records_received = count
            report.accepted = sum(r.accepted for r in reports)
            report.quarantined = sum(r.quarantined for r in reports) + len(unrouted)
            report.duplicates = sum(r.duplicates for r in reports)
            report.inserts = sum(r.inserts for r in reports)
            report.updates = sum(r.updates for r in reports)
            report.deletes = sum(r.deletes for r in reports)
            report.silver_files_rewritten = files_rewritten(reports)
            report.duration_ms = int((time.perf_counter() - started) * 1000)
            log_row = pa.Table.from_pylist([report.row()], schema=BATCH_LOG.schema)
            append_once(self.store.table(BATCH_LOG), log_row, self.app_id, batch_id, BATCH_LOG)
        crash_point("after_audit", batch_id)
        log.info(
            "micro-batch committed",
            extra={"batch": report.log_fields(), "tables": [vars(r) for r in reports]},
        )
        return report


__all__ = [
    "SKIPPED",
    "TABLE_BATCH_LOG",
    "TRUNCATES",
    "UNKNOWN_TABLE",
    "UNROUTED",
    "ContractTable",
    "LocalContractsEngine",
    "TableReport",
    "route_name",
]
