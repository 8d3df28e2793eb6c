"""Table maintenance with delta-rs: compaction, Z-order, vacuum.

* ``silver/customers``: Z-order by ``maintenance.zorder_silver_by`` (default city, status) — files
  are rewritten so that rows with close (city, status) values share files, which lets readers
  skip files on those columns;
* with declared tables (``tables:``): each table's Silver by the ``zorder_silver_by`` columns it
  has (none: compaction), and every other table of each contract, ``quarantine/unrouted_events``
  and the audit tables compacted;
* every other pipeline, history and Gold table: bin-packing compaction of small files;
* every table: vacuum of files no longer referenced and older than
  ``maintenance.vacuum_retention`` (the config refuses a retention shorter than
  ``maintenance.time_travel_window``, so as-of by version and replays keep working inside it).

Optimize rewrites files with a ``dataChange = false`` commit: the content of every table (and its
Change Data Feed) is unchanged.

Concurrency: ``cdcflow optimize`` (:func:`optimize_between_runs`) holds the pipeline's checkpoint
lock (the one ``run`` and ``replay --apply`` hold), so it never rewrites files under a running
micro-batch: while a run holds it, it stops with one line (or waits up to ``--wait``). The
automatic optimize of ``maintenance.optimize_every_batches`` calls :func:`optimize` from inside the
run, which already holds the lock. A commit that still conflicts with a writer that takes no lock
(e.g. ``cdcflow gold``) is retried from the table's new version, up to :data:`COMMIT_ATTEMPTS`
times, then reported in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.errors import CheckpointError, TableError
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.layers.tables import ALL_TABLES, SILVER, TableSpec
from cdcflow.logs import get_logger
from cdcflow.state.checkpoint import Checkpoint

log = get_logger("engine.local.maintenance")

T = TypeVar("T")

COMMIT_ATTEMPTS = 4
"""Attempts of one table's compaction / Z-order when its commit conflicts."""

_LOCK_POLL_SECONDS = 0.2


@contextmanager
def checkpoint_lock(
    checkpoint: Checkpoint, wait: timedelta | None = None, command: str = "optimize"
) -> Iterator[None]:
    """Hold the checkpoint's run lock, waiting up to ``wait`` for a running pipeline to end.

    Args:
        checkpoint: the pipeline's checkpoint (:meth:`Checkpoint.of` its config).
        wait: how long to wait for the lock (None or 0: do not wait).
        command: the command that needs it (named in the error).

    Raises:
        CheckpointError: another process still holds the lock (one line, says what to do).
    """
    location = checkpoint.location
    deadline = time.monotonic() + (wait.total_seconds() if wait else 0.0)
    with ExitStack() as stack:
        while True:
            try:
                stack.enter_context(checkpoint.lock())
                break
            except CheckpointError:
                if time.monotonic() >= deadline:
                    waited = f" after waiting {wait}" if wait else ""
                    holder = checkpoint.holder()
                    by = f" ({holder})" if holder else ""
                    raise CheckpointError(
                        f"{location}: a running cdcflow pipeline (or replay) holds this "
                        f"checkpoint's lock{by}{waited}; {command} runs between runs: try again "
                        "when it has stopped (or pass --wait, e.g. --wait 10m)"
                    ) from None
                time.sleep(_LOCK_POLL_SECONDS)
        yield


@dataclass
class TableMaintenance:
    """What optimize did to one table.

    Attributes:
        table: table name (e.g. ``silver/customers``).
        action: ``zorder`` or ``compact``.
        files_added / files_removed: data files written / logically removed by the rewrite.
        files_vacuumed: files physically deleted by vacuum.
        version: table version after maintenance.
    """

    table: str
    action: str
    files_added: int
    files_removed: int
    files_vacuumed: int
    version: int


def _tables(config: CdcflowConfig) -> tuple[tuple[TableSpec, ...], set[str]]:
    """(every table of the pipeline, the names of its Silver tables)."""
    if not config.tables:
        return (*ALL_TABLES, *GOLD_TABLES), {SILVER.name}
    from cdcflow.engines.local.contracts import TABLE_BATCH_LOG, UNROUTED
    from cdcflow.layers.contract_tables import contract_tables
    from cdcflow.layers.schema_log import SCHEMA_LOG
    from cdcflow.layers.tables import BATCH_LOG

    specs: list[TableSpec] = []
    silvers = set()
    for contract in config.contracts():
        tables = contract_tables(contract)
        specs += vars(tables).values()
        silvers.add(tables.silver.name)
    return (*specs, UNROUTED, TABLE_BATCH_LOG, BATCH_LOG, SCHEMA_LOG), silvers


