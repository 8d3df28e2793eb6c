"""Connections to Snowflake, or to the fakesnow emulator's local HTTP server.

Without credentials (see :mod:`cdcflow.sinks.snowflake.settings`) the real
``snowflake-connector-python`` talks over HTTP to a fakesnow server started inside this process
(one per process, on a free port of 127.0.0.1). Its database files live in
``snowflake.emulator_path`` (default ``<storage.root>/_snowflake_emulator``) so that separate
commands (``cdcflow sync snowflake``, reconcile) see the same tables; ``:memory:`` keeps them in
memory for the process's lifetime. Only one process at a time can hold a file-backed emulator.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdcflow.config import CdcflowConfig
from cdcflow.errors import CdcflowError, ConfigError, MissingDependencyError
from cdcflow.logs import get_logger
from cdcflow.sinks.snowflake.settings import SnowflakeCredentials

log = get_logger("snowflake")

MEMORY = ":memory:"
_INSTALL_HINT = (
    "Snowflake support needs the 'snowflake' extra: uv sync --extra snowflake "
    "(or pip install 'cdcflow[snowflake]')"
)


def import_connector() -> Any:
    """The ``snowflake.connector`` module.

    Raises:
        MissingDependencyError: the ``snowflake`` extra is not installed.
    """
    try:
        import snowflake.connector
    except ImportError as exc:
        raise MissingDependencyError(_INSTALL_HINT) from exc
    return snowflake.connector


@dataclass
class _Emulator:
    db_path: str
    port: int
    server: Any
    thread: threading.Thread

    def kwargs(self) -> dict[str, Any]:
        return {
            "user": "fake",
            "password": "snow",
            "account": "fakesnow",
            "host": "127.0.0.1",
            "port": self.port,
            "protocol": "http",
            "session_parameters": {"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False},
            "network_timeout": 5,
            "login_timeout": 10,
        }


_emulator: _Emulator | None = None
_lock = threading.Lock()


def start_emulator(db_path: str = MEMORY) -> dict[str, Any]:
    """Start (once per process) the fakesnow HTTP server; return connector keyword arguments.

    Args:
        db_path: folder of the emulator's database files, or ``:memory:``.

    Raises:
        MissingDependencyError: fakesnow (the ``snowflake`` extra) is not installed.
        CdcflowError: an emulator with another ``db_path`` already runs in this process, or the
            server did not start.
    """
    global _emulator
    with _lock:
        if _emulator is not None:
            if _emulator.db_path != db_path:
                raise CdcflowError(
                    f"a Snowflake emulator on {_emulator.db_path!r} already runs in this process"
                )
            return _emulator.kwargs()
        try:
            import uvicorn
            from fakesnow.instance import FakeSnow

            # the module, not the ``fakesnow.server`` context manager of the package
            fs_server = importlib.import_module("fakesnow.server")
            fs_stage = importlib.import_module("fakesnow.transforms.stage")
        except ImportError as exc:
            raise MissingDependencyError(_INSTALL_HINT) from exc
        # the folder fakesnow makes for its stages' files when imported (/tmp/fakesnow_bucket_*,
        # one per process, never removed by fakesnow): removed when this process ends
        if not _stage_folders:
            atexit.register(remove_stage_folders)
        _stage_folders.add(fs_stage.LOCAL_BUCKET_PATH)
        import logging

        logging.getLogger("fakesnow.server").setLevel(logging.WARNING)
        # the emulator's SQL parser announcing that it passes a statement through (REMOVE @stage)
        logging.getLogger("sqlglot").setLevel(logging.ERROR)
        # fakesnow's advice to its own callers (it copies rows to Arrow for the connector's
        # fetch_arrow_all): not something a cdcflow user can act on
        warnings.filterwarnings(
            "ignore", message="Arrow output on a DB-API result", category=UserWarning
        )
        if db_path != MEMORY:
            Path(db_path).mkdir(parents=True, exist_ok=True)
            # every session of the server shares this one instance (the module's default is an
            # in-memory one); a per-session FAKESNOW_DB_PATH cannot open one file twice
            setattr(fs_server, "shared_fs", FakeSnow(db_path=db_path))  # noqa: B010
        with contextlib.closing(socket.socket(type=socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(fs_server.app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, name="fakesnow-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while thread.is_alive() and not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        if not server.started:
            raise CdcflowError("the fakesnow emulator server did not start")
        _emulator = _Emulator(db_path, port, server, thread)
        log.info("snowflake emulator started", extra={"port": port, "in_memory": db_path == MEMORY})
        return _emulator.kwargs()


#: The emulator's stage folders of this process (:func:`remove_stage_folders`).
_stage_folders: set[str] = set()


def remove_stage_folders() -> None:
    """Remove the folders where this process's emulator kept its stages' files.

    Registered with :mod:`atexit` when the emulator starts; the ``cdcflow`` command, which
    leaves with ``os._exit`` (no exit handlers), calls it itself. Nothing is lost: fakesnow
    makes a new, empty folder in each process.
    """
    while _stage_folders:
        shutil.rmtree(_stage_folders.pop(), ignore_errors=True)


def stop_emulator() -> None:
    """Stop the process's emulator server, if any (its in-memory tables are lost)."""
    global _emulator
    with _lock:
        if _emulator is None:
            return
        _emulator.server.should_exit = True
        _emulator.thread.join(timeout=10)
        _emulator = None


