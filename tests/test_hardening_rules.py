"""Hardening of the validation rules (issue 11, items 4, 5 and 10).

* Item 4 — rejection details, logs and reconcile errors never carry a field's value.
* Item 5 — the customer_id pattern is matched in linear time (RE2); a pattern RE2 cannot
  compile is a configuration error; the Spark engine refuses patterns Java would backtrack on.
* Item 10 — edge values: BOM, leap second, lowercase ``z``, epoch values beyond 9999 and before
  1900, deep nesting.
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pythonjsonlogger.json import JsonFormatter
from typer.testing import CliRunner

from cdcflow.config import load_config
from cdcflow.errors import ConfigError
from cdcflow.generator import GeneratorConfig, generate
from cdcflow.logs import LOGGER_NAME
from cdcflow.model.events import OPERATION_ALIASES, STATUSES, CdcEvent
from cdcflow.plan.rules import (
    MAX_NESTING,
    CustomerIdPattern,
    Rejection,
    RuleSet,
    validate_record,
)
from tests.conftest import Lake
from tests.test_rules import NOW, RULES, good

# ------------------------------------------------------------------ item 4: no values in details
PII = ("Maya Kim", "maya.kim@example.com", "+1-555-0100", "Zoë Ünal")
#: Words of the contract itself (operations, statuses): they may appear in a detail.
VOCABULARY = {*OPERATION_ALIASES, *STATUSES}
FIELDS = (
    "event_id",
    "customer_id",
    "operation",
    "event_timestamp",
    "customer_name",
    "email",
    "phone",
    "city",
    "country",
    "status",
)


def string_values(value: Any) -> Iterator[str]:
    """Every string value in a JSON value (not the keys: details name fields)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from string_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from string_values(item)


def pii_records() -> list[str | bytes]:
    """Bad records carrying names, e-mails and phones in every field, in every shape."""
    records: list[str | bytes] = []
    for value in PII:
        for name in FIELDS:
            records.append(json.dumps(good(**{name: value}), ensure_ascii=False))
            records.append(json.dumps(good(**{name: {"v": value}}), ensure_ascii=False))
            records.append(json.dumps(good(**{name: [value]})))
        for meta in ("lsn", "tx_id", "source_table"):
            metadata = {"lsn": "0/10", meta: value}
            records.append(json.dumps(good(metadata=metadata), ensure_ascii=False))
            records.append(json.dumps(good(metadata={"lsn": "0/10", meta: {"v": value}})))
        records.append(json.dumps(good(metadata=value)))
        records.append(json.dumps(good(operation="UPDATE", status=value, city=value)))
        records.append(json.dumps(good(event_timestamp=f"2026-01-01T{value}")))
        records.append(json.dumps(good(event_timestamp=f"{value}Z")))
        text = json.dumps(good(customer_name=value), ensure_ascii=False)
        records.append(text[:-30])  # truncated after the value
        records.append(text[:-1] + ', "x": NaN}')
        records.append(text[:-1] + ', "x": "\\ud800"}')  # lone surrogate next to the value
        records.append(text[:-1] + ', "x": 1, "x": "' + value + '" x}')
        records.append(text[:-1] + "," + json.dumps({value: 1})[1:])  # the value as a key
        records.append(text.encode("utf-8")[:-1] + b"\xff}")  # not UTF-8 after the value
        records.append('"' + value + '"')
        records.append("[" + json.dumps(value) + "]")
        records.append(text[:-1] + ', "x": ' + "[" * (MAX_NESTING + 5) + json.dumps(value))
        records.append("{" + json.dumps(value) + "}")
        records.append(json.dumps(good(customer_id=value * 100, event_id=value)))
    return records


def assert_no_values(raw: str | bytes, detail: str) -> None:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    for value in PII:
        assert value not in detail, (detail, text)
    try:
        record = json.loads(text)
    except ValueError:
        return
    for value in string_values(record):
        if len(value) >= 3 and value.strip().upper() not in VOCABULARY:
            assert value not in detail, (detail, text)


