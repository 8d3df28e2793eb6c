"""Engines: thin adapters that run the engine-neutral CDC plan.

``local`` (default) uses delta-rs (``deltalake``) + Polars + PyArrow in-process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cdcflow.errors import ConfigError

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig
    from cdcflow.report import BatchReport
    from cdcflow.state.checkpoint import BatchOffsets


class Engine(Protocol):
    """What the pipeline needs from an engine."""

    def run_batch(self, offsets: BatchOffsets) -> BatchReport:
        """Process one micro-batch of landing files through every table (idempotently)."""
        ...


def get_engine(config: CdcflowConfig) -> Engine:
    """Instantiate the engine named by ``pipeline.engine`` (imported lazily).

    Raises:
        ConfigError: the engine is not available in this build.
    """
    if config.pipeline.engine == "local":
        from cdcflow.engines.local.engine import LocalEngine

        return LocalEngine(config)
    raise ConfigError(
        f"pipeline.engine: engine {config.pipeline.engine!r} is not available yet "
        "(only 'local' is implemented)"
    )
