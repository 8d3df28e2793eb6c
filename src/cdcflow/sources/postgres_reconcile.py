"""Reconcile Silver with the live PostgreSQL source table, at the LSN the pipeline consumed.

:func:`reconcile_postgres` reads ``SELECT customer_id, <attributes> FROM <table>`` (every
attribute column of ``ATTRIBUTES`` the table has, as text) and compares Silver's non-deleted
rows with it field by field (:func:`cdcflow.reconcile.reconcile_snapshot`).

The comparison is only meaningful when the table is at the position the pipeline consumed: the
replication slot's confirmed position, with no change of the table after it. The snapshot is
therefore taken between two peeks of the slot; both must show no pending change of the table
and the same confirmed position, else :class:`SourceAheadError` says how far the source is
ahead (run the pipeline to catch up, then reconcile).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from cdcflow.engines.local.delta import read_arrow
from cdcflow.model.events import ATTRIBUTES
from cdcflow.model.lsn import format_pg_lsn
from cdcflow.reconcile import ReconcileReport, reconcile_snapshot
from cdcflow.sources.postgres import PostgresSourceError, confirmed_lsn, connection, peek

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig, PostgresSourceSection

#: How many decoded rows a pending-changes check peeks at most.
PENDING_PEEK_LIMIT = 10_000


class SourceAheadError(PostgresSourceError):
    """The source table has changes the pipeline has not consumed yet."""


@dataclass(frozen=True)
class SourceSnapshot:
    """The source table at the pipeline's consumed position.

    Attributes:
        frame: one row per live customer_id: ``customer_id`` and the attribute columns the table
            has, all text.
        consumed_lsn: the slot's confirmed position, ``X/Y``.
    """

    frame: pl.DataFrame
    consumed_lsn: str


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _table_parts(table: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def _pending(conn: Any, settings: PostgresSourceSection) -> int:
    return len(peek(conn, settings, PENDING_PEEK_LIMIT).events)


def read_source_snapshot(settings: PostgresSourceSection) -> SourceSnapshot:
    """Read the source table, checking it is at the slot's confirmed position.

    Raises:
        SourceAheadError: the table has changes beyond the slot's confirmed position.
        PostgresSourceError: the table or slot does not exist, or the server is unreachable.
    """
    schema, name = _table_parts(settings.table)
    with connection(settings) as conn:
        before = confirmed_lsn(conn, settings.slot_name)
        pending = _pending(conn, settings)
        if pending:
            raise SourceAheadError(
                f"the source table has {pending} change(s) after the consumed position "
                f"{format_pg_lsn(before)}; run the pipeline until it is caught up, then reconcile"
            )
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s",
                (schema, name),
            ).fetchall()
        ]
        if settings.key_column not in columns:
            raise PostgresSourceError(
                f"source table {settings.table} not found or without column {settings.key_column}"
            )
        attributes = [c for c in ATTRIBUTES if c in columns]
        select = ", ".join(
            [f"{_quote(settings.key_column)}::text AS customer_id"]
            + [f"{_quote(c)}::text AS {_quote(c)}" for c in attributes]
        )
        rows = conn.execute(f"SELECT {select} FROM {_quote(schema)}.{_quote(name)}").fetchall()
        after = confirmed_lsn(conn, settings.slot_name)
        if after != before or _pending(conn, settings):
            raise SourceAheadError(
                "the source table changed while it was read; reconcile when the workload is idle"
            )
    names = ["customer_id", *attributes]
    frame = pl.DataFrame(
        {n: [row[i] for row in rows] for i, n in enumerate(names)},
        schema=dict.fromkeys(names, pl.String),
    )
    return SourceSnapshot(frame, format_pg_lsn(before))


def reconcile_postgres(config: CdcflowConfig, silver: pl.DataFrame) -> ReconcileReport:
    """Compare Silver (public columns, one row per customer_id) with the live source table.

    Args:
        config: the pipeline configuration (``source.postgres``).
        silver: Silver's public columns, e.g. ``cdcflow.cli.reconcile.read_silver(config)``.

    Returns:
        The report (kind ``source-snapshot``); its expected side is labelled with the table and
        the consumed LSN.

    Raises:
        SourceAheadError: the table has changes the pipeline has not consumed.
        PostgresSourceError: the database, table or slot cannot be read.
    """
    settings = config.source.postgres
    snapshot = read_source_snapshot(settings)
    label = f"postgres {settings.table} @ {snapshot.consumed_lsn}"
    return reconcile_snapshot(silver, snapshot.frame, snapshot_label=label)


def reconcile_postgres_tables(config: CdcflowConfig) -> dict[str, ReconcileReport]:
    """Compare every declared table's Silver with its live PostgreSQL table (a Kafka /
    Debezium source: ``source.type: kafka``, connection settings in ``source.postgres``).

    Each contract's table is ``<source.postgres.schema_name>.<contract name>``; its columns are
    the contract's (as the Delta tables hold it: evolved columns included) that the table has,
    read under their source names and typed as Silver types them. Silver's non-deleted rows are
    compared, key by key and column by column (:func:`cdcflow.reconcile.reconcile_table`).

    Only meaningful once the pipeline has consumed everything the source sent: with a Kafka
    source, every record of its topics must be committed in Silver (else
    :class:`SourceAheadError`); the connector's own lag inside PostgreSQL is not visible here —
    reconcile when the workload has been idle for a few seconds.

    Returns:
        table name → its report (kind ``source-snapshot``), in declared order.

    Raises:
        SourceAheadError: Kafka holds records the pipeline has not committed yet.
        PostgresSourceError: the database or a table cannot be read.
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    from cdcflow.layers.contract_replay import held_contracts
    from cdcflow.reconcile import contract_public_schema, reconcile_table

    if config.source.type == "kafka":
        from cdcflow.sources.kafka import KafkaSource
        from cdcflow.state.checkpoint import Checkpoint

        pending = KafkaSource(config).pending(Checkpoint.of(config))
        if pending:
            raise SourceAheadError(
                f"Kafka holds {pending} record(s) the pipeline has not committed yet; run the "
                "pipeline until it is caught up, then reconcile"
            )
    settings = config.source.postgres
    schema_name = settings.schema_name if settings.schema_name != "*" else "public"
    reports: dict[str, ReconcileReport] = {}
    with connection(settings) as conn:
        for contract in held_contracts(config):
            present = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s",
                    (schema_name, contract.name),
                ).fetchall()
            }
            if not present:
                raise PostgresSourceError(f"source table {schema_name}.{contract.name} not found")
            specs = [c for c in contract.columns if c.field in present]
            select = ", ".join(f"{_quote(c.field)} AS {_quote(c.name)}" for c in specs)
            rows = conn.execute(
                f"SELECT {select} FROM {_quote(schema_name)}.{_quote(contract.name)}"
            ).fetchall()
            public = contract_public_schema(contract)
            schema = pa.schema([public.field(c.name) for c in specs])
            table = pa.Table.from_pylist(
                [dict(zip(schema.names, row, strict=True)) for row in rows], schema=schema
            )
            expected = pl.from_arrow(table)
            assert isinstance(expected, pl.DataFrame)
            silver = DeltaTable(
                config.table_uri(contract.table_names.silver),
                storage_options=config.storage.options or None,
            )
            actual = pl.from_arrow(read_arrow(silver, columns=public.names))
            assert isinstance(actual, pl.DataFrame)
            report = reconcile_table(
                actual.filter(~pl.col("is_deleted")),
                expected,
                contract,
                expected_label=f"postgres {schema_name}.{contract.name}",
                actual_label=f"silver {contract.name}",
            )
            report.kind = "source-snapshot"
            # the live rows are compared; Silver's soft-deleted rows are counted beside them
            report.actual_counts.deleted = int(actual.get_column("is_deleted").sum())
            reports[contract.name] = report
    return reports