def test_rejection_details_never_quote_a_field_value(tmp_path: Path) -> None:
    summary = generate(tmp_path, GeneratorConfig(events=3000, customers=200, files=3, now=NOW))
    raws: list[str | bytes] = [*summary.lines, *pii_records()]
    rules = RuleSet(re.compile(r"^C-[0-9]+$"), NOW - timedelta(hours=1), timedelta(minutes=5))
    rejected = 0
    for raw in raws:
        result = validate_record(raw, rules)
        if isinstance(result, Rejection):
            rejected += 1
            assert_no_values(raw, result.detail)
    assert rejected > 300


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The cdcflow logger's JSON lines, at DEBUG, in a buffer."""
    logger = logging.getLogger(LOGGER_NAME)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield buffer
    logger.handlers, logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_quarantine_details_and_logs_carry_no_pii(tmp_path: Path, json_log: io.StringIO) -> None:
    lake = Lake(tmp_path)
    summary = generate(lake.landing, GeneratorConfig(events=600, customers=80, files=2))
    pii_values = set(PII)
    for line in summary.lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        pii_values |= {record.get(k) for k in ("customer_name", "email", "phone")} - {None, ""}
    lake.write(pii_records())
    lake.run()
    quarantine = lake.table("quarantine/customer_events")
    assert quarantine.height > 100
    details = "\n".join(quarantine["failure_detail"].to_list())
    logs = json_log.getvalue()
    assert logs  # the run logged
    for value in pii_values:
        assert isinstance(value, str)
        assert value not in details, value
        assert value not in logs, value
    for raw, detail in zip(quarantine["raw_line"], quarantine["failure_detail"], strict=True):
        assert_no_values(raw, detail)


def lake_config_file(lake: Lake, folder: Path, **sections: dict[str, object]) -> Path:
    """A config file for ``lake`` (its paths, WARNING logs) plus ``sections``."""
    config = folder / "cdcflow.yaml"
    paths = {
        "storage": {"root": lake.config.storage.root},
        "source": {"path": lake.config.source.path},
        "checkpoint": {"location": lake.config.checkpoint.location},
    }
    config.write_text(yaml.safe_dump({**paths, **sections, "logging": {"level": "WARNING"}}))
    return config


