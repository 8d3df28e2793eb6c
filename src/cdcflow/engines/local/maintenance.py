"""Table maintenance with delta-rs: compaction, Z-order, vacuum.

* ``silver/customers``: Z-order by ``maintenance.zorder_silver_by`` (default city, status) — files
  are rewritten so that rows with close (city, status) values share files, which lets readers
  skip files on those columns;
* every other pipeline, history and Gold table: bin-packing compaction of small files;
* every table: vacuum of files no longer referenced and older than
  ``maintenance.vacuum_retention`` (the config refuses a retention shorter than
  ``maintenance.time_travel_window``, so as-of by version and replays keep working inside it).

Optimize rewrites files with a ``dataChange = false`` commit: the content of every table (and its
Change Data Feed) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdcflow.config import CdcflowConfig
from cdcflow.layers.gold import GOLD_TABLES
from cdcflow.layers.tables import ALL_TABLES, SILVER, TableSpec
from cdcflow.logs import get_logger

log = get_logger("engine.local.maintenance")


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


def _tables() -> tuple[TableSpec, ...]:
    return (*ALL_TABLES, *GOLD_TABLES)


def optimize(config: CdcflowConfig, vacuum: bool = True) -> list[TableMaintenance]:
    """Compact / Z-order every existing table and vacuum it.

    Args:
        config: the pipeline configuration (``maintenance`` section).
        vacuum: also vacuum (default True).

    Returns:
        One entry per existing table (tables never created are skipped).
    """
    settings = config.maintenance
    retention_hours = int(settings.vacuum_retention.total_seconds() // 3600)
    options = config.storage.options or None
    done = []
    for spec in _tables():
        try:
            table = DeltaTable(config.table_uri(spec.name), storage_options=options)
        except TableNotFoundError:
            continue
        if spec is SILVER and settings.zorder_silver_by:
            metrics = table.optimize.z_order(list(settings.zorder_silver_by))
            action = "zorder"
        else:
            metrics = table.optimize.compact()
            action = "compact"
        vacuumed: list[str] = []
        if vacuum:
            vacuumed = table.vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
            )
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


__all__ = ["TableMaintenance", "optimize"]
