"""Right to erasure: an audited, exactly-once purge of data subjects' personal data.

``cdcflow erase --table T --key K`` removes, for each subject (one key of table ``T``), every
value of a column the table's contract marks ``pii`` from every layer, and the raw text that
contains them, keeping what the pipeline needs to stay correct (the key, the sequence, the
operation, the timestamps):

=========================  =====================================================================
layer                      what happens to the subject's rows
=========================  =====================================================================
Bronze                     PII columns set to null; ``raw_payload``: every field named like a PII
                           column set to null (at any depth: flat, Debezium ``before``/``after``,
                           DMS ``data``); other fields are kept as they are, so that a replay
                           from Bronze reproduces Silver (a PII value a source put in a column
                           the contract does not mark ``pii`` stays: mark that column).
                           ``content_hash`` is kept, so a redelivery of an erased event stays a
                           duplicate.
quarantine                 the rows of the key (its key columns, or a raw line holding
(and unrouted records)     ``"<key column>": <value>``): in ``raw_line`` (JSON) the PII fields set
                           to null and every PII value replaced by :data:`REDACTED`; a subject's
                           raw line that is not JSON is replaced whole by :data:`REDACTED`. A
                           line naming no key that holds one of the subject's values: only those
                           values replaced (a line naming another key is never touched: it may
                           share a value, e.g. a common name). ``failure_detail``: the values
                           replaced
Silver, history            PII columns set to null
replay shadows             ``_shadow/<silver>`` (``cdcflow replay``'s rebuild) as Silver
outcomes, tombstones       nothing to do: they hold keys, sequences and times only
Gold                       recomputed from the redacted history (the shipped customers tables)
Snowflake                  synced in the same run (``snowflake.mode`` not ``off``, or a sync has
                           run before): the redacted Silver rows reach the Snowflake table as
                           updates
=========================  =====================================================================

Every table the erasure changed is then vacuumed with a retention of zero (``full`` mode: the
Change Data Feed's files too) and its Delta log truncated at a new checkpoint: the files and
the log entries (their column statistics carry min/max values) of earlier versions are gone,
and time travel to them ends there.

Exactly-once: each table's redaction is one MERGE, carrying the app transaction
``cdcflow-erase-<request id>``, of exactly the rows the redaction changes: a table already
redacted has none, so a re-run writes nothing to it. A re-run of an unfinished request (same
table and subjects, not completed in ``audit/erasure_log``) finishes it under its id, reason
and request time, and also redacts what arrived meanwhile. Every step is a crash point
(:data:`ERASURE_CRASH_POINTS`).

Keys no layer holds are left out (``ErasureReport.unknown``); when no key is held, nothing is
written (:class:`ErasureError`). The ``--reason`` is refused when it holds the key, one of the
subject's values, an e-mail address or a phone number: the log holds no personal data.

Subjects are recorded in ``audit/erasure_log`` by a keyed hash (HMAC-SHA256) of the key, never
by the key or any value: the key of the hash comes from ``$CDCFLOW_ERASURE_KEY``, else from the
file ``erasure.key_file``, else from ``<checkpoint>/erasure.key`` (32 random bytes, created on
first use; set one of the first two in production, since anyone who can read the checkpoint
can otherwise test a guessed key against the log).

A later event of an erased subject (a late or replayed delivery) is applied with its PII columns
nulled: the micro-batch that brings it erases the subject's new values before its checkpoint
commit (:func:`enforce_erasures`). A contract that marks more columns ``pii`` has the erased
subjects erased again by the run that applies it (:func:`erase_newly_pii`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.errors import ConfigError, UsageError
from cdcflow.layers.tables import TS, TableSpec
from cdcflow.logs import get_logger
from cdcflow.model.contracts import ColumnSpec, TableContract
from cdcflow.state.faults import crash_point

log = get_logger("erasure")

#: What replaces a PII value found inside a text (a raw payload, a raw line, a detail).
REDACTED = "[erased]"
#: The environment variable holding the key of the subjects' keyed hash.
KEY_ENV = "CDCFLOW_ERASURE_KEY"
#: Shortest PII value searched for inside texts (shorter ones would match everywhere).
MIN_VALUE_LENGTH = 3
#: Layers of quarantined raw lines (the contract's quarantine, and the unrouted records' table
#: of declared tables: ``quarantine/unrouted_events``).
QUARANTINES = ("quarantine", "unrouted")
#: Folder of a replay's rebuilt tables (:mod:`cdcflow.engines.local.replay`).
SHADOW_PREFIX = "_shadow"
#: The steps of an erasure, each followed by a crash point ``erase_after_<step>``.
ERASURE_CRASH_POINTS = (
    "erase_after_log",
    "erase_after_quarantine",
    "erase_after_bronze",
    "erase_after_history",
    "erase_after_silver",
    "erase_after_gold",
    "erase_after_snowflake",
    "erase_after_vacuum",
)

ERASURE_LOG = TableSpec(
    "audit/erasure_log",
    pa.schema(
        [
            pa.field("request_id", pa.string(), nullable=False),
            pa.field("table_name", pa.string(), nullable=False),
            pa.field("subject_hash", pa.string(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("requested_at", TS, nullable=False),
            pa.field("completed_at", TS),
            pa.field("status", pa.string(), nullable=False),
            pa.field("rows_redacted", pa.string()),  # JSON: Delta table -> rows
            pa.field("versions", pa.string()),  # JSON: Delta table -> version written
        ]
    ),
)


class ErasureError(UsageError):
    """An erasure cannot run as asked (unknown table, no PII column, time travel not
    confirmed)."""


@dataclass(frozen=True)
class Subject:
    """One data subject: a key of the table (its values as text, in key order) and its keyed
    hash."""

    key: tuple[str, ...]
    hash: str


@dataclass
class ErasureReport:
    """What one ``erase`` did (or, with ``dry_run``, would do).

    Attributes:
        request_id: the request's id in ``audit/erasure_log``.
        table: the contract's name.
        subjects: how many subjects.
        rows: Delta table → rows redacted (a dry run: rows that would be).
        versions: Delta table → the version the erasure wrote.
        vacuumed: Delta table → files removed by the vacuum.
        snowflake: ``synced``, ``off`` (no sync configured) or ``dry-run``.
        dry_run: nothing was written.
        resumed: an unfinished request with the same subjects was finished.
        unknown: given keys no layer holds (left out, not logged).
    """

    request_id: str
    table: str
    subjects: int
    rows: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    vacuumed: dict[str, int] = field(default_factory=dict)
    snowflake: str = "off"
    dry_run: bool = False
    resumed: bool = False
    unknown: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


# ------------------------------------------------------------------ subjects and the keyed hash
def erasure_key(config: CdcflowConfig) -> bytes:
    """The key of the subjects' keyed hash (see the module docstring for where it comes from).

    Raises:
        ConfigError: ``erasure.key_file`` cannot be read (names the key).
    """
    from_env = os.environ.get(KEY_ENV, "")
    if from_env:
        return from_env.encode("utf-8")
    if config.erasure.key_file:
        try:
            text = Path(config.erasure.key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"erasure.key_file: cannot read {config.erasure.key_file} ({exc.strerror})"
            ) from None
        if not text:
            raise ConfigError(f"erasure.key_file: {config.erasure.key_file} is empty")
        return text.encode("utf-8")
    from cdcflow.state.checkpoint import Checkpoint

    storage = Checkpoint.of(config).storage
    storage.create("erasure.key", secrets.token_hex(32).encode("ascii"))  # kept if present
    stored = storage.read("erasure.key")
    assert stored is not None
    return stored.strip()


def subject_hash(key: Sequence[str], secret: bytes) -> str:
    """HMAC-SHA256 of a key's values (as text, joined by U+001F), hex."""
    return hmac.new(secret, "\x1f".join(key).encode("utf-8"), hashlib.sha256).hexdigest()


