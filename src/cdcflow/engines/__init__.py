"""Engines: thin adapters that run the engine-neutral CDC plan.

``local`` (default) uses delta-rs (``deltalake``) + Polars + PyArrow in-process; ``spark`` runs
PySpark Structured Streaming + delta-spark (optional extra ``spark``, see docs/spark.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from cdcflow.errors import ConfigError

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig
    from cdcflow.pipeline import Trigger
    from cdcflow.report import BatchReport
    from cdcflow.sinks.snowflake.sync import SyncFileWriter
    from cdcflow.state.checkpoint import BatchOffsets


class Engine(Protocol):
    """What the pipeline needs from an engine."""

    def run_batch(self, offsets: BatchOffsets) -> BatchReport:
        """Process one micro-batch of landing files through every table (idempotently)."""
        ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that drives its own streaming loop (Spark Structured Streaming)."""

    def run_stream(self, trigger: Trigger, on_batch: Callable[[BatchReport], None]) -> None:
        """Run micro-batches per the trigger, calling ``on_batch`` after each committed one."""
        ...


def get_engine(config: CdcflowConfig) -> Engine:
    """Instantiate the engine named by ``pipeline.engine`` (imported lazily).

    Raises:
        ConfigError: the engine is not available in this build.
    """
    if config.tables:  # declared table contracts
        if config.pipeline.engine == "spark":
            from cdcflow.engines.spark.contracts import SparkContractsEngine

            return SparkContractsEngine(config)
        from cdcflow.engines.local.contracts import LocalContractsEngine

        return LocalContractsEngine(config)
    if config.pipeline.engine == "local":
        from cdcflow.engines.local.engine import LocalEngine

        return LocalEngine(config)
    if config.pipeline.engine == "spark":
        from cdcflow.engines.spark.engine import SparkEngine

        return SparkEngine(config)
    raise ConfigError(
        f"pipeline.engine: engine {config.pipeline.engine!r} is not available yet "
        "(only 'local' is implemented)"
    )


def sync_file_writer(config: CdcflowConfig) -> SyncFileWriter | None:
    """What writes a Snowflake sync's rows for ``pipeline.engine``: the Spark engine's executors
    (:class:`~cdcflow.engines.spark.snowflake.SparkSyncFiles`, a session started or reused);
    None for the local engine (the sync reads Delta itself).

    Raises:
        MissingDependencyError: ``spark`` without the Spark extra or the Delta jars.
    """
    if config.pipeline.engine != "spark":
        return None
    from cdcflow.engines.spark.session import get_session
    from cdcflow.engines.spark.snowflake import SparkSyncFiles

    return SparkSyncFiles(get_session(config.spark, config.storage), config)
