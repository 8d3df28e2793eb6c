"""The lakehouse and the checkpoint on object stores, against real protocol servers.

Two servers, each test on both (fixture ``object_store``): moto's S3-compatible server (PyPI)
and the Azure Storage emulator Azurite (npm), started by ``scripts/objectstore/server.sh``;
every client — delta-rs, Polars, obstore, a child ``cdcflow run`` — reaches them through the
``AWS_*`` / ``AZURE_*`` environment. What runs here, on each:

* the checkpoint's primitives: put-if-absent offsets and commit markers, the lease (taken,
  refused while live, taken over once expired, lost to another run → no commit);
* the pipeline against the independent oracle (shuffled, batched streams, both modes);
* a real ``SIGKILL`` at every commit point of a micro-batch, then a restart, compared with an
  uninterrupted run (:mod:`tests.crashkit`);
* two ``cdcflow run`` processes on the same root: exactly one proceeds.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import CheckpointError
from cdcflow.state.checkpoint import BatchOffsets, Checkpoint
from cdcflow.state.faults import CRASH_EXIT_CODE, CRASH_POINTS
from cdcflow.state.storage import Lease, ObjectStorage, is_object_uri
from tests.conftest import Lake, fresh_prefix
from tests.crashkit import (
    BATCHES,
    assert_crashed_at,
    assert_same_lake,
    checkpoint_state,
    config_file,
    run_cli,
    snapshot,
    versions,
    write_workload,
)
from tests.test_property import check_against_oracle, streams

pytestmark = pytest.mark.objectstore


def _offsets(batch: int, minute: int = 0) -> BatchOffsets:
    return BatchOffsets(batch, datetime(2026, 1, 1, 0, minute, tzinfo=UTC), ())


def test_object_uris_are_recognised() -> None:
    assert is_object_uri("s3://bucket/lake")
    assert is_object_uri("abfss://lake@account.dfs.core.windows.net/x")
    assert is_object_uri("az://container/x") and is_object_uri("gs://bucket/x")
    assert not is_object_uri("/data/lake") and not is_object_uri("file:///data/lake")


def test_offsets_and_commits_are_put_if_absent(store_prefix: str) -> None:
    """Two runs writing batch 0: the first's offsets stay, the second is refused; the same
    offsets again (a retry) and a second commit marker are no-ops."""
    first, second = Checkpoint(store_prefix), Checkpoint(store_prefix)
    assert first.is_object_store
    first.write_offsets(_offsets(0))
    first.write_offsets(_offsets(0))  # the same content: a retried put
    with pytest.raises(CheckpointError, match="written by another run first"):
        second.write_offsets(_offsets(0, minute=5))
    assert second.offsets(0) == _offsets(0)
    assert second.pending() == _offsets(0)
    first.write_commit(0, {"at": "first"})
    second.write_commit(0, {"at": "second"})
    marker = ObjectStorage(store_prefix).read("commits/0.json")
    assert marker is not None and json.loads(marker)["at"] == "first"
    assert first.last_batch() == 0 and first.is_committed(0) and first.pending() is None


def test_the_lease_excludes_a_second_run_and_ends_on_release(store_prefix: str) -> None:
    holder, other = Checkpoint(store_prefix), Checkpoint(store_prefix)
    with holder.lock():
        assert other.holder().startswith("pid ")
        with (
            pytest.raises(CheckpointError, match="holds this checkpoint's lease"),
            other.lock(),
        ):
            pass
    assert other.holder() == ""  # released
    with other.lock():  # and free again
        assert holder.holder()


def test_an_expired_lease_is_taken_over_and_its_holder_cannot_commit(store_prefix: str) -> None:
    """A stalled holder (no renewal) loses its lease at expiry; the new run takes it; the old
    holder's next renewal finds another owner and its commit is refused."""
    storage = ObjectStorage(store_prefix)
    stalled = Lease(storage, timedelta(seconds=3))
    stalled.acquire()
    stalled._stop.set()  # the renewal thread stops: as if the process hung
    time.sleep(3.5)
    taker = Checkpoint(store_prefix, lease_ttl=timedelta(seconds=30))
    with taker.lock():
        stalled.renew()
        with pytest.raises(CheckpointError, match="lost the checkpoint's lease"):
            stalled.check()
        taker.write_offsets(_offsets(0))  # the new holder writes
    stalled.release()  # does not end the other run's lease
    assert taker.offsets(0) == _offsets(0)


def test_a_stalled_holder_stops_at_expiry_before_a_renewal_tells_it(store_prefix: str) -> None:
    """A holder whose renewals stopped (a stalled process) refuses to write at its lease's
    expiry by its own clock, before any renewal has found the new owner."""
    storage = ObjectStorage(store_prefix)
    stalled = Lease(storage, timedelta(seconds=3))
    stalled.acquire()
    stalled._stop.set()
    stalled.check()  # valid now
    time.sleep(2.6)  # past ttl less the margin (ttl / 6)
    with pytest.raises(CheckpointError, match="expired without renewal"):
        stalled.check()
    stalled.release()