def key_text(value: Any, spec: ColumnSpec) -> str:
    """A key value as the one text every layer compares and hashes: the value coerced to the
    key column's type (``docs/SEMANTICS.md``: keys are equal by value, ``"007"`` is 7) and
    written as Polars writes that type as text (``2``, ``10.00``, ``2024-01-08``,
    ``2024-01-01 00:00:00.000000+00:00``, ``true``): what a typed Delta key column cast to
    text holds. A value that is not of the type (a quarantined record's) stays its trimmed
    text.

    Args:
        value: the key value as a record or a ``--key`` gives it (text, or a parsed JSON value).
        spec: the key column.
    """
    from cdcflow.model.contracts import TypeMismatch, coerce_given

    text = str(value).strip()
    if spec.type == "string":
        return text
    try:
        typed = coerce_given(value, spec.type)
    except (TypeMismatch, ValueError, TypeError, OverflowError):  # a record's value: data
        return text
    if typed is None:
        return text
    if isinstance(typed, bool):
        return "true" if typed else "false"
    if isinstance(typed, datetime):
        return typed.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00:00")
    if hasattr(typed, "isoformat"):  # a date
        return str(typed.isoformat())
    return str(typed)


def _key_text_expr(column: str, spec: ColumnSpec, dtype: pl.DataType) -> pl.Expr:
    """A key column's values as :func:`key_text` writes them. A typed column (Bronze,
    Silver, history) cast to text already is; a text column (quarantine: the values as
    records gave them) is parsed by type where it can be (integers with leading zeros,
    decimals, booleans, ISO dates and instants, epoch days and milliseconds), else trimmed."""
    raw = pl.col(column).cast(pl.String).str.strip_chars()
    if spec.type == "string" or dtype != pl.String:
        return raw
    kind = spec.type.split("(")[0]
    number = raw.cast(pl.Int64, strict=False)
    parsed: pl.Expr | None = None
    if kind == "integer":
        parsed = number.cast(pl.String)
    elif kind == "boolean":
        parsed = raw.str.to_lowercase().replace_strict(
            {"true": "true", "false": "false"}, default=None
        )
    elif kind == "date":
        parsed = pl.coalesce(
            raw.str.to_date("%Y-%m-%d", strict=False),
            number.cast(pl.Date, strict=False),
        ).cast(pl.String)
    elif kind == "timestamp":
        utc = pl.Datetime("us", "UTC")
        parsed = pl.coalesce(
            raw.str.to_datetime(time_zone="UTC", time_unit="us", strict=False),
            number.cast(pl.Datetime("ms", "UTC"), strict=False).cast(utc),
        ).cast(pl.String)
    elif kind == "decimal":
        from cdcflow.model.contracts import parse_type

        _, precision, scale = parse_type(spec.type)
        parsed = raw.cast(pl.Decimal(precision, scale), strict=False).cast(pl.String)
    return raw if parsed is None else pl.coalesce(parsed, raw)


def parse_key(text: str, contract: TableContract) -> tuple[str, ...]:
    """A ``--key`` value as the key's values in key order (each as :func:`key_text` writes
    it): the text itself for a one-column key; for a composite key a JSON array
    (``["O-1", 1]``) or comma-separated values.

    Raises:
        ErasureError: not as many values as the table has key columns.
    """
    if not text.strip():
        raise ErasureError("--key: an empty key")
    specs = [contract.column(k) for k in contract.keys]
    if len(contract.keys) == 1:
        return (key_text(text, specs[0]),)
    try:
        values = json.loads(text)
    except ValueError:
        values = text.split(",")
    if not isinstance(values, list) or len(values) != len(contract.keys):
        raise ErasureError(
            f"--key {text!r}: table {contract.name} has the key ({', '.join(contract.keys)}): "
            "give its values as a JSON array or separated by commas"
        )
    if not all(str(v).strip() for v in values):
        raise ErasureError(f"--key: table {contract.name}: a key value is empty")
    return tuple(key_text(v, spec) for v, spec in zip(values, specs, strict=True))


def find_contract(config: CdcflowConfig, table: str) -> TableContract:
    """The contract called ``table``.

    Raises:
        ErasureError: no such table, or it marks no column ``pii``.
    """
    contracts = {c.name: c for c in config.contracts()}
    contract = contracts.get(table)
    if contract is None:
        raise ErasureError(
            f"--table {table}: no such table (tables: {', '.join(sorted(contracts))})"
        )
    if not [c for c in contract.columns if c.pii]:
        raise ErasureError(f"--table {table}: its contract marks no column pii: nothing to erase")
    if not erased_columns(contract):
        raise ErasureError(
            f"--table {table}: its only pii columns are key columns, which erasure keeps "
            "(the key keeps the pipeline correct): nothing to erase"
        )
    return contract


def erased_columns(contract: TableContract) -> list[ColumnSpec]:
    """The columns erasure sets to null: the contract's ``pii`` columns but its keys (a key is
    kept in every table: it is what keeps the pipeline correct; a key that is personal data
    takes a surrogate in the source, docs/erasure.md)."""
    return [c for c in contract.columns if c.pii and c.name not in contract.keys]


# ------------------------------------------------------------------ redaction of values and texts
def _map_pii(
    value: Any,
    paths: frozenset[tuple[str, ...]],
    data: frozenset[str],
    leaf: Callable[[Any], Any],
    text: Callable[[str], str],
    pending: frozenset[tuple[str, ...]] = frozenset(),
) -> Any:
    """``value`` (parsed JSON) with each non-null PII field's value replaced by ``leaf(value)``
    and every other string by ``text(string)``.

    A PII field is one of ``paths`` (a record field, split on ``.``), found wherever it starts:
    at the top or at any depth (a Debezium ``after``/``before``, a DMS ``data`` hold the record).
    ``pending``: the rest of paths begun in an enclosing object. Inside the value of a ``data``
    field (a non-PII column's own field, e.g. a json column) no path starts anew: a nested key
    that merely shares a PII field's name is data, not the PII column.
    """
    if isinstance(value, dict):
        here = paths | pending
        out: dict[str, Any] = {}
        for key, item in value.items():
            if (key,) in here and item is not None:
                out[key] = leaf(item)
                continue
            inner = frozenset(p[1:] for p in here if len(p) > 1 and p[0] == key)
            starts: frozenset[tuple[str, ...]] = frozenset() if key in data else paths
            out[key] = _map_pii(item, starts, data, leaf, text, inner)
        return out
    if isinstance(value, list):
        return [_map_pii(v, paths, data, leaf, text, pending) for v in value]
    if isinstance(value, str):
        return text(value)
    return value