def _committed(
    spec: TableSpec,
    action: str,
    open_table: Callable[[], DeltaTable],
    operation: Callable[[DeltaTable], T],
) -> tuple[DeltaTable, T]:
    """Run ``operation`` on a freshly opened table, again from the new version on a conflict.

    Raises:
        TableNotFoundError: the table does not exist.
        TableError: the commit conflicted :data:`COMMIT_ATTEMPTS` times.
    """
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = open_table()
        try:
            return table, operation(table)
        except CommitFailedError as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0] if text else "commit failed"
            if attempt == COMMIT_ATTEMPTS:
                raise TableError(
                    f"{spec.name}: optimize ({action}) conflicted with a concurrent commit "
                    f"{attempt} times ({reason}); nothing of it was committed: run optimize again"
                ) from exc
            log.warning(
                "optimize commit conflicted, retrying from the new version",
                extra={"table": spec.name, "action": action, "attempt": attempt},
            )
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def optimize_between_runs(
    config: CdcflowConfig,
    vacuum: bool = True,
    wait: timedelta | None = None,
    on_table: Callable[[str, int, int], None] | None = None,
) -> list[TableMaintenance]:
    """:func:`optimize` holding the pipeline's checkpoint lock (``cdcflow optimize``).

    Args:
        config: the pipeline configuration (``maintenance`` section).
        vacuum: also vacuum (default True).
        wait: how long to wait for a running pipeline to release the lock (None: fail at once).
        on_table: progress callback, see :func:`optimize`.

    Returns:
        One entry per existing table (tables never created are skipped).

    Raises:
        CheckpointError: a running pipeline (or replay) holds the checkpoint lock.
        TableError: a table's rewrite kept conflicting with concurrent commits.
    """
    with checkpoint_lock(Checkpoint.of(config), wait):
        return optimize(config, vacuum=vacuum, on_table=on_table)


def optimize(
    config: CdcflowConfig,
    vacuum: bool = True,
    on_table: Callable[[str, int, int], None] | None = None,
) -> list[TableMaintenance]:
    """Compact / Z-order every existing table and vacuum it.

    The caller holds the checkpoint lock: a pipeline run (automatic optimize after a batch) or
    :func:`optimize_between_runs`.

    Args:
        config: the pipeline configuration (``maintenance`` section).
        vacuum: also vacuum (default True).
        on_table: called before each table with (table name, tables done, tables in all).

    Returns:
        One entry per existing table (tables never created are skipped).

    Raises:
        TableError: a table's rewrite kept conflicting with concurrent commits.
    """
    settings = config.maintenance
    retention_hours = int(settings.vacuum_retention.total_seconds() // 3600)
    options = config.storage.options or None
    zorder_by = list(settings.zorder_silver_by)
    done = []
    specs, silvers = _tables(config)
    for number, spec in enumerate(specs):
        if on_table is not None:
            on_table(spec.name, number, len(specs))
        uri = config.table_uri(spec.name)

        def open_table(uri: str = uri) -> DeltaTable:
            return DeltaTable(uri, storage_options=options)

        # a declared table's Silver: by the zorder_silver_by columns it has (none: compact)
        by = [c for c in zorder_by if c in spec.schema.names] if spec.name in silvers else []
        action = "zorder" if by else "compact"

        def rewrite(table: DeltaTable, action: str = action, by: list[str] = by) -> dict[str, Any]:
            if action == "zorder":
                return table.optimize.z_order(by)
            return table.optimize.compact()

        def clean(table: DeltaTable) -> list[str]:
            return table.vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
            )

        try:
            table, metrics = _committed(spec, action, open_table, rewrite)
        except TableNotFoundError:
            continue
        vacuumed: list[str] = []
        if vacuum:
            table, vacuumed = _committed(spec, "vacuum", open_table, clean)
        entry = TableMaintenance(
            table=spec.name,
            action=action,
            files_added=int(metrics.get("numFilesAdded", 0)),
            files_removed=int(metrics.get("numFilesRemoved", 0)),
            files_vacuumed=len(vacuumed),
            version=table.version(),
        )
        done.append(entry)
        log.info("table optimized", extra={"maintenance": entry.__dict__})
    return done


__all__ = [
    "COMMIT_ATTEMPTS",
    "TableMaintenance",
    "checkpoint_lock",
    "optimize",
    "optimize_between_runs",
]
