"""The SparkSession of the Spark engine: Delta jars from a local folder, small local defaults.

Nothing is downloaded when the session starts: the Delta jars come from ``spark.jars_dir``
(filled by ``scripts/spark/fetch-jars.sh``), never from ``spark.jars.packages``; with a storage
root on S3, the S3A connector's jars from its ``s3a`` subfolder and the connector's settings
translated from ``storage.options`` and the ``AWS_*`` environment (:func:`s3a_conf`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdcflow.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.config import SparkSection, StorageSection

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


#: URI schemes the S3A connector serves here: ``s3://`` (delta-rs' and obstore's spelling, mapped
#: to S3A by :func:`s3a_conf`) and ``s3a://``.
S3_SCHEMES = ("s3", "s3a")

#: The S3 settings cdcflow reads, as delta-rs / object_store name them (``storage.options``
#: keys, case-insensitive, or the same names upper case in the environment) → the S3A
#: connector's Hadoop keys (https://hadoop.apache.org/docs/r3.4.1/hadoop-aws/tools/hadoop-aws/).
S3A_KEYS = {
    "aws_endpoint_url": "fs.s3a.endpoint",
    "aws_endpoint": "fs.s3a.endpoint",
    "aws_access_key_id": "fs.s3a.access.key",
    "aws_secret_access_key": "fs.s3a.secret.key",
    "aws_session_token": "fs.s3a.session.token",
    "aws_region": "fs.s3a.endpoint.region",
    "aws_default_region": "fs.s3a.endpoint.region",
}


def _scheme(root: str) -> str:
    return root.split("://", 1)[0].lower() if "://" in root else ""


def s3a_conf(storage: StorageSection, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark settings for a storage root on S3, through Hadoop's S3A connector.

    Each setting of :data:`S3A_KEYS` comes from ``storage.options`` (the keys delta-rs takes,
    any case), else from the environment variable of that name upper case (``AWS_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``…); as ``spark.hadoop.fs.s3a.*`` they reach the executors too (whose
    environment is the worker's, not the driver's). Spark redacts the keys and the token in its
    UI and logs (``spark.redaction.regex``); cdcflow never logs them. An endpoint other than
    AWS's (an S3-compatible server) is addressed path-style unless
    ``aws_virtual_hosted_style_request`` is true, over TLS unless the endpoint is ``http://``
    (which also needs ``aws_allow_http: true``, as for delta-rs). ``s3://`` is served by S3A.

    Args:
        storage: the ``storage`` config section.
        environ: the environment (default: ``os.environ``).

    Returns:
        ``spark.hadoop.*`` keys → values; empty when the root is not on S3.

    Raises:
        ConfigError: an ``http://`` endpoint without ``aws_allow_http`` (names the key).
    """
    if _scheme(storage.root) not in S3_SCHEMES:
        return {}
    env = os.environ if environ is None else environ
    options = {key.lower(): value for key, value in storage.options.items()}

    def setting(name: str) -> str | None:
        return options.get(name) or env.get(name.upper()) or None

    hadoop = {
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    for name, key in S3A_KEYS.items():
        value = setting(name)
        if value is not None and key not in hadoop:
            hadoop[key] = value
    if "fs.s3a.session.token" in hadoop:
        hadoop["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    endpoint = hadoop.get("fs.s3a.endpoint")
    if endpoint is not None:
        virtual = (setting("aws_virtual_hosted_style_request") or "").lower() == "true"
        hadoop["fs.s3a.path.style.access"] = "false" if virtual else "true"
        if endpoint.lower().startswith("http://"):
            if (setting("aws_allow_http") or "").lower() not in ("1", "true"):
                raise ConfigError(
                    f"storage.options: the endpoint {endpoint} is http://; set "
                    "aws_allow_http: true (or AWS_ALLOW_HTTP=true) to allow it"
                )
            hadoop["fs.s3a.connection.ssl.enabled"] = "false"
    return {f"spark.hadoop.{key}": value for key, value in hadoop.items()}


def s3a_jars(jars_dir: str) -> list[str]:
    """Absolute paths of the S3A connector's jars (``jars_dir``/s3a, from
    ``scripts/spark/fetch-jars.sh``).

    Raises:
        MissingDependencyError: the folder holds no ``hadoop-aws`` jar.
    """
    folder = Path(jars_dir).resolve() / "s3a"
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any(Path(j).name.startswith("hadoop-aws-") for j in jars):
        raise MissingDependencyError(
            f"no S3A connector jars in {folder} (a storage root on S3 needs them): run "
            "`make spark-jars` in the cdcflow checkout"
        )
    return jars


def get_session(settings: SparkSection, storage: StorageSection | None = None) -> SparkSession:
    """Return the active SparkSession or start one configured for Delta.

    An active session (a Databricks notebook's or job's, or the tests' shared one) is used as it
    is, with :data:`SESSION_CONF` set on it: ``settings`` (master, jars, conf) apply only to a
    session started here.

    With ``storage`` on S3, the S3A connector's jars and :func:`s3a_conf` are added to a session
    started here; an active session gets the Hadoop settings of :func:`s3a_conf` (its own jars
    must hold the connector, as Databricks' do).

    Args:
        settings: the ``spark`` config section (master, jars folder, extra conf).
        storage: the ``storage`` config section (root and options), or None.

    Raises:
        MissingDependencyError: pyspark/delta-spark, the Delta jars or (for S3) the S3A jars are
            missing.
        ConfigError: the S3 settings are not usable (:func:`s3a_conf`).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    store = s3a_conf(storage) if storage is not None else {}
    active = SparkSession.getActiveSession()
    if active is not None:  # e.g. a Databricks job's session: its own master, jars and conf
        for key in SESSION_CONF:
            active.conf.set(key, DEFAULT_CONF[key])
        hadoop = active.sparkContext._jsc.hadoopConfiguration()
        for key, value in store.items():
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        return active
    # PySpark starts its Python workers with $PYSPARK_PYTHON (default: "python3" on PATH), not
    # with the spark.pyspark.python conf: point it at this interpreter (the one with cdcflow)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.master).appName("cdcflow")
    conf = {
        **DEFAULT_CONF,
        "spark.jars": ",".join(
            delta_jars(settings.jars_dir) + (s3a_jars(settings.jars_dir) if store else [])
        ),
        "spark.pyspark.python": sys.executable,
        **store,
        # the S3A jars on the driver's own classpath too: Hadoop's FileContext (Spark's
        # streaming checkpoint) resolves its AbstractFileSystem class through the classloader
        # of a Configuration that may predate the session's added jars
        **(
            {"spark.driver.extraClassPath": os.pathsep.join(s3a_jars(settings.jars_dir))}
            if store
            else {}
        ),
        "spark.pyspark.driver.python": sys.executable,
        **settings.conf,
        JAVA_OPTIONS: java_options(settings.conf.get(JAVA_OPTIONS)),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
