"""Checkpoint folder: write-ahead offset log, commit log and a run lock.

Layout (``checkpoint.location``)::

    offsets/<batch_id>.json   written BEFORE a micro-batch is processed: its files and its
                              processing time (so a re-run validates identically)
    commits/<batch_id>.json   written AFTER every table of the batch is committed
    lock                      held (flock) by the running pipeline

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdcflow.errors import CheckpointError
from cdcflow.sources.files import LandingFile


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


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file, fsync, rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class Checkpoint:
    """The checkpoint folder of one pipeline (local file system)."""

    def __init__(self, location: str | Path) -> None:
        self.root = Path(location)
        self.offsets_dir = self.root / "offsets"
        self.commits_dir = self.root / "commits"

    def _ensure(self) -> None:
        self.offsets_dir.mkdir(parents=True, exist_ok=True)
        self.commits_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _ids(folder: Path) -> list[int]:
        if not folder.is_dir():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def offsets(self, batch_id: int) -> BatchOffsets:
        """Read the offsets of a batch.

        Raises:
            CheckpointError: missing or unreadable.
        """
        path = self.offsets_dir / f"{batch_id}.json"
        try:
            return BatchOffsets.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: unreadable offsets ({exc})") from exc

    def last_batch(self) -> int | None:
        """Highest batch id in the offset log, or None when empty."""
        ids = self._ids(self.offsets_dir)
        return ids[-1] if ids else None

    def is_committed(self, batch_id: int) -> bool:
        """True when the commit marker of the batch exists."""
        return (self.commits_dir / f"{batch_id}.json").exists()

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
        for batch_id in self._ids(self.offsets_dir):
            latest.update((f.path, f) for f in self.offsets(batch_id).files)
        return latest

    def write_offsets(self, offsets: BatchOffsets) -> None:
        """Write-ahead the offsets of a batch (atomic rename)."""
        self._ensure()
        write_atomic(self.offsets_dir / f"{offsets.batch_id}.json", offsets.to_json())

    def write_commit(self, batch_id: int, info: dict[str, Any]) -> None:
        """Mark a batch committed (atomic rename)."""
        self._ensure()
        write_atomic(self.commits_dir / f"{batch_id}.json", {"batch_id": batch_id, **info})

    def holder(self) -> str:
        """Who holds the run lock, as written by :meth:`lock`: ``pid N on HOST since TIME``.

        Returns:
            The description, or an empty string when the lock file names no holder (an older
            version took it, or the holder has only just taken it).
        """
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

        Raises:
            CheckpointError: another process holds the lock (the message names it).
        """
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