def uses_emulator(config: CdcflowConfig) -> bool:
    """Whether ``config`` connects to the emulator (no ``SNOWFLAKE_ACCOUNT`` or forced on)."""
    mode = config.snowflake.emulator
    if mode == "on":
        return True
    if mode == "off":
        return False
    return SnowflakeCredentials.from_env() is None


def emulator_path(config: CdcflowConfig) -> str:
    """Folder of the emulator's database files for ``config`` (or ``:memory:``).

    Raises:
        ConfigError: the folder has a ``?`` in its path, which the emulator's DuckDB cannot
            open (it names ``snowflake.emulator_path``, the way out).
    """
    path = config.snowflake.emulator_path
    if path == MEMORY:
        return MEMORY
    root = config.storage.root
    if not path and "://" in root:
        return MEMORY
    folder = str(Path(path).resolve() if path else Path(root).resolve() / "_snowflake_emulator")
    if "?" in folder:
        raise ConfigError(
            f"snowflake.emulator_path: the emulator cannot open database files under {folder} "
            "(a '?' in the path): set snowflake.emulator_path to a folder without '?'"
        )
    return folder


@dataclass(frozen=True)
class Target:
    """Where the tables go: database, schema, and whether it is the emulator."""

    database: str
    schema: str
    emulator: bool

    def qualify(self, table: str) -> str:
        """``DATABASE.SCHEMA.TABLE``."""
        return f"{self.database}.{self.schema}.{table}"


def target_of(config: CdcflowConfig) -> Target:
    """Database and schema of ``config`` (``SNOWFLAKE_DATABASE``/``SNOWFLAKE_SCHEMA`` win)."""
    emulator = uses_emulator(config)
    creds = None if emulator else SnowflakeCredentials.from_env()
    database = (creds.database if creds else None) or config.snowflake.database
    schema = (creds.schema if creds else None) or config.snowflake.schema_name
    return Target(database.upper(), schema.upper(), emulator)


@contextlib.contextmanager
def connect(config: CdcflowConfig, autocommit: bool = True) -> Iterator[Any]:
    """Open a connection to the configured database and schema; closed on exit.

    Args:
        config: the pipeline configuration.
        autocommit: False for a transaction committed explicitly with ``commit()``.

    Yields:
        A ``snowflake.connector`` connection.

    Raises:
        MissingDependencyError: the ``snowflake`` extra is not installed.
        ConfigError: incomplete credentials.
        CdcflowError: the connection failed (the message names no secret).
    """
    connector = import_connector()
    target = target_of(config)
    if target.emulator:
        kwargs = start_emulator(emulator_path(config))
    else:
        creds = SnowflakeCredentials.from_env()
        if creds is None:
            raise ConfigError("snowflake.emulator is off but SNOWFLAKE_ACCOUNT is not set")
        kwargs = creds.connect_kwargs()
    try:
        conn = connector.connect(
            **kwargs, database=target.database, schema=target.schema, autocommit=autocommit
        )
    except connector.errors.Error as exc:
        raise CdcflowError(
            f"cannot connect to Snowflake ({type(exc).__name__} {getattr(exc, 'errno', '')})"
        ) from None
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()
