"""Where the checkpoint's files live: a local folder or an object store (S3, Azure, GCS).

One small interface, :class:`CheckpointStorage`, with two implementations:

* :class:`LocalStorage` — a folder: a file is replaced atomically (temporary file, ``fsync``,
  ``rename``) and created only when absent with a hard link (``link(2)`` fails when the name
  exists); the run lock is an ``flock`` (:meth:`cdcflow.state.checkpoint.Checkpoint.lock`).
* :class:`ObjectStorage` — a prefix in an object store, through ``obstore`` (the Rust
  ``object_store`` crate delta-rs itself uses, so the tables and the checkpoint reach the store
  with the same client, endpoints and credentials). An object store has no rename and no lock,
  so a file is created with a **conditional put** (``If-None-Match: *`` on S3 and Azure,
  ``ifGenerationMatch=0`` on GCS): of two runs writing the offsets or the commit marker of the
  same micro-batch exactly one succeeds. The run lock becomes a **lease** (:class:`Lease`): an
  object naming its owner and an expiry, taken and renewed with conditional puts on its ETag
  (``If-Match``).

Credentials and endpoints come from ``storage.options`` (the keys delta-rs takes, e.g.
``AWS_ENDPOINT_URL``, ``AZURE_STORAGE_ACCOUNT_NAME``) and from the environment (``AWS_*``,
``AZURE_*``, ``GOOGLE_*``); they are never logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from cdcflow.errors import CheckpointError, ConfigError
from cdcflow.logs import get_logger

log = get_logger("state.storage")

#: schemes of the object stores a checkpoint (and ``storage.root``) may name
OBJECT_SCHEMES = ("s3", "s3a", "az", "abfs", "abfss", "adl", "azure", "gs", "gcs")


def write_temp(path: Path, data: bytes) -> Path:
    """Write ``data`` to a hidden temporary name beside ``path`` (``.<name>.tmp``: no listing
    of ``*.json`` or landing files picks it up) and ``fsync`` it; returns the temporary path."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return tmp


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: :func:`write_temp`, then rename. The one
    atomic local write of the checkpoint, the sources' state files and staged files."""
    os.replace(write_temp(path, data), path)


def is_object_uri(location: str) -> bool:
    """True when ``location`` names an object store (``s3://``, ``abfss://``, ``az://``,
    ``gs://``…), False for a local path (or a ``file://`` URI)."""
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.lower() in OBJECT_SCHEMES


class CheckpointStorage(Protocol):
    """The operations the checkpoint needs (names are ``/``-separated, relative to the
    checkpoint's location)."""

    location: str

    def read(self, name: str) -> bytes | None:
        """The content of ``name``, or None when it does not exist."""
        ...

    def exists(self, name: str) -> bool:
        """True when ``name`` exists."""
        ...

    def ids(self, folder: str) -> list[int]:
        """The sorted numbers ``N`` of the files ``<folder>/N.json``."""
        ...

    def replace(self, name: str, payload: bytes) -> None:
        """Write ``name`` whole (readers see the old or the new content, never a part)."""
        ...

    def create(self, name: str, payload: bytes) -> bool:
        """Write ``name`` only if it does not exist (atomically): True when written, False
        when it already existed (its content is left as it was)."""
        ...

    def names(self, folder: str = "") -> list[str]:
        """Names of the objects directly under ``folder`` (relative to it), sorted."""
        ...

    def delete(self, name: str) -> None:
        """Delete ``name`` (nothing when it does not exist)."""
        ...


class LocalStorage:
    """A checkpoint folder on the local file system."""

    def __init__(self, location: str | Path) -> None:
        self.root = Path(location)
        self.location = str(location)

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def ids(self, folder: str) -> list[int]:
        path = self.root / folder
        if not path.is_dir():
            return []
        return sorted(int(p.stem) for p in path.glob("*.json") if p.stem.isdigit())

    def replace(self, name: str, payload: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, payload)

    def names(self, folder: str = "") -> list[str]:
        path = self.root / folder
        if not path.is_dir():
            return []
        return sorted(p.name for p in path.iterdir() if p.is_file())

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def create(self, name: str, payload: bytes) -> bool:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = write_temp(path, payload)
        try:
            os.link(tmp, path)  # fails when the name exists: put-if-absent
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True


