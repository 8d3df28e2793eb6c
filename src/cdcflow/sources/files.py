"""Landing-folder source: ``*.jsonl`` and ``*.jsonl.gz`` files of one JSON event per line.

Files are taken in order of (modification time, name). The source never modifies or deletes a
landing file. Producers should write a file under another name and rename it into place, so a
half-written file is never listed; for writers that do not rename, ``source.min_file_age``
holds a file back until it has not been modified for that long. Blank lines (empty or
whitespace only) are not records; line numbers count every line, starting at 1.

**What a micro-batch takes of a file** (recorded in the checkpoint's offset log, see
:class:`LandingFile`): the byte range ``[start, size)`` as the file was listed, with the
SHA-256 of its first ``size`` bytes. Reading never goes past ``size``, so a file that grows
while it is read is read up to its listed size, and a re-run after a crash reads exactly the
bytes of the first attempt — or stops with :class:`~cdcflow.errors.LandingFileChangedError`
when those bytes are no longer there.

**A file that changes after it was taken** is never skipped in silence (:func:`plan_landing`):

* *continued* — the rest of a file an earlier micro-batch took only part of, because the batch
  reached ``source.max_records_per_trigger`` or ``source.max_bytes_per_trigger``
  (:func:`cut_landing`): the range starts where the last one ended, at a line boundary.
* *appended* — the first ``size`` bytes are unchanged, the file is longer, the part already
  taken ended with a line break and the file is not gzip: only the new bytes are taken, as a
  new micro-batch (line numbers continue the file's own).
* *replaced* — anything else (other content under the same name, a shorter file, a gzip file
  that changed, a previously taken part that ended inside a line): the whole file is taken
  again as new content. Its events go through duplicate detection like any redelivery
  (identical copies become ``DUPLICATE``, different content under a known event id
  ``DUPLICATE_EVENT_CONFLICT``), and a warning is logged.

A file whose size, modification time and inode are unchanged is not read again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from cdcflow.errors import LandingFileChangedError

SUFFIXES = (".jsonl", ".jsonl.gz")
_BLOCK = 1 << 20

#: Why a file is in a micro-batch: first time seen, grown by appending, or changed otherwise.
Change = Literal["new", "appended", "replaced", "continued"]


@dataclass(frozen=True, slots=True)
class LandingFile:
    """One landing file as a micro-batch takes it.

    Attributes:
        path: absolute path.
        size: bytes of the file taken into account, from its start: the batch reads
            ``[start, size)``.
        mtime_ns: modification time when listed, in nanoseconds since the epoch.
        start: first byte of the batch's range (0, or the size taken before for an appended
            file).
        sha256: hex SHA-256 of the file's first ``size`` bytes when listed (None in offset
            logs written before fingerprints existed: only the size is checked then).
        inode: inode number when listed (0 when unknown).
        change: ``new``, ``appended``, ``replaced`` or ``continued`` (see the module docstring).
        cut: the range ends before the listed end of the file, at a line boundary, because
            the micro-batch reached its record or byte limit (:func:`cut_landing`); the next
            micro-batch continues from ``size``.
    """

    path: str
    size: int
    mtime_ns: int
    start: int = 0
    sha256: str | None = None
    inode: int = 0
    change: Change = "new"
    cut: bool = False

    @property
    def name(self) -> str:
        """File name without folder."""
        return Path(self.path).name

    @property
    def is_gzip(self) -> bool:
        """True for a ``.gz`` file."""
        return self.path.endswith(".gz")

    def to_json(self) -> dict[str, Any]:
        """Serialisable form stored in the offset log."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LandingFile:
        """Inverse of :meth:`to_json` (fields added later take their defaults)."""
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            mtime_ns=int(data["mtime_ns"]),
            start=int(data.get("start", 0)),
            sha256=data.get("sha256"),
            inode=int(data.get("inode", 0)),
            change=data.get("change", "new"),
            cut=bool(data.get("cut", False)),
        )


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


def fingerprint(
    path: str | Path, size: int, cut: int | None = None
) -> tuple[str, int, str | None, bool]:
    """SHA-256 of the first ``size`` bytes of a file, and of its first ``cut`` bytes, in one read.

    Returns:
        (hex digest, bytes actually read — less than ``size`` when the file is shorter, hex
        digest of the first ``cut`` bytes — None without ``cut`` or when fewer were read,
        whether byte ``cut`` - 1 is a line feed).

    Raises:
        OSError: the file cannot be opened.
    """
    digest = hashlib.sha256()
    read = 0
    at_cut: str | None = digest.hexdigest() if cut == 0 else None
    cut_ends_line = False
    with open(path, "rb") as handle:
        while read < size:
            want = min(_BLOCK, size - read)
            if cut is not None and read < cut:
                want = min(want, cut - read)  # a block ends exactly at the cut
            block = handle.read(want)
            if not block:
                break
            digest.update(block)
            read += len(block)
            if cut is not None and read == cut and cut > 0:
                at_cut, cut_ends_line = digest.copy().hexdigest(), block[-1:] == b"\n"
    return digest.hexdigest(), read, at_cut, cut_ends_line