def test_reconcile_source_snapshot_errors_carry_no_row_values(tmp_path: Path) -> None:
    from cdcflow.cli.app import app

    lake = Lake(tmp_path)
    lake.write([good(customer_id="C-1")])
    lake.run()
    config = lake_config_file(lake, tmp_path)
    header = "customer_id,customer_name,email,phone,created_at,is_deleted\n"
    row = "C-1,Maya Kim,maya.kim@example.com,+1-555-0100"
    snapshots = {
        "quote.csv": header + row + ',"Zoë Ünal,2025\n',  # an unterminated quote
        "ragged.csv": header + row + ",2025-01-01T00:00:00Z,false,Zoë Ünal\n",
        "bad_time.csv": header + row + ",Zoë Ünal,false\n",
        "bad_bool.csv": header + row + ",2025-01-01T00:00:00Z,Zoë Ünal\n",
    }
    for name, text in snapshots.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        args = ["reconcile", "--config", str(config), "--source-snapshot", str(path)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0, (name, result.output)
        message = f"{result.output}\n{result.exception}"
        assert str(path) in message
        for value in PII:
            assert value not in message, (name, message)
        if name != "quote.csv":
            continue
        # the command as a user runs it: exit code 2, no row values on stderr
        done = subprocess.run(
            [sys.executable, "-m", "cdcflow", *args], capture_output=True, text=True, check=False
        )
        assert done.returncode == 2, done.stderr
        assert name in done.stderr
        for value in PII:
            assert value not in done.stderr + done.stdout, (name, done.stderr)


# ------------------------------------------------------------------ item 5: linear-time pattern
HOSTILE = r"^(a+)+$"


def test_catastrophic_pattern_answers_at_once() -> None:
    # in a child process with a timeout: before RE2, Python's backtracking took 2**40 steps
    code = textwrap.dedent(
        f"""
        import json, re
        from datetime import UTC, datetime, timedelta
        from cdcflow.plan.rules import Rejection, RuleSet, validate_record
        record = {{"event_id": "E1", "customer_id": "a" * 40 + "!", "operation": "INSERT",
                  "event_timestamp": "2026-01-01T00:00:00Z", "status": "ACTIVE",
                  "metadata": {{"lsn": "0/1"}}}}
        now = datetime(2026, 6, 1, tzinfo=UTC)
        for pattern in ({HOSTILE!r}, re.compile({HOSTILE!r})):
            rules = RuleSet(pattern, now, timedelta(minutes=5))
            result = validate_record(json.dumps(record), rules)
            assert isinstance(result, Rejection), result
            print(result.reason)
            record["customer_id"] = "a" * 40
            assert not isinstance(validate_record(json.dumps(record), rules), Rejection)
            record["customer_id"] = "a" * 40 + "!"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["INVALID_CUSTOMER_ID_FORMAT"] * 2


def test_catastrophic_pattern_in_a_pipeline_run(tmp_path: Path) -> None:
    # the whole batch, in a child process: it used to hang forever (and on every restart)
    lake = Lake(tmp_path)
    lake.write(
        [good(customer_id="a" * 40 + "!", event_id="E1"), good(customer_id="aaa", event_id="E2")]
    )
    config = lake_config_file(
        lake,
        tmp_path,
        processing={"customer_id_pattern": HOSTILE},
        gold={"refresh_every_batches": 0},
    )
    done = subprocess.run(
        [sys.executable, "-m", "cdcflow", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    quarantine = lake.table("quarantine/customer_events")
    assert quarantine["failure_reason"].to_list() == ["INVALID_CUSTOMER_ID_FORMAT"]
    assert lake.table("silver/customers")["customer_id"].to_list() == ["aaa"]


@pytest.mark.parametrize("pattern", [r"^(C)-\1$", r"^(?=C)C-[0-9]+$", r"^C-(?!0)[0-9]+$"])
def test_pattern_re2_cannot_compile_is_a_config_error(tmp_path: Path, pattern: str) -> None:
    path = tmp_path / "cdcflow.yaml"
    path.write_text(yaml.safe_dump({"processing": {"customer_id_pattern": pattern}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and "processing.customer_id_pattern" in message
    assert "RE2" in message
    with pytest.raises(ConfigError, match=r"processing\.customer_id_pattern"):
        CustomerIdPattern(pattern)


def test_re2_classes_are_ascii() -> None:
    digits = CustomerIdPattern(r"^C-\d+$")
    assert digits.fullmatch("C-12") and not digits.fullmatch("C-\u0663")
    assert CustomerIdPattern(r"^C-\p{Nd}+$").fullmatch("C-\u0663")
    assert CustomerIdPattern(r"^C.X$").fullmatch("C\u2028X")


@pytest.mark.parametrize(
    ("pattern", "risky"),
    [
        (HOSTILE, True),
        (r"^(a|a)*$", True),
        (r"^(\w+\s?)+$", True),
        (r"^(?:[a-z]{1,3}){4}$", True),
        (r"^((ab)*c)+$", True),
        (r"^a*a*a*a*a*a*a*a*a*a*a*a*$", True),
        (r"^(a+)(a+)(a+)(a+)$", True),
        (r"^[A-Z]+-[0-9]+$", True),
        (r"^[A-Z]{1,10}-[0-9]+$", False),
        (r"^C-[0-9]+$", False),
        (r"^(?:[A-Z]{2}-)?[0-9]{4,8}$", False),
        (r"^(?:C|D)-[0-9]{3}(?:-[0-9]{2})?$", False),
        (r"^(a{3})+$", False),
        (r"^\Q(a+)+\E$", False),
        (r"^[(a+)+]+$", False),
    ],
)
def test_spark_refuses_patterns_java_would_backtrack_on(pattern: str, risky: bool) -> None:
    from cdcflow.engines.spark.validate import backtracking_risk, check_pattern

    assert (backtracking_risk(pattern) is not None) is risky
    if risky:  # refused before Spark is even asked to compile it
        with pytest.raises(ConfigError, match=r"processing\.customer_id_pattern.*exponential"):
            check_pattern(None, pattern)  # type: ignore[arg-type]


# ------------------------------------------------------------------ item 10: edge values
def accepted(raw: str | bytes, rules: RuleSet = RULES) -> CdcEvent:
    result = validate_record(raw, rules)
    assert isinstance(result, CdcEvent), result
    return result


def rejected(raw: str | bytes) -> Rejection:
    result = validate_record(raw, RULES)
    assert isinstance(result, Rejection), result
    return result


def test_bom_at_the_start_is_not_part_of_the_record() -> None:
    line = json.dumps(good())
    with_bom = accepted(b"\xef\xbb\xbf" + line.encode())
    assert with_bom == accepted(line)
    assert with_bom.content_hash == accepted(line).content_hash
    assert accepted("\ufeff" + line) == with_bom
    assert rejected(b"\xef\xbb\xbf").reason == "MALFORMED_JSON"  # nothing after the BOM


def test_bom_file_through_the_pipeline(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    path = lake.write([good(event_id="E1", customer_id="C-1"), good(event_id="E2")])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    lake.run()
    assert sorted(lake.table("silver/customers")["customer_id"]) == ["C-1", "C-9021"]
    assert lake.table("quarantine/customer_events").height == 0


def test_leap_second_is_the_last_microsecond_of_its_minute() -> None:
    def at(ts: str, event_id: str = "E") -> CdcEvent:
        return accepted(json.dumps(good(event_timestamp=ts, event_id=event_id)))

    leap = at("2016-12-31T23:59:60Z")
    assert leap.event_timestamp == datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert at("2016-12-31T23:59:60.5Z").event_timestamp == leap.event_timestamp
    assert at("2017-01-01T01:59:60+02:00").event_timestamp == leap.event_timestamp
    # it sorts after every instant of second 59 (ties go to event_id) and before the next minute
    before = at("2016-12-31T23:59:59.9999999Z", "Z")
    after = at("2017-01-01T00:00:00Z", "A")
    assert before.sequence < leap.sequence < after.sequence
    assert rejected(json.dumps(good(event_timestamp="2016-12-31T23:59:61Z"))).reason == (
        "INVALID_EVENT_TIMESTAMP"
    )


def test_lowercase_z_means_utc() -> None:
    lower = accepted(json.dumps(good(event_timestamp="2025-06-30T10:00:00.5z")))
    upper = accepted(json.dumps(good(event_timestamp="2025-06-30T10:00:00.5Z")))
    assert lower.event_timestamp == upper.event_timestamp
    assert lower.sequence == upper.sequence


@pytest.mark.parametrize(
    "value",
    [253_402_300_800_000, "253402300800000", 10**18, str(10**25), "9999-12-31T23:30:00-01:00"],
)
def test_beyond_year_9999_is_a_future_timestamp(value: object) -> None:
    rejection = rejected(json.dumps(good(event_timestamp=value)))
    assert rejection.reason == "FUTURE_EVENT_TIMESTAMP", rejection
    # and the reason order still holds: an INVALID_OPERATION comes first
    assert rejected(json.dumps(good(event_timestamp=value, operation="X"))).reason == (
        "INVALID_OPERATION"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-2_208_988_800_001, datetime(1899, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
        ("-2208988800001", datetime(1899, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
        (-62_135_596_800_000, datetime(1, 1, 1, tzinfo=UTC)),
    ],
)
def test_epoch_before_1900_is_a_valid_instant(value: object, expected: datetime) -> None:
    assert accepted(json.dumps(good(event_timestamp=value))).event_timestamp == expected


def test_epoch_before_year_1_is_invalid() -> None:
    for value in (-62_135_596_800_001, "-99999999999999999999999"):
        rejection = rejected(json.dumps(good(event_timestamp=value)))
        assert rejection.reason == "INVALID_EVENT_TIMESTAMP"


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * (depth - 1) + '{"a": ' + leaf + "}" + "]" * (depth - 1)


@pytest.mark.parametrize("leaf", ["1", "1.5", str(2**70), '"x"'])
def test_unknown_field_nested_400_deep_is_accepted(leaf: str) -> None:
    raw = json.dumps(good())[:-1] + ', "extra": ' + nested(400, leaf) + "}"
    event = accepted(raw)
    assert event.customer_id == "C-9021"
    assert event.content_hash == accepted(raw.replace('"extra": ', '"extra":')).content_hash


def test_attribute_nested_400_deep_is_a_schema_mismatch() -> None:
    raw = json.dumps(good())[:-1] + ', "city": ' + nested(400) + "}"
    assert rejected(raw).reason == "SCHEMA_MISMATCH"


def test_nesting_beyond_the_limit_is_malformed_whatever_the_stack() -> None:
    # the record itself is level 1: a field nested MAX_NESTING - 1 deep is the deepest allowed
    for leaf in ("1", "1.5"):
        raw = json.dumps(good())[:-1] + ', "extra": ' + nested(MAX_NESTING, leaf) + "}"
        rejection = rejected(raw)
        assert rejection.reason == "MALFORMED_JSON"
        assert f"deeper than {MAX_NESTING}" in rejection.detail
        assert accepted(json.dumps(good())[:-1] + ', "x": ' + nested(MAX_NESTING - 1, leaf) + "}")


def test_deep_record_through_the_pipeline(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    deep = json.dumps(good(event_id="E1"))[:-1] + ', "extra": ' + nested(400) + "}"
    lake.write([deep, json.dumps(good(event_id="E1"))[:-1] + ', "extra": ' + nested(400) + "}"])
    lake.run()
    bronze = lake.table("bronze/customer_events")
    assert sorted(bronze["is_duplicate"].to_list()) == [False, True]
    assert lake.table("quarantine/customer_events").height == 0
