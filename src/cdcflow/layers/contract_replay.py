"""Replay of declared tables: rebuild each table's Silver from its Bronze alone and compare.

For every declared table, Bronze's first copies (``is_duplicate = false``) up to a Delta version
are re-parsed from ``raw_payload`` and re-validated with the contract its tables hold (the
latest ``audit/schema_log`` contract, evolved columns included), each with its micro-batch's
processing time (``ingested_at``) so the rules apply exactly as when it was accepted; the
accepted events are folded by the reference fold (:func:`cdcflow.plan.reference.fold_changes`,
pure Python, independent of the engine's incremental MERGE path), and the result is compared
with the live Silver (:func:`cdcflow.reconcile.reconcile_table`). Nothing is written: this is
``cdcflow replay --verify`` for declared tables; ``--apply`` writes the rebuilt tables
(:mod:`cdcflow.engines.local.contract_replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow, version_after_batch
from cdcflow.errors import TableError
from cdcflow.layers.contract_tables import contract_tables
from cdcflow.layers.schema_log import SCHEMA_LOG, recorded_contracts
from cdcflow.model.contracts import TableContract
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator, TruncateEvent
from cdcflow.plan.reference import fold_changes
from cdcflow.plan.routing import Router
from cdcflow.plan.rules import Rejection
from cdcflow.reconcile import (
    ReconcileReport,
    contract_public_schema,
    contract_state_frame,
    reconcile_table,
)


@dataclass
class TableReplay:
    """The replay of one declared table.

    Attributes:
        table: the table's name.
        bronze_version: the Bronze Delta version read.
        events: Bronze first copies re-validated.
        rejected: reason → first copies the contract rejects on replay (0 unless the rules
            changed since they were accepted).
        silver_rows: rows of the rebuilt Silver.
        report: the rebuilt Silver vs the live Silver.
    """

    table: str
    bronze_version: int
    events: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    silver_rows: int = 0
    report: ReconcileReport | None = None
    accepted: list[ChangeEvent | TruncateEvent] = field(default_factory=list, repr=False)
    ingested_at: dict[str, datetime] = field(default_factory=dict, repr=False)
    applied_version: int | None = None

    @property
    def verified(self) -> bool:
        """True when the rebuilt Silver equals the live Silver."""
        return self.report is not None and self.report.ok

    def to_json(self) -> dict[str, Any]:
        """JSON form (the report's counts, not its samples' values)."""
        return {
            "table": self.table,
            "bronze_version": self.bronze_version,
            "events": self.events,
            "rejected": self.rejected,
            "silver_rows": self.silver_rows,
            "verified": self.verified,
            "applied_version": self.applied_version,
            "report": None if self.report is None else self.report.to_json(),
        }


def _open(config: CdcflowConfig, name: str, version: int | None = None) -> DeltaTable:
    """The Delta table ``name`` (at ``version``).

    Raises:
        TableError: no such table (no run yet), or no such version.
    """
    uri = config.table_uri(name)
    try:
        return DeltaTable(uri, version=version, storage_options=config.storage.options or None)
    except TableNotFoundError:
        raise TableError(f"{uri}: Delta table not found (no run of this table yet)") from None
    except Exception as exc:  # delta-rs raises a generic error for a missing version
        latest = DeltaTable(uri, storage_options=config.storage.options or None).version()
        raise TableError(f"{uri}: cannot open version {version} (versions 0 to {latest})") from exc


def held_contracts(config: CdcflowConfig) -> list[TableContract]:
    """Each declared table's contract as its Delta tables hold it (``audit/schema_log``;
    the declared one for a table never run)."""
    declared = config.contracts()
    if not DeltaTable.is_deltatable(
        config.table_uri(SCHEMA_LOG.name), storage_options=config.storage.options or None
    ):
        return declared
    recorded = recorded_contracts(_open(config, SCHEMA_LOG.name))
    return [recorded.get(c.name, c) for c in declared]


def _truncate_records(config: CdcflowConfig, table: str, until: datetime | None) -> pl.DataFrame:
    """The first copies of ``table``'s truncates in ``audit/source_truncates`` accepted no
    later than ``until`` (Bronze's last ingestion): ``raw_payload``, ``ingested_at``."""
    from cdcflow.engines.local.contracts import TRUNCATES

    try:
        stored = DeltaTable(
            config.table_uri(TRUNCATES.name), storage_options=config.storage.options
        )
    except TableNotFoundError:  # no truncate kept yet: none (the table's own columns)
        empty = pl.from_arrow(TRUNCATES.schema.empty_table().select(["raw_payload", "ingested_at"]))
        assert isinstance(empty, pl.DataFrame)
        return empty
    frame = pl.from_arrow(
        read_arrow(stored, columns=["table_name", "raw_payload", "ingested_at", "is_duplicate"])
    )
    assert isinstance(frame, pl.DataFrame)
    keep = (pl.col("table_name") == table) & ~pl.col("is_duplicate")
    if until is not None:
        keep &= pl.col("ingested_at") <= until
    return frame.filter(keep).select("raw_payload", "ingested_at")


def replay_rules(contract: TableContract) -> TableContract:
    """The contract Bronze's first copies are re-validated with: ``contract`` with the columns
    erasure nulls (:func:`cdcflow.layers.erasure.erased_columns`) neither required nor
    NOT NULL.

    Every first copy passed the contract when it was accepted; an erasure then set its PII
    fields to null in the raw payload (docs/erasure.md). Re-validating that null against
    ``nullable: false`` or ``required_on_insert`` would reject the event on replay and drop
    the subject's row with its other columns; the live Silver keeps them with the PII null.
    """
    from cdcflow.layers.erasure import erased_columns

    erased = {c.name for c in erased_columns(contract)}
    if not erased:
        return contract
    columns = tuple(
        c.model_copy(update={"nullable": True, "required_on_insert": False})
        if c.name in erased
        else c
        for c in contract.columns
    )
    return contract.model_copy(update={"columns": columns})


def replay_table(
    config: CdcflowConfig, contract: TableContract, to_version: int | None = None
) -> TableReplay:
    """Rebuild one declared table's Silver from its Bronze and compare with the live Silver.

    Args:
        config: the pipeline configuration (``processing.max_clock_skew``).
        contract: the contract the table's Delta tables hold.
        to_version: the Bronze version to read (None: the latest); an older one is compared
            with Silver as the last micro-batch in it left it.

    Returns:
        The replay, with its comparison report.
    """
    tables = contract_tables(contract)
    bronze = _open(config, tables.bronze.name, to_version)
    read = pl.from_arrow(
        read_arrow(
            bronze, columns=["raw_payload", "ingested_at", "is_duplicate", "sequence", "batch_id"]
        )
    )
    assert isinstance(read, pl.DataFrame)
    rows = read.filter(~pl.col("is_duplicate")).sort("sequence")
    skew = config.processing.max_clock_skew
    validators: dict[Any, ContractValidator] = {}
    declared = next((c for c in config.contracts() if c.name == contract.name), contract)
    router = Router.of(config, [declared])  # Bronze keeps the record as delivered
    events: list[ChangeEvent | TruncateEvent] = []
    result = TableReplay(contract.name, bronze.version())
    records = rows.select("raw_payload", "ingested_at")
    if contract.truncate == "apply":  # the table's truncates are kept beside its Bronze
        last = read.select(pl.col("ingested_at").max()).item()
        records = pl.concat([records, _truncate_records(config, contract.name, last)])
    rules = replay_rules(contract)
    for raw, ingested_at in records.iter_rows():
        validator = validators.get(ingested_at)
        if validator is None:
            validator = validators[ingested_at] = ContractValidator(rules, ingested_at, skew)
        decoded = router.decode_raw(contract.name, raw) if router.decodes else None
        if decoded is None:
            event = validator.validate(raw)
        elif isinstance(decoded, dict):
            event = validator.validate_object(decoded)
        elif isinstance(decoded, Rejection):
            event = decoded
        else:  # never in Bronze: a skip is not a delivery
            continue
        result.events += 1
        if isinstance(event, Rejection):
            result.rejected[event.reason] = result.rejected.get(event.reason, 0) + 1
        else:
            events.append(event)
            result.ingested_at[event.event_id] = ingested_at
    result.accepted = events
    state = fold_changes(events, contract, contract.delete_mode)
    expected = contract_state_frame(contract, state)
    result.silver_rows = expected.height
    public = contract_public_schema(contract)
    silver_uri = config.table_uri(tables.silver.name)
    live_label = "live silver"
    if DeltaTable.is_deltatable(silver_uri, storage_options=config.storage.options or None):
        version = None
        if bronze.version() < _open(config, tables.bronze.name).version():  # --to-version
            # Silver as the last micro-batch in that Bronze left it, not today's
            last_batch = read.select(pl.col("batch_id").max()).item()
            version = version_after_batch(
                silver_uri,
                config.storage.options,
                f"cdcflow-{config.pipeline.name}",
                -1 if last_batch is None else last_batch,
            )
            live_label = f"silver v{version} (after micro-batch {last_batch})"
        silver = _open(config, tables.silver.name, version)
        live = pl.from_arrow(read_arrow(silver, columns=public.names))
    else:  # a lost Silver (cdcflow run refuses it): every replayed key shows as missing
        live = pl.from_arrow(public.empty_table())
    assert isinstance(live, pl.DataFrame)
    result.report = reconcile_table(
        live, expected, contract, expected_label="replayed", actual_label=live_label
    )
    result.report.kind = "replay"
    return result


def replay_tables(config: CdcflowConfig, to_version: int | None = None) -> list[TableReplay]:
    """:func:`replay_table` for every declared table, in declared order."""
    return [replay_table(config, c, to_version) for c in held_contracts(config)]


__all__ = ["TableReplay", "held_contracts", "replay_rules", "replay_table", "replay_tables"]
