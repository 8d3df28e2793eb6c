"""The SparkSession of the Spark engine: Delta jars from a local folder, small local defaults.

Nothing is downloaded when the session starts: the Delta jars come from ``spark.jars_dir``
(filled by ``scripts/spark/fetch-jars.sh``), never from ``spark.jars.packages``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdcflow.errors import MissingDependencyError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.config import SparkSection

INSTALL_HINT = (
    "the Spark engine needs the 'spark' extra (uv sync --extra spark) and the Delta jars "
    "(scripts/spark/fetch-jars.sh)"
)

#: log4j2 configuration of the driver JVM: errors only, on stderr (a file URI: no spaces, which
#: would split ``spark.driver.extraJavaOptions``)
LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")

#: The driver JVM option that loads :data:`LOG4J2_CONFIG`.
LOG4J2_OPTION = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
#: Driver JVM options: their own key, whose ``spark.conf`` value is added to the defaults'.
JAVA_OPTIONS = "spark.driver.extraJavaOptions"

#: Defaults for a small local run; ``spark.conf`` entries override them (but
#: ``spark.driver.extraJavaOptions`` adds to the default's: :func:`java_options`).
DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    # Parquet INT96 (Spark's default) overflows other readers before 1677: write microseconds
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # a streaming query plans the same shapes every micro-batch: keep their generated classes
    # (Spark's default keeps 100, fewer than one Silver MERGE batch makes, so every batch
    # compiled them again: ~20% of a warm batch's time)
    "spark.sql.codegen.cache.maxEntries": "2000",
    # the driver's log4j2 configuration: errors only (see log4j2.properties)
    JAVA_OPTIONS: LOG4J2_OPTION,
}


#: The defaults that the tables' contents depend on, set on an active session cdcflow did not
#: start too (a Databricks notebook's or job's): instants written and read in UTC, Parquet
#: timestamps in microseconds (what delta-rs and the local engine read back exactly).
SESSION_CONF = ("spark.sql.session.timeZone", "spark.sql.parquet.outputTimestampType")


def java_options(configured: str | None) -> str:
    """The driver's JVM options: the default (:data:`LOG4J2_OPTION`) plus ``configured``.

    Args:
        configured: ``spark.conf``'s ``spark.driver.extraJavaOptions``, or None.

    Returns:
        The default option followed by ``configured`` (the JVM takes the last of a repeated
        ``-D``, so a configured ``-Dlog4j2.configurationFile`` still wins).
    """
    return " ".join(part for part in (LOG4J2_OPTION, configured) if part)


def delta_jars(jars_dir: str) -> list[str]:
    """Absolute paths of the jars in ``jars_dir``.

    Raises:
        MissingDependencyError: the folder has no Delta jar.
    """
    folder = Path(jars_dir).resolve()
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise MissingDependencyError(
            f"no Delta jars in {folder} (spark.jars_dir, relative to the current folder): run "
            "`make spark-jars` in the cdcflow checkout, or set spark.jars_dir to its "
            ".spark-jars folder"
        )
    return jars


def get_session(settings: SparkSection) -> SparkSession:
    """Return the active SparkSession or start one configured for Delta.

    An active session (a Databricks notebook's or job's, or the tests' shared one) is used as it
    is, with :data:`SESSION_CONF` set on it: ``settings`` (master, jars, conf) apply only to a
    session started here.

    Args:
        settings: the ``spark`` config section (master, jars folder, extra conf).

    Raises:
        MissingDependencyError: pyspark/delta-spark or the Delta jars are missing.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    active = SparkSession.getActiveSession()
    if active is not None:  # e.g. a Databricks job's session: its own master, jars and conf
        for key in SESSION_CONF:
            active.conf.set(key, DEFAULT_CONF[key])
        return active
    # PySpark starts its Python workers with $PYSPARK_PYTHON (default: "python3" on PATH), not
    # with the spark.pyspark.python conf: point it at this interpreter (the one with cdcflow)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.master).appName("cdcflow")
    conf = {
        **DEFAULT_CONF,
        "spark.jars": ",".join(delta_jars(settings.jars_dir)),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **settings.conf,
        JAVA_OPTIONS: java_options(settings.conf.get(JAVA_OPTIONS)),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