def _paths(names: Iterable[str]) -> frozenset[tuple[str, ...]]:
    return frozenset(tuple(name.split(".")) for name in names)


def _redact_plain(text: str, values: Sequence[str]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_text(
    text: str | None,
    names: set[str],
    values: Sequence[str],
    elsewhere: bool = True,
    data: frozenset[str] = frozenset(),
) -> str | None:
    """``text`` without personal data: a JSON text with every PII field in ``names`` set to
    null (found at any depth) and, with ``elsewhere``, every occurrence of one of ``values``
    inside its other strings replaced by :data:`REDACTED`, written back compactly; any other text
    with those occurrences replaced (also inside JSON-escaped strings).

    Args:
        text: a raw payload, raw line or failure detail (None stays None).
        names: the record fields the contract's PII columns are read from
            (:attr:`~cdcflow.model.contracts.ColumnSpec.field`: its ``source``, a dotted path,
            or its name).
        values: the subject's PII values (longest first).
        elsewhere: also replace the values inside a JSON text's other fields (False for
            Bronze's raw payload, whose non-PII fields must stay as the columns hold them).
        data: the fields of the contract's other columns: inside their values no PII field is
            looked for (a json column's nested key named like a PII field is kept).
    """
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict | list):
        kept = values if elsewhere else ()
        redacted = _map_pii(
            parsed, _paths(names), data, lambda _: None, lambda t: _redact_plain(t, kept)
        )
        return json.dumps(redacted, ensure_ascii=False)
    escaped = [json.dumps(v, ensure_ascii=False)[1:-1] for v in values]
    return _redact_plain(_redact_plain(text, values), escaped)


def pii_fields(contract: TableContract) -> tuple[set[str], frozenset[str]]:
    """(the record fields of the columns erasure nulls (:func:`erased_columns`), the top-level
    fields of the other columns that no such field is read from inside): the ``names`` and
    ``data`` of :func:`redact_text`."""
    erased = erased_columns(contract)
    fields = {c.field for c in erased}
    heads = {f.split(".")[0] for f in fields}
    data = frozenset(
        head
        for c in contract.columns
        if c not in erased and (head := c.field.split(".")[0]) not in heads
    )
    return fields, data


# ------------------------------------------------------------------ the tables
@dataclass
class _Layer:
    """One Delta table of a contract: how its rows are identified and what is redacted."""

    name: str
    kind: str  # bronze | quarantine | silver | history
    identity: tuple[str, ...]
    nulled: tuple[str, ...]  # PII columns set to null
    texts: tuple[str, ...]  # text columns redacted


def _layers(contract: TableContract, config: CdcflowConfig | None = None) -> list[_Layer]:
    """The contract's tables an erasure redacts, in order; with ``config`` (a local
    ``storage.root``) also the copies ``cdcflow schema accept`` retired under
    ``_retired/<table>/<version>/`` (inside the lakehouse: they hold the subject's data too)."""
    base = _live_layers(contract)
    if config is None or "://" in config.storage.root:
        return base
    folder = Path(config.storage.root) / "_retired" / contract.name
    if not folder.is_dir():
        return base
    retired = []
    for version in sorted(p.name for p in folder.iterdir() if p.is_dir()):
        for layer in base:
            if layer.kind in ("quarantine", "bronze", "history", "silver"):
                name = f"_retired/{contract.name}/{version}/{layer.name}"
                retired.append(replace(layer, name=name))
    return base + retired


def _live_layers(contract: TableContract) -> list[_Layer]:
    names = contract.table_names
    pii = tuple(c.name for c in erased_columns(contract))
    keys = tuple(contract.keys)
    return [
        # quarantine first: its rows are found by the PII values the others still hold
        _Layer(
            names.quarantine,
            "quarantine",
            ("batch_id", "source_file", "source_line"),
            (),
            ("raw_line", "failure_detail"),
        ),
        # records no contract took (declared tables: a misspelled source table)
        _Layer(
            "quarantine/unrouted_events",
            "unrouted",
            ("batch_id", "source_file", "source_line"),
            (),
            ("raw_line", "failure_detail"),
        ),
        _Layer(
            names.bronze,
            "bronze",
            ("batch_id", "source_file", "source_line"),
            pii,
            ("raw_payload",),
        ),
        _Layer(names.history, "history", (*keys, "sequence", "event_id"), pii, ()),
        _Layer(names.silver, "silver", keys, pii, ()),
        # a replay's rebuilt Silver (cdcflow replay), when one is left
        _Layer(f"{SHADOW_PREFIX}/{names.silver}", "shadow", keys, pii, ()),
    ]


def _open(config: CdcflowConfig, name: str) -> DeltaTable | None:
    uri = config.table_uri(name)
    options = config.storage.options or None
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    return DeltaTable(uri, storage_options=options)


def _scan(table: DeltaTable) -> pl.LazyFrame:
    from cdcflow.engines.local.delta import scan_table

    return scan_table(table)


def _key_filter(
    contract: TableContract, subjects: Sequence[Subject], columns: Mapping[str, pl.DataType]
) -> pl.Expr:
    """Rows whose key (its columns as :func:`key_text` writes them) is one of the subjects'.

    Args:
        columns: the table's schema (a text key column is parsed by type).
    """
    if not all(k in columns for k in contract.keys):
        return pl.lit(False)
    texts = [_key_text_expr(k, contract.column(k), columns[k]) for k in contract.keys]
    if len(contract.keys) == 1:
        return texts[0].is_in([s.key[0] for s in subjects])
    expr = pl.lit(False)
    for subject in subjects:
        one = pl.lit(True)
        for text, value in zip(texts, subject.key, strict=True):
            one = one & (text == value)
        expr = expr | one
    return expr


def _raw_key_filter(
    contract: TableContract, subjects: Sequence[Subject], column: str = "raw_line"
) -> pl.Expr:
    """Rows whose text ``column`` names one of the subjects' keys (:func:`_raw_keys`: a JSON
    object at any depth holding every key column, or the ``"<key column>": <value>`` of a line
    that is not JSON), compared as :func:`key_text` writes keys: a quarantined line of the
    subject, parsed or not, in whatever form it gave the key (``"002"`` for 2)."""
    wanted = {s.key for s in subjects}
    return pl.col(column).map_elements(
        lambda text: any(k in wanted for k in _raw_keys(text, contract)),
        return_dtype=pl.Boolean,
    )