def _store_options(options: dict[str, str] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """Split delta-rs style storage options into obstore's store config and client options
    (``AWS_ALLOW_HTTP`` / ``AZURE_ALLOW_HTTP`` / ``ALLOW_HTTP`` → ``allow_http``)."""
    config: dict[str, str] = {}
    client: dict[str, Any] = {}
    for key, value in (options or {}).items():
        lower = key.lower()
        if lower.endswith("allow_http"):
            client["allow_http"] = str(value).lower() in ("1", "true", "yes")
        elif lower.endswith("allow_invalid_certificates"):
            client["allow_invalid_certificates"] = str(value).lower() in ("1", "true", "yes")
        else:
            config[lower] = value
    for name in ("AWS_ALLOW_HTTP", "AZURE_ALLOW_HTTP", "ALLOW_HTTP"):
        if "allow_http" not in client and os.environ.get(name, "").lower() in ("1", "true"):
            client["allow_http"] = True
    return config, client


class ObjectStorage:
    """A checkpoint under an object-store prefix (``s3://bucket/path``, ``az://container/path``,
    ``abfss://container@account.dfs.core.windows.net/path``, ``gs://bucket/path``).

    Raises:
        ConfigError: the URI or its options cannot make a store (names ``checkpoint.location``).
    """

    def __init__(self, location: str, options: dict[str, str] | None = None) -> None:
        import obstore
        from obstore.store import from_url

        self.location = location.rstrip("/")
        self._obstore = obstore
        config, client = _store_options(options)
        try:
            # the config's keys depend on the store the URI names
            self.store = from_url(  # type: ignore[call-overload]
                self.location, config=config or None, client_options=client
            )
        except Exception as exc:  # obstore raises its own error types (and ValueError)
            raise ConfigError(
                f"checkpoint.location: cannot open object store {self.location} "
                f"({type(exc).__name__})"
            ) from exc

    def _errors(self) -> tuple[type[BaseException], ...]:
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        return NotFoundError, AlreadyExistsError, PreconditionError

    def read(self, name: str) -> bytes | None:
        not_found, _, _ = self._errors()
        try:
            return bytes(self._obstore.get(self.store, name).bytes())
        except (not_found, FileNotFoundError):
            return None

    def read_tagged(self, name: str) -> tuple[bytes, str] | None:
        """(content, ETag) of ``name``, or None when it does not exist."""
        not_found, _, _ = self._errors()
        try:
            result = self._obstore.get(self.store, name)
        except (not_found, FileNotFoundError):
            return None
        return bytes(result.bytes()), str(result.meta["e_tag"])

    def exists(self, name: str) -> bool:
        not_found, _, _ = self._errors()
        try:
            self._obstore.head(self.store, name)
        except (not_found, FileNotFoundError):
            return False
        return True

    def ids(self, folder: str) -> list[int]:
        found = []
        prefix = f"{folder}/"
        for chunk in self._obstore.list(self.store, prefix=prefix):
            for meta in chunk:
                stem = meta["path"][len(prefix) :]
                # the folder's own objects only (as a local folder's), not a subfolder's
                if "/" not in stem and stem.endswith(".json") and stem[:-5].isdigit():
                    found.append(int(stem[:-5]))
        return sorted(found)

    def replace(self, name: str, payload: bytes) -> None:
        self._obstore.put(self.store, name, payload)

    def names(self, folder: str = "") -> list[str]:
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else None
        found = []
        for chunk in self._obstore.list(self.store, prefix=prefix):
            for meta in chunk:
                rest = meta["path"][len(prefix or "") :]
                if "/" not in rest:
                    found.append(rest)
        return sorted(found)

    def delete(self, name: str) -> None:
        not_found, _, _ = self._errors()
        with contextlib.suppress(not_found, FileNotFoundError):
            self._obstore.delete(self.store, name)

    def create(self, name: str, payload: bytes) -> bool:
        _, exists, precondition = self._errors()
        try:
            self._obstore.put(self.store, name, payload, mode="create")
        except (exists, precondition):
            return False
        return True

    def swap(self, name: str, payload: bytes, e_tag: str | None) -> str | None:
        """Write ``name`` when its ETag is still ``e_tag`` (None: when it does not exist).

        Returns:
            The new ETag, or None when another writer changed (or created) it first.
        """
        _, exists, precondition = self._errors()
        mode: Any = "create" if e_tag is None else {"e_tag": e_tag}
        try:
            result = self._obstore.put(self.store, name, payload, mode=mode)
        except (exists, precondition):
            return None
        return str(result["e_tag"])


def open_storage(location: str, options: dict[str, str] | None = None) -> CheckpointStorage:
    """The storage of a checkpoint: :class:`ObjectStorage` for an object-store URI, else
    :class:`LocalStorage`."""
    if is_object_uri(location):
        return ObjectStorage(location, options)
    return LocalStorage(location)


@dataclass
class LeaseHolder:
    """What a lease object says (``lock`` under the checkpoint's location).

    Attributes:
        owner: a random id of the holding run (a UUID).
        pid: its process id.
        host: its host name.
        since: when it took the lease (UTC, ISO 8601).
        expires_at: when the lease ends unless renewed (UTC, ISO 8601).
    """

    owner: str
    pid: int
    host: str
    since: str
    expires_at: str

    def describe(self) -> str:
        """``pid N on HOST since TIME`` (the local lock's wording)."""
        return f"pid {self.pid} on {self.host} since {self.since}"

    def expired(self, now: datetime) -> bool:
        """True when the lease ended before ``now``."""
        return datetime.fromisoformat(self.expires_at) <= now


def read_lease(payload: bytes | None) -> LeaseHolder | None:
    """The holder a lease object names, or None (no object, released, or unreadable: not JSON,
    a field missing, an expiry that is no ISO-8601 instant with an offset)."""
    if not payload:
        return None
    try:
        data = json.loads(payload)
        holder = LeaseHolder(
            owner=str(data["owner"]),
            pid=int(data["pid"]),
            host=str(data["host"]),
            since=str(data["since"]),
            expires_at=str(data["expires_at"]),
        )
        if datetime.fromisoformat(holder.expires_at).tzinfo is None:
            return None  # cdcflow writes UTC instants: not a lease of a cdcflow run
        return holder
    except (ValueError, KeyError, TypeError):
        return None


class Lease:
    """The run lock on an object store: a lease object with an owner and an expiry.

    Taken when the object is missing, released, or expired (a killed run's lease ends after
    ``ttl``), with a conditional put on the ETag read, so two runs racing for it cannot both
    win. A background thread renews it every ``ttl / 3``; when a renewal finds another owner
    (this run was stalled past its expiry and another took over) the lease is **lost**; when
    renewals fail (the store refuses or does not answer) it is kept while it is valid — until
    ``ttl`` after the last successful write, by this process's monotonic clock, less a safety
    margin of ``ttl / 6`` — and lost after. A lost or expired lease makes :meth:`check` raise,
    and the checkpoint refuses to write offsets, state or a commit marker. Other runs judge
    expiry by the lease object's ``expires_at`` and their own clock: hosts sharing a checkpoint
    need clocks within the margin of each other (NTP).

    Args:
        storage: the checkpoint's object storage.
        ttl: how long a lease lasts without renewal.
        name: the lease object's name.
    """

    def __init__(self, storage: ObjectStorage, ttl: timedelta, name: str = "lock") -> None:
        self.storage = storage
        self.ttl = ttl
        self.name = name
        self.owner = uuid.uuid4().hex
        self.since = datetime.now(UTC).isoformat(timespec="seconds")
        self._e_tag: str | None = None
        self._lost = False
        #: monotonic time until which this run holds the lease for certain
        self._valid_until = 0.0
        self._margin = ttl.total_seconds() / 6
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _payload(self, now: datetime) -> bytes:
        return json.dumps(
            {
                "owner": self.owner,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": self.since,
                "expires_at": (now + self.ttl).isoformat(),
            }
        ).encode()

    def acquire(self) -> None:
        """Take the lease.

        Raises:
            CheckpointError: a live lease of another run holds it (the message names it).
        """
        now = datetime.now(UTC)
        started = time.monotonic()
        current = self.storage.read_tagged(self.name)
        if current is not None:
            holder = read_lease(current[0])
            if holder is not None and not holder.expired(now):
                raise CheckpointError(
                    f"{self.storage.location}: another cdcflow run holds this checkpoint's "
                    f"lease ({holder.describe()}, until {holder.expires_at})"
                )
        e_tag = self.storage.swap(
            self.name, self._payload(now), None if current is None else current[1]
        )
        if e_tag is None:
            raise CheckpointError(
                f"{self.storage.location}: another cdcflow run took this checkpoint's lease "
                "at the same moment"
            )
        self._e_tag = e_tag
        self._valid_until = started + self.ttl.total_seconds()
        self._thread = threading.Thread(target=self._renew_loop, name="cdcflow-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl.total_seconds() / 3):
            self.renew()

    def renew(self) -> None:
        """Extend the lease by ``ttl``. Marks it lost when another run owns it now, or when
        the store fails and the lease's validity has run out (a failure before that is
        logged and retried at the next renewal). Never raises."""
        with self._guard:
            if self._lost or self._e_tag is None:
                return
            started = time.monotonic()
            try:
                e_tag = self.storage.swap(self.name, self._payload(datetime.now(UTC)), self._e_tag)
            except Exception as exc:  # the store refused or failed: keep it while valid
                log.warning(
                    "checkpoint lease not renewed",
                    extra={"error": type(exc).__name__, "location": self.storage.location},
                )
                if time.monotonic() >= self._valid_until - self._margin:
                    self._lost = True
                return
            if e_tag is None:
                self._lost = True
            else:
                self._e_tag = e_tag
                self._valid_until = started + self.ttl.total_seconds()

    def check(self) -> None:
        """Raise when the lease is lost or has expired without renewal.

        Raises:
            CheckpointError: this run no longer holds the lease.
        """
        if self._lost:
            raise CheckpointError(
                f"{self.storage.location}: this run lost the checkpoint's lease (another run "
                "took it, or renewing it failed until it expired); it stops without committing"
            )
        if self._e_tag is not None and time.monotonic() >= self._valid_until - self._margin:
            raise CheckpointError(
                f"{self.storage.location}: this run's checkpoint lease expired without renewal "
                "(the process was stalled or the store did not answer); it stops without "
                "committing"
            )

    def release(self) -> None:
        """Stop renewing and end the lease (an empty object), unless another run owns it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._guard:
            if not self._lost and self._e_tag is not None:
                try:
                    self.storage.swap(self.name, b"", self._e_tag)
                except Exception as exc:  # it then ends by expiry
                    log.warning(
                        "checkpoint lease not released (it expires by itself)",
                        extra={"error": type(exc).__name__, "location": self.storage.location},
                    )
            self._e_tag = None


__all__ = [
    "OBJECT_SCHEMES",
    "CheckpointStorage",
    "Lease",
    "LeaseHolder",
    "LocalStorage",
    "ObjectStorage",
    "is_object_uri",
    "open_storage",
    "read_lease",
    "write_bytes_atomic",
    "write_temp",
]
