"""The Spark rendering of the validation rules agrees with the shared Python rules.

For every line the column rules decide (reason null = accepted, or a reason code), the reason
must equal :func:`cdcflow.plan.rules.validate_record`'s, and an accepted line's normalised
values (ids, operation, UTC timestamp, attributes, mask, LSN, sequence, content hash) must be
identical. ``UNDECIDED`` lines go to the Python rules in the engine, so they only have to be rare:
a realistic workload must be decided entirely by the column rules.
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.model.events import ATTRIBUTES, CdcEvent
from cdcflow.plan.rules import Rejection, RuleSet, validate_record
from tests.rule_cases import edge_records, messy_records
from tests.test_rules import NOW, RULES, good

pytestmark = pytest.mark.spark

LINE_DDL = "source_file string, source_line long, file_mtime_ms long, file_name string, raw string"


def compare(spark: Any, raws: list[str], rules: RuleSet = RULES) -> tuple[int, int]:
    """Validate ``raws`` both ways; assert agreement. Returns (decided, undecided) counts."""
    from cdcflow.engines.spark.validate import UNDECIDED, validate_lines

    rows = [("/l/f.jsonl", i + 1, 0, "f.jsonl", raw) for i, raw in enumerate(raws)]
    lines = spark.createDataFrame(rows, LINE_DDL)
    pattern = rules.customer_id_pattern.pattern
    native = validate_lines(lines, pattern, NOW, rules.max_clock_skew)
    out = native.orderBy("source_line").collect()
    assert len(out) == len(raws)
    undecided = 0
    for raw, row in zip(raws, out, strict=True):
        expected = validate_record(raw, rules)
        if row.reason == UNDECIDED:
            undecided += 1
            continue
        if isinstance(expected, Rejection):
            assert row.reason == expected.reason, raw
            continue
        assert row.reason is None, (row.reason, raw)
        assert isinstance(expected, CdcEvent)
        got = {
            "event_id": row.event_id,
            "customer_id": row.customer_id,
            "operation": row.operation,
            "event_timestamp": row.event_timestamp.replace(tzinfo=UTC),
            "values": {
                n: getattr(row, n) for i, n in enumerate(ATTRIBUTES) if row.present_mask >> i & 1
            },
            "present_mask": row.present_mask,
            "lsn": row.lsn,
            "source_table": row.source_table,
            "tx_id": row.tx_id,
            "sequence": row.sequence,
            "content_hash": row.content_hash,
        }
        want = {name: getattr(expected, name) for name in got}
        want["operation"] = expected.operation.value
        assert got == want, raw
    return len(raws) - undecided, undecided


def test_reason_codes_and_values_agree(spark: Any) -> None:
    raws = edge_records()
    decided, _ = compare(spark, raws)
    assert decided >= len(raws) - 8  # only unusual timestamps/JSON shapes are left to Python
    # keys that sort differently in UTF-16 and in code points: left to the Python rules
    mixed = json.dumps(good(**{"\ue000": 1, "\U0001f600": 2}), ensure_ascii=False)
    escaped = json.dumps(good(**{"\U0001f600": 2}), ensure_ascii=False)[:-1] + ', "\\ue000": 1}'
    # numbers inside mixed arrays (canonical text differs between JSON writers), deep nesting
    arrays = [json.dumps(good(extra=["x", n])) for n in (1.0, 1.5e-7, -0.0, 10**30)]
    deep = json.dumps(good())[:-1] + ', "x": ' + "[" * 995 + "]" * 995 + "}"
    assert compare(spark, [mixed, escaped, *arrays, deep]) == (0, 7)


@pytest.mark.slow
def test_generated_workload_is_decided_by_the_column_rules(spark: Any, tmp_path: Path) -> None:
    from cdcflow.generator import GeneratorConfig, generate

    raws: list[str] = []
    for notation in ("postgres", "sqlserver", "decimal"):
        out = tmp_path / notation
        generate(
            out, GeneratorConfig(events=400, customers=50, files=2, lsn_notation=notation, now=NOW)
        )
        for file in sorted(out.glob("*.jsonl")):
            raws += [line for line in file.read_text(encoding="utf-8").splitlines() if line]
    _, undecided = compare(spark, raws)
    accepted = sum(not isinstance(validate_record(r, RULES), Rejection) for r in raws)
    assert accepted > 1000
    # only the truncated-JSON records of the generator (not parseable) are left to Python
    assert undecided == sum(r.endswith('"customer_id": ') for r in raws)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(messy_records(), min_size=120, max_size=120))
def test_messy_records_agree(spark: Any, raws: list[str]) -> None:
    compare(spark, raws)


def test_split_lines_matches_the_python_reader(spark: Any) -> None:
    from cdcflow.engines.spark.validate import split_lines
    from cdcflow.sources.files import content_lines

    content = "a\r\n\u2028\n \u0085\r\n\nX\r\u0085\n  \t\nlast".encode()
    files = spark.createDataFrame(
        [("/l/f.jsonl", 0, content)], "source_file string, file_mtime_ms long, content binary"
    )
    got = [(r.source_line, r.raw) for r in split_lines(files).orderBy("source_line").collect()]
    want = [(n, data.decode()) for n, data, _ in content_lines("/l/f.jsonl", content) if data]
    assert got == want


def test_pattern_classes_match_as_in_re2(spark: Any) -> None:
    ids = ("C\u00a0X", "C-\u0663", "C-\u00e9", "CX", "C\u2028X", "C\u0085X", "c-\u00c9", "C-1")
    raws = [json.dumps(good(customer_id=c)) for c in ids]
    patterns = (
        r"^\S+$",
        r"^C-\d+$",
        r"^C-\W+$",
        r"^C-\w+$",
        r"^C.X$",  # . matches U+2028 and U+0085 in RE2 (Java: with (?d))
        "(?i)^C-\u00e9$",  # Unicode case folding (Java: with (?u))
        r"^C-\p{Nd}+$",
    )
    for pattern in patterns:
        compare(spark, raws, RuleSet(pattern, NOW, RULES.max_clock_skew))


def test_edge_values_agree(spark: Any) -> None:
    base = json.dumps(good())[:-1]
    deep = "[" * 399 + '{"a": 1}' + "]" * 399
    decided = [
        json.dumps(good(event_timestamp="2025-06-30T10:00:00z")),
        json.dumps(good(event_timestamp="2025-06-30T10:00:00.123456789z")),
        json.dumps(good(event_timestamp=253_402_300_800_000)),  # beyond 9999: FUTURE
        json.dumps(good(event_timestamp="253402300800000")),
        json.dumps(good(event_timestamp=10**18)),
        json.dumps(good(event_timestamp="999999999999999")),
        json.dumps(good(event_timestamp=-2_208_988_800_001)),  # 1899: a valid instant
    ]
    undecided = [
        "\ufeff" + json.dumps(good()),  # BOM
        json.dumps(good(event_timestamp="2016-12-31T23:59:60Z")),  # leap second
        json.dumps(good(event_timestamp="2017-01-01T01:59:60.5+02:00")),
        json.dumps(good(event_timestamp=-62_135_596_800_001)),  # before year 1
        json.dumps(good(event_timestamp="9999-12-31T23:30:00-01:00")),
        base + ', "extra": ' + deep + "}",  # nested 400 deep
        base + ', "city": ' + deep + "}",
    ]
    assert compare(spark, decided) == (len(decided), 0)
    compare(spark, undecided)  # whatever the column rules decide agrees; the rest goes to Python


def test_python_only_pattern_syntax_is_a_config_error(spark: Any) -> None:
    from cdcflow.engines.spark.validate import check_pattern
    from cdcflow.errors import ConfigError

    check_pattern(spark, r"^C-[0-9]+$")
    with pytest.raises(ConfigError, match=r"processing\.customer_id_pattern"):
        check_pattern(spark, r"^(?P<prefix>C)-[0-9]+$")
    # Java backtracks: a repeated variable group is refused at engine start
    with pytest.raises(ConfigError, match=r"processing\.customer_id_pattern.*exponential"):
        check_pattern(spark, r"^(a+)+$")
