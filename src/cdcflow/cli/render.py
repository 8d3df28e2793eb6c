"""Rich rendering of run reports."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from cdcflow.report import BatchReport

_COLUMNS = (
    ("batch", "batch_id"),
    ("files", "files"),
    ("received", "records_received"),
    ("accepted", "accepted"),
    ("quarantined", "quarantined"),
    ("dups", "duplicates"),
    ("ins", "inserts"),
    ("upd", "updates"),
    ("del", "deletes"),
    ("stale", "stale_ignored"),
    ("tomb", "tombstoned"),
    ("late", "late_events"),
    ("ms", "duration_ms"),
    ("silver v", "silver_version"),
)


def batch_table(reports: Sequence[BatchReport], title: str | None = "micro-batches") -> Table:
    """One row per micro-batch with its counts."""
    table = Table(title=title)
    for header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    for report in reports:
        table.add_row(*(str(getattr(report, attr)) for _, attr in _COLUMNS))
    return table
