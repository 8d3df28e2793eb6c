"""End-to-end lag of declared tables: source commit → Silver commit, per event.

For each accepted first copy (outcomes other than ``DUPLICATE``) of each declared table:
``lag = lag_s + (Silver commit time − batch processing time)``, where ``lag_s`` is the
outcome's processing time − ``event_timestamp`` (the source's commit time, e.g. Debezium's
``source.ts_ms``), the processing time is ``audit/batch_log.started_at`` and the Silver commit
time is the Delta commit timestamp of the table's Silver version after the batch
(``audit/table_batch_log.silver_version``). Seconds, from the clocks of the source database
and of this machine (a skew between them shifts every figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig


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
    frame = pl.from_arrow(table.to_pyarrow_table(columns=columns))
    assert isinstance(frame, pl.DataFrame)
    return frame


def end_to_end_lag(config: CdcflowConfig) -> list[TableLag]:
    """The lag of every declared table (module doc), in declared order.

    Raises:
        TableNotFoundError: the pipeline has not run yet (no audit tables).
    """
    batches = _read(config, "audit/batch_log", ["batch_id", "started_at"])
    per_table = _read(config, "audit/table_batch_log", ["batch_id", "table_name", "silver_version"])
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
        versions = per_table.filter(pl.col("table_name") == contract.name).join(
            batches, on="batch_id"
        )
        delay = {
            row["batch_id"]: (commits[row["silver_version"]] - row["started_at"]).total_seconds()
            for row in versions.iter_rows(named=True)
            if row["silver_version"] in commits
        }
        outcomes = _read(config, contract.outcomes_table, ["batch_id", "outcome", "lag_s"])
        lags = (
            outcomes.filter(pl.col("outcome") != "DUPLICATE")
            .with_columns(
                (
                    pl.col("lag_s")
                    + pl.col("batch_id").replace_strict(delay, default=0.0, return_dtype=pl.Float64)
                ).alias("lag")
            )
            .get_column("lag")
        )
        if lags.is_empty():
            out.append(TableLag(contract.name, 0, None, None, None))
            continue
        ordered = sorted(float(x) for x in lags.to_list())
        pick = lambda q, xs=ordered: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
        out.append(TableLag(contract.name, len(ordered), pick(0.5), pick(0.95), ordered[-1]))
    return out


__all__ = ["TableLag", "end_to_end_lag"]
