"""``cdcflow replay --apply`` of declared tables: each table's Silver (and hard-mode tombstones)
replaced by the state rebuilt from its Bronze alone.

The rebuild is :func:`cdcflow.layers.contract_replay.replay_table`: Bronze's first copies
re-validated with the contract the table holds; here they are folded by the engine's fold
(:func:`cdcflow.engines.local.fold.fold_events`, with the sequence registers Silver's MERGE
needs; the reference fold checked the same state in the verification), and written under the
run lock, in this order, every write under the app transaction ``cdcflow-<pipeline>-replay``
with version = the replay id (0, 1, ...):

1. per table, in declared order: the tombstones — one overwrite (hard mode: the latest DELETE
   of each key with the processing time of the micro-batch that brought it, those past
   ``tombstone_retention_days`` of the last micro-batch left out as the stream purges them;
   soft mode: empty) — then Silver, one overwrite (time travel still reaches the previous
   version);
2. one ``kind = 'replay'`` row in ``audit/batch_log`` — the mark of a finished replay.

A replay killed before its batch_log row did not finish: the engines refuse to run
micro-batches (:func:`check_replays`), and the next ``replay --apply`` takes over its replay id
and writes every table again, so a killed and re-run replay ends equal to an uninterrupted one.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.contracts import in_table_order
from cdcflow.engines.local.delta import DeltaStore, txn_done
from cdcflow.engines.local.fold import batch_tombstones, change_frame, fold_events
from cdcflow.engines.local.replay import ReplayError, replay_app_id
from cdcflow.layers.contract_replay import TableReplay, held_contracts
from cdcflow.layers.contract_tables import contract_tables
from cdcflow.layers.tables import BATCH_LOG, TableSpec
from cdcflow.logs import get_logger
from cdcflow.model.events import Operation
from cdcflow.plan.truncates import with_truncates_applied
from cdcflow.report import BatchReport
from cdcflow.state.checkpoint import Checkpoint
from cdcflow.state.faults import crash_point

log = get_logger("engine.local.tables.replay")


def _open(config: CdcflowConfig, name: str) -> DeltaTable:
    return DeltaTable(config.table_uri(name), storage_options=config.storage.options or None)


def _txn_version(config: CdcflowConfig, name: str, app_id: str) -> int:
    if not DeltaTable.is_deltatable(
        config.table_uri(name), storage_options=config.storage.options or None
    ):
        return -1
    version = _open(config, name).transaction_version(app_id)
    return -1 if version is None else version


def _progress(config: CdcflowConfig) -> tuple[int, int]:
    """(latest replay id any declared table's Silver or tombstones hold, latest replay id
    ``audit/batch_log`` holds); -1 for none."""
    app_id = replay_app_id(config)
    written = -1
    for contract in config.contracts():
        names = contract.table_names
        for name in (names.tombstones, names.silver):
            written = max(written, _txn_version(config, name, app_id))
    return written, _txn_version(config, BATCH_LOG.name, app_id)


def check_replays(config: CdcflowConfig) -> None:
    """Refuse to run micro-batches over a replay that did not finish.

    Raises:
        ReplayError: a ``replay --apply`` wrote a table but not its batch_log row.
    """
    written, logged = _progress(config)
    if written > logged:
        raise ReplayError(
            f"declared tables: replay {written} (`cdcflow replay --apply`) is running or was "
            "interrupted; run `cdcflow replay --apply` again to finish it before running "
            "micro-batches"
        )


def _overwrite(
    config: CdcflowConfig, spec: TableSpec, frame: pl.DataFrame, props: CommitProperties
) -> int:
    # a lost table (check_tables_kept) is created empty first, as a run creates it
    table = DeltaStore({spec.name: config.table_uri(spec.name)}, config.storage.options).open(spec)
    ordered = in_table_order(spec, table)
    data = frame.select(ordered.schema.names).to_arrow().cast(ordered.schema)
    write_deltalake(table, data, mode="overwrite", commit_properties=props)
    return _open(config, spec.name).version()


def apply_tables(config: CdcflowConfig, replays: list[TableReplay]) -> int:
    """Write the rebuilt state of every declared table (see module doc).

    Args:
        config: the pipeline configuration.
        replays: the verified rebuilds (:func:`cdcflow.layers.contract_replay.replay_tables`),
            one per declared table, of the latest Bronze.

    Returns:
        The replay id.

    Raises:
        ReplayError: a table's Bronze moved past the replayed version, or its replay rejects
            events the pipeline accepted (nothing is written).
        CheckpointError: a pipeline run holds the checkpoint lock.
    """
    refused = {r.table: r.rejected for r in replays if r.rejected}
    if refused:
        # Bronze holds accepted events only: a rejection on replay is an event the contract
        # took when it arrived and a changed contract (a constraint, a column added with a type
        # its old field does not fit) no longer takes. A contract change applies to the
        # micro-batches after it (docs/tables.md): applying would drop those events from Silver.
        shown = "; ".join(
            f"table {table}: {sum(reasons.values())} ({', '.join(sorted(reasons))})"
            for table, reasons in refused.items()
        )
        raise ReplayError(
            f"replay --apply: the current contracts reject events the pipeline accepted ({shown});"
            " writing the replay would drop them from Silver, so nothing was written (a contract "
            "change applies to the micro-batches after it: docs/tables.md)"
        )
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    with Checkpoint.of(config).lock():
        contracts = {c.name: c for c in held_contracts(config)}
        for replay in replays:
            bronze = contract_tables(contracts[replay.table]).bronze.name
            latest = _open(config, bronze).version()
            if latest != replay.bronze_version:
                raise ReplayError(
                    f"table {replay.table}: bronze is at version {latest} but the replay read "
                    f"version {replay.bronze_version}; run the replay again"
                )
        written, logged = _progress(config)
        resumed = written > logged
        replay_id = written if resumed else max(written, logged) + 1
        if resumed:
            log.warning("finishing an interrupted replay", extra={"replay_id": replay_id})
        app_id = replay_app_id(config)
        props = CommitProperties(
            custom_metadata={"cdcflow.operation": "replay", "cdcflow.replay_id": str(replay_id)},
            app_transactions=[Transaction(app_id=app_id, version=replay_id)],
        )
        totals = BatchReport(
            batch_id=-1,
            pipeline=config.pipeline.name,
            kind="replay",
            started_at=started_at,
            delete_mode=",".join(sorted({c.delete_mode for c in contracts.values()})),
        )
        crash_point("replay_before_write", replay_id)
        for replay in replays:
            contract = contracts[replay.table]
            tables = contract_tables(contract)
            # a truncate is the DELETE of every key with an event before it (plan.truncates)
            frame = change_frame(with_truncates_applied(replay.accepted), contract)
            folded = fold_events(frame, contract.delete_mode, None, contract)
            silver = folded.filter(pl.col("_cdc_seq").is_not_null())
            tombs = batch_tombstones(frame, contract=contract)
            tombs = tombs.with_columns(
                pl.col("last_event_id")
                .replace_strict(replay.ingested_at, return_dtype=pl.Datetime("us", "UTC"))
                .alias("tombstoned_at")
            )
            if contract.delete_mode == "soft":
                tombs = tombs.clear()
            elif replay.ingested_at:  # the stream purges tombstones past their retention
                last = max(replay.ingested_at.values())
                cutoff = last - timedelta(days=contract.tombstone_retention_days)
                tombs = tombs.filter(pl.col("tombstoned_at") >= cutoff)
            _overwrite(config, tables.tombstones, tombs, props)
            crash_point("replay_after_tombstones", replay_id)
            replay.applied_version = _overwrite(config, tables.silver, silver, props)
            crash_point("replay_after_silver", replay_id)
            ops = [getattr(e, "operation", None) for e in replay.accepted]
            totals.records_received += replay.events
            totals.accepted += len(replay.accepted)
            totals.quarantined += sum(replay.rejected.values())
            totals.inserts += ops.count(Operation.INSERT)
            totals.updates += ops.count(Operation.UPDATE)
            totals.deletes += ops.count(Operation.DELETE)
        totals.duration_ms = int((time.perf_counter() - started) * 1000)
        row = pa.Table.from_pylist([totals.row()], schema=BATCH_LOG.schema)
        log_table = _open(config, BATCH_LOG.name)
        if not txn_done(log_table, app_id, replay_id):
            write_deltalake(log_table, row, mode="append", commit_properties=props)
        crash_point("replay_after_log", replay_id)
    log.info("declared tables replay applied", extra={"replay_id": replay_id})
    return replay_id


__all__ = ["apply_tables", "check_replays"]