def _own_filter(
    layer: _Layer,
    contract: TableContract,
    subjects: Sequence[Subject],
    columns: Mapping[str, pl.DataType],
) -> pl.Expr:
    """The subjects' own rows of a layer: their key, or in a quarantine layer also a raw line
    naming it."""
    own = _key_filter(contract, subjects, columns)
    if layer.kind in QUARANTINES:
        own = own | _raw_key_filter(contract, subjects)
    return own


def _raw_keys(text: str, contract: TableContract) -> list[tuple[str, ...]]:
    """The keys a raw line names (each value as :func:`key_text` writes it): every JSON object
    (at any depth) holding all key columns, or for a line that is not JSON the first
    ``"<key column>": <value>`` of each key column."""
    found: list[tuple[str, ...]] = []
    specs = [contract.column(k) for k in contract.keys]

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if all(k in value and value[k] is not None for k in contract.keys):
                found.append(
                    tuple(key_text(value[k], spec) for k, spec in zip(contract.keys, specs,
                                                                      strict=True))
                )  # fmt: skip
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    parsed = _loads(text)
    if parsed is not None:
        walk(parsed)
        return found
    parts = []
    for name in contract.keys:
        match = re.search(rf'"{re.escape(name)}"\s*:\s*"?\s*([^",}}\]\s]+)', text)
        if match is None:
            return []
        parts.append(key_text(match.group(1), contract.column(name)))
    return [tuple(parts)]


def _held_keys(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject] | None = None
) -> set[tuple[str, ...]]:
    """The keys (as :func:`key_text` writes them) some layer of the contract holds — a row
    with the key, or a quarantined raw line naming it: those of ``subjects``, or with None
    every key (read from every layer)."""
    wanted = None if subjects is None else {s.key for s in subjects}
    held: set[tuple[str, ...]] = set()
    for layer in _layers(contract, config):
        table = _open(config, layer.name)
        if table is None:
            continue
        scan = _scan(table)
        columns = scan.collect_schema()
        if all(k in columns for k in contract.keys):
            rows = (
                scan if subjects is None else scan.filter(_key_filter(contract, subjects, columns))
            )
            keys = (
                rows.select(
                    _key_text_expr(k, contract.column(k), columns[k]) for k in contract.keys
                )
                .unique()
                .drop_nulls()
                .collect()
            )
            held.update(keys.iter_rows())
        if layer.kind in QUARANTINES and "raw_line" in columns:
            lines = scan if subjects is None else scan.filter(_raw_key_filter(contract, subjects))
            for text in lines.select("raw_line").collect()["raw_line"].drop_nulls().to_list():
                held.update(k for k in _raw_keys(text, contract) if wanted is None or k in wanted)
    return held


def _present(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject]
) -> set[tuple[str, ...]]:
    """The subjects' keys some layer holds (a row with the key, or a quarantined raw line
    naming it)."""
    return _held_keys(config, contract, subjects) & {s.key for s in subjects}


_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_PHONE = re.compile(r"\+\d[\d ().-]{5,}\d")


def _check_reason(reason: str, subjects: Sequence[Subject], values: Sequence[str]) -> None:
    """Refuse a ``--reason`` holding personal data: a subject's key or PII value, an e-mail
    address or a phone number (``+`` and digits).

    Raises:
        ErasureError: names what the reason looks like, never the value.
    """
    folded = reason.casefold()
    if any(v.casefold() in folded for v in values) or any(
        part.casefold() in folded for s in subjects for part in s.key if len(part) >= 3
    ):
        raise ErasureError("--reason: holds a subject's key or personal data; give a ticket id")
    if _EMAIL.search(reason) or _PHONE.search(reason):
        raise ErasureError(
            "--reason: looks like an e-mail address or a phone number; give a ticket id"
        )


def _pii_values(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject]
) -> list[str]:
    """The subjects' PII values the tables still hold (Bronze's columns and raw payloads'
    PII fields, Silver, history), as texts of at least :data:`MIN_VALUE_LENGTH` characters,
    longest first. Kept in memory only: never logged nor written."""
    pii = [c.name for c in erased_columns(contract)]
    fields = pii_fields(contract)
    found: set[str] = set()
    for layer in _layers(contract, config)[1:]:
        table = _open(config, layer.name)
        if table is None:
            continue
        scan = _scan(table)
        columns = scan.collect_schema()
        wanted = [c for c in (*pii, *layer.texts) if c in columns]
        rows = scan.filter(_key_filter(contract, subjects, columns)).select(wanted).collect()
        for column in pii:
            if column in rows.columns:
                found.update(str(v) for v in rows[column].drop_nulls().to_list())
        for column in layer.texts:
            if column not in rows.columns:
                continue
            for text in rows[column].drop_nulls().to_list():
                _collect_fields(_loads(text), fields, found)
    return sorted((v for v in found if len(v.strip()) >= MIN_VALUE_LENGTH), key=len, reverse=True)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _collect_fields(value: Any, pii: tuple[set[str], frozenset[str]], found: set[str]) -> None:
    """Add to ``found`` the non-null values of the PII fields in ``value`` (parsed JSON; ``pii``:
    :func:`pii_fields`); of a nested value (a json PII column), every scalar inside it."""

    def take(item: Any) -> Any:
        if isinstance(item, dict):
            for inner in item.values():
                take(inner)
        elif isinstance(item, list):
            for inner in item:
                take(inner)
        elif item is not None:
            found.add(str(item))
        return item

    fields, data = pii
    _map_pii(value, _paths(fields), data, take, lambda t: t)


def _matching_rows(
    table: DeltaTable,
    layer: _Layer,
    contract: TableContract,
    subjects: Sequence[Subject],
    values: Sequence[str],
) -> pl.DataFrame:
    """The table's rows to redact: those of the subjects (and, in quarantine, every row whose
    texts hold one of ``values``; its column ``_subject`` tells the subjects' own rows)."""
    scan = _scan(table)
    columns = scan.collect_schema()
    match = _own_filter(layer, contract, subjects, columns)
    if layer.kind in QUARANTINES:
        scan = scan.with_columns(match.alias("_subject"))
        match = pl.col("_subject")
        if values:
            # a line naming no key that holds one of the values (a broken line with their
            # e-mail); another subject's line may share a value (a common name), so a line
            # naming a key is only ever redacted as the subjects' own (``_subject``)
            keyless = pl.lit(True)
            for name in contract.keys:
                if name in columns:
                    keyless = keyless & pl.col(name).is_null()
            holds = pl.col("raw_line").str.contains_any(list(values)) | pl.col(
                "failure_detail"
            ).str.contains_any(list(values))
            match = match | (keyless & holds)
    rows = scan.filter(match).collect()
    if layer.kind in QUARANTINES:
        own = rows["_subject"].to_list()
        named = [bool(_raw_keys(t, contract)) for t in rows["raw_line"].to_list()]
        keep = [o or not n for o, n in zip(own, named, strict=True)]
        return rows.filter(pl.Series(keep, dtype=pl.Boolean))
    if layer.kind == "bronze":
        return rows
    # Silver, history, shadow: only rows that still hold a value to null
    nulled = [c for c in layer.nulled if c in rows.columns]
    if not nulled:
        return rows.clear()
    return rows.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in nulled))