def test_a_failing_renewal_keeps_the_lease_while_valid_then_loses_it(store_prefix: str) -> None:
    """A store that refuses the renewals (an expired session token, a policy change): the
    renewal logs and retries, never kills its thread or raises; once the lease's validity has
    run out it is lost, and releasing it does not raise either."""
    storage = ObjectStorage(store_prefix)
    lease = Lease(storage, timedelta(seconds=3))
    lease.acquire()
    lease._stop.set()
    real_swap = storage.swap

    def refused(*_: object, **__: object) -> str | None:
        raise PermissionError("403 Forbidden")

    storage.swap = refused  # type: ignore[method-assign]
    lease.renew()  # fails, still valid
    lease.check()
    time.sleep(2.6)
    lease.renew()  # fails after the validity: lost
    with pytest.raises(CheckpointError, match="lost the checkpoint's lease"):
        lease.check()
    lease._lost = False
    lease.release()  # the store refuses: a warning, not an error
    storage.swap = real_swap  # type: ignore[method-assign]


def test_a_stray_commit_marker_and_garbage_are_refused_not_trusted(store_prefix: str) -> None:
    """A commit marker of a batch without offsets (copied from elsewhere) is refused when the
    batch's offsets would be written (after a crash it would make the batch look done); a
    subfolder of ``offsets/`` holds no batches; a lease object that is no cdcflow lease does
    not stop a run."""
    storage = ObjectStorage(store_prefix)
    checkpoint = Checkpoint(store_prefix)
    checkpoint.write_offsets(_offsets(0))
    checkpoint.write_commit(0, {})
    storage.replace("commits/1.json", b'{"batch_id": 1}')
    with pytest.raises(CheckpointError, match=r"commits/1\.json exists but micro-batch 1"):
        checkpoint.write_offsets(_offsets(1))
    assert not checkpoint.has_batch(1)
    storage.replace("offsets/old/7.json", b"{}")
    assert checkpoint.last_batch() == 0
    naive = b'{"owner": "x", "pid": 1, "host": "h", "since": "s", "expires_at": "2999-01-01"}'
    for garbage in (b"{", naive, b'{"expires_at": "tomorrow"}'):
        storage.replace("lock", garbage)
        with checkpoint.lock():
            assert checkpoint.holder().startswith("pid ")


def test_racing_runs_take_the_lease_once(store_prefix: str) -> None:
    """Eight threads try to take a free lease at the same moment: exactly one gets it."""
    storage = ObjectStorage(store_prefix)
    start = threading.Barrier(8)
    won: list[Lease] = []
    refused: list[str] = []

    def attempt() -> None:
        lease = Lease(storage, timedelta(seconds=30))
        start.wait()
        try:
            lease.acquire()
            won.append(lease)
        except CheckpointError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7
    won[0].release()


@settings(max_examples=5, deadline=None)
@pytest.mark.parametrize("mode", ["soft", "hard"])
@given(stream=streams(), max_files=st.sampled_from([1, 2]))
def test_shuffled_batched_streams_on_object_stores_match_oracle(
    tmp_path_factory: pytest.TempPathFactory,
    object_store: str,
    mode: str,
    stream: tuple[list[Any], list[int], int],
    max_files: int,
) -> None:
    records, cuts, seed = stream
    store = fresh_prefix(object_store, f"property-{mode}")
    lake = Lake(tmp_path_factory.mktemp(mode), mode=mode, max_files=max_files, store=store)
    lake.config.gold.refresh_every_batches = 0
    lake.write_stream(list(records), cuts, seed)
    lake.run("available-now")
    check_against_oracle(lake, len(records))


def _crash_lake(root: Path, store: str, mode: str) -> Lake:
    lake = Lake(root, mode=mode, max_files=1, store=store)
    write_workload(lake)
    return lake


@pytest.fixture(scope="module")
def store_reference(
    tmp_path_factory: pytest.TempPathFactory, object_store: str
) -> dict[str, dict[str, Any]]:
    """The uninterrupted run of the crash workload on the object store, per delete mode."""
    snapshots = {}
    for mode in ("soft", "hard"):
        store = fresh_prefix(object_store, f"reference-{mode}")
        lake = _crash_lake(tmp_path_factory.mktemp(f"{object_store}-reference-{mode}"), store, mode)
        assert [r.batch_id for r in lake.run()] == list(range(BATCHES))
        snapshots[mode] = snapshot(lake)
    return snapshots


#: every commit point once, alternating delete mode, in the middle micro-batch
STORE_CELLS = [
    pytest.param(point, ("soft", "hard")[i % 2], id=f"{point}-{('soft', 'hard')[i % 2]}")
    for i, point in enumerate(CRASH_POINTS)
]


