"""Prometheus metrics of a running pipeline (``cdcflow run --metrics-port N``).

An HTTP endpoint of ``prometheus-client`` (``/metrics``, text exposition format) serves, per
pipeline and table, what each committed micro-batch reports (:class:`~cdcflow.report.
BatchReport`, and for declared tables their ``audit/table_batch_log`` rows):

==========================================  =========  ===========================================
metric                                      type       labels and meaning
==========================================  =========  ===========================================
``cdcflow_records_total``                   counter    pipeline, table, outcome: ``received``,
                                                       ``accepted``, ``quarantined``, ``duplicate``
``cdcflow_changes_total``                   counter    pipeline, table, operation: ``INSERT``,
                                                       ``UPDATE``, ``DELETE`` (first copies)
``cdcflow_events_total``                    counter    pipeline, outcome: ``STALE``,
                                                       ``TOMBSTONED``, ``LATE``
``cdcflow_quarantined_records_total``       counter    pipeline, table, reason (the reason code)
``cdcflow_batch_duration_seconds``          histogram  pipeline, table: wall time of each
                                                       micro-batch that brought the table records
                                                       (one micro-batch serves all its tables)
``cdcflow_event_lag_seconds``               gauge      pipeline, table: the largest event lag
                                                       (processing time − event time) of the
                                                       table's last micro-batch with events
``cdcflow_last_commit_timestamp_seconds``   gauge      pipeline, table: Unix time of the last
                                                       commit that brought the table records
``cdcflow_batches_total``                   counter    pipeline: micro-batches committed
==========================================  =========  ===========================================

Each process has its own registry (not the library's global one), so tests and embedded uses
can run several. Only counts, reason codes and times are exported: no record values.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.errors import ConfigError, MissingDependencyError
from cdcflow.report import BatchReport

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: Declared tables: the quarantine of records no table's routing matched.
UNROUTED_QUARANTINE = "quarantine/unrouted_events"
#: Histogram buckets of the micro-batch duration (seconds).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))


class PipelineMetrics:
    """The metrics of one pipeline, updated by :meth:`observe` after each committed batch.

    Args:
        config: the pipeline's config (its tables: the declared ones, else customers).
        registry: where to register (default: a new registry of its own).

    Raises:
        MissingDependencyError: ``prometheus-client`` is not installed.
    """

    def __init__(self, config: CdcflowConfig, registry: CollectorRegistry | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:  # pragma: no cover - a dependency of the package
            raise MissingDependencyError(
                "Prometheus metrics need prometheus-client: pip install prometheus-client"
            ) from exc
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.pipeline = config.pipeline.name
        r = self.registry
        self.records = Counter(
            "cdcflow_records", "Landing records by outcome", ["pipeline", "table", "outcome"],
            registry=r,
        )  # fmt: skip
        self.changes = Counter(
            "cdcflow_changes", "Accepted first copies by operation",
            ["pipeline", "table", "operation"], registry=r,
        )  # fmt: skip
        self.events = Counter(
            "cdcflow_events", "Accepted events by outcome (stale, tombstoned) and late events",
            ["pipeline", "outcome"], registry=r,
        )  # fmt: skip
        self.quarantined = Counter(
            "cdcflow_quarantined_records", "Quarantined records by reason code",
            ["pipeline", "table", "reason"], registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "cdcflow_batch_duration_seconds", "Wall time of each micro-batch",
            ["pipeline", "table"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.lag = Gauge(
            "cdcflow_event_lag_seconds",
            "Largest event lag (processing time - event time) of the last micro-batch",
            ["pipeline", "table"], registry=r,
        )  # fmt: skip
        self.last_commit = Gauge(
            "cdcflow_last_commit_timestamp_seconds", "Unix time of the last committed micro-batch",
            ["pipeline", "table"], registry=r,
        )  # fmt: skip
        self.batches = Counter(
            "cdcflow_batches", "Micro-batches committed", ["pipeline"], registry=r
        )

    def observe(self, report: BatchReport) -> None:
        """Count one committed micro-batch.

        Args:
            report: the batch's report (for declared tables the sums over the tables; the
                per-table counts are read from ``audit/table_batch_log``).
        """
        p = self.pipeline
        now = time.time()
        per_table = self._per_table(report)
        lags = self._lags(report, [t for t, c in per_table.items() if c["accepted"]])
        for table, counts in per_table.items():
            for outcome in ("received", "accepted", "quarantined", "duplicate"):
                self.records.labels(p, table, outcome).inc(counts[outcome])
            for operation in ("INSERT", "UPDATE", "DELETE"):
                self.changes.labels(p, table, operation).inc(counts[operation])
            if counts["received"]:
                self.duration.labels(p, table).observe(report.duration_ms / 1000)
                self.last_commit.labels(p, table).set(now)
            lag = lags.get(table)
            if lag is not None:
                self.lag.labels(p, table).set(lag)
        self.events.labels(p, "STALE").inc(report.stale_ignored)
        self.events.labels(p, "TOMBSTONED").inc(report.tombstoned)
        self.events.labels(p, "LATE").inc(report.late_events)
        if report.quarantined:
            for (table, reason), n in self._reasons(report.batch_id).items():
                self.quarantined.labels(p, table, reason).inc(n)
        self.batches.labels(p).inc()

    def _lags(self, report: BatchReport, tables: list[str]) -> dict[str, float | None]:
        """Per table with accepted events: the largest event lag of the batch, in seconds (the
        shipped table: the report's; declared tables: from the batch's Bronze rows,
        ``ingested_at`` − ``event_timestamp``)."""
        if not self.config.tables:
            return dict.fromkeys(tables, report.max_event_lag_s)
        out: dict[str, float | None] = {}
        for contract in self.config.contracts():
            if contract.name not in tables:
                continue
            rows = self._read(
                contract.table_names.bronze, report.batch_id, ["ingested_at", "event_timestamp"]
            )
            if not rows.height:
                continue
            lag = rows.select(
                (pl.col("ingested_at") - pl.col("event_timestamp")).dt.total_microseconds().max()
            ).item()
            out[contract.name] = None if lag is None else lag / 1e6
        return out

    def _per_table(self, report: BatchReport) -> dict[str, dict[str, int]]:
        def counts(row: Any) -> dict[str, int]:
            return {
                "received": row["records_received"],
                "accepted": row["accepted"],
                "quarantined": row["quarantined"],
                "duplicate": row["duplicates"],
                "INSERT": row["inserts"],
                "UPDATE": row["updates"],
                "DELETE": row["deletes"],
            }

        if not self.config.tables:
            (contract,) = self.config.contracts()
            return {contract.name: counts(report.row())}
        rows = self._read("audit/table_batch_log", report.batch_id)
        return {row["table_name"]: counts(row) for row in rows.iter_rows(named=True)}

    def _reasons(self, batch_id: int) -> dict[tuple[str, str], int]:
        """(table, reason code) → records the batch quarantined; declared tables: records
        routed to no table are counted under the table ``unrouted``."""
        out: dict[tuple[str, str], int] = {}
        tables = [(c.name, c.table_names.quarantine) for c in self.config.contracts()]
        if self.config.tables:
            tables.append(("unrouted", UNROUTED_QUARANTINE))
        for table, name in tables:
            rows = self._read(name, batch_id, ["failure_reason"])
            if rows.height:
                for reason, n in rows.group_by("failure_reason").len().iter_rows():
                    out[(table, reason)] = int(n)
        return out

    def _read(self, name: str, batch_id: int, columns: list[str] | None = None) -> pl.DataFrame:
        """The rows of micro-batch ``batch_id`` of table ``name`` (empty when it is missing)."""
        uri = self.config.table_uri(name)
        options = self.config.storage.options or None
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            return pl.DataFrame()
        frame = pl.scan_delta(uri, storage_options=options).filter(pl.col("batch_id") == batch_id)
        if columns:
            frame = frame.select(columns)
        return frame.collect()


def serve(metrics: PipelineMetrics, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``metrics`` on ``http://host:port/metrics`` from a daemon thread.

    Returns:
        The HTTP server (``shutdown()`` stops it).

    Raises:
        ConfigError: the port cannot be bound (in use, or not allowed).
    """
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(f"--metrics-port: cannot serve on {host}:{port} ({exc})") from None
    return server


__all__ = ["DURATION_BUCKETS", "PipelineMetrics", "serve"]