def _redacted(
    rows: pl.DataFrame,
    layer: _Layer,
    pii: tuple[set[str], frozenset[str]],
    values: Sequence[str],
) -> pl.DataFrame:
    """``rows`` redacted (see the module docstring), only the rows the redaction changes.

    ``pii``: the contract's :func:`pii_fields`."""
    fields, data = pii
    out = rows.with_columns(
        pl.lit(None, dtype=rows.schema[c]).alias(c) for c in layer.nulled if c in rows.columns
    )
    mine = out["_subject"].to_list() if "_subject" in out.columns else [False] * out.height
    for column in layer.texts:
        if column not in out.columns:
            continue
        redacted = []
        for text, subject in zip(out[column].to_list(), mine, strict=True):
            if layer.kind == "bronze":
                redacted.append(redact_text(text, fields, values, elsewhere=False, data=data))
            elif column == "raw_line" and subject and text and _loads(text) is None:
                redacted.append(REDACTED)  # the subject's line, not JSON: what is PII is unknown
            elif subject:
                redacted.append(redact_text(text, fields, values, data=data))
            else:  # a line naming no key: only the subject's values go, nothing else
                redacted.append(redact_text(text, set(), values))
        out = out.with_columns(pl.Series(column, redacted, dtype=pl.String))
    changed = [c for c in (*layer.nulled, *layer.texts) if c in out.columns]
    if not changed or out.is_empty():
        return out.clear()
    differs = rows[changed[0]].ne_missing(out[changed[0]])
    for column in changed[1:]:
        differs = differs | rows[column].ne_missing(out[column])
    return out.filter(differs)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _merge(table: DeltaTable, rows: pl.DataFrame, layer: _Layer, app_id: str) -> None:
    """Write the redacted ``rows`` over the table's rows of the same identity: one MERGE
    carrying the app transaction (``app_id``, 1)."""
    from cdcflow.engines.local.delta import commit_props

    changed = [c for c in (*layer.nulled, *layer.texts) if c in rows.columns]
    predicate = " AND ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in layer.identity)
    source = rows.select([*layer.identity, *changed]).to_arrow()
    (
        table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=commit_props(app_id, 1),
        )
        .when_matched_update({_quote(c): f"s.{_quote(c)}" for c in changed})
        .execute()
    )


# ------------------------------------------------------------------ the log
def _log_table(config: CdcflowConfig) -> DeltaTable:
    from cdcflow.engines.local.delta import DeltaStore

    store = DeltaStore(
        {ERASURE_LOG.name: config.table_uri(ERASURE_LOG.name)}, config.storage.options
    )
    return store.open(ERASURE_LOG)


def erasure_log(config: CdcflowConfig) -> pl.DataFrame:
    """``audit/erasure_log``: one row per subject per request (empty when no erasure ran)."""
    table = _open(config, ERASURE_LOG.name)
    if table is None:
        empty = pl.DataFrame(ERASURE_LOG.schema.empty_table())
        return empty
    return _scan(table).collect()


def erased_hashes(config: CdcflowConfig, table: str) -> set[str]:
    """The keyed hashes of every subject of ``table`` an erasure was requested for."""
    rows = erasure_log(config)
    return set(rows.filter(pl.col("table_name") == table)["subject_hash"].to_list())


@dataclass(frozen=True)
class _Request:
    """An erasure request: a new one, or an unfinished one resumed (its reason and time)."""

    id: str
    resumed: bool
    reason: str
    requested_at: datetime


def _request(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject], reason: str
) -> _Request:
    """An unfinished request of exactly these subjects, resumed; otherwise a new one."""
    rows = erasure_log(config).filter(pl.col("table_name") == contract.name)
    wanted = sorted(s.hash for s in subjects)
    for request_id, group in rows.group_by("request_id"):
        if (
            sorted(group["subject_hash"].to_list()) == wanted
            and (group["status"] != "completed").all()
        ):
            first = group.row(0, named=True)
            return _Request(str(request_id[0]), True, first["reason"], first["requested_at"])
    return _Request(uuid.uuid4().hex[:16], False, reason, datetime.now(UTC))


def _append_log(
    config: CdcflowConfig,
    request_id: str,
    contract: TableContract,
    subjects: Sequence[Subject],
    reason: str,
    requested_at: datetime,
    status: str,
    report: ErasureReport | None = None,
) -> None:
    from deltalake import write_deltalake

    from cdcflow.engines.local.delta import commit_props, txn_done

    table = _log_table(config)
    app_id = f"cdcflow-erase-log-{request_id}"
    version = 0 if status == "requested" else 1
    if txn_done(table, app_id, version):
        return
    completed = datetime.now(UTC) if status == "completed" else None
    rows = pa.Table.from_pylist(
        [
            {
                "request_id": request_id,
                "table_name": contract.name,
                "subject_hash": s.hash,
                "reason": reason,
                "requested_at": requested_at,
                "completed_at": completed,
                "status": status,
                "rows_redacted": json.dumps(report.rows, sort_keys=True) if report else None,
                "versions": json.dumps(report.versions, sort_keys=True) if report else None,
            }
            for s in subjects
        ],
        schema=ERASURE_LOG.schema,
    )
    write_deltalake(table, rows, mode="append", commit_properties=commit_props(app_id, version))


# ------------------------------------------------------------------ vacuum and the log's end
def _truncate_history(config: CdcflowConfig, name: str) -> int:
    """Vacuum the table with a retention of zero (full mode: every file the latest version does
    not reference, the Change Data Feed's included), write a checkpoint at the latest version
    and delete the log entries and checkpoints before it. Returns the files vacuumed."""
    table = _open(config, name)
    if table is None:
        return 0
    removed = table.vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True
    )
    table = _open(config, name)
    assert table is not None
    version = table.version()
    table.create_checkpoint()
    _delete_log_before(config, name, version)
    return len(removed)


def purge_history(config: CdcflowConfig, name: str) -> int:
    """Remove every file and log entry of table ``name`` that its latest version does not need
    (vacuum with a retention of zero, the log truncated at a new checkpoint): time travel
    ends at the latest version. Returns the files vacuumed (0 when there is no such table)."""
    return _truncate_history(config, name)


def _delete_log_before(config: CdcflowConfig, name: str, version: int) -> None:
    """Delete ``_delta_log`` commit files, checksums and checkpoints of versions before
    ``version``."""
    from cdcflow.state.storage import open_storage

    storage = open_storage(f"{config.table_uri(name)}/_delta_log", config.storage.options)
    for entry in storage.names():
        head = entry.split(".", 1)[0]
        if head.isdigit() and int(head) < version:
            storage.delete(entry)


def _duration(value: Any) -> str:
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def snowflake_synced(config: CdcflowConfig) -> bool:
    """True when Silver reaches Snowflake: ``snowflake.mode`` is ``inline`` or ``standalone``,
    or a sync has run (``audit/snowflake_sync`` has rows: e.g. ``cdcflow sync snowflake`` by
    hand, or the demo's step)."""
    if config.snowflake.mode != "off":
        return True
    table = _open(config, "audit/snowflake_sync")
    return table is not None and _scan(table).select(pl.len()).collect().item() > 0


