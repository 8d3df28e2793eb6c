"""Landing files that change after a micro-batch took them (issue 11, items 1 and 2).

A re-run after a crash must read exactly the bytes its offsets recorded, or stop without
writing; a file that grows or is replaced under a processed name is taken again (appended
bytes only, or the whole file as new content), never skipped in silence.
"""

from __future__ import annotations

import gzip
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdcflow.errors import LandingFileChangedError
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.sources.files import plan_landing, read_records
from cdcflow.state.faults import CRASH_EXIT_CODE
from tests.conftest import Lake, ev, full
from tests.crashkit import config_file, run_cli


def _line(record: dict[str, object]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _append(path: Path, *records: dict[str, object], stamp: int) -> None:
    with open(path, "ab") as handle:
        for record in records:
            handle.write(_line(record))
    os.utime(path, (stamp, stamp))


def _positions(lake: Lake) -> list[tuple[str, int]]:
    bronze = lake.table("bronze/customer_events")
    quarantine = lake.table("quarantine/customer_events")
    return sorted(
        [
            *zip(bronze["source_file"], bronze["source_line"], strict=True),
            *zip(quarantine["source_file"], quarantine["source_line"], strict=True),
        ]
    )


def _versions(lake: Lake) -> dict[str, int]:
    names = ["bronze/customer_events", "quarantine/customer_events", "silver/customers"]
    return {name: DeltaTable(lake.config.table_uri(name)).version() for name in names}


def _first_file(lake: Lake) -> Path:
    return lake.landing / "f00001.jsonl"


def _two_files(lake: Lake) -> None:
    lake.write(
        [
            ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full()),
            ev("E2", "C-2", "INSERT", "0/11", minutes_ago=49, **full(city="Lyon")),
        ]
    )
    lake.write([ev("E3", "C-1", "UPDATE", "0/20", minutes_ago=40, email="n@x.com")])


@pytest.mark.parametrize("point", ["after_bronze", "after_silver", "before_commit"])
def test_rerun_after_crash_reads_recorded_bytes_when_file_grew(tmp_path: Path, point: str) -> None:
    lake = Lake(tmp_path, max_files=1)
    config = config_file(lake)
    _two_files(lake)
    assert run_cli(config, crash=f"{point}@0").returncode == CRASH_EXIT_CODE
    # the producer appends to the first file before the restart
    late = ev("E4", "C-3", "INSERT", "0/30", minutes_ago=30, **full(city="Oslo"))
    _append(_first_file(lake), late, stamp=1_700_000_100)
    lake.arrival.append(json.dumps(late))
    restarted = run_cli(config)
    assert restarted.returncode == 0, restarted.stderr
    # batch 0 is what its first attempt read: 2 records; the appended line comes later
    log = lake.table("audit/batch_log").sort("batch_id")
    bronze = lake.table("bronze/customer_events")
    assert log["records_received"].to_list()[0] == 2
    assert bronze.filter(bronze["batch_id"] == 0).height == 2
    assert sum(log["records_received"].to_list()) == bronze.height == 4
    appended = bronze.filter(bronze["event_id"] == "E4")
    assert appended["source_line"].to_list() == [3]
    assert appended["batch_id"].to_list() == [2]
    assert _positions(lake) == sorted(set(_positions(lake)))
    assert lake.silver() == lake.expected().rows
    replay = run_cli(config)  # a further run is a no-op
    assert replay.returncode == 0
    assert lake.table("bronze/customer_events").height == 4


