"""Rich rendering of run reports: the micro-batch table, one-line summaries, run totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.table import Table

from cdcflow.report import BatchReport

_COLUMNS = (
    ("batch", "batch_id"),
    ("files", "files"),
    ("records", "records_received"),
    ("accepted", "accepted"),
    ("quar.", "quarantined"),
    ("dups", "duplicates"),
    ("ins", "inserts"),
    ("upd", "updates"),
    ("del", "deletes"),
    ("stale", "stale_ignored"),
    ("tomb", "tombstoned"),
    ("late", "late_events"),
    ("ms", "duration_ms"),
    ("rec/s", None),
    ("silver v", "silver_version"),
)


def records_per_second(records: int, duration_ms: int) -> int:
    """Records per second of wall time (0 when no time was measured)."""
    return round(records * 1000 / duration_ms) if duration_ms > 0 else 0


def _cell(value: object) -> str:
    """A table cell: ``-`` for a value the batch does not have (a run of declared tables has
    one Silver version per table: ``audit/table_batch_log``)."""
    return "-" if value is None else str(value)


def batch_table(reports: Sequence[BatchReport], title: str | None = "micro-batches") -> Table:
    """One row per micro-batch with its counts and throughput (records per second)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    for header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    for report in reports:
        table.add_row(
            *(
                _cell(getattr(report, attr))
                if attr
                else f"{records_per_second(report.records_received, report.duration_ms):,}"
                for _, attr in _COLUMNS
            )
        )
    return table


def batch_line(report: BatchReport) -> str:
    """One line summarising a committed micro-batch (files, records, outcome, records/s)."""
    rate = records_per_second(report.records_received, report.duration_ms)
    return (
        f"batch {report.batch_id}: {report.files} files, {report.records_received:,} records"
        f" ({report.accepted:,} accepted, {report.quarantined:,} quarantined,"
        f" {report.duplicates:,} duplicates), {rate:,} records/s, {report.duration_ms:,} ms"
        + ("" if report.silver_version is None else f", silver v{report.silver_version}")
    )


@dataclass
class RunTotals:
    """Running totals of the micro-batches of one ``cdcflow run`` (the live progress line)."""

    batches: int = 0
    files: int = 0
    records: int = 0
    duration_ms: int = 0

    def add(self, report: BatchReport) -> None:
        """Count one committed micro-batch."""
        self.batches += 1
        self.files += report.files
        self.records += report.records_received
        self.duration_ms += report.duration_ms

    def detail(self) -> str:
        """``N files, N records, N records/s`` so far."""
        rate = records_per_second(self.records, self.duration_ms)
        return f"{self.files:,} files, {self.records:,} records, {rate:,} records/s"