@pytest.mark.slow
@pytest.mark.parametrize(("point", "mode"), STORE_CELLS)
def test_crash_at_every_commit_point_on_object_stores(
    tmp_path: Path,
    store_prefix: str,
    store_reference: dict[str, dict[str, Any]],
    point: str,
    mode: str,
) -> None:
    """A child ``cdcflow run`` on the object store is killed (SIGKILL) at the point; the lake
    holds exactly the commits before it; a restart ends equal to the uninterrupted run, and a
    second restart writes nothing."""
    if mode == "soft" and point == "after_silver_merge":
        mode = "hard"  # soft mode has no commit between the Silver MERGE and after_silver
    batch = 1
    lake = _crash_lake(tmp_path, store_prefix, mode)
    # the killed run's lease stays live until it expires: a short one keeps the test short
    lake.config.checkpoint.lease_ttl = timedelta(seconds=3)
    crashed = run_cli(config_file(lake), crash=f"{point}@{batch}")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    assert_crashed_at(lake, point, batch)
    deadline = time.monotonic() + 60
    while True:
        try:
            reports = lake.run()
            break
        except CheckpointError as exc:
            assert "holds this checkpoint's lease" in str(exc)
            assert time.monotonic() < deadline, "the killed run's lease never expired"
            time.sleep(0.5)
    first = batch + (point == "after_commit")
    assert [r.batch_id for r in reports] == list(range(first, BATCHES))
    assert_same_lake(lake, store_reference[mode])
    assert lake.run() == []
    assert (versions(lake), checkpoint_state(lake)) == (
        store_reference[mode]["versions"],
        store_reference[mode]["checkpoint"],
    )


def test_two_runs_on_one_object_store_root_exactly_one_proceeds(
    tmp_path: Path, store_prefix: str
) -> None:
    """While one ``cdcflow run`` holds the checkpoint's lease, a second on the same root
    and checkpoint exits 2 (as for a local lock) naming the holder and writes nothing; the
    first ends every batch."""
    lake = _crash_lake(tmp_path, store_prefix, "soft")
    config = config_file(lake, pipeline={"name": "customers"})
    results: dict[str, Any] = {}
    first = threading.Thread(target=lambda: results.setdefault("first", run_cli(config)))
    first.start()
    storage = ObjectStorage(lake.config.checkpoint.location)
    deadline = time.monotonic() + 60
    while not storage.read("lock"):
        assert time.monotonic() < deadline and first.is_alive(), "the first run took no lease"
        time.sleep(0.05)
    second = run_cli(config)
    first.join()
    assert results["first"].returncode == 0, results["first"].stderr[-3000:]
    assert second.returncode == 1, second.stdout + second.stderr  # as for a local lock
    assert "holds this checkpoint's lease" in second.stderr
    state = checkpoint_state(lake)
    assert state["committed"] == [True] * BATCHES and state["pending"] is None
    assert lake.silver() == lake.expected().rows


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {
                "pipeline": {"engine": "spark"},
                "storage": {"root": "az://container/lake"},
                "checkpoint": {"location": "az://container/lake/_checkpoints/customers"},
            },
            "the Spark engine keeps its checkpoint on an object store only on S3",
        ),
        (
            {"pipeline": {"engine": "spark"}, "storage": {"root": "./lake"}},
            "with storage.root on S3 too",
        ),
    ],
)
def test_an_object_store_checkpoint_is_refused_where_it_is_not_supported_yet(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    """A config error naming the key and the file, before anything runs."""
    from cdcflow.config import load_config
    from cdcflow.errors import ConfigError

    path = tmp_path / "cdcflow.yaml"
    path.write_text(
        json.dumps(
            {
                "storage": {"root": "s3://bucket/lake"},
                "checkpoint": {"location": "s3://bucket/lake/_checkpoints/customers"},
                **section,
            }
        )
    )
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(path)
    assert "checkpoint.location" in str(raised.value) and str(path) in str(raised.value)


def test_erase_on_object_stores(store_prefix: str, tmp_path: Path) -> None:
    """``erase`` on a lakehouse and checkpoint on each object store: the subject's values are
    in no object under the prefix afterwards (every object read back: Parquet as values), the
    Delta logs start at the erasure, ``verify_erasure`` passes."""
    from cdcflow.layers.erasure import erase, scan_files, verify_erasure
    from tests.test_erasure import SUBJECT, VALUES, subject_events

    lake = Lake(tmp_path, store=store_prefix)
    for records in subject_events():
        lake.write(records)
        lake.run()
    assert scan_files(lake.config, VALUES)  # there before
    erase(lake.config, "customers", [SUBJECT], confirmed=True)
    assert scan_files(lake.config, VALUES) == []
    checks = verify_erasure(lake.config, "customers", [SUBJECT], VALUES)
    assert all(c.ok for c in checks), [vars(c) for c in checks if not c.ok]
    row = lake.silver()[SUBJECT]
    assert (row["customer_name"], row["email"], row["phone"]) == (None, None, None)
    lake.write([{"event_id": "E99", "customer_id": "C-8", "operation": "UPDATE",
                 "event_timestamp": "2026-01-01T00:00:00Z", "city": "Hull",
                 "metadata": {"lsn": 99}}])  # fmt: skip
    lake.run()  # the pipeline continues on the truncated logs
    assert lake.silver()["C-8"]["city"] == "Hull"