# ------------------------------------------------------------------ the command
def erase(
    config: CdcflowConfig,
    table: str,
    keys: Sequence[str],
    reason: str = "",
    dry_run: bool = False,
    confirmed: bool = False,
    on_step: Callable[[str], None] | None = None,
    own_reason: bool = False,
) -> ErasureReport:
    """Erase the personal data of the subjects ``keys`` of ``table`` (see the module docstring).

    The caller holds the checkpoint's run lock (no micro-batch runs meanwhile).

    Args:
        config: the pipeline configuration.
        table: the contract's name (``customers`` for the shipped table).
        keys: the subjects' keys (:func:`parse_key`).
        reason: why (e.g. a ticket number); recorded in ``audit/erasure_log``, never personal
            data.
        dry_run: count what would be redacted, write nothing.
        confirmed: ``--yes``: the run may end time travel earlier than
            ``maintenance.time_travel_window``.
        on_step: called with each step's name before it runs (progress).
        own_reason: ``reason`` is cdcflow's own (a late event, a contract marking more columns
            pii), not an operator's: it is not checked for personal data (a subject keyed
            ``eve`` or ``100`` would otherwise stop the run whose reason text holds the word
            or the micro-batch number).

    Returns:
        The report.

    Raises:
        ErasureError: unknown table, no PII column, no key, or time travel not confirmed.
    """
    contract = find_contract(config, table)
    if not keys:
        raise ErasureError("give at least one --key (or --from-file)")
    secret = erasure_key(config)
    given = sorted(
        {Subject(k, subject_hash(k, secret)) for k in (parse_key(t, contract) for t in keys)},
        key=lambda s: s.hash,
    )
    step = on_step or (lambda name: None)
    step("finding the subjects")
    held = _present(config, contract, given)
    subjects = [s for s in given if s.key in held]
    if not subjects:
        raise ErasureError(
            f"no layer of table {contract.name} holds the {len(given)} key(s) given: "
            "nothing written"
        )
    pii = pii_fields(contract)
    step("collecting the subjects' values")
    values = _pii_values(config, contract, subjects)
    request = _request(config, contract, subjects, reason)
    if not request.resumed and not own_reason:
        _check_reason(reason, subjects, values)
    request_id, reason, requested_at = request.id, request.reason, request.requested_at
    report = ErasureReport(request_id, contract.name, len(subjects), dry_run=dry_run)
    report.resumed = request.resumed
    report.unknown = len(given) - len(subjects)
    app_id = f"cdcflow-erase-{request_id}"
    planned: list[tuple[_Layer, DeltaTable, pl.DataFrame]] = []
    for layer in _layers(contract, config):
        delta = _open(config, layer.name)
        if delta is None:
            continue
        # only rows the redaction changes: none in a table an earlier attempt redacted
        rows = _redacted(
            _matching_rows(delta, layer, contract, subjects, values), layer, pii, values
        )
        report.rows[layer.name] = rows.height
        planned.append((layer, delta, rows))
    if dry_run:
        report.snowflake = "dry-run"
        return report
    if not request.resumed and not any(report.rows.values()):
        return report  # nothing holds their personal data any more: nothing to write
    window = config.maintenance.time_travel_window
    if window.total_seconds() > 0 and not confirmed:
        raise ErasureError(
            "erase vacuums the tables it changes and ends their time travel at the erasure "
            f"(maintenance.time_travel_window is {_duration(window)}): run it again with --yes"
        )
    step("recording the request")
    _append_log(config, request_id, contract, subjects, reason, requested_at, "requested")
    crash_point("erase_after_log", 0)
    for layer, delta, rows in planned:
        step(f"redacting {layer.name}")
        if rows.height:
            _merge(delta, rows, layer, app_id)
        if f"erase_after_{layer.kind}" in ERASURE_CRASH_POINTS:
            crash_point(f"erase_after_{layer.kind}", 0)
    # every table of the contract is vacuumed (a resumed request's earlier redactions too)
    touched = [layer.name for layer in _layers(contract, config)]
    if not config.tables:  # the shipped customers tables: Gold from the redacted history
        step("recomputing Gold")
        from cdcflow.engines.local.gold import refresh_gold
        from cdcflow.layers.gold import GOLD_TABLES

        refresh_gold(config)
        touched += [spec.name for spec in GOLD_TABLES]
    crash_point("erase_after_gold", 0)
    if snowflake_synced(config):
        step("syncing Snowflake")
        from cdcflow.sinks.snowflake.sync import sync_snowflake

        redact_snowflake_stage(config, contract, subjects)
        sync_snowflake(config)
        report.snowflake = "synced"
    crash_point("erase_after_snowflake", 0)
    for name in dict.fromkeys(touched):
        step(f"vacuuming {name}")
        report.vacuumed[name] = _truncate_history(config, name)
        opened = _open(config, name)
        if opened is not None:
            report.versions[name] = opened.version()
    crash_point("erase_after_vacuum", 0)
    _append_log(config, request_id, contract, subjects, reason, requested_at, "completed", report)
    log.info(
        "erasure completed",
        extra={"erasure": {"request_id": request_id, "table": contract.name,
                           "subjects": len(subjects), "rows": report.rows}},
    )  # fmt: skip
    return report


