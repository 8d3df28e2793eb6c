"""The data catalog of a pipeline (``cdcflow catalog``): every dataset it owns.

One entry per dataset, generated from the table contracts (the declared tables, else the
shipped customers contract), the table specifications of :mod:`cdcflow.layers` and, where the
Delta table exists, its live schema: layer, path / URI, grain, key, columns (type, PII flag,
description), owner and consumers (config section ``catalog``), update cadence, upstream and
downstream datasets. Written as YAML (``catalog.yaml``, for tools) and Markdown
(``catalog.md``, for people).

:func:`check_catalog` compares the catalog with the lakehouse: a Delta table under
``storage.root`` without an entry (folders starting with ``_`` — replay shadows, checkpoints —
are the pipeline's internals and not listed) and an entry whose live table's columns or types
differ from its specification are problems.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.model.contracts import TableContract

#: Descriptions of the columns cdcflow adds beside a contract's own (any table).
METADATA_COLUMNS = {
    "batch_id": "micro-batch that wrote the row",
    "ingested_at": "processing time of that micro-batch (UTC)",
    "ingestion_date": "date of ingested_at (Bronze partition)",
    "source_file": "landing file the record came from",
    "source_line": "line of the record in that file (1-based)",
    "raw_payload": "the record as delivered (JSON text)",
    "raw_line": "the rejected line as delivered",
    "event_id": "the change event's id (deduplication key)",
    "operation": "INSERT, UPDATE or DELETE",
    "event_timestamp": "the source's commit time of the change (UTC)",
    "present_mask": "bit i set: the record carried the i-th non-key column",
    "lsn": "the source's log sequence number, as delivered",
    "sequence": "total-order sequence: numeric LSN, event time, event id (sortable text)",
    "content_hash": "SHA-256 of the record's canonical content",
    "is_duplicate": "a later copy of an event already in Bronze",
    "quarantined_at": "processing time of the micro-batch that rejected it (UTC)",
    "failure_reason": "reason code of the rejection",
    "failure_detail": "why, without personal data",
    "is_deleted": "soft delete: the key's latest change is a DELETE",
    "is_active": "derived: not deleted and status ACTIVE",
    "created_at": "time of the row's first event",
    "last_updated_at": "time of the row's latest event",
    "deleted_at": "time of the DELETE (soft mode)",
    "last_event_id": "id of the event that set the row",
    "last_operation": "operation of that event",
    "last_lsn": "LSN of that event",
    "valid_from": "start of this version (event time)",
    "valid_to": "end of this version: the next version's valid_from (null: current)",
    "is_current": "the key's latest version",
    "outcome": "APPLIED, SUPERSEDED_IN_BATCH, STALE, DUPLICATE or TOMBSTONED",
    "is_late": "older than processing.late_event_threshold",
    "lag_s": "processing time - event time, seconds",
    "tombstoned_at": "processing time of the DELETE's micro-batch (UTC)",
    "request_id": "the erasure request",
    "subject_hash": "HMAC-SHA256 of the subject's key (docs/erasure.md), never the key",
    "requested_at": "when the erasure was requested (UTC)",
    "completed_at": "when the erasure completed (UTC); null while requested",
    "rows_redacted": "JSON: Delta table -> rows redacted",
    "versions": "JSON: Delta table -> version the erasure wrote (time travel starts there)",
}

#: Per kind of table: (layer, grain, update cadence).
KINDS = {
    "bronze": ("bronze", "one row per delivery of an accepted record (every copy)", "micro-batch"),
    "quarantine": ("quarantine", "one row per rejected record", "micro-batch"),
    "silver": ("silver", "one row per key (current state)", "micro-batch"),
    "tombstones": ("silver", "one row per hard-deleted key", "micro-batch (hard mode)"),
    "history": ("silver", "one row per key and version (SCD2)", "micro-batch"),
    "outcomes": ("audit", "one row per accepted delivery", "micro-batch"),
    "batch_log": ("audit", "one row per micro-batch", "micro-batch"),
    "table_batch_log": ("audit", "one row per micro-batch and table", "micro-batch"),
    "schema_log": ("audit", "one row per contract change applied", "when a contract changes"),
    "skipped": ("audit", "one row per skipped source record (e.g. Kafka tombstone)", "micro-batch"),
    "truncates": ("audit", "one row per source TRUNCATE", "micro-batch"),
    "unrouted": ("quarantine", "one row per record no table's routing matched", "micro-batch"),
    "gold": ("gold", "see docs/history_and_gold.md", "every gold.refresh_every_batches"),
    "snowflake_sync": ("audit", "one row per Snowflake table and sync", "each Snowflake sync"),
    "erasure_log": (
        "audit",
        "one row per data subject, erasure request and status (docs/erasure.md)",
        "each cdcflow erase (and a late event of an erased subject)",
    ),
    "snowflake": ("snowflake", "one row per key (Silver's current state)", "each Snowflake sync"),
}


@dataclass
class Column:
    """One column: name, type (Arrow, or Snowflake's), PII flag, description."""

    name: str
    type: str
    pii: bool = False
    description: str = ""


@dataclass
class Entry:
    """One dataset of the catalog (module doc)."""

    name: str
    layer: str
    uri: str
    grain: str
    key: list[str]
    cadence: str
    owner: str
    consumers: list[str]
    upstream: list[str]
    downstream: list[str]
    columns: list[Column] = field(default_factory=list)
    exists: bool = False
    spec: Any = field(default=None, repr=False)  # the TableSpec (None: not a Delta table)


def _live_schema(uri: str, options: dict[str, str] | None) -> pa.Schema:
    """The Arrow schema of the Delta table at ``uri`` (pyarrow, via the C data interface)."""
    return pa.schema(DeltaTable(uri, storage_options=options).schema().to_arrow())


def _columns(schema: Any, contract: TableContract | None) -> list[Column]:
    pii = {c.name for c in contract.columns if c.pii} if contract else set()
    own = {c.name: c for c in contract.columns} if contract else {}
    out = []
    for f in schema:
        if f.name in own:
            text = f"{contract.name if contract else ''} column ({own[f.name].type})"
        else:
            text = METADATA_COLUMNS.get(f.name, "")
        raw = f.name in ("raw_payload", "raw_line") and bool(pii)  # holds every field as sent
        out.append(Column(f.name, str(f.type), f.name in pii or raw, text))
    return out


def build_catalog(config: CdcflowConfig) -> list[Entry]:
    """Every dataset ``config``'s pipeline owns (module doc), in layer order."""
    from cdcflow.engines.local.contracts import SKIPPED, TABLE_BATCH_LOG, TRUNCATES, UNROUTED
    from cdcflow.layers.contract_tables import contract_tables
    from cdcflow.layers.gold import GOLD_TABLES
    from cdcflow.layers.schema_log import SCHEMA_LOG
    from cdcflow.layers.tables import BATCH_LOG, HISTORY, TableSpec
    from cdcflow.sinks.snowflake.inline import SYNC_LOG_SCHEMA, SYNC_LOG_TABLE

    owner = config.catalog.owner
    consumers = list(config.catalog.consumers)
    source = "source:" + (config.source.type if config.source.type != "files" else "landing")
    entries: list[Entry] = []

    def add(spec: Any, kind: str, contract: TableContract | None, key: list[str], up: list[str],
            down: list[str]) -> None:  # fmt: skip
        layer, grain, cadence = KINDS[kind]
        uri = config.table_uri(spec.name)
        options = config.storage.options or None
        exists = DeltaTable.is_deltatable(uri, storage_options=options)
        schema = _live_schema(uri, options) if exists else None
        columns = _columns(spec.schema, contract)
        if schema is not None:  # the live types (an evolved contract adds columns)
            live = {f.name: str(f.type) for f in schema}
            columns = [
                Column(c.name, live.get(c.name, c.type), c.pii, c.description) for c in columns
            ]
        entries.append(
            Entry(spec.name, layer, uri, grain, key, cadence, owner, consumers, up, down,
                  columns, exists, spec)
        )  # fmt: skip

    declared = bool(config.tables)
    for contract in config.contracts():
        t = contract_tables(contract)
        keys = list(contract.keys)
        gold = [] if declared else [g.name for g in GOLD_TABLES]
        synced = config.snowflake.mode != "off"
        snowflake = [f"snowflake:{contract.table_names.snowflake}"] if synced else []
        from_bronze = [t.silver.name, t.history.name, t.outcomes.name]
        add(t.bronze, "bronze", contract, keys, [source], from_bronze)
        add(t.quarantine, "quarantine", contract, [], [source], [])
        add(t.silver, "silver", contract, keys, [t.bronze.name], snowflake)
        add(t.tombstones, "tombstones", contract, keys, [t.bronze.name], [t.silver.name])
        add(t.history, "history", contract, [*keys, "sequence"], [t.bronze.name], gold)
        add(t.outcomes, "outcomes", contract, ["event_id"], [t.bronze.name], [])
    add(BATCH_LOG, "batch_log", None, ["batch_id"], [source], [])
    if declared:
        add(TABLE_BATCH_LOG, "table_batch_log", None, ["batch_id", "table_name"], [source], [])
        add(SCHEMA_LOG, "schema_log", None, [], [], [])
        add(SKIPPED, "skipped", None, [], [source], [])
        add(TRUNCATES, "truncates", None, [], [source], [])
        add(UNROUTED, "unrouted", None, [], [source], [])
    else:
        for spec in GOLD_TABLES:
            add(spec, "gold", None, [], [HISTORY.name], [])
    add(TableSpec(SYNC_LOG_TABLE, SYNC_LOG_SCHEMA), "snowflake_sync", None, [], [], [])
    from cdcflow.layers.erasure import ERASURE_LOG

    add(ERASURE_LOG, "erasure_log", None, ["request_id", "subject_hash", "status"], [], [])
    if config.snowflake.mode != "off":
        snow = config.snowflake
        for contract in config.contracts():
            layer, grain, cadence = KINDS["snowflake"]
            name = contract.table_names.snowflake
            entries.append(
                Entry(
                    f"snowflake:{name}", layer, f"{snow.database}.{snow.schema_name}.{name}",
                    grain, list(contract.keys), cadence, owner, consumers,
                    [contract_tables(contract).silver.name], [],
                    _columns(contract_tables(contract).silver.schema, contract),
                )
            )  # fmt: skip
    return entries


def delta_tables(config: CdcflowConfig) -> list[str]:
    """The Delta tables under a local ``storage.root`` (names relative to it), folders starting
    with ``_`` (replay shadows, checkpoints, the Snowflake emulator) not searched."""
    root = Path(config.storage.root)
    found = []
    for folder, subfolders, _files in os.walk(root):
        if "_delta_log" in subfolders:
            found.append(Path(folder).relative_to(root).as_posix())
            subfolders.clear()
            continue
        subfolders[:] = [s for s in subfolders if not s.startswith("_")]
    return sorted(found)


def check_catalog(config: CdcflowConfig, entries: list[Entry]) -> list[str]:
    """Problems between the catalog and the lakehouse (module doc); empty: they agree."""
    problems = []
    listed = {e.name for e in entries}
    if "://" not in config.storage.root:
        for name in delta_tables(config):
            if name not in listed:
                problems.append(f"{name}: a Delta table without a catalog entry")
    for entry in entries:
        if entry.spec is None or not entry.exists:
            continue
        live = _live_schema(entry.uri, config.storage.options or None)
        live_fields = {f.name: str(f.type) for f in live}
        spec_fields = {f.name: str(f.type) for f in entry.spec.schema}
        missing = [n for n in spec_fields if n not in live_fields]
        extra = [n for n in live_fields if n not in spec_fields]
        retyped = [n for n in spec_fields if n in live_fields and spec_fields[n] != live_fields[n]]
        if missing:
            problems.append(f"{entry.name}: columns missing from the table: {', '.join(missing)}")
        if extra:
            problems.append(f"{entry.name}: columns not in the catalog: {', '.join(extra)}")
        for n in retyped:
            problems.append(
                f"{entry.name}: column {n} is {live_fields[n]} in the table, "
                f"{spec_fields[n]} in the catalog"
            )
    return problems


def to_yaml(entries: list[Entry]) -> str:
    """The catalog as YAML text (``datasets:`` list)."""
    import yaml

    data = []
    for entry in entries:
        item = asdict(entry)
        item.pop("spec")
        data.append(item)
    return yaml.safe_dump({"datasets": data}, sort_keys=False, allow_unicode=True, width=100)


def to_markdown(entries: list[Entry], pipeline: str) -> str:
    """The catalog as a Markdown page: a summary table, then each dataset's columns."""
    lines = [
        f"# Data catalog: {pipeline}",
        "",
        "Generated by `cdcflow catalog` from the table contracts and the live Delta tables.",
        "",
        "| dataset | layer | grain | key | cadence | exists |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        exists = "yes" if e.exists or e.spec is None else "not yet"
        lines.append(
            f"| `{e.name}` | {e.layer} | {e.grain} | {', '.join(e.key) or '-'} | {e.cadence} | "
            f"{exists} |"
        )
    for e in entries:
        lines += ["", f"## `{e.name}`", "", f"* URI: `{e.uri}`", f"* grain: {e.grain}"]
        lines.append(f"* owner: {e.owner or '(catalog.owner not set)'}")
        lines.append(f"* consumers: {', '.join(e.consumers) or '(catalog.consumers not set)'}")
        lines.append(f"* upstream: {', '.join(f'`{u}`' for u in e.upstream) or '-'}")
        lines.append(f"* downstream: {', '.join(f'`{d}`' for d in e.downstream) or '-'}")
        lines += ["", "| column | type | PII | description |", "|---|---|---|---|"]
        for c in e.columns:
            lines.append(f"| `{c.name}` | {c.type} | {'yes' if c.pii else ''} | {c.description} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "KINDS",
    "METADATA_COLUMNS",
    "Column",
    "Entry",
    "build_catalog",
    "check_catalog",
    "delta_tables",
    "to_markdown",
    "to_yaml",
]
