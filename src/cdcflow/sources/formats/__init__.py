"""Record formats of a change stream, each decoded to the flat record of a table's contract.

``source.format`` names the format of every record (a landing-file line or a Kafka record
value); a declared table's ``format`` overrides it where that table's records differ:

=============== ===========================================================================
``flat``        cdcflow's own flat JSON record (``event_id``, key and columns, ``operation``,
                ``event_timestamp``, ``metadata.lsn``): read as it is (the default)
``debezium``    a Debezium change-event value, JSON, with or without the ``schema`` /
                ``payload`` wrapper (:mod:`cdcflow.sources.formats.debezium`)
``dms``         an AWS DMS record: the JSON message format (``data`` + ``metadata``) or the
                flat file flavour with an ``Op`` column (:mod:`cdcflow.sources.formats.dms`)
=============== ===========================================================================

A decoder turns one parsed record into one of three results:

* a **flat record** (a dict in the contract's field paths): validated by
  :class:`cdcflow.plan.contract_rules.ContractValidator` as if it had arrived flat, so every
  reason code, the content hash (over the decoded record: a redelivery is an exact
  ``DUPLICATE``) and the sequence rules are the flat format's;
* a :class:`~cdcflow.plan.rules.Rejection`: the record goes to quarantine with that reason
  (``MALFORMED_JSON`` when it is not a record of the format at all, ``INVALID_OPERATION``,
  ``INVALID_LSN``, ``SOURCE_TRUNCATE``…); the detail never quotes a value;
* a :class:`Skipped` record: not a change of a row (a Kafka tombstone after a delete, a
  truncate under the ``ignore`` policy, a DMS control record): counted in
  ``audit/skipped_records``, never quarantined.

Bronze keeps the record as it was delivered (``raw_payload``); replay decodes it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cdcflow.model.contracts import TableContract
from cdcflow.plan.rules import Rejection

#: The record formats (``source.format``, a table's ``format``).
FORMATS = ("flat", "debezium", "dms")
Format = Literal["flat", "debezium", "dms"]

#: Reason of a source truncate under the ``quarantine`` policy.
SOURCE_TRUNCATE = "SOURCE_TRUNCATE"


@dataclass(frozen=True, slots=True)
class Skipped:
    """A record that is not a row change, skipped and counted (``audit/skipped_records``).

    Attributes:
        kind: ``tombstone`` (a Kafka tombstone: null value), ``truncate`` (a source truncate,
            ``truncate: ignore``) or ``control`` (a DMS control record).
        detail: what it was, never a value of the record.
    """

    kind: Literal["tombstone", "truncate", "control"]
    detail: str


#: One decoded record: the flat record, a rejection or a skip.
Decoded = dict[str, Any] | Rejection | Skipped


class RecordDecoder(Protocol):
    """Decodes records of one format (see the module doc)."""

    name: str

    def table_of(self, record: Any) -> str | None:
        """The source table a parsed record names (the last dotted part), or None."""

    def decode(self, record: Any, contract: TableContract) -> Decoded:
        """One parsed record (a JSON value; None for a null value) → the flat record of
        ``contract``, a rejection or a skip. Never raises."""

    def skip_of(self, record: Any) -> Skipped | None:
        """The skip of a parsed record that is no row change of any table (a DMS control
        record, a Debezium logical decoding message), decided before routing: it may name no
        table, or one not declared. None for any other record. Never raises."""


def put_path(record: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``record[a][b]…`` for the dotted path ``a.b…`` (objects created on the way)."""
    parts = dotted.split(".")
    node = record
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def not_an_object(value: Any) -> Rejection:
    """The rejection of a parsed record that is not a JSON object (``MALFORMED_JSON``)."""
    kind = "null" if value is None else type(value).__name__
    return Rejection("MALFORMED_JSON", f"JSON {kind} is not an object")


class FlatDecoder:
    """``flat`` records of a table with ``truncate: ignore``: a record whose operation says
    ``TRUNCATE`` is skipped and counted, every other record is read as it is (docs/tables.md:
    "a source TRUNCATE — a record whose operation is TRUNCATE, Debezium's ``op: t``")."""

    name = "flat"

    def table_of(self, record: Any) -> str | None:
        """The table ``metadata.source_table`` names
        (:func:`~cdcflow.plan.contract_rules.route_name`)."""
        from cdcflow.plan.contract_rules import route_name

        return route_name(record) if isinstance(record, dict) else None

    def skip_of(self, record: Any) -> Skipped | None:
        """None: a flat record is skipped by its table's policy only (:meth:`decode`)."""
        return None

    def decode(self, record: Any, contract: TableContract) -> Decoded:
        """The record itself; a truncate: :class:`Skipped`; not an object: ``MALFORMED_JSON``."""
        from cdcflow.plan.contract_rules import field_at, is_truncate

        if not isinstance(record, dict):
            return not_an_object(record)
        if is_truncate(field_at(record, contract.operation_field)):
            return Skipped("truncate", "a source TRUNCATE (truncate: ignore)")
        return record


def decoder_for(name: str, truncate: str = "quarantine") -> RecordDecoder | None:
    """The decoder of a format, or None for ``flat`` records read as they are (a flat table
    with ``truncate: ignore`` has :class:`FlatDecoder`, which skips its truncates).

    Args:
        name: one of :data:`FORMATS`.
        truncate: the truncate policy of the table (``ignore`` or ``quarantine``).

    Raises:
        ValueError: an unknown format.
    """
    if name == "flat":
        return FlatDecoder() if truncate == "ignore" else None
    if name == "debezium":
        from cdcflow.sources.formats.debezium import DebeziumDecoder

        return DebeziumDecoder(truncate=truncate)
    if name == "dms":
        from cdcflow.sources.formats.dms import DmsDecoder

        return DmsDecoder(truncate=truncate)
    raise ValueError(f"unknown record format {name!r} (one of {', '.join(FORMATS)})")


__all__ = [
    "FORMATS",
    "SOURCE_TRUNCATE",
    "Decoded",
    "FlatDecoder",
    "Format",
    "RecordDecoder",
    "Skipped",
    "decoder_for",
    "not_an_object",
    "put_path",
]
