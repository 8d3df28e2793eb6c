"""The Snowflake sync's rows computed by Spark and written as Parquet files by its executors.

:class:`SparkSyncFiles` is the Spark engine's :class:`~cdcflow.sinks.snowflake.sync.
SyncFileWriter`: Silver's Change Data Feed (delta-spark's ``readChangeFeed``) is reduced to one
row per key by a window — the same rule as the local :func:`~cdcflow.sinks.snowflake.sync.
read_changes`: the change of the highest ``_commit_version`` wins, a post-image over a
``delete`` of the same version — and written as Parquet with the stage table's columns by the
executors; the driver reads the files' footers only (row counts) and gets two scalars back (the
upserted rows' event-time quantiles). The sync then ``PUT``\\s the files and runs ``COPY INTO``
(:mod:`cdcflow.sinks.snowflake.sync`): no row of Silver or Gold is collected to the driver.

Why not the Snowflake Spark connector: it writes through its own internal stage with its own
retry and transaction handling, which would bypass the stage table + one-transaction MERGE +
``CDC_SYNC_STATE`` protocol that makes a sync exactly-once, and it cannot talk to the local
emulator the tests use. The file route keeps one protocol for both engines.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cdcflow.sinks.snowflake.sync import EVENT_TIME_COLUMN, StageStamp, WrittenFiles

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdcflow.config import CdcflowConfig
    from cdcflow.sinks.snowflake.tables import SyncTarget

#: Relative accuracy of the event-time quantiles (``percentile_approx``: 1 / accuracy of the
#: rows' rank); they feed the lag metrics only.
QUANTILE_ACCURACY = 100_000


class SparkSyncFiles:
    """Writes a Snowflake sync's rows with Spark (see the module docstring).

    Args:
        spark: the engine's session.
        config: the pipeline configuration (``storage.root``, ``snowflake.bulk_file_rows``:
            rows per Parquet file at most).
    """

    def __init__(self, spark: SparkSession, config: CdcflowConfig) -> None:
        self.spark = spark
        self.config = config

    def _read(self, name: str) -> DataFrame:
        return self.spark.read.format("delta").load(self.config.table_uri(name))

    def changes(
        self, target: SyncTarget, from_version: int, to_version: int, stamp: StageStamp,
        folder: Path,
    ) -> WrittenFiles:  # fmt: skip
        """Silver's CDF for versions ``from_version+1 .. to_version``, one row per key:
        ``CHANGE_KIND`` ``DELETE`` for a ``delete`` change, else ``UPSERT`` of the post-image.

        Raises:
            Exception: delta-spark's, when the CDF of a version cannot be read (the sync falls
                back to a full refresh).
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        cdf = (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", from_version + 1)
            .option("endingVersion", to_version)
            .load(self.config.table_uri(target.silver))
            .filter(F.col("_change_type") != "update_preimage")
        )
        latest = Window.partitionBy(*target.keys).orderBy(
            F.col("_commit_version").desc(), (F.col("_change_type") != "delete").desc()
        )
        reduced = (
            cdf.withColumn("_n", F.row_number().over(latest))
            .filter(F.col("_n") == 1)
            .withColumn(
                "CHANGE_KIND",
                F.when(F.col("_change_type") == "delete", F.lit("DELETE")).otherwise(
                    F.lit("UPSERT")
                ),
            )
        )
        return self._write_stage(reduced, target, stamp, folder, measure=True)

    def snapshot(
        self, target: SyncTarget, version: int, stamp: StageStamp, folder: Path
    ) -> WrittenFiles:
        """Silver's public columns at ``version``, each row ``UPSERT``."""
        from pyspark.sql import functions as F

        rows = (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(self.config.table_uri(target.silver))
            .withColumn("CHANGE_KIND", F.lit("UPSERT"))
        )
        return self._write_stage(rows, target, stamp, folder, measure=False)

    def table(self, name: str, version: int, folder: Path) -> WrittenFiles:
        """Every row of the Delta table ``name`` at ``version``, columns upper-cased."""
        from pyspark.sql import functions as F

        frame = (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(self.config.table_uri(name))
        )
        upper = frame.select(*(F.col(c).alias(c.upper()) for c in frame.columns))
        return self._write(upper, folder)

    def _write_stage(
        self, rows: DataFrame, target: SyncTarget, stamp: StageStamp, folder: Path,
        measure: bool,
    ) -> WrittenFiles:  # fmt: skip
        """``rows`` (``CHANGE_KIND`` + the public columns) with the stage's columns, written;
        with ``measure`` the upserted rows' event-time quantiles too (one more job over the
        written files)."""
        from pyspark.sql import functions as F

        staged = rows.select(
            F.lit(stamp.sync_id).alias("SYNC_ID"),
            F.lit(stamp.loaded_at).alias("LOADED_AT"),
            F.col("CHANGE_KIND"),
            *(F.col(c).alias(c.upper()) for c in target.names),
        )
        written = self._write(staged, folder)
        if measure and written.files and EVENT_TIME_COLUMN in target.names:
            written.median_event_at, written.early_event_at = self._quantiles(folder)
        return written

    def _write(self, frame: DataFrame, folder: Path) -> WrittenFiles:
        """``frame`` as Parquet files in ``folder`` (by the executors, at most
        ``snowflake.bulk_file_rows`` rows each); their rows counted from the footers."""
        import pyarrow.parquet as pq

        (
            frame.write.mode("errorifexists")
            .option("maxRecordsPerFile", self.config.snowflake.bulk_file_rows)
            .parquet(str(folder))
        )
        files = sorted(folder.glob("part-*.parquet"))
        return WrittenFiles(files, sum(pq.read_metadata(f).num_rows for f in files))

    def _quantiles(self, folder: Path) -> tuple[datetime | None, datetime | None]:
        """The median and 5th percentile of the written ``UPSERT`` rows' event times
        (approximate: :data:`QUANTILE_ACCURACY`), as :func:`~cdcflow.sinks.snowflake.sync.
        event_time_quantiles` measures them locally."""
        from pyspark.sql import functions as F

        micros = F.unix_micros(F.col(EVENT_TIME_COLUMN.upper()))
        row = (
            self.spark.read.parquet(str(folder))
            .filter((F.col("CHANGE_KIND") == "UPSERT") & micros.isNotNull())
            .agg(F.percentile_approx(micros, [0.5, 0.05], QUANTILE_ACCURACY).alias("q"))
            .first()
        )
        if row is None or row["q"] is None:
            return None, None
        median, early = (datetime.fromtimestamp(v / 1e6, UTC) for v in row["q"])
        return median, early


__all__ = ["QUANTILE_ACCURACY", "SparkSyncFiles"]
