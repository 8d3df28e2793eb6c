"""The product's pure-Python plan (validation, duplicate classification, reference fold and
timeline) against the independent oracle, on the property streams: fast, so many examples.

The end-to-end tests compare the engines with the oracle; this compares the product's own
reference (``plan/reference.py``, ``plan/history.py``) with it, so a wrong rule in the reference
cannot hide behind an engine that shares it.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings

from cdcflow.generator import GeneratorConfig, delivery_order, expected_outcome
from cdcflow.model.events import CdcEvent
from cdcflow.plan.dedup import classify
from cdcflow.plan.history import timeline
from cdcflow.plan.reference import fold
from cdcflow.plan.rules import Rejection, RuleSet, validate_record
from tests.oracle import Oracle
from tests.test_property import streams

NOW = datetime.now(UTC)


def _lines(records: list[Any]) -> list[bytes | str]:
    return [json.dumps(r) if isinstance(r, dict) else r for r in records]


def _product(lines: list[bytes | str], mode: str) -> tuple[list[tuple[int, str, str]], Any, Any]:
    """(verdicts like ``Oracle.judge``'s, reference fold, reference timeline) by the product."""
    rules = RuleSet(re.compile(r"^C-[0-9]+$"), NOW, timedelta(minutes=5))
    verdicts: dict[int, tuple[str, str]] = {}
    candidates: list[tuple[int, CdcEvent]] = []
    for index, line in enumerate(lines):
        raw = line if isinstance(line, bytes) else line.encode()
        if not raw.strip():
            continue
        result = validate_record(raw, rules)
        if isinstance(result, Rejection):
            verdicts[index] = ("QUARANTINED", result.reason)
        else:
            candidates.append((index, result))
    deliveries, conflicts = classify(candidates, {})
    for delivery in deliveries:
        fate = "DUPLICATE" if delivery.is_duplicate else "ACCEPTED"
        verdicts[delivery.position] = (fate, delivery.event.event_id)
    for position, rejection in conflicts:
        verdicts[position] = ("QUARANTINED", rejection.reason)
    firsts = [d.event for d in deliveries if not d.is_duplicate]
    judged = [(i, *verdicts[i]) for i in sorted(verdicts)]
    return judged, fold(firsts, mode), timeline(firsts, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["soft", "hard"])
@settings(max_examples=300)
@given(stream=streams())
def test_reference_fold_and_timeline_equal_oracle(mode: str, stream: Any) -> None:
    records, _, _ = stream
    lines = _lines(records)
    oracle = Oracle(processing_time=NOW)
    judged, state, history = _product(lines, mode)
    want = [
        (i, verdict, detail if verdict == "QUARANTINED" else detail.event_id)
        for i, verdict, detail in oracle.judge(lines)
    ]
    assert judged == want
    expected = oracle.silver(lines, mode)
    assert state.rows == expected.rows
    assert state.tombstones == (expected.tombstones if mode == "hard" else {})
    assert history == oracle.timeline(lines, mode)


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("notation", ["postgres", "sqlserver", "decimal", "mixed"])
def test_generator_expected_state_equals_oracle(mode: str, notation: str) -> None:
    """The demo's, ``reconcile``'s and ``replay``'s expected state (``generate --expected``,
    computed with the product's rules) equals the oracle's on a generated workload with
    duplicates, late and invalid records."""
    cfg = GeneratorConfig(
        events=1500, customers=120, seed=11, now=NOW, lsn_notation=notation, invalid_rate=0.03
    )
    lines = delivery_order(cfg, random.Random(cfg.seed), NOW)
    outcome = expected_outcome(lines, mode, processing_time=NOW)
    oracle = Oracle(processing_time=NOW)
    expected = oracle.silver(lines, mode)
    assert outcome.state.rows == expected.rows
    assert outcome.state.tombstones == (expected.tombstones if mode == "hard" else {})
    reasons = Counter(d for _, verdict, d in oracle.judge(lines) if verdict == "QUARANTINED")
    assert dict(outcome.quarantine) == dict(reasons) and sum(reasons.values()) > 0
