"""Engine-neutral part of a replay: re-validating Bronze rows and bucketing customers.

A replay rebuilds Silver from Bronze alone. Every Bronze first copy (``is_duplicate = false``)
is re-parsed from ``raw_payload`` and re-validated with :func:`cdcflow.plan.rules.validate_object`
using the row's ``ingested_at`` (its micro-batch's processing time) as processing time, so the
rules apply exactly as they did when the row was accepted. The fold is per customer_id, so the
customers can be processed in independent hash buckets, each folded completely: the union of the
buckets' results equals a single fold over all events.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cdcflow.model.events import ATTRIBUTES, CdcEvent
from cdcflow.plan.rules import Rejection, RuleSet, parse_record, validate_object

#: Default number of Bronze rows per replay bucket (bounds the memory of one fold).
DEFAULT_BUCKET_ROWS = 250_000


def bucket_count(bronze_rows: int, bucket_rows: int = DEFAULT_BUCKET_ROWS) -> int:
    """Number of customer hash buckets so that a bucket holds about ``bucket_rows`` rows.

    Raises:
        ValueError: ``bucket_rows`` is not positive.
    """
    if bucket_rows <= 0:
        raise ValueError("bucket_rows must be positive")
    return max(1, -(-bronze_rows // bucket_rows))


@dataclass
class Revalidation:
    """Result of re-validating a set of Bronze rows.

    Attributes:
        columns: the accepted events as fold input columns (``customer_id``, ``event_id``,
            ``operation``, ``event_timestamp``, the attributes, ``present_mask``, ``lsn``,
            ``sequence``, ``ingested_at``), one entry per event: lists, or Polars series from
            the local engine's columnar re-validation.
        rejected: failure reason → rows that no longer pass validation.
        sequence_mismatches: rows whose re-derived sequence differs from the stored one.
        duplicate_ids: first copies whose event_id was already seen (kept: the first).
    """

    columns: dict[str, Any] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    sequence_mismatches: int = 0
    duplicate_ids: int = 0

    @property
    def accepted(self) -> int:
        """Number of re-validated events."""
        return len(self.columns.get("event_id", []))


#: The columns of :attr:`Revalidation.columns` (the fold input plus ``ingested_at``).
EVENT_COLUMNS = (
    "customer_id",
    "event_id",
    "operation",
    "event_timestamp",
    *ATTRIBUTES,
    "present_mask",
    "lsn",
    "sequence",
    "ingested_at",
)


def revalidate(
    rows: Iterable[tuple[str, datetime, str]],
    customer_id_pattern: str,
    max_clock_skew: timedelta,
) -> Revalidation:
    """Re-validate Bronze first copies in arrival order.

    Args:
        rows: (raw_payload, ingested_at, stored sequence) per Bronze row, in arrival order
            (batch, then position); only first copies (``is_duplicate = false``).
        customer_id_pattern: ``processing.customer_id_pattern``.
        max_clock_skew: ``processing.max_clock_skew``.

    Returns:
        The accepted events as columns, plus what no longer validates.
    """
    pattern = re.compile(customer_id_pattern)
    rules: dict[datetime, RuleSet] = {}
    out = Revalidation(columns={name: [] for name in EVENT_COLUMNS})
    cols = out.columns
    seen: set[str] = set()
    for raw, ingested_at, stored_sequence in rows:
        rule = rules.get(ingested_at)
        if rule is None:
            rule = rules[ingested_at] = RuleSet(pattern, ingested_at, max_clock_skew)
        record = parse_record(raw)  # the same parsing as the stream
        if isinstance(record, Rejection):
            out.rejected[record.reason] += 1
            continue
        event = validate_object(record, rule)
        if isinstance(event, Rejection):
            out.rejected[event.reason] += 1
            continue
        if event.event_id in seen:
            out.duplicate_ids += 1
            continue
        seen.add(event.event_id)
        _append(cols, event, ingested_at)
        if cols["sequence"][-1] != stored_sequence:
            out.sequence_mismatches += 1
    return out


def _append(cols: dict[str, list[Any]], event: CdcEvent, ingested_at: datetime) -> None:
    cols["customer_id"].append(event.customer_id)
    cols["event_id"].append(event.event_id)
    cols["operation"].append(event.operation.value)
    cols["event_timestamp"].append(event.event_timestamp)
    for name in ATTRIBUTES:
        cols[name].append(event.values.get(name))
    cols["present_mask"].append(event.present_mask)
    cols["lsn"].append(event.lsn)
    cols["sequence"].append(event.sequence)
    cols["ingested_at"].append(ingested_at)