def mask_erased(config: CdcflowConfig, table: str, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (an expected state or a source snapshot of ``table``: one row per key) with the
    PII columns of erased subjects set to null, as Silver holds them after the erasure, so
    that a reconciliation compares what the pipeline is meant to hold. Unchanged when no
    erasure of the table is logged."""
    hashes = erased_hashes(config, table)
    if not hashes or frame.is_empty():
        return frame
    contract = next(c for c in config.contracts() if c.name == table)
    pii = [c.name for c in erased_columns(contract) if c.name in frame.columns]
    if not pii or not all(k in frame.columns for k in contract.keys):
        return frame
    secret = erasure_key(config)
    keys = frame.select(
        _key_text_expr(k, contract.column(k), frame.schema[k]) for k in contract.keys
    )
    erased = pl.Series(
        [subject_hash(tuple(row), secret) in hashes for row in keys.iter_rows()], dtype=pl.Boolean
    )
    return frame.with_columns(pl.when(erased).then(None).otherwise(pl.col(c)).alias(c) for c in pii)


def enforce_erasures(config: CdcflowConfig, batch_id: int) -> list[ErasureReport]:
    """Erase again the subjects of earlier erasures that micro-batch ``batch_id`` brought
    events of (late or replayed deliveries): their new PII values are redacted from every layer
    like the first time (a request of its own in ``audit/erasure_log``, reason
    ``late event of an erased subject (micro-batch N)``), so the event is applied with its PII
    columns nulled. Nothing to do (and nothing read but the log) when no erasure was logged.

    The caller holds the checkpoint's run lock; the local engine calls it before the batch's
    checkpoint commit (a crash before it re-runs the batch and this), the Spark engine right
    after it.

    The micro-batch's keys are its Bronze rows' and its quarantined and unrouted records'
    (their key columns, or the keys their raw lines name: a late record of an erased subject
    that fails validation or routing holds personal data too). With ``snowflake.mode:
    inline`` it also runs before the micro-batch's inline sync
    (:func:`cdcflow.sinks.snowflake.inline.inline_sync`).

    Returns:
        One report per table whose subjects were erased again.
    """
    reports = []
    for contract in config.contracts():
        hashes = erased_hashes(config, contract.name)
        if not hashes:
            continue
        keys: set[tuple[str, ...]] = set()
        names = contract.table_names
        for name in (names.bronze, names.quarantine, "quarantine/unrouted_events"):
            delta = _open(config, name)
            if delta is None:
                continue
            rows = _scan(delta).filter(pl.col("batch_id") == batch_id).collect()
            if all(k in rows.columns for k in contract.keys):
                keyed = rows.select(
                    _key_text_expr(k, contract.column(k), rows.schema[k]) for k in contract.keys
                ).drop_nulls()
                keys.update(keyed.iter_rows())
            if "raw_line" in rows.columns:
                for text in rows["raw_line"].to_list():
                    keys.update(_raw_keys(text, contract))
        reason = f"late event of an erased subject (micro-batch {batch_id})"
        report = _erase_again(config, contract, keys, hashes, reason)
        if report is not None:
            reports.append(report)
    return reports


def newly_pii(old: TableContract, new: TableContract) -> list[str]:
    """The record fields (and columns) ``new`` erases that ``old`` did not: a column marked
    ``pii`` since, added with ``pii: true``, or a ``pii`` column read from another field.

    Returns:
        Their names, sorted; empty when ``new`` erases nothing more than ``old``.
    """
    before = pii_fields(old)[0] | {c.name for c in erased_columns(old)}
    after = pii_fields(new)[0] | {c.name for c in erased_columns(new)}
    return sorted(after - before)


def _erase_again(
    config: CdcflowConfig,
    contract: TableContract,
    keys: Iterable[tuple[str, ...]],
    hashes: set[str],
    reason: str,
) -> ErasureReport | None:
    """Erase again those of ``keys`` (as :func:`key_text` writes them) whose keyed hash is one
    of the erased subjects' ``hashes``, under cdcflow's own ``reason``; None when none is."""
    secret = erasure_key(config)
    again = sorted(k for k in keys if subject_hash(k, secret) in hashes)
    if not again:
        return None
    texts = [row[0] if len(row) == 1 else json.dumps(list(row)) for row in again]
    return erase(config, contract.name, texts, reason=reason, confirmed=True, own_reason=True)


def erase_newly_pii(
    config: CdcflowConfig, recorded: Mapping[str, TableContract]
) -> list[ErasureReport]:
    """Erase again the erased subjects of each declared table whose contract now erases more
    than the one its tables were built for: a column marked ``pii`` after the subjects were
    erased kept their values in Silver and history, and in Bronze's raw payloads, from which
    a ``replay --apply`` would bring them back (:func:`newly_pii`).

    Runs when a run applies the contract change (:func:`cdcflow.engines.local.contracts.
    open_tables`, before the change is recorded in ``audit/schema_log``: a crash in between
    runs it again), holding the checkpoint's run lock. Each table is one request of its own
    in ``audit/erasure_log`` (reason ``contract v<N> marks more columns pii``).

    Args:
        config: the pipeline's config (its declared contracts are the new ones).
        recorded: table name → the contract its tables hold (``audit/schema_log``).

    Returns:
        One report per table whose subjects were erased again (none when no erasure of a
        table whose contract erases more was logged).

    Raises:
        CheckpointError: another run or command holds the checkpoint's lock.
    """
    due = []
    for contract in config.contracts():
        old = recorded.get(contract.name)
        if old is None or not newly_pii(old, contract):
            continue
        hashes = erased_hashes(config, contract.name)
        if hashes:
            due.append((contract, hashes))
    if not due:
        return []
    from cdcflow.state.checkpoint import Checkpoint

    reports = []
    with Checkpoint.of(config).lock():
        for contract, hashes in due:
            # every key the layers hold is hashed: the log keeps only the subjects' hashes
            keys = _held_keys(config, contract)
            reason = f"contract v{contract.version} marks more columns pii"
            report = _erase_again(config, contract, keys, hashes, reason)
            if report is not None:
                reports.append(report)
    return reports


# ------------------------------------------------------------------ verification
@dataclass
class Check:
    """One finding of :func:`verify_erasure`: ``ok`` or not, and where (never a value)."""

    what: str
    ok: bool
    detail: str = ""


def _subjects(config: CdcflowConfig, contract: TableContract, keys: Sequence[str]) -> list[Subject]:
    secret = erasure_key(config)
    return [Subject(k, subject_hash(k, secret)) for k in (parse_key(t, contract) for t in keys)]


def _value_forms(values: Sequence[str]) -> list[bytes]:
    forms: set[bytes] = set()
    for value in values:
        forms.add(value.encode("utf-8"))
        forms.add(json.dumps(value)[1:-1].encode("utf-8"))
    return sorted(forms)


def _file_holds(path: str, data: bytes, forms: Sequence[bytes]) -> bool:
    """True when the file's content holds one of ``forms``: a Parquet file read back as values
    (compressed pages hide strings from a byte search), a gzip file decompressed, any other
    file as bytes."""
    import gzip
    import io

    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
        for column in table.columns:
            text = "\n".join(str(v) for v in column.to_pylist() if v is not None)
            if any(form.decode("utf-8") in text for form in forms):
                return True
        return False
    if path.endswith(".gz"):
        with contextlib.suppress(OSError):
            data = gzip.decompress(data)
    return any(form in data for form in forms)


def scan_files(config: CdcflowConfig, values: Sequence[str]) -> list[str]:
    """Every file under ``storage.root`` and ``checkpoint.location`` that still holds one of
    ``values`` (the Snowflake emulator's database files excepted: Snowflake is checked by
    query). Returns their paths (relative to the root / the checkpoint)."""
    from cdcflow.state.storage import is_object_uri

    forms = _value_forms([v for v in values if v])
    found: list[str] = []
    for location in dict.fromkeys((config.storage.root, config.checkpoint.location)):
        for name, data in _files(location, config.storage.options, is_object_uri(location)):
            if name.startswith("_snowflake_emulator"):
                continue
            if _file_holds(name, data, forms):
                found.append(name)
    return found


def _files(location: str, options: dict[str, str], remote: bool) -> Iterable[tuple[str, bytes]]:
    if remote:
        import obstore
        from obstore.store import from_url

        from cdcflow.state.storage import _store_options

        store_config, client = _store_options(options)
        store = from_url(location.rstrip("/"), config=store_config or None, client_options=client)  # type: ignore[call-overload]
        for chunk in obstore.list(store):
            for meta in chunk:
                yield meta["path"], bytes(obstore.get(store, meta["path"]).bytes())
        return
    root = Path(location)
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        if path.is_file():
            yield str(path.relative_to(root)), path.read_bytes()


def verify_erasure(
    config: CdcflowConfig, table: str, keys: Sequence[str], values: Sequence[str] = ()
) -> list[Check]:
    """Check that the subjects ``keys`` of ``table`` are erased.

    * ``audit/erasure_log`` holds a completed request for each subject;
    * each layer's rows of the subjects hold no PII: the PII columns are null and the raw
      texts have no PII field with a value;
    * each table's Delta log starts at or after the erasure's version (no earlier version, whose
      files or statistics could hold the values, can be read);
    * with ``values`` (what the requester knows of their data: e-mail, phone, name), no file
      under the lakehouse root or the checkpoint holds any of them (:func:`scan_files`);
    * with a Snowflake sync configured, the subjects' rows in the Snowflake table hold no PII.

    Returns:
        The checks, each ``ok`` or not; a detail names a table or file, never a value.
    """
    contract = find_contract(config, table)
    subjects = _subjects(config, contract, keys)
    pii = [c.name for c in erased_columns(contract)]
    fields = pii_fields(contract)
    checks: list[Check] = []
    rows = erasure_log(config).filter(
        (pl.col("table_name") == contract.name) & (pl.col("status") == "completed")
    )
    done = set(rows["subject_hash"].to_list())
    missing = [s for s in subjects if s.hash not in done]
    checks.append(
        Check(
            "audit/erasure_log: a completed erasure of every subject",
            not missing,
            f"{len(missing)} subject(s) without one" if missing else "",
        )
    )
    versions: dict[str, int] = {}
    for text in rows["versions"].drop_nulls().to_list():
        for name, version in json.loads(text).items():
            versions[name] = max(versions.get(name, 0), int(version))
    for layer in _layers(contract, config):
        delta = _open(config, layer.name)
        if delta is None:
            continue
        scan = _scan(delta)
        columns = scan.collect_schema()
        mine = scan.filter(_own_filter(layer, contract, subjects, columns)).collect()
        bad = 0
        for column in (c for c in pii if c in mine.columns):
            bad += int(mine[column].is_not_null().sum())
        for column in (c for c in layer.texts if c in mine.columns):
            for text in mine[column].drop_nulls().to_list():
                held: set[str] = set()
                _collect_fields(_loads(text), fields, held)
                bad += bool(held)
        checks.append(
            Check(
                f"{layer.name}: the subjects' rows hold no PII",
                bad == 0,
                f"{bad} value(s) left" if bad else "",
            )
        )
        if layer.name in versions:
            from cdcflow.engines.local.delta import log_versions

            commits = log_versions(config.table_uri(layer.name), config.storage.options)
            earliest = min(commits, default=versions[layer.name])
            checks.append(
                Check(
                    f"{layer.name}: no version before the erasure can be read",
                    earliest >= versions[layer.name],
                    f"the log starts at version {earliest}",
                )
            )
    if values:
        found = scan_files(config, values)
        checks.append(
            Check(
                "every file under the lakehouse root and the checkpoint: none of the values",
                not found,
                ", ".join(found[:10]),
            )
        )
    if snowflake_synced(config):
        checks.append(_snowflake_check(config, contract, subjects, pii))
    return checks


def _stage_rows(
    cur: Any, contract: TableContract, subjects: Sequence[Subject]
) -> list[tuple[Any, ...]] | None:
    """The subjects' rows in the Snowflake table's stage (``<table>_STAGE``: rows of sync
    attempts that failed before they removed them), each (``SYNC_ID``, its key values as
    Snowflake returns them); None when the stage does not exist. Keys are compared as
    :func:`key_text` writes them."""
    stage = f"{contract.table_names.snowflake}_STAGE"
    specs = [contract.column(k) for k in contract.keys]
    columns = ", ".join(k.upper() for k in contract.keys)
    try:
        rows = cur.execute(f"SELECT DISTINCT SYNC_ID, {columns} FROM {stage}").fetchall()
    except Exception:  # no stage: nothing was ever synced
        return None
    wanted = {s.key for s in subjects}

    def text(value: Any, spec: ColumnSpec) -> str:
        given = value.isoformat() if hasattr(value, "isoformat") else value
        return key_text(str(given) if given is not None else "", spec)

    return [
        tuple(row)
        for row in rows
        if tuple(text(v, spec) for v, spec in zip(row[1:], specs, strict=True)) in wanted
    ]


def redact_snowflake_stage(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject]
) -> int:
    """Delete the subjects' rows from the Snowflake table's stage: a sync attempt that failed
    after its load (an inline sync, a killed ``sync snowflake``) leaves its rows there, PII
    included, until a later sync removes rows older than a day. Their changes are not lost:
    the erasure's own sync that follows carries the subjects' rows, redacted, from Silver.

    Returns:
        Stage rows deleted.
    """
    from cdcflow.sinks.snowflake.connection import connect

    stage = f"{contract.table_names.snowflake}_STAGE"
    where = " AND ".join(f"{k.upper()} = %s" for k in contract.keys)
    deleted = 0
    with connect(config) as conn:
        cur = conn.cursor()
        for sync_id, *values in _stage_rows(cur, contract, subjects) or []:
            cur.execute(f"DELETE FROM {stage} WHERE SYNC_ID = %s AND {where}", (sync_id, *values))
            deleted += max(cur.rowcount or 0, 0)
    return deleted


def _snowflake_check(
    config: CdcflowConfig, contract: TableContract, subjects: Sequence[Subject], pii: list[str]
) -> Check:
    from cdcflow.sinks.snowflake.connection import connect

    where = " AND ".join(f"TO_VARCHAR({k}) = %s" for k in contract.keys)
    table = contract.table_names.snowflake
    bad = 0
    with connect(config) as conn:
        cur = conn.cursor()
        for subject in subjects:
            try:
                cur.execute(f"SELECT {', '.join(pii)} FROM {table} WHERE {where}", subject.key)
            except Exception as exc:  # the table may not exist yet (nothing synced)
                return Check(f"Snowflake {table}: the subjects' rows hold no PII", False,
                             type(exc).__name__)  # fmt: skip
            bad += sum(v is not None for row in cur.fetchall() for v in row)
        staged = len(_stage_rows(cur, contract, subjects) or [])
    left = [f"{bad} value(s) left"] if bad else []
    if staged:
        left.append(f"{staged} row(s) in {table}_STAGE")
    return Check(f"Snowflake {table} and its stage: the subjects' rows hold no PII",
                 not left, ", ".join(left))  # fmt: skip


__all__ = [
    "ERASURE_CRASH_POINTS",
    "ERASURE_LOG",
    "Check",
    "ErasureError",
    "ErasureReport",
    "enforce_erasures",
    "erase",
    "erased_columns",
    "erased_hashes",
    "erasure_key",
    "erasure_log",
    "mask_erased",
    "purge_history",
    "redact_text",
    "scan_files",
    "subject_hash",
    "verify_erasure",
]