@pytest.mark.parametrize("change", ["deleted", "rewritten", "truncated"])
def test_rerun_after_crash_stops_when_recorded_bytes_are_gone(tmp_path: Path, change: str) -> None:
    lake = Lake(tmp_path, max_files=1)
    config = config_file(lake)
    _two_files(lake)
    assert run_cli(config, crash="after_bronze@0").returncode == CRASH_EXIT_CODE
    before = _versions(lake)
    path = _first_file(lake)
    original = path.read_bytes()
    if change == "deleted":
        path.unlink()
    elif change == "rewritten":  # same size, other content
        path.write_bytes(original.replace(b"Lyon", b"Rome"))
    else:
        path.write_bytes(original[:10])
    restarted = run_cli(config)
    assert restarted.returncode == 1
    lines = [line for line in restarted.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1  # the error, in one line (JSON log lines aside)
    assert str(path) in lines[0] and "micro-batch 0" in lines[0] and "restore" in lines[0]
    assert _versions(lake) == before  # nothing written
    # the operator restores the file: the batch completes as its first attempt would have
    path.write_bytes(original)
    assert run_cli(config).returncode == 0
    assert lake.silver() == lake.expected().rows
    log = lake.table("audit/batch_log").sort("batch_id")
    assert log["records_received"].to_list() == [2, 1]


def test_read_records_checks_the_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    (file,), _ = plan_landing(tmp_path, {}, now=datetime.now(UTC))
    assert [r.data for r in read_records(file, 7)] == [b'{"a": 1}', b'{"a": 2}']
    path.write_bytes(b'{"a": 3}\n{"a": 2}\n')
    with pytest.raises(LandingFileChangedError, match="micro-batch 7"):
        list(read_records(file, 7))


def test_file_growing_while_taken_is_read_in_full_over_two_batches(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    path = lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    lake.run()
    # the producer keeps appending to the same file
    records = [
        ev("E2", "C-1", "UPDATE", "0/20", minutes_ago=40, city="Paris"),
        ev("E3", "C-2", "INSERT", "0/21", minutes_ago=39, **full(city="Lyon")),
    ]
    _append(path, *records, stamp=1_700_000_050)
    lake.arrival.extend(json.dumps(r) for r in records)
    reports = lake.run()
    assert [r.records_received for r in reports] == [2]
    bronze = lake.table("bronze/customer_events").sort("source_line")
    assert bronze["source_line"].to_list() == [1, 2, 3]
    assert bronze["batch_id"].to_list() == [0, 1, 1]
    assert not bronze["is_duplicate"].any()
    assert lake.silver() == lake.expected().rows
    first_line = _line(ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full()))
    offsets = Pipeline(lake.config).checkpoint.offsets(1)
    assert [(f.start, f.change) for f in offsets.files] == [(len(first_line), "appended")]
    assert lake.run() == []  # nothing new


def test_new_file_renamed_over_a_processed_name_is_taken(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    path = lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    lake.run()
    fresh = tmp_path / "incoming.tmp"
    record = ev("E9", "C-9", "INSERT", "0/90", minutes_ago=10, **full(city="Quito"))
    fresh.write_bytes(_line(record))
    os.utime(fresh, (1_700_000_200, 1_700_000_200))
    os.replace(fresh, path)
    lake.arrival.append(json.dumps(record))
    reports = lake.run()
    assert [r.records_received for r in reports] == [1]
    assert "C-9" in lake.silver()
    assert lake.silver() == lake.expected().rows
    (taken,) = Pipeline(lake.config).checkpoint.offsets(1).files
    assert taken.change == "replaced" and taken.start == 0


def test_same_size_same_mtime_replacement_is_detected_by_inode(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    path = lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    lake.run()
    stat = path.stat()
    fresh = tmp_path / "incoming.tmp"
    fresh.write_bytes(path.read_bytes().replace(b"C-1", b"C-7").replace(b"E1", b"E7"))
    os.utime(fresh, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(fresh, path)
    assert lake.run()[0].records_received == 1
    assert set(lake.silver()) == {"C-1", "C-7"}


def test_unterminated_last_line_then_append_takes_the_file_again(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    first = ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())
    second = ev("E2", "C-2", "INSERT", "0/11", minutes_ago=49, **full(city="Lyon"))
    path = lake.landing / "f00001.jsonl"
    whole = _line(first) + _line(second)
    cut = len(_line(first)) + 20
    path.write_bytes(whole[:cut])  # caught while the producer is writing line 2
    os.utime(path, (1_700_000_001, 1_700_000_001))
    lake.run()
    assert lake.quarantine_reasons() == ["MALFORMED_JSON"]
    path.write_bytes(whole)
    os.utime(path, (1_700_000_002, 1_700_000_002))
    lake.run()
    bronze = lake.table("bronze/customer_events").sort("batch_id", "source_line")
    assert bronze.select("event_id", "is_duplicate").rows() == [
        ("E1", False),
        ("E1", True),
        ("E2", False),
    ]
    assert set(lake.silver()) == {"C-1", "C-2"}


def test_changed_gzip_file_is_taken_again_whole(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    first = ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())
    path = lake.write([first], gz=True)
    lake.run()
    second = ev("E2", "C-2", "INSERT", "0/11", minutes_ago=49, **full(city="Lyon"))
    path.write_bytes(gzip.compress(_line(first) + _line(second)))
    os.utime(path, (1_700_000_050, 1_700_000_050))
    lake.run()
    bronze = lake.table("bronze/customer_events").sort("batch_id", "source_line")
    assert bronze.select("event_id", "batch_id", "is_duplicate").rows() == [
        ("E1", 0, False),
        ("E1", 1, True),
        ("E2", 1, False),
    ]


def test_touch_without_new_content_takes_nothing(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    path = lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    lake.run()
    os.utime(path, (1_700_000_999, 1_700_000_999))
    assert lake.run() == []


def test_min_file_age_holds_back_young_files(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.config.source.min_file_age = timedelta(hours=1)
    old = lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    young = lake.write([ev("E2", "C-2", "INSERT", "0/11", minutes_ago=49, **full())])
    now = datetime.now(UTC).timestamp()
    os.utime(young, (now, now))
    reports = Pipeline(lake.config).run(Trigger.parse("available-now"))
    assert [r.records_received for r in reports] == [1]
    assert set(lake.silver()) == {"C-1"}
    os.utime(young, (now - 7200, now - 7200))
    assert [r.records_received for r in lake.run()] == [1]
    assert set(lake.silver()) == {"C-1", "C-2"}
    del old


def test_legacy_offsets_without_fingerprint_still_run(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.write([ev("E1", "C-1", "INSERT", "0/10", minutes_ago=50, **full())])
    config = config_file(lake)
    assert run_cli(config, crash="after_bronze@0").returncode == CRASH_EXIT_CODE
    offsets_file = Path(lake.config.checkpoint.location) / "offsets" / "0.json"
    data = json.loads(offsets_file.read_text())
    for file in data["files"]:
        for key in ("start", "sha256", "inode", "change"):
            file.pop(key)
    offsets_file.write_text(json.dumps(data))
    assert run_cli(config).returncode == 0
    assert lake.silver() == lake.expected().rows
    assert lake.run() == []


def _records(n: int) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for i in range(n):
        key = f"C-{i % 7}"
        op = "INSERT" if i < 7 else "UPDATE"
        fields = full(city=f"City-{i}") if op == "INSERT" else {"city": f"City-{i}"}
        out.append(ev(f"E{i}", key, op, f"0/{100 + i:X}", minutes_ago=60 - i * 0.1, **fields))
    out.insert(20, "not json")  # a quarantined line counts as a record too
    out.insert(30, json.dumps(out[10]))  # a re-delivery
    return out


@pytest.mark.parametrize(
    ("limits", "batches"),
    [({"max_records_per_trigger": 7}, 9), ({"max_bytes_per_trigger": 900}, None)],
)
def test_trigger_limits_split_a_large_file_across_micro_batches(
    tmp_path: Path, limits: dict[str, int], batches: int | None
) -> None:
    whole = Lake(tmp_path / "whole")
    whole.write(_records(60))
    whole.run()
    split = Lake(tmp_path / "split")
    split.config = split.config.model_copy(
        update={"source": split.config.source.model_copy(update=limits)}
    )
    records = _records(60)
    split.write(records[:31])
    split.write(records[31:])
    reports = split.run()
    if batches is not None:
        assert len(reports) == batches
        assert all(r.records_received <= 7 for r in reports)
    else:
        assert len(reports) > 5
    assert sum(r.records_received for r in reports) == 62
    # every line exactly once, with its own line number; the same Silver as one batch
    positions = _positions(split)
    assert len(positions) == len(set(positions)) == 62
    assert sorted(line for _, line in positions) == sorted([*range(1, 32), *range(1, 32)])
    assert split.silver() == whole.silver()
    offsets = [Pipeline(split.config).checkpoint.offsets(i) for i in range(len(reports))]
    changes = {f.change for o in offsets for f in o.files}
    assert changes == {"new", "continued"}
    assert any(f.cut for o in offsets for f in o.files)
    assert split.run() == []


def test_a_cut_file_that_grows_is_continued_with_its_new_lines(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.config = lake.config.model_copy(
        update={"source": lake.config.source.model_copy(update={"max_records_per_trigger": 4})}
    )
    path = lake.write(_records(10))
    pipeline = Pipeline(lake.config)
    first = pipeline.run(Trigger.parse("once"))
    assert [r.records_received for r in first] == [4]
    more = [ev("E-new", "C-1", "UPDATE", "0/FFFF", minutes_ago=1, city="Last")]
    _append(path, *more, stamp=1_700_000_100)
    reports = lake.run()
    assert sum(r.records_received for r in [*first, *reports]) == 13
    assert lake.silver()["C-1"]["city"] == "Last"
    positions = _positions(lake)
    assert sorted(line for _, line in positions) == list(range(1, 14))


def test_cut_landing_takes_at_least_one_line_and_never_cuts_gzip(tmp_path: Path) -> None:
    from cdcflow.sources.files import cut_landing, fingerprinted, list_landing

    big = tmp_path / "a.jsonl"
    big.write_bytes(b"x" * 100 + b"\n" + b"y" * 10 + b"\n")
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n' * 50))
    os.utime(packed, (1_800_000_000, 1_800_000_000))
    files = [fingerprinted(f) for f in list_landing(tmp_path)]
    first = cut_landing(files, None, 10)
    assert len(first) == 1 and first[0].cut and first[0].size == 101
    assert cut_landing(files[1:], 1, 1) == files[1:]  # gzip: whole
    assert cut_landing(files, None, None) == files


def test_a_trigger_limit_fingerprints_only_the_files_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog of N files costs N fingerprints in all (issue 14), not one per file and
    trigger; the limited plan is the prefix of the full one."""
    from cdcflow.sources import files as files_module

    for n in range(6):
        path = tmp_path / f"f{n}.jsonl"
        path.write_bytes(_line({"n": n}))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    now = datetime.now(UTC)
    full_plan, _ = plan_landing(tmp_path, {}, now=now)
    read: list[str] = []
    real = files_module.fingerprint

    def counted(path: str | Path, size: int, cut: int | None = None) -> object:
        read.append(Path(path).name)
        return real(path, size, cut)

    monkeypatch.setattr(files_module, "fingerprint", counted)
    limited, _ = plan_landing(tmp_path, {}, now=now, limit=2)
    assert [f.path for f in limited] == [f.path for f in full_plan[:2]]
    assert [f.sha256 for f in limited] == [f.sha256 for f in full_plan[:2]]
    assert read == ["f0.jsonl", "f1.jsonl"]


def test_a_backlog_with_one_file_per_trigger_takes_every_file_once(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.config.source.max_files_per_trigger = 1
    for n in range(4):
        lake.write([ev(f"E{n}", f"C-{n}", "INSERT", f"0/{10 + n}", minutes_ago=50, **full())])
    reports = lake.run()
    assert [r.records_received for r in reports] == [1, 1, 1, 1]
    assert set(lake.silver()) == {"C-0", "C-1", "C-2", "C-3"}
