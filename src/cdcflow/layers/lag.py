"""End-to-end lag of a pipeline's tables: source commit → Silver commit, per event.

For each accepted first copy (outcomes other than ``DUPLICATE``) of each table (the declared
tables, or the shipped customers table when none is declared):
``lag = lag_s + (Silver commit time − batch processing time)``, where ``lag_s`` is the
outcome's processing time − ``event_timestamp`` (the source's commit time, e.g. Debezium's
``source.ts_ms``), the processing time is ``audit/batch_log.started_at`` and the Silver commit
time is the Delta commit timestamp of the table's Silver version after the batch
(``audit/table_batch_log.silver_version``; customers: ``audit/batch_log.silver_version``), or,
for a version whose commit the Delta log no longer holds (``cdcflow erase`` truncates it), the
batch's end (``started_at + duration_ms``, after that commit by the audit stage). Seconds, from
the clocks of the source database and of this machine (a skew between them shifts every
figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow


@dataclass(frozen=True)
class TableLag:
    """Lag figures of one table (seconds; None when it has no event).

    Attributes:
        table: the declared table.
        events: accepted first copies measured.
        p50 / p95 / max: source commit → Silver commit.
    """

    table: str
    events: int
    p50: float | None
    p95: float | None
    max: float | None


def _read(config: CdcflowConfig, name: str, columns: list[str]) -> pl.DataFrame:
    table = DeltaTable(config.table_uri(name), storage_options=config.storage.options or None)
    frame = pl.from_arrow(read_arrow(table, columns=columns))
    assert isinstance(frame, pl.DataFrame)
    return frame


def end_to_end_lag(config: CdcflowConfig, since: datetime | None = None) -> list[TableLag]:
    """The lag of every table (module doc), in declared order.

    Args:
        config: the pipeline's config.
        since: only the micro-batches whose Silver commit is at or after this time (UTC);
            None: every micro-batch.

    Raises:
        TableNotFoundError: the pipeline has not run yet (no audit tables).
    """
    declared = bool(config.tables)
    columns = ["batch_id", "started_at", "duration_ms"] + ([] if declared else ["silver_version"])
    batches = _read(config, "audit/batch_log", columns)
    per_table = (
        _read(config, "audit/table_batch_log", ["batch_id", "table_name", "silver_version"])
        if declared
        else None
    )
    out = []
    for contract in config.contracts():
        silver = DeltaTable(
            config.table_uri(contract.table_names.silver),
            storage_options=config.storage.options or None,
        )
        commits = {
            int(entry["version"]): datetime.fromtimestamp(int(entry["timestamp"]) / 1000, UTC)
            for entry in silver.history()
            if "version" in entry and "timestamp" in entry
        }
        if per_table is None:
            versions = batches
        else:
            versions = per_table.filter(pl.col("table_name") == contract.name).join(
                batches, on="batch_id"
            )
        delay = {}
        for row in versions.iter_rows(named=True):
            if row["silver_version"] is None:
                continue
            committed = commits.get(row["silver_version"])
            if committed is None:  # a log truncated since (an erasure): the batch's end
                committed = row["started_at"] + timedelta(milliseconds=row["duration_ms"] or 0)
            if since is None or committed >= since:
                delay[row["batch_id"]] = (committed - row["started_at"]).total_seconds()
        outcomes = _read(config, contract.outcomes_table, ["batch_id", "outcome", "lag_s"])
        measured = outcomes.filter(pl.col("outcome") != "DUPLICATE")
        if since is not None:
            measured = measured.filter(pl.col("batch_id").is_in(list(delay)))
        lags = measured.with_columns(
            (
                pl.col("lag_s")
                + pl.col("batch_id").replace_strict(delay, default=0.0, return_dtype=pl.Float64)
            ).alias("lag")
        ).get_column("lag")
        if lags.is_empty():
            out.append(TableLag(contract.name, 0, None, None, None))
            continue
        ordered = sorted(float(x) for x in lags.to_list())
        pick = lambda q, xs=ordered: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
        out.append(TableLag(contract.name, len(ordered), pick(0.5), pick(0.95), ordered[-1]))
    return out


__all__ = ["TableLag", "end_to_end_lag"]
