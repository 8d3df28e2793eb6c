"""PostgreSQL source: stage a logical replication slot's changes as landing files.

``source.type: postgres`` reuses the whole file pipeline. Before each micro-batch is planned,
:meth:`PostgresSource.stage` *peeks* (never gets) up to ``max_changes_per_batch`` decoded rows
(whole transactions) from the slot with ``pg_logical_slot_peek_changes`` (wal2json
format-version 2), converts every row change of the configured table into a canonical flat event
(:mod:`cdcflow.sources.postgres_decode`) and writes them atomically (temporary name + rename) to
one landing file named by its LSN range, ``pg_<start>_<end>.jsonl`` (16 hex digits each).

The slot is the offset store. Its confirmed position advances
(``pg_replication_slot_advance``) in :meth:`PostgresSource.acknowledge`, called only after the
micro-batch holding the staged file has its commit marker. A small state file next to the
checkpoint, ``<checkpoint.location>/postgres_source.json``, remembers which staged file covers
which LSN range and whether the slot was advanced past it:

* a staged file not yet committed is not staged again — the pipeline lists and processes it;
* a staged file whose batch is committed but whose acknowledgement was lost (crash between the
  commit marker and the advance) is acknowledged on the next :meth:`stage`;
* if a crash loses the state entry of a file, the same changes are re-peeked from the slot's
  confirmed position and re-staged under the same name with the same content: identical events
  are exact duplicates (same event_id, same content), which the pipeline classifies as
  ``DUPLICATE``. Nothing is lost (the slot never moves past uncommitted events) and nothing is
  applied twice.

The password is never logged nor stored: it comes from the environment variable named by
``source.postgres.password_env``, the file ``source.postgres.password_file``, or libpq's own
``PGPASSWORD``/``.pgpass``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.errors import CdcflowError, ConfigError, MissingDependencyError
from cdcflow.logs import get_logger
from cdcflow.model.lsn import format_pg_lsn, parse_lsn
from cdcflow.sources.postgres_decode import DecodedRange, decode_rows
from cdcflow.state.storage import open_storage, write_bytes_atomic

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig, PostgresSourceSection
    from cdcflow.state.checkpoint import BatchOffsets, Checkpoint

log = get_logger("sources.postgres")

STATE_FILE = "postgres_source.json"
INSTALL_HINT = "the PostgreSQL source needs psycopg 3: pip install 'cdcflow[postgres]'"


class PostgresSourceError(CdcflowError):
    """The PostgreSQL source cannot connect, read its slot or advance it."""


def require_psycopg() -> Any:
    """The ``psycopg`` module.

    Raises:
        MissingDependencyError: psycopg 3 is not installed (the message says how to install it).
    """
    try:
        import psycopg
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return psycopg


def _password(settings: PostgresSourceSection) -> str | None:
    if settings.password_file:
        try:
            return Path(settings.password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"source.postgres.password_file: cannot read {settings.password_file} "
                f"({exc.strerror})"
            ) from exc
    if settings.password_env and settings.password_env in os.environ:
        return os.environ[settings.password_env]
    return None


def describe(settings: PostgresSourceSection) -> str:
    """Where the source connects, for messages and logs (no password, no DSN text)."""
    if settings.dsn:
        return "the configured dsn"
    return f"{settings.host}:{settings.port}/{settings.dbname} as {settings.user}"


def connect(settings: PostgresSourceSection, autocommit: bool = True) -> Any:
    """Open a psycopg connection from the ``source.postgres`` settings.

    Raises:
        MissingDependencyError: psycopg is not installed.
        PostgresSourceError: the server cannot be reached or refuses the login.
    """
    psycopg = require_psycopg()
    kwargs: dict[str, Any] = {"autocommit": autocommit, "connect_timeout": 10}
    if not settings.dsn:
        kwargs.update(
            host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user
        )
    password = _password(settings)
    if password is not None:
        kwargs["password"] = password
    try:
        return psycopg.connect(settings.dsn, **kwargs)
    except psycopg.Error as exc:
        # the message of libpq never contains the password
        raise PostgresSourceError(
            f"cannot connect to PostgreSQL at {describe(settings)}: {str(exc).strip()}"
        ) from None


@contextmanager
def connection(settings: PostgresSourceSection) -> Iterator[Any]:
    """A connection (autocommit) closed on exit."""
    conn = connect(settings)
    try:
        yield conn
    finally:
        conn.close()


def wal2json_options(table: str) -> list[str]:
    """Options of ``pg_logical_slot_peek_changes`` for wal2json format-version 2.

    Args:
        table: the ``add-tables`` filter: ``schema.table`` (a bare name: ``public.<name>``), or
            a comma-separated list of them (wal2json's syntax; ``*.name``: that table in any
            schema).
    """
    qualified = table if "." in table else f"public.{table}"
    return [
        "format-version",
        "2",
        "include-xids",
        "1",
        "include-timestamp",
        "1",
        "include-lsn",
        "1",
        "add-tables",
        qualified,
    ]


def ensure_slot(conn: Any, settings: PostgresSourceSection) -> int:
    """Create the logical replication slot if missing; return its confirmed position (numeric).

    Raises:
        PostgresSourceError: the slot exists with another plugin, or cannot be created.
    """
    row = conn.execute(
        "SELECT plugin, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (settings.slot_name,),
    ).fetchone()
    if row is None:
        try:
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, %s)",
                (settings.slot_name, settings.plugin),
            )
        except Exception as exc:
            raise PostgresSourceError(
                f"cannot create replication slot {settings.slot_name!r} "
                f"(wal_level=logical and the {settings.plugin} plugin are required): "
                f"{str(exc).strip()}"
            ) from None
        log.info("replication slot created", extra={"slot": settings.slot_name})
        return confirmed_lsn(conn, settings.slot_name)
    plugin, confirmed = row
    if plugin != settings.plugin:
        raise PostgresSourceError(
            f"replication slot {settings.slot_name!r} uses plugin {plugin!r}, "
            f"expected {settings.plugin!r}"
        )
    return parse_lsn(confirmed)


def check_tables(
    conn: Any, settings: PostgresSourceSection, tables: dict[str, tuple[str, ...]]
) -> None:
    """Refuse declared tables the slot cannot stream exactly.

    Each declared table must exist in ``settings.schema_name`` (``*``: in exactly one
    schema), and its replica identity must carry its key: a primary key under ``REPLICA
    IDENTITY DEFAULT``, or ``FULL`` / ``USING INDEX`` — without one, PostgreSQL writes an UPDATE's
    or DELETE's old row without its key, and wal2json sends no key for it.

    Raises:
        PostgresSourceError: a table is missing, in several schemas, or without identity.
    """
    schema = settings.schema_name
    rows = conn.execute(
        "SELECT n.nspname, c.relname, c.relreplident, EXISTS (SELECT 1 FROM pg_index i "
        "WHERE i.indrelid = c.oid AND i.indisprimary) FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND c.relname = ANY(%s) "
        "AND (%s = '*' OR n.nspname = %s)",
        (list(tables), schema, schema),
    ).fetchall()
    found: dict[str, list[tuple[str, str, bool]]] = {}
    for nspname, relname, identity, has_pk in rows:
        found.setdefault(relname, []).append((nspname, identity, has_pk))
    for name in tables:
        where = found.get(name, [])
        if not where:
            raise PostgresSourceError(
                f"source.postgres: declared table {name} does not exist in schema {schema} of "
                "the source database (a contract's name is its PostgreSQL table's name)"
            )
        if len(where) > 1:
            schemas = ", ".join(sorted(w[0] for w in where))
            raise PostgresSourceError(
                f"source.postgres: declared table {name} exists in several schemas ({schemas}): "
                "set source.postgres.schema_name to one of them"
            )
        nspname, identity, has_pk = where[0]
        if identity == "n" or (identity == "d" and not has_pk):
            raise PostgresSourceError(
                f"source.postgres: table {nspname}.{name} has no replica identity for its key "
                "(no primary key under REPLICA IDENTITY DEFAULT): its UPDATEs and DELETEs would "
                f"reach cdcflow without a key; add a primary key or run ALTER TABLE "
                f"{nspname}.{name} REPLICA IDENTITY FULL"
            )


def confirmed_lsn(conn: Any, slot_name: str) -> int:
    """The slot's confirmed position (``confirmed_flush_lsn``), numeric.

    Raises:
        PostgresSourceError: no such slot.
    """
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (slot_name,),
    ).fetchone()
    if row is None or row[0] is None:
        raise PostgresSourceError(f"replication slot {slot_name!r} does not exist")
    return parse_lsn(row[0])


def peek(
    conn: Any,
    settings: PostgresSourceSection,
    max_changes: int,
    tables: dict[str, tuple[str, ...]] | None = None,
) -> DecodedRange:
    """Peek up to ``max_changes`` decoded rows (whole transactions) and decode them.

    Args:
        conn: an open connection.
        settings: the source's settings (slot; ``table`` and ``key_column`` for customers).
        max_changes: upper bound on decoded rows (whole transactions are kept).
        tables: declared tables: PostgreSQL table name → key columns; the slot's changes of
            each such table (in ``settings.schema_name``) are decoded instead of
            ``settings.table``'s.
    """
    schema = settings.schema_name
    filter_ = settings.table if tables is None else ",".join(f"{schema}.{t}" for t in tables)
    options = wal2json_options(filter_)
    placeholders = ", ".join(["%s"] * len(options))
    rows = conn.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, %s, {placeholders})",
        (settings.slot_name, max_changes, *options),
    ).fetchall()
    return decode_rows(rows, key_column=settings.key_column, tables=tables)


def advance(conn: Any, slot_name: str, target: int) -> int:
    """Advance the slot's confirmed position to ``target`` unless it is already there.

    Returns:
        The confirmed position afterwards (numeric).
    """
    current = confirmed_lsn(conn, slot_name)
    if target <= current:
        return current
    conn.execute(
        "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot_name, format_pg_lsn(target))
    )
    return confirmed_lsn(conn, slot_name)


@dataclass(frozen=True)
class StagedFile:
    """One landing file staged from the slot.

    Attributes:
        path: absolute path of the landing file.
        start_lsn: first decoded row's LSN (numeric).
        end_lsn: end of the last commit record covered (numeric): the slot's target.
        events: number of events in the file.
        acknowledged: True once the slot was advanced to ``end_lsn``.
    """

    path: str
    start_lsn: int
    end_lsn: int
    events: int
    acknowledged: bool = False

    def to_json(self) -> dict[str, Any]:
        """Serialisable form (LSNs in ``X/Y`` notation)."""
        return {
            "path": self.path,
            "start_lsn": format_pg_lsn(self.start_lsn),
            "end_lsn": format_pg_lsn(self.end_lsn),
            "events": self.events,
            "acknowledged": self.acknowledged,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StagedFile:
        """Inverse of :meth:`to_json`."""
        return cls(
            path=str(data["path"]),
            start_lsn=parse_lsn(data["start_lsn"]),
            end_lsn=parse_lsn(data["end_lsn"]),
            events=int(data["events"]),
            acknowledged=bool(data["acknowledged"]),
        )


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary name, fsync, then rename (both
    staging sources' state and staged files; :func:`cdcflow.state.storage.write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


class PostgresSource:
    """Stages a replication slot's changes into the landing folder; advances it on commit.

    Args:
        config: the pipeline configuration (``source.path`` = landing folder,
            ``source.postgres`` = connection, slot and table, ``checkpoint.location`` = where
            the state file lives).
    """

    def __init__(self, config: CdcflowConfig) -> None:
        self.settings = config.source.postgres
        self.landing = Path(config.source.path)
        #: the state file's store: the checkpoint's (a local folder or an object store)
        self.state = open_storage(config.checkpoint.location, config.storage.options)
        self.state_path = f"{config.checkpoint.location.rstrip('/')}/{STATE_FILE}"
        #: declared tables: PostgreSQL table (= the contract's name) → its key columns' source
        #: fields; None for the customers table (``source.postgres.table``)
        self.tables: dict[str, tuple[str, ...]] | None = None
        self._checked = False  # the declared tables checked at the source (check_tables)
        if config.tables:
            self.tables = {
                c.name: tuple(c.column(k).field for k in c.keys) for c in config.contracts()
            }

    # -- state file -------------------------------------------------------------------------
    def staged(self) -> list[StagedFile]:
        """The staged files recorded in the state file, oldest first."""
        try:
            raw = self.state.read(STATE_FILE)
            if raw is None:
                return []
            data = json.loads(raw.decode("utf-8"))
            return [StagedFile.from_json(f) for f in data["staged"]]
        except (OSError, ValueError, KeyError) as exc:
            raise PostgresSourceError(
                f"{self.state_path}: unreadable source state ({exc})"
            ) from exc

    def _save(self, staged: list[StagedFile]) -> None:
        payload = {"slot": self.settings.slot_name, "staged": [f.to_json() for f in staged]}
        self.state.replace(STATE_FILE, json.dumps(payload, indent=1).encode("utf-8"))

    def wal_behind(self) -> int:
        """Bytes of WAL the replication slot holds that the pipeline has not confirmed: from
        its ``confirmed_flush_lsn`` to the server's current WAL position (the usual slot lag,
        ``pg_wal_lsn_diff``; PostgreSQL docs, "pg_replication_slots"). Every change not yet
        committed to Silver is in it, and so is other WAL of the server written since.

        Raises:
            PostgresSourceError: the database cannot be reached, or the slot does not exist.
            MissingDependencyError: psycopg is not installed.
        """
        with connection(self.settings) as conn:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (self.settings.slot_name,),
            ).fetchone()
        if row is None or row[0] is None:
            raise PostgresSourceError(
                f"replication slot {self.settings.slot_name!r} does not exist (a first run "
                "creates it)"
            )
        return max(0, int(row[0]))

    # -- pipeline hooks ---------------------------------------------------------------------
    def stage(self, checkpoint: Checkpoint) -> StagedFile | None:
        """Stage the next changes of the slot as one landing file, if there is nothing pending.

        Staged files of committed batches that were not acknowledged yet (a crash after the
        commit marker) are acknowledged first. While a staged file is not committed, nothing new
        is staged (the pipeline processes that file first).

        Args:
            checkpoint: the pipeline's checkpoint (which files which batches took, and which
                batches are committed).

        Returns:
            The newly staged file, or None when nothing new was staged.

        Raises:
            PostgresSourceError: the database or slot cannot be read or advanced.
            MissingDependencyError: psycopg is not installed.
        """
        staged = self.staged()
        committed = committed_paths(checkpoint)
        with connection(self.settings) as conn:
            ensure_slot(conn, self.settings)
            if self.tables is not None and not self._checked:
                check_tables(conn, self.settings, self.tables)
                self._checked = True
            unacked = [f for f in staged if not f.acknowledged]
            if unacked:
                done = [f for f in unacked if f.path in committed]
                if done:
                    staged = self._acknowledge(conn, staged, {f.path for f in done})
                waiting = [f for f in unacked if f.path not in committed and Path(f.path).exists()]
                if waiting:
                    return None
                lost = {f.path for f in unacked if f.path not in committed} - {
                    f.path for f in waiting
                }
                if lost:  # a state entry without its file: re-peek those changes
                    staged = [f for f in staged if f.path not in lost]
                    self._save(staged)
            while True:
                decoded = peek(
                    conn, self.settings, self.settings.max_changes_per_batch, self.tables
                )
                if decoded.end_lsn is None or decoded.start_lsn is None:
                    return None
                name = f"pg_{decoded.start_lsn:016X}_{decoded.end_lsn:016X}.jsonl"
                path = (self.landing / name).resolve()
                if decoded.events and str(path) not in committed:
                    break
                # no change of the table in these transactions, or this very range is already
                # committed (its state entry was lost): nothing to stage, move the slot on
                advance(conn, self.settings.slot_name, decoded.end_lsn)
        self.landing.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in decoded.events)
        write_text_atomic(path, lines)
        entry = StagedFile(str(path), decoded.start_lsn, decoded.end_lsn, len(decoded.events))
        self._save([*[f for f in staged if f.path != entry.path], entry])
        if decoded.truncates:
            log.warning(
                "source TRUNCATE staged; it is quarantined, not applied",
                extra={
                    "table": ",".join(
                        sorted(
                            {
                                str(e["metadata"]["source_table"])
                                for e in decoded.events
                                if e["operation"] == "TRUNCATE"
                            }
                        )
                    ),
                    "truncates": decoded.truncates,
                },
            )
        log.info(
            "staged changes from replication slot",
            extra={
                "slot": self.settings.slot_name,
                "file": name,
                "events": entry.events,
                "transactions": decoded.transactions,
                "start_lsn": format_pg_lsn(entry.start_lsn),
                "end_lsn": format_pg_lsn(entry.end_lsn),
            },
        )
        return entry

    def acknowledge(self, offsets: BatchOffsets) -> None:
        """Advance the slot past the staged files of a committed micro-batch.

        Call only after the batch's commit marker is written.

        Raises:
            PostgresSourceError: the slot cannot be advanced.
        """
        paths = {f.path for f in offsets.files}
        staged = self.staged()
        if not any(f.path in paths and not f.acknowledged for f in staged):
            return
        with connection(self.settings) as conn:
            self._acknowledge(conn, staged, paths)

    def _acknowledge(
        self, conn: Any, staged: list[StagedFile], paths: set[str]
    ) -> list[StagedFile]:
        targets = [f.end_lsn for f in staged if f.path in paths and not f.acknowledged]
        if not targets:
            return staged
        position = advance(conn, self.settings.slot_name, max(targets))
        updated = [
            StagedFile(f.path, f.start_lsn, f.end_lsn, f.events, True)
            if f.path in paths or f.end_lsn <= position
            else f
            for f in staged
        ]
        self._save(updated)
        log.info(
            "replication slot advanced",
            extra={"slot": self.settings.slot_name, "confirmed_lsn": format_pg_lsn(position)},
        )
        return updated


def committed_paths(checkpoint: Checkpoint) -> set[str]:
    """The landing files committed whole (absolute paths): a file a micro-batch took to its
    end (a file cut at a record or byte limit is committed once the batch holding its last
    part is)."""
    last = checkpoint.last_batch()
    paths: set[str] = set()
    if last is None:
        return paths
    for batch_id in range(last + 1):
        if checkpoint.is_committed(batch_id):
            paths.update(f.path for f in checkpoint.offsets(batch_id).files if not f.cut)
    return paths


def make_source(config: CdcflowConfig) -> Any:
    """The staging source for ``source.type`` (None for plain landing files): a
    :class:`PostgresSource` or a :class:`cdcflow.sources.kafka.KafkaSource`."""
    if config.source.type == "postgres":
        return PostgresSource(config)
    if config.source.type == "kafka":
        from cdcflow.sources.kafka import KafkaSource

        return KafkaSource(config)
    return None
