"""Checkpoint folder: write-ahead offset log, commit log and a run lock.

Layout (``checkpoint.location``: a local folder or an object-store prefix,
:mod:`cdcflow.state.storage`)::

    offsets/<batch_id>.json   written BEFORE a micro-batch is processed: its files and its
                              processing time (so a re-run validates identically)
    commits/<batch_id>.json   written AFTER every table of the batch is committed
    lock                      held (flock) by the running pipeline; on an object store a
                              lease (owner, expiry) taken with conditional puts

On restart the last batch that has offsets but no commit is re-run with the same offsets; each
Delta write skips itself when the table already holds that batch's app transaction.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.errors import CheckpointError
from cdcflow.sources.files import LandingFile
from cdcflow.state.storage import (
    Lease,
    ObjectStorage,
    open_storage,
    read_lease,
    write_bytes_atomic,
)

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig


@dataclass(frozen=True)
class BatchOffsets:
    """The input of one micro-batch, as recorded in the offset log.

    Attributes:
        batch_id: 0-based micro-batch number.
        processing_time: the batch's processing time (UTC).
        files: the landing files of the batch, in processing order.
    """

    batch_id: int
    processing_time: datetime
    files: tuple[LandingFile, ...]

    def to_json(self) -> dict[str, Any]:
        """Serialisable form."""
        return {
            "batch_id": self.batch_id,
            "processing_time": self.processing_time.isoformat(),
            "files": [f.to_json() for f in self.files],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchOffsets:
        """Inverse of :meth:`to_json`."""
        return cls(
            batch_id=int(data["batch_id"]),
            processing_time=datetime.fromisoformat(data["processing_time"]),
            files=tuple(LandingFile.from_json(f) for f in data["files"]),
        )


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, indent=1).encode("utf-8")


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file, fsync, rename)."""
    write_bytes_atomic(path, _json(payload))


