"""Routing one raw record of a micro-batch to its declared table, decoded from its format.

Engine-neutral: the local and the Spark contracts engines (and replay) call the same
:class:`Router`, so they route, decode and skip exactly alike.

For every record (a non-blank landing line, or a staged Kafka record value):

1. parse it as JSON (:func:`cdcflow.plan.rules.parse_record`); a bad line is unrouted as
   ``MALFORMED_JSON``. A ``null`` value is a record too where a format allows it (a Debezium
   Kafka tombstone).
2. a record that is no row change of any table — a DMS control record, a Debezium logical
   decoding message (``op: m``) — is skipped, whatever table it names (a declared one is
   kept as the skip's table) (:meth:`~cdcflow.sources.formats.RecordDecoder.skip_of`).
   Otherwise find its table: the flat format's ``metadata.source_table`` (last dotted part); a
   Debezium event's ``source.table``; a DMS record's ``table-name`` /
   ``AR_M_SOURCE_TABLE_NAME`` — read by the decoder of each format in use, first the
   source's (``source.format``) — and only a table whose format is that decoder's takes it.
   A DMS flat record that names no table goes to the one declared DMS table, when there is
   exactly one. Otherwise the record is unrouted as ``UNKNOWN_TABLE``.
3. decode it to the table's flat record (:mod:`cdcflow.sources.formats`): the record to
   validate, a rejection (quarantined in that table) or a skip (``audit/skipped_records``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdcflow.model.contracts import TableContract
from cdcflow.plan.contract_rules import route_name
from cdcflow.plan.rules import Rejection, parse_record
from cdcflow.sources.formats import RecordDecoder, Skipped, decoder_for, not_an_object

#: The envelope field of a staged Kafka record (:data:`cdcflow.sources.kafka.ENVELOPE`).
ENVELOPE = "_kafka"

#: The reason of a record whose table names no declared table.
UNKNOWN_TABLE = "UNKNOWN_TABLE"


@dataclass(frozen=True, slots=True)
class Route:
    """Where one record goes.

    Attributes:
        table: the declared table it belongs to, or None (unrouted, or a skip of no table).
        record: the flat record to validate (None when rejected or skipped).
        rejection: why it is quarantined (in ``table``'s quarantine, or unrouted when
            ``table`` is None), or None.
        skipped: the skip, or None.
        source_table: the table name the record gave when it names no declared table.
    """

    table: str | None
    record: dict[str, Any] | None = None
    rejection: Rejection | None = None
    skipped: Skipped | None = None
    source_table: str | None = None


def parse_value(data: bytes) -> Any:
    """A raw record → its parsed JSON object, None for a ``null`` value, or a rejection."""
    parsed = parse_record(data)
    if isinstance(parsed, Rejection) and data.strip() == b"null":
        return None
    return parsed


class Router:
    """Routes and decodes the records of one pipeline (module doc).

    Args:
        contracts: the declared tables, in order.
        source_format: ``source.format``.
        topic_tables: ``source.kafka.topic_tables`` of a Kafka source (a topic not listed
            maps to the last dotted part of its name); None for another source.
    """

    @classmethod
    def of(cls, config: Any, contracts: list[TableContract] | None = None) -> Router:
        """The router of a pipeline config (its declared contracts unless ``contracts``)."""
        kafka = config.source.kafka.topic_tables if config.source.type == "kafka" else None
        return cls(contracts or config.contracts(), config.source.format, kafka)

    def __init__(
        self,
        contracts: list[TableContract],
        source_format: str,
        topic_tables: dict[str, str] | None = None,
    ) -> None:
        #: a Kafka source's topic → table mapping (None: not a Kafka source)
        self.topic_tables = topic_tables
        self.names = tuple(c.name for c in contracts)
        self.contracts = {c.name: c for c in contracts}
        self.formats = {c.name: c.format or source_format for c in contracts}
        self.decoders: dict[str, RecordDecoder | None] = {
            c.name: decoder_for(self.formats[c.name], c.truncate) for c in contracts
        }
        order = [source_format, *(f for f in self.formats.values() if f != source_format)]
        self._order = list(dict.fromkeys(order))
        self._probes = {f: decoder_for(f) for f in self._order}
        dms = [n for n in self.names if self.formats[n] == "dms"]
        self._only_dms = dms[0] if len(dms) == 1 else None
        #: whether records can be skipped: a format other than flat, Kafka tombstones, or the
        #: truncates of a flat table with ``truncate: ignore``
        self.decodes = (
            topic_tables is not None
            or any(f != "flat" for f in self._order)
            or any(d is not None for d in self.decoders.values())
        )

    def route(self, data: bytes | None, error: str | None = None) -> Route:
        """Route one raw record (``data`` None: an unreadable line, ``error`` says why)."""
        if data is None:
            return Route(None, rejection=Rejection("MALFORMED_JSON", error or "unreadable"))
        parsed = parse_value(data) if self.decodes else parse_record(data)
        if isinstance(parsed, Rejection):
            return Route(None, rejection=parsed)
        if self.topic_tables is not None and isinstance(parsed, dict) and ENVELOPE in parsed:
            return self._kafka(parsed)
        if parsed is None or _null_payload(parsed):
            # a null value (or JsonConverter's {"schema": null, "payload": null}): only a
            # decoding format gives it a meaning (a Debezium tombstone is skipped)
            first = next(iter(self.contracts.values()))
            for decoder in self._probes.values():
                skipped = decoder.decode(parsed, first) if decoder is not None else None
                if isinstance(skipped, Skipped):
                    return Route(None, skipped=skipped)
            if parsed is None:
                return Route(
                    None, rejection=Rejection("MALFORMED_JSON", "JSON null is not an object")
                )
        for fmt, decoder in self._probes.items():  # a control record, whatever table it names
            control = None if decoder is None else decoder.skip_of(parsed)
            if decoder is not None and control is not None:
                name = decoder.table_of(parsed)
                own = name is not None and name in self.contracts and self.formats[name] == fmt
                return Route(name if own else None, skipped=control)
        named: str | None = None
        for fmt in self._order:
            probe = self._probes[fmt]
            name = route_name(parsed) if probe is None else probe.table_of(parsed)
            if name is None and fmt == "dms" and self._only_dms is not None and _dms_row(parsed):
                name = self._only_dms
            if name is None:
                continue
            named = named or name
            if name in self.contracts and self.formats[name] == fmt:
                return self.decode(name, parsed)
        raw_eid = parsed.get("event_id") if isinstance(parsed, dict) else None
        event_id = raw_eid.strip() if isinstance(raw_eid, str) else None
        if self._order == ["flat"]:
            detail = (
                "metadata.source_table is missing, null or blank"
                if named is None
                else "metadata.source_table names no declared table "
                f"(declared: {', '.join(self.names)})"
            )
        else:
            declared = ", ".join(f"{n} ({self.formats[n]})" for n in self.names)
            detail = (
                "the record names no table"
                if named is None
                else f"the record's table is not a declared table of its format ({declared})"
            )
        return Route(None, rejection=Rejection(UNKNOWN_TABLE, detail, event_id), source_table=named)

    def _kafka(self, staged: dict[str, Any]) -> Route:
        """A staged Kafka record (:mod:`cdcflow.sources.kafka`): its table from its topic,
        its value decoded in that table's format; a null value is a tombstone, skipped."""
        position = staged.get(ENVELOPE)
        topic = position.get("topic") if isinstance(position, dict) else None
        if not isinstance(topic, str):
            return Route(
                None, rejection=Rejection("MALFORMED_JSON", "a Kafka envelope without topic")
            )
        mapped = (self.topic_tables or {}).get(topic)
        table = mapped or topic.rsplit(".", 1)[-1]
        value = staged.get("value")
        fmt = self.formats.get(table, self._order[0])
        probe = self._probes.get(fmt) or decoder_for(fmt)
        control = probe.skip_of(value) if probe is not None else None
        if control is not None:  # a control record, of a declared table or not
            return Route(table if table in self.contracts else None, skipped=control)
        if mapped is None and isinstance(value, dict):
            # no explicit mapping: the table the record names wins over the topic's name (a
            # DMS task writes every table to one topic; a routing SMT merges topics)
            own = route_name(value) if probe is None else probe.table_of(value)
            if own is not None:
                table = own
        if table not in self.contracts:
            declared = ", ".join(self.names)
            detail = f"a record of topic {topic}, table {table}: not a declared table ({declared})"
            return Route(None, rejection=Rejection(UNKNOWN_TABLE, detail), source_table=table)
        if "value_text" in staged:
            error = staged.get("value_error")  # its bytes are not UTF-8
            detail = str(error) if error else "the Kafka record's value is not JSON"
            return Route(table, rejection=Rejection("MALFORMED_JSON", detail))
        if value is None:
            return Route(table, skipped=Skipped("tombstone", "a Kafka tombstone (null value)"))
        return self.decode(table, value)

    def decode(self, table: str, parsed: Any) -> Route:
        """Decode a parsed record of ``table`` (a declared table) to its flat record."""
        decoder = self.decoders[table]
        if decoder is None:
            if not isinstance(parsed, dict):
                return Route(table, rejection=not_an_object(parsed))
            return Route(table, record=parsed)
        decoded = decoder.decode(parsed, self.contracts[table])
        if isinstance(decoded, Rejection):
            return Route(table, rejection=decoded)
        if isinstance(decoded, Skipped):
            return Route(table, skipped=decoded)
        return Route(table, record=decoded)

    def decode_raw(self, table: str, data: bytes | str) -> dict[str, Any] | Rejection | Skipped:
        """Decode a raw record already routed to ``table`` (Spark validation, replay)."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        parsed = parse_value(raw) if self.decodes else parse_record(raw)
        if isinstance(parsed, Rejection):
            return parsed
        if self.topic_tables is not None and isinstance(parsed, dict) and ENVELOPE in parsed:
            route = self._kafka(parsed)
        else:
            route = self.decode(table, parsed)
        if route.rejection is not None:
            return route.rejection
        if route.skipped is not None:
            return route.skipped
        assert route.record is not None
        return route.record


def _null_payload(record: Any) -> bool:
    """Whether a record is Kafka Connect JsonConverter's wrapper of a null value."""
    return (
        isinstance(record, dict)
        and set(record) == {"schema", "payload"}
        and (record["payload"] is None)
    )


def _dms_row(record: Any) -> bool:
    """Whether a record that names no table can be a DMS flat row (S3 files name none): an
    object without the flat format's ``metadata`` and without a Debezium envelope."""
    return isinstance(record, dict) and not ({"metadata", "payload", "op", "source"} & set(record))


__all__ = ["UNKNOWN_TABLE", "Route", "Router", "parse_value"]
