"""Landing-folder source: ``*.jsonl`` and ``*.jsonl.gz`` files of one JSON event per line.

Files are taken in order of (modification time, name), each exactly once (the checkpoint's
offset log records which files every micro-batch took). The source never modifies or deletes a
landing file. Producers should write a file under another name and rename it into place, so a
half-written file is never listed. Blank lines (empty or whitespace only) are not records; line
numbers count every line, starting at 1.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True, slots=True)
class LandingFile:
    """One landing file as listed (path, size in bytes, modification time in nanoseconds)."""

    path: str
    size: int
    mtime_ns: int

    @property
    def name(self) -> str:
        """File name without folder."""
        return Path(self.path).name

    def to_json(self) -> dict[str, Any]:
        """Serialisable form stored in the offset log."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LandingFile:
        """Inverse of :meth:`to_json`."""
        return cls(path=str(data["path"]), size=int(data["size"]), mtime_ns=int(data["mtime_ns"]))


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One non-blank line of a landing file.

    Attributes:
        source_file: the file's path.
        source_line: 1-based line number.
        data: the line's bytes without the line terminator. ``None`` when the rest of the file
            could not be read (corrupt gzip); ``error`` then says why.
        error: reason the data is missing, else None.
    """

    source_file: str
    source_line: int
    data: bytes | None
    error: str | None = None


def list_landing(folder: str | Path) -> list[LandingFile]:
    """List landing files in (modification time, name) order.

    Args:
        folder: the landing folder; a missing folder has no files.

    Returns:
        The ``*.jsonl`` / ``*.jsonl.gz`` regular files directly in the folder.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    files = []
    for entry in root.iterdir():
        if entry.name.endswith(SUFFIXES) and entry.is_file():
            stat = entry.stat()
            files.append(LandingFile(str(entry.resolve()), stat.st_size, stat.st_mtime_ns))
    files.sort(key=lambda f: (f.mtime_ns, f.name))
    return files


def read_records(file: LandingFile) -> Iterator[RawRecord]:
    """Yield the non-blank lines of a landing file in order.

    A gzip file that is truncated or corrupt yields its readable lines, then one record with
    ``data=None`` and an ``error`` (quarantined as ``MALFORMED_JSON``), so nothing is dropped
    silently and the stream does not stop.
    """
    line_no = 0
    try:
        opener = gzip.open if file.path.endswith(".gz") else open
        with opener(file.path, "rb") as handle:
            for line in handle:
                line_no += 1
                data = line.rstrip(b"\r\n")
                if data.strip():
                    yield RawRecord(file.path, line_no, data)
    except (OSError, EOFError, zlib.error) as exc:
        yield RawRecord(file.path, line_no + 1, None, f"unreadable file content: {exc}")