class Checkpoint:
    """The checkpoint of one pipeline: a local folder or an object-store prefix.

    On a local folder files are replaced atomically (rename) and the run lock is an ``flock``.
    On an object store (``s3://``, ``az://``/``abfss://``, ``gs://``; :mod:`cdcflow.state.storage`)
    the offsets and the commit marker of a micro-batch are created with a conditional put
    (put-if-absent), so two runs cannot both write batch N, and the run lock is a lease
    (:class:`~cdcflow.state.storage.Lease`).

    Args:
        location: ``checkpoint.location``.
        options: storage options (``storage.options``: endpoints, credentials) for an
            object store; the environment's ``AWS_*``/``AZURE_*``/``GOOGLE_*`` apply too.
        lease_ttl: how long an object-store lease lasts without renewal.
    """

    def __init__(
        self,
        location: str | Path,
        options: dict[str, str] | None = None,
        lease_ttl: timedelta = timedelta(seconds=30),
    ) -> None:
        self.location = str(location)
        self.storage = open_storage(self.location, options)
        self.is_object_store = isinstance(self.storage, ObjectStorage)
        self.root = Path(location)
        self.offsets_dir = self.root / "offsets"
        self.commits_dir = self.root / "commits"
        self.lease_ttl = lease_ttl
        self._lease: Lease | None = None

    @classmethod
    def of(cls, config: CdcflowConfig) -> Checkpoint:
        """The checkpoint of a :class:`~cdcflow.config.CdcflowConfig` (its location, the
        storage options and the lease time)."""
        return cls(config.checkpoint.location, config.storage.options, config.checkpoint.lease_ttl)

    def has_offsets(self) -> bool:
        """True when the offset log holds at least one micro-batch."""
        return bool(self.storage.ids("offsets"))

    def has_batch(self, batch_id: int) -> bool:
        """True when the offsets of micro-batch ``batch_id`` are written."""
        return self.storage.exists(f"offsets/{batch_id}.json")

    def uri(self, name: str) -> str:
        """Where ``name`` (a path relative to the checkpoint) lives: a local path, or a URI
        under the object-store prefix (for a writer of its own, e.g. Spark's streaming
        checkpoint)."""
        if self.is_object_store:
            return f"{self.location.rstrip('/')}/{name}"
        return str(self.root / name)

    def read_state(self, name: str) -> dict[str, Any] | None:
        """An engine's own JSON state file ``name`` in the checkpoint, or None when absent."""
        payload = self.storage.read(name)
        return None if payload is None else dict(json.loads(payload.decode("utf-8")))

    def write_state(self, name: str, payload: dict[str, Any]) -> None:
        """Replace the JSON state file ``name`` (local: atomic rename; object store: a put,
        after checking the lease).

        Raises:
            CheckpointError: on an object store, this run lost its lease.
        """
        if self._lease is not None:
            self._lease.check()
        self.storage.replace(name, _json(payload))

    def offsets(self, batch_id: int) -> BatchOffsets:
        """Read the offsets of a batch.

        Raises:
            CheckpointError: missing or unreadable.
        """
        name = f"offsets/{batch_id}.json"
        path = self.offsets_dir / f"{batch_id}.json"
        where = f"{self.location.rstrip('/')}/{name}" if self.is_object_store else str(path)
        try:
            if self.is_object_store:
                payload = self.storage.read(name)
                if payload is None:
                    raise FileNotFoundError(f"No such object: {where!r}")
                text = payload.decode("utf-8")
            else:
                text = path.read_text(encoding="utf-8")
            return BatchOffsets.from_json(json.loads(text))
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{where}: unreadable offsets ({exc})") from exc

    def last_batch(self) -> int | None:
        """Highest batch id in the offset log, or None when empty."""
        ids = self.storage.ids("offsets")
        return ids[-1] if ids else None

    def is_committed(self, batch_id: int) -> bool:
        """True when the commit marker of the batch exists."""
        return self.storage.exists(f"commits/{batch_id}.json")

    def pending(self) -> BatchOffsets | None:
        """The last batch when it has offsets but no commit marker (to re-run), else None."""
        last = self.last_batch()
        if last is None or self.is_committed(last):
            return None
        return self.offsets(last)

    def processed_paths(self) -> set[str]:
        """Paths of every landing file named in the offset log."""
        return set(self.taken())

    def taken(self) -> dict[str, LandingFile]:
        """Per landing file path, the range the latest micro-batch that read it took.

        Returns:
            path → :class:`LandingFile` (its ``size`` is how far the file has been taken).
        """
        latest: dict[str, LandingFile] = {}
        for batch_id in self.storage.ids("offsets"):
            latest.update((f.path, f) for f in self.offsets(batch_id).files)
        return latest

    def write_offsets(self, offsets: BatchOffsets) -> None:
        """Write-ahead the offsets of a batch (local: atomic rename; object store:
        put-if-absent).

        Raises:
            CheckpointError: a commit marker of this batch exists without its offsets (a
                stray marker would make the batch look done after a crash); on an object
                store, another run wrote different offsets for this batch first, or this run
                lost its lease.
        """
        payload = _json(offsets.to_json())
        name = f"offsets/{offsets.batch_id}.json"
        if self.is_committed(offsets.batch_id) and not self.has_batch(offsets.batch_id):
            raise CheckpointError(
                f"{self.location}: commits/{offsets.batch_id}.json exists but micro-batch "
                f"{offsets.batch_id} has no offsets: a commit marker this checkpoint did not "
                "write (copied from another checkpoint?); remove it, or restore the offsets it "
                "belongs to, and run again (nothing was written)"
            )
        if not self._write(name, payload) and self.storage.read(name) != payload:
            raise CheckpointError(
                f"{self.location}: micro-batch {offsets.batch_id}'s offsets were written by "
                "another run first; this run stops (one run per checkpoint)"
            )

    def write_commit(self, batch_id: int, info: dict[str, Any]) -> None:
        """Mark a batch committed (local: atomic rename; object store: put-if-absent, a marker
        that exists already stays).

        Raises:
            CheckpointError: on an object store, this run lost its lease.
        """
        self._write(f"commits/{batch_id}.json", _json({"batch_id": batch_id, **info}))

    def _write(self, name: str, payload: bytes) -> bool:
        """A checkpoint file: on a local folder replaced atomically (both log folders
        created), True; on an object store created only if absent, after checking the lease
        (False: it existed already).

        Raises:
            CheckpointError: on an object store, this run lost its lease.
        """
        if not self.is_object_store:
            self.offsets_dir.mkdir(parents=True, exist_ok=True)
            self.commits_dir.mkdir(parents=True, exist_ok=True)
            self.storage.replace(name, payload)
            return True
        if self._lease is not None:
            self._lease.check()
        return self.storage.create(name, payload)

    def holder(self) -> str:
        """Who holds the run lock, as written by :meth:`lock`: ``pid N on HOST since TIME``.

        Returns:
            The description, or an empty string when the lock names no holder (an older
            version took it, the holder has only just taken it, or an object-store lease has
            expired or been released).
        """
        if self.is_object_store:
            lease = read_lease(self.storage.read("lock"))
            if lease is None or lease.expired(datetime.now(UTC)):
                return ""
            return lease.describe()
        try:
            data = json.loads((self.root / "lock").read_text(encoding="utf-8"))
            return f"pid {int(data['pid'])} on {data['host']} since {data['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run lock: one running pipeline per checkpoint.

        The lock file names the holder (process id, host, UTC time it took the lock) while it is
        held, so a refused run can say who holds it; it is emptied on release.

        On an object store the lock is a lease (:class:`~cdcflow.state.storage.Lease`),
        renewed in the background while held.

        Raises:
            CheckpointError: another process holds the lock (the message names it).
        """
        if isinstance(self.storage, ObjectStorage):
            lease = Lease(self.storage, self.lease_ttl)
            lease.acquire()
            self._lease = lease
            try:
                yield
            finally:
                self._lease = None
                lease.release()
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a+", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                holder = self.holder()
                by = f" ({holder})" if holder else ""
                raise CheckpointError(
                    f"{self.root}: another cdcflow run holds this checkpoint's lock{by}"
                ) from exc
            try:
                handle.truncate(0)
                handle.write(
                    json.dumps(
                        {
                            "pid": os.getpid(),
                            "host": socket.gethostname(),
                            "since": datetime.now(UTC).isoformat(timespec="seconds"),
                        }
                    )
                    + "\n"
                )
                handle.flush()
                yield
            finally:
                handle.truncate(0)
                handle.flush()
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