def fingerprinted(file: LandingFile) -> LandingFile:
    """The file with the SHA-256 of its first ``size`` bytes (``size`` cut to what is there).

    Raises:
        OSError: the file cannot be opened.
    """
    digest, read, _, _ = fingerprint(file.path, file.size)
    return replace(file, size=read, sha256=digest)


def check_taken(file: LandingFile, batch_id: int | None) -> None:
    """Check that a file still holds the bytes a recorded micro-batch took from it.

    Raises:
        LandingFileChangedError: the file is gone, shorter than ``file.size``, or its first
            ``file.size`` bytes no longer hash to ``file.sha256``.
    """
    try:
        digest, read, _, _ = fingerprint(file.path, file.size)
    except OSError as exc:
        raise _unopenable(file, batch_id, exc) from None
    _check(file, batch_id, read, digest)


def _listed(entry: Path) -> LandingFile:
    stat = entry.stat()
    return LandingFile(str(entry.resolve()), stat.st_size, stat.st_mtime_ns, inode=stat.st_ino)


def list_landing(folder: str | Path) -> list[LandingFile]:
    """List landing files in (modification time, name) order.

    Args:
        folder: the landing folder; a missing folder has no files.

    Returns:
        The ``*.jsonl`` / ``*.jsonl.gz`` regular files directly in the folder (whole files, no
        fingerprint).
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    files = [
        _listed(entry)
        for entry in root.iterdir()
        if entry.name.endswith(SUFFIXES) and entry.is_file()
    ]
    files.sort(key=lambda f: (f.mtime_ns, f.name))
    return files


def plan_landing(
    folder: str | Path,
    taken: Mapping[str, LandingFile],
    *,
    now: datetime,
    min_file_age: timedelta = timedelta(0),
    new_files: bool = True,
    limit: int | None = None,
) -> tuple[list[LandingFile], list[LandingFile]]:
    """Decide what of the landing folder a new micro-batch takes.

    Args:
        folder: the landing folder.
        taken: per path, the latest range an earlier micro-batch took (from the offset log).
        now: the listing time (UTC), for ``min_file_age``.
        min_file_age: files modified more recently than this are left for a later trigger.
        new_files: False to look only at files an earlier micro-batch took (changed files).
        limit: stop after this many files to take (``source.max_files_per_trigger``): the
            files after them are neither read nor fingerprinted, so a backlog of N files costs
            N fingerprints in all, not one per file and trigger (None: plan every file).

    Returns:
        (files to take, in (mtime, name) order, each with its range, fingerprint and
        :data:`Change`; files held back by ``min_file_age``).
    """
    horizon = int((now - min_file_age).timestamp() * 1e9)
    plan: list[LandingFile] = []
    young: list[LandingFile] = []
    for listed in list_landing(folder):
        if not new_files and listed.path not in taken:
            continue
        try:
            item = _plan_one(listed, taken.get(listed.path))
        except FileNotFoundError:  # removed while listing: nothing to take
            continue
        if item is None:
            continue
        if min_file_age and listed.mtime_ns > horizon:
            young.append(listed)
            continue
        plan.append(item)
        if limit is not None and len(plan) >= limit:
            break
    return plan, young


def unchanged(listed: LandingFile, before: LandingFile | None) -> bool:
    """True when a listed landing file is the one a micro-batch took (same size, modification
    time and inode): nothing of it is left to take."""
    return before is not None and (listed.size, listed.mtime_ns, listed.inode) == (
        before.size,
        before.mtime_ns,
        before.inode,
    )


def _plan_one(listed: LandingFile, before: LandingFile | None) -> LandingFile | None:
    if unchanged(listed, before):
        return None
    cut = None if before is None else before.size
    digest, read, prefix, prefix_ends_line = fingerprint(listed.path, listed.size, cut)
    listed = replace(listed, size=read, sha256=digest)
    if before is None:
        return listed
    if prefix is not None and prefix == before.sha256:  # legacy offsets: no sha256, no match
        if before.cut and read > before.size:  # the rest of a file cut by the trigger limits
            return replace(listed, start=before.size, change="continued")
        if read == before.size:
            return None  # same bytes, only the metadata changed
        if not listed.is_gzip and (before.size == 0 or prefix_ends_line):
            return replace(listed, start=before.size, change="appended")
    return replace(listed, change="replaced")


def read_records(file: LandingFile, batch_id: int | None = None) -> Iterator[RawRecord]:
    """Yield the non-blank lines of a micro-batch's range of a landing file, in order.

    Exactly the bytes ``[file.start, file.size)`` are read, and the first ``file.size`` bytes
    must still hash to ``file.sha256``: a re-run after a crash reads what the first attempt
    read. The check completes when the generator is exhausted, so a caller must read every
    record before it writes anything.

    A gzip file that is truncated or corrupt yields its readable lines, then one record with
    ``data=None`` and an ``error`` (quarantined as ``MALFORMED_JSON``), so nothing is dropped
    silently and the stream does not stop.

    Args:
        file: the file and range, as recorded in the batch's offsets.
        batch_id: the micro-batch, named in the error.

    Raises:
        LandingFileChangedError: the file is gone, shorter than ``file.size``, or its first
            ``file.size`` bytes differ from the recorded fingerprint.
    """
    digest = hashlib.sha256()
    try:
        handle = open(file.path, "rb")  # noqa: SIM115 - closed below, around the generator
    except OSError as exc:
        raise _unopenable(file, batch_id, exc) from None
    with handle:
        if file.is_gzip:
            raw = handle.read(file.size)
            digest.update(raw)
            _check(file, batch_id, len(raw), digest.hexdigest())
            for line_no, data, error in content_lines(file.path, raw):
                yield RawRecord(file.path, line_no, data, error)
            return
        offset = line_no = 0
        while offset < file.size:
            line = handle.readline(file.size - offset)
            if not line:
                break
            digest.update(line)
            line_no += 1
            begins = offset
            offset += len(line)
            if begins < file.start:
                continue
            data = line.rstrip(b"\r\n")
            if data.strip():
                yield RawRecord(file.path, line_no, data)
        _check(file, batch_id, offset, digest.hexdigest())


def _unopenable(file: LandingFile, batch_id: int | None, exc: OSError) -> LandingFileChangedError:
    if isinstance(exc, FileNotFoundError):
        return LandingFileChangedError(file, batch_id, "no longer exists")
    return LandingFileChangedError(file, batch_id, f"cannot be opened ({exc.strerror})")


def _check(file: LandingFile, batch_id: int | None, read: int, digest: str) -> None:
    if read < file.size:
        raise LandingFileChangedError(file, batch_id, f"is now {read} bytes long")
    if file.sha256 is not None and digest != file.sha256:
        raise LandingFileChangedError(file, batch_id, "has different content")


def unreadable_detail(exc: BaseException) -> str:
    """Quarantine detail for file content that cannot be decoded: the kind of problem only.

    The exception's own text is not used: for a file that is not gzip it quotes the file's
    first bytes.
    """
    if isinstance(exc, gzip.BadGzipFile):
        kind = "not a gzip file"
    elif isinstance(exc, EOFError):
        kind = "the gzip stream ends early"
    elif isinstance(exc, zlib.error):
        kind = "corrupt gzip data"
    else:
        kind = type(exc).__name__
    return f"unreadable file content: {kind}"


def content_lines(name: str, content: bytes) -> Iterator[tuple[int, bytes | None, str | None]]:
    """Split a landing file's bytes into its non-blank lines (gzip decoded by ``name``).

    Yields:
        (1-based line number, the line without its terminator, None); when gzip content stops
        being readable, one last (line number, None, :func:`unreadable_detail`).
    """
    line_no = 0
    try:
        handle: Any = (
            gzip.GzipFile(fileobj=io.BytesIO(content))
            if name.endswith(".gz")
            else io.BytesIO(content)
        )
        for line in handle:
            line_no += 1
            data = line.rstrip(b"\r\n")
            if data.strip():
                yield line_no, data, None
    except (OSError, EOFError, zlib.error) as exc:
        yield line_no + 1, None, unreadable_detail(exc)


#: What ``bytes.strip()`` removes: a line of only these is blank (not a record).
_ASCII_SPACE = " \t\n\r\x0b\x0c"


def scan_lines(file: LandingFile, batch_id: int | None = None) -> tuple[Any, list[RawRecord]]:
    """The non-blank lines of a micro-batch's range of a landing file, as columns.

    The same lines, numbers and checks as :func:`read_records` (``[file.start, file.size)``,
    fingerprint, gzip tails), read without a Python step per line: the file's bytes are decoded
    once and split by Polars.

    Args:
        file: the file and range, as recorded in the batch's offsets.
        batch_id: the micro-batch, named in the error.

    Returns:
        (a Polars frame of ``source_line`` int64 and ``line`` string, one row per non-blank line
        in file order; the records that are not valid UTF-8 text, or the unreadable rest of a
        corrupt gzip file, as :class:`RawRecord` — those lines are not in the frame). A file
        that is not valid UTF-8 as a whole is returned as records only.

    Raises:
        LandingFileChangedError: as :func:`read_records`.
    """
    import polars as pl

    digest = hashlib.sha256()
    skipped = 0  # lines before ``file.start`` (a plain file's range may start inside it)
    try:
        with open(file.path, "rb") as handle:
            start = 0 if file.is_gzip else file.start
            done = 0
            while done < start:  # the prefix is hashed and its lines counted, not kept
                block = handle.read(min(_BLOCK, start - done))
                if not block:
                    break
                digest.update(block)
                skipped += block.count(b"\n")
                done += len(block)
            content = handle.read(file.size - done) if done == start else b""
    except OSError as exc:
        raise _unopenable(file, batch_id, exc) from None
    digest.update(content)
    _check(file, batch_id, done + len(content), digest.hexdigest())
    empty = pl.DataFrame(schema={"source_line": pl.Int64, "line": pl.String})
    if file.is_gzip:
        try:
            content = gzip.decompress(content)
        except (OSError, EOFError, zlib.error):
            return empty, [
                RawRecord(file.path, n, d, e) for n, d, e in content_lines(file.path, content)
            ]
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        records = [
            RawRecord(file.path, n + skipped, d, e) for n, d, e in content_lines("", content)
        ]
        return empty, records
    lines = pl.DataFrame({"line": pl.Series([text]).str.split("\n").explode()})
    lines = lines.with_row_index("source_line", offset=1 + skipped).with_columns(
        pl.col("source_line").cast(pl.Int64)
    )
    lines = lines.with_columns(pl.col("line").str.strip_chars_end("\r")).filter(
        pl.col("line").str.strip_chars(_ASCII_SPACE) != ""
    )
    return lines, []


def cut_landing(
    files: list[LandingFile], max_records: int | None, max_bytes: int | None
) -> list[LandingFile]:
    """Bound a micro-batch by records (lines) and bytes as well as files.

    Files are taken in order while the batch is under both limits; the file that would pass a
    limit is cut at a line boundary (its range ends after the last whole line within the
    limit, ``cut`` set, fingerprint of the bytes up to there) and the next micro-batch
    continues it (``continued``). A batch always takes at least one line. A gzip file cannot be
    cut (its byte offsets are not line offsets): it is taken whole, or left for the next batch
    when the batch already holds something.

    Args:
        files: the planned files, in landing order (each with its range).
        max_records: at most this many lines (blank lines count), or None.
        max_bytes: at most this many bytes of the files' ranges, or None.

    Returns:
        The files of the batch (a prefix of ``files``, the last one possibly cut).
    """
    if max_records is None and max_bytes is None:
        return files
    taken: list[LandingFile] = []
    records = size = 0
    for file in files:
        if file.is_gzip:
            if taken and max_bytes is not None and size + file.size > max_bytes:
                break
            taken.append(file)
            size += file.size - file.start
            if max_bytes is not None and size >= max_bytes:
                break
            continue
        end, lines = _cut_point(
            file,
            None if max_records is None else max_records - records,
            None if max_bytes is None else max_bytes - size,
            at_least_one=not taken,
        )
        if end <= file.start:
            break
        if end < file.size:
            digest, _, _, _ = fingerprint(file.path, end)
            taken.append(replace(file, size=end, sha256=digest, cut=True))
            break
        taken.append(file)
        records += lines
        size += file.size - file.start
        if (max_records is not None and records >= max_records) or (
            max_bytes is not None and size >= max_bytes
        ):
            break
    return taken


def _cut_point(
    file: LandingFile, records: int | None, size: int | None, *, at_least_one: bool
) -> tuple[int, int]:
    """(end offset of the range within the budgets, lines up to there) of a plain file."""
    budget = file.size if size is None else min(file.size, file.start + max(size, 0))
    end, lines = file.start, 0
    with open(file.path, "rb") as handle:
        handle.seek(file.start)
        offset = file.start
        while offset < file.size:
            line = handle.readline(file.size - offset)
            if not line:
                break
            nxt = offset + len(line)
            over = nxt > budget or (records is not None and lines + 1 > records)
            if over and not (at_least_one and lines == 0):
                break
            end, lines, offset = nxt, lines + 1, nxt
            if not line.endswith(b"\n"):  # the file's last line, without a terminator
                break
    return end, lines
