"""The local engine's columnar rendering of the rules agrees with the Python rules.

For every line :mod:`cdcflow.engines.local.vector_rules` decides, the reason, the detail and the
rejection's ids must equal :func:`cdcflow.plan.rules.validate_record`'s, and an accepted line's
normalised values (ids, operation, UTC timestamp, attributes, mask, LSN, sequence, content hash)
must be identical. ``UNDECIDED`` lines go to the Python rules in the engine, so they only have to
be rare: a generated workload is decided entirely by the columns, except its unparseable lines.
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.engines.local.batch_frame import classify_batch, scan_batch, validate_batch
from cdcflow.engines.local.vector_rules import UNDECIDED, validate_lines
from cdcflow.model.events import ATTRIBUTES, CdcEvent
from cdcflow.plan.dedup import classify
from cdcflow.plan.rules import Rejection, RuleSet, validate_record
from cdcflow.sources.files import LandingFile, read_records
from tests.rule_cases import edge_records, messy_records
from tests.test_rules import NOW, RULES, good


def compare(raws: list[str], rules: RuleSet = RULES) -> tuple[int, int]:
    """Validate ``raws`` both ways; assert agreement. Returns (decided, undecided) counts."""
    lines = pa.table({"pos": pa.array(range(len(raws)), pa.int64()), "line": raws})
    out = validate_lines(lines, rules).sort("pos").to_dicts()
    assert len(out) == len(raws)
    undecided = 0
    for raw, row in zip(raws, out, strict=True):
        expected = validate_record(raw, rules)
        if row["reason"] == UNDECIDED:
            undecided += 1
            continue
        if isinstance(expected, Rejection):
            got = (row["reason"], row["detail"], row["reject_event_id"], row["reject_customer_id"])
            assert got == (
                expected.reason,
                expected.detail,
                expected.event_id,
                expected.customer_id,
            ), raw
            continue
        assert row["reason"] is None, (row["reason"], raw)
        assert isinstance(expected, CdcEvent)
        got_event = {
            "event_id": row["event_id"],
            "customer_id": row["customer_id"],
            "operation": row["operation"],
            "event_timestamp": row["event_timestamp"],
            "values": {n: row[n] for i, n in enumerate(ATTRIBUTES) if row["present_mask"] >> i & 1},
            "present_mask": row["present_mask"],
            "lsn": row["lsn"],
            "source_table": row["source_table"],
            "tx_id": row["tx_id"],
            "sequence": row["sequence"],
            "content_hash": row["content_hash"],
        }
        want = {name: getattr(expected, name) for name in got_event}
        want["operation"] = expected.operation.value
        assert row["event_timestamp"].tzinfo is not None
        assert got_event == want, raw
        assert row["lsn_key"] == expected.sequence[:32]
    return len(raws) - undecided, undecided


def test_reason_codes_and_values_agree() -> None:
    raws = edge_records()
    decided, undecided = compare(raws)
    # objects, arrays and numbers in fields, other timestamp forms and JSON that is not an
    # object are left to Python; the common shapes are decided
    assert decided >= len(raws) // 2, (decided, undecided)


def test_edge_texts_agree() -> None:
    """Trimming, case, non-ASCII, quotes-free unicode, key order and spacing, LSN widths."""
    cases: list[dict[str, Any]] = [
        good(customer_name="Zoë Ünal 😀 \u2028 \x7f"),
        good(customer_id=" C-1\u3000"),
        good(event_id="\u00a0E-1 "),
        good(operation=" u ", status=" active\t"),
        good(operation="ınsert"),
        good(status="ſuspended"),
        good(operation="delete", status="whatever", city=None),
        good(event_timestamp="2026-11-29T11:59:59.1234567+01:00"),
        good(event_timestamp="2026-11-29T12:04:59.999999z"),
        good(event_timestamp="2026-11-29T12:05:00.000001Z"),
        good(event_timestamp="2026-11-29T12:06:00-00:30"),
        good(event_timestamp="2024-02-29T10:00:00"),
        good(event_timestamp="2026-02-29T10:00:00Z"),
        good(event_timestamp="2026-11-29T24:00:00Z"),
        good(event_timestamp="0001-01-01T00:00:00Z"),
        good(metadata={"lsn": "ABCDEF01/0"}),
        good(metadata={"lsn": "123456789/0"}),
        good(metadata={"lsn": "ffffffff:FFFFFFFF:ffff"}),
        good(metadata={"lsn": "0"}),
        good(metadata={"lsn": 0}),
        good(metadata={"lsn": 123456789012345678}),
        good(metadata={"lsn": "1234567890123456789012"}),
        good(metadata={"lsn": "12/"}),
        good(metadata={"lsn": "/12"}),
        good(metadata={"lsn": "0/10", "source_table": None}),
        good(metadata={"lsn": "0/10", "extra": "x"}),
        good(metadata={}),
        good(metadata={"lsn": "0/1", "tx_id": 5, "source_table": 12}),
        good(metadata={"lsn": "0/1", "tx_id": 0, "source_table": None}),
        good(customer_name=...),
        good(customer_name=None, email=None),
    ]
    raws = [json.dumps({k: v for k, v in c.items() if v is not ...}) for c in cases]
    raws += [json.dumps(good(), separators=(",", ":")), json.dumps(good(), indent=None)[::1]]
    raws += [
        '{ "customer_id" :"C-1" , "event_id":"E" ,"operation":"I","event_timestamp":'
        '"2026-11-29T11:00:00Z","status":"ACTIVE","metadata":{ "lsn" : 7 } }'
    ]
    raws += [json.dumps(dict(reversed(list(good().items()))))]
    raws += [
        '{"customer_id":"C-1","customer_id":"C-2","event_id":"E","operation":"I",'
        '"event_timestamp":"2026-11-29T11:00:00Z","status":"ACTIVE","metadata":{"lsn":"1"}}'
    ]
    raws += [json.dumps(good())[:-1] + ",}", json.dumps(good()).replace('"ACTIVE"', "NaN")]
    decided, _ = compare(raws)
    assert decided >= len(raws) - 16


def test_a_processing_time_with_an_offset_is_the_same_instant() -> None:
    from datetime import timedelta, timezone

    local = NOW.astimezone(timezone(timedelta(hours=5, minutes=30)))
    rules = RuleSet(RULES.customer_id_pattern, local, RULES.max_clock_skew)
    stamps = ["2026-11-29T12:04:59Z", "2026-11-29T12:05:01Z", "2026-11-29T12:06:00Z"]
    decided, _ = compare([json.dumps(good(event_timestamp=t)) for t in stamps], rules)
    assert decided == len(stamps)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(messy_records(), min_size=60, max_size=60))
def test_messy_records_agree(raws: list[str]) -> None:
    compare(raws)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "customer_id": st.sampled_from(["C-1", " C-2", "X", ""]),
                "event_id": st.sampled_from(["E1", "E2", " "]),
                "operation": st.sampled_from(["INSERT", "u", "D", "x"]),
                "event_timestamp": st.sampled_from(
                    ["2026-11-29T11:00:00Z", "2026-11-29T11:00:00.5+02:00", "2026-11-30T00:00:00Z"]
                ),
                "status": st.sampled_from(["ACTIVE", "gone", None]),
                "city": st.text(max_size=4),
                "metadata": st.fixed_dictionaries(
                    {}, optional={"lsn": st.sampled_from(["0/1", "1:2:3", "9", 5, None, "q"])}
                ),
            },
        ),
        min_size=40,
        max_size=40,
    ),
    st.booleans(),
)
def test_common_shapes_are_decided_and_agree(records: list[dict[str, Any]], ascii: bool) -> None:
    raws = [json.dumps(r, ensure_ascii=ascii) for r in records]
    compare(raws)


def test_generated_workload_is_decided_by_the_columns(tmp_path: Path) -> None:
    from cdcflow.generator import GeneratorConfig, generate

    generate(tmp_path, GeneratorConfig(events=3000, customers=200, files=3, seed=5, now=NOW))
    raws: list[str] = []
    for file in sorted(tmp_path.glob("*.jsonl")):
        raws += [line for line in file.read_text(encoding="utf-8").splitlines() if line]
    rules = RULES
    _, undecided = compare(raws, rules)
    accepted = sum(not isinstance(validate_record(r, rules), Rejection) for r in raws)
    assert accepted > 2000
    # only the generator's unparseable lines (truncated JSON, a timestamp in words) are left
    assert undecided == sum(r.endswith('"customer_id": ') or "yesterday at noon" in r for r in raws)


def test_batch_equals_the_record_at_a_time_path(tmp_path: Path) -> None:
    """Reading, validation and duplicate classification in columns equal the Python path,
    including a non-UTF-8 line, a BOM, CRLF, blank lines, an appended range and a corrupt gzip."""
    import gzip

    one = tmp_path / "a.jsonl"
    good_line = json.dumps(good())
    other = json.dumps(good(city="Pune"))
    one.write_bytes(
        ("\ufeff" + good_line + "\r\n\n  \t\n").encode()
        + b'{"customer_id": "C-1", "x": "\xff"}\n'
        + (good_line + "\n" + other + "\n" + json.dumps(good(event_id="E-2")) + "\n").encode()
    )
    two = tmp_path / "b.jsonl.gz"
    two.write_bytes(gzip.compress((other + "\n" + good_line + "\n").encode())[:-6])
    three = tmp_path / "c.jsonl"
    three.write_bytes((good_line + "\n" + json.dumps(good(event_id="E-3")) + "\n").encode())
    files = [
        LandingFile(str(one), one.stat().st_size, 0),
        LandingFile(str(two), two.stat().st_size, 0),
        LandingFile(str(three), three.stat().st_size, 0, start=len(good_line) + 1),
    ]
    frame, others = scan_batch(files, 1)
    validated = validate_batch(frame, others, RULES, columnar_min_lines=0)
    assert validated.equals(validate_batch(frame, others, RULES))  # the Python path: the same
    prior = {"E-2": "not-its-hash"}
    import polars as pl

    deliveries, rejected = classify_batch(
        validated,
        pl.DataFrame({"event_id": list(prior), "content_hash": list(prior.values())}),
    )
    records = [r for f in files for r in read_records(f, 1)]
    candidates, rejections = [], []
    for position, record in enumerate(records):
        result = (
            validate_record(record.data, RULES)
            if record.data is not None
            else Rejection("MALFORMED_JSON", record.error or "unreadable")
        )
        (rejections if isinstance(result, Rejection) else candidates).append((position, result))
    want_deliveries, conflicts = classify(candidates, prior)  # type: ignore[arg-type]
    assert validated.height == len(records)
    assert validated["source_line"].to_list() == [r.source_line for r in records]
    assert [(d["pos"], d["event_id"], d["is_duplicate"]) for d in deliveries.to_dicts()] == [
        (d.position, d.event.event_id, d.is_duplicate) for d in want_deliveries
    ]
    want_rejected = sorted([*rejections, *conflicts], key=lambda item: item[0])
    assert [(r["pos"], r["reason"], r["detail"]) for r in rejected.to_dicts()] == [
        (p, r.reason, r.detail) for p, r in want_rejected
    ]
    raw = {p: r.data for p, r in enumerate(records)}
    assert [r["raw"] for r in rejected.to_dicts()] == [
        raw[p].decode("utf-8", errors="backslashreplace") if raw[p] else ""
        for p, _ in want_rejected
    ]
    assert any(r["reason"] == "DUPLICATE_EVENT_CONFLICT" for r in rejected.to_dicts())
    assert deliveries["is_duplicate"].any()
    assert UTC  # timestamps are aware (checked in compare)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_columnar_revalidation_equals_the_replay_rules(tmp_path: Path) -> None:
    """Replay's re-validation in columns equals :func:`cdcflow.plan.replay.revalidate`: counts
    of what no longer validates, kept first copies, sequence mismatches, every column."""
    from datetime import timedelta

    import polars as pl

    from cdcflow.engines.local.batch_frame import revalidate_frame
    from cdcflow.generator import GeneratorConfig, generate
    from cdcflow.plan.replay import revalidate
    from cdcflow.plan.rules import CustomerIdPattern

    generate(tmp_path, GeneratorConfig(events=1500, customers=100, files=2, seed=9, now=NOW))
    raws: list[str] = []
    for file in sorted(tmp_path.glob("*.jsonl")):
        raws += [line for line in file.read_text(encoding="utf-8").splitlines() if line]
    raws += [raws[3], "\ufeff" + raws[5], json.dumps(good(event_id="X", city="é"))]
    times = [NOW - timedelta(days=2) if i % 3 else NOW for i in range(len(raws))]
    stored = ["wrong" if i % 50 == 0 else "" for i in range(len(raws))]
    stored = [
        s
        or (
            getattr(
                validate_record(r, RuleSet(RULES.customer_id_pattern, t, RULES.max_clock_skew)),
                "sequence",
                "",
            )
        )
        for s, r, t in zip(stored, raws, times, strict=True)
    ]
    rows = pl.DataFrame(
        {"raw_payload": raws, "ingested_at": times, "sequence": stored},
        schema={
            "raw_payload": pl.String,
            "ingested_at": pl.Datetime("us", "UTC"),
            "sequence": pl.String,
        },
    )
    skew = RULES.max_clock_skew
    want = revalidate(rows.iter_rows(), RULES.customer_id_pattern.pattern, skew)
    got = revalidate_frame(rows, CustomerIdPattern(RULES.customer_id_pattern.pattern), skew, 0)
    assert got.rejected == want.rejected and sum(want.rejected.values()) > 10
    assert (got.duplicate_ids, got.sequence_mismatches) == (
        want.duplicate_ids,
        want.sequence_mismatches,
    )
    assert got.duplicate_ids >= 1 and got.sequence_mismatches >= 1
    assert got.accepted == want.accepted
    for name, values in want.columns.items():
        assert got.columns[name].to_list() == values, name
