"""AWS DMS records → the flat record of a table's contract.

Two flavours, told apart per record (AWS DMS User Guide: "Using Apache Kafka as a target"
/ "Using Amazon Kinesis Data Streams as a target" for the JSON message format; "Using Amazon
S3 as a target", "Indicating source DB operations" and "Using a change sequence number" for the
flat one):

**JSON messages** — ``{"data": {<row>}, "metadata": {"timestamp", "record-type", "operation",
"partition-key-type", "schema-name", "table-name", "transaction-id", …}}``:

* ``record-type`` ``control`` (table DDL, …) is skipped as ``control``; ``data`` records
  carry ``operation`` ``load`` (full load) / ``insert`` → INSERT, ``update`` → UPDATE,
  ``delete`` → DELETE (any other is ``INVALID_OPERATION``).
* The sequence: a full-load row has the position 0, so it orders before every change of the
  same key. A change's position is its ``AR_H_CHANGE_SEQ`` when the task adds that header
  column to ``data`` (a transformation rule ``add-column`` with the expression
  ``$AR_H_CHANGE_SEQ``: a 35-digit number, compared as a number, not as text); without it
  the message carries no log position, every change has the position 1 and
  ``metadata.timestamp`` (the change's time, microseconds) orders the changes, then the event
  id — changes of one key within the timestamp's precision may then apply out of order: add
  the header column.
* Event id: ``dms-<transaction-id, 20 digits>-<transaction-record-id, 10 digits>`` when the
  task includes transaction details (``IncludeTransactionDetails``: changes of one transaction
  at one timestamp then keep their source order), else ``dms-`` + the first 32 hex digits of
  the SHA-256 of the record's canonical JSON (a redelivery is an exact ``DUPLICATE``).

**Flat flavour** (one row per record, the S3 target's columns as JSON): the row's columns plus
``Op`` (``I`` / ``U`` / ``D``; a full-load row has no ``Op``), ``AR_H_CHANGE_SEQ`` (a 35-digit
number, compared as a number: the sequence) and ``AR_H_TIMESTAMP`` (``YYYY-MM-DD
HH:MM:SS.ffffff``, UTC), added by the task's header-column transformations:

* A full-load row has the sequence 0 (before every change); a change without
  ``AR_H_CHANGE_SEQ`` is ``NULL_LSN``.
* The event time: ``AR_H_TIMESTAMP``, else ``AR_H_COMMIT_TIMESTAMP``; a full-load row
  without either is dated 1970-01-01T00:00:00Z (it has no change time; its sequence 0 orders
  it first anyway).
* Event id: ``AR_H_STREAM_POSITION`` when present, else ``dms-<AR_H_CHANGE_SEQ>``; a full-load
  row: ``dms-load-`` + the hash of its canonical JSON.
* Table: ``AR_M_SOURCE_SCHEMA`` / ``AR_M_SOURCE_TABLE_NAME`` when the task adds them (S3 files
  are per table and their rows name none); without them, a source of one declared table
  routes every record to it.
* ``AR_H_*`` / ``AR_M_*`` headers and ``Op`` are not columns.

A DELETE carries only the key columns (DMS sends the deleted row or its key). Any other record
is the whole row: a nullable column of the contract it leaves out is null — DMS leaves NULL
columns out of its messages unless the endpoint's ``IncludeNullAndEmpty`` is true (AWS DMS User
Guide, ``KafkaSettings`` / ``KinesisSettings``: "The default is false") — not unchanged as in a
flat or Debezium record that leaves a column out.

Control records (``record-type`` ``control``: a message with ``control`` and no ``data``, of a
table declared or not) are skipped as ``control`` before routing (:meth:`DmsDecoder.skip_of`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from cdcflow.model.contracts import TableContract, canonical_json
from cdcflow.plan.rules import Rejection
from cdcflow.sources.formats import Decoded, Skipped, put_path
from cdcflow.sources.formats.debezium import envelope_heads

_DIGITS = re.compile(r"^[0-9]+$")
_JSON_OPERATIONS = {"load": "INSERT", "insert": "INSERT", "update": "UPDATE", "delete": "DELETE"}
_FLAT_OPERATIONS = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}
#: Positions of the JSON flavour: a full-load row before every change.
LOAD_POSITION, CHANGE_POSITION = "0", "1"
EPOCH = "1970-01-01T00:00:00Z"


def _is_message(record: dict[str, Any]) -> bool:
    metadata = record.get("metadata")
    if not isinstance(metadata, dict):
        return False
    return "data" in record or "control" in record or metadata.get("record-type") == "control"


def _has_path(row: dict[str, Any], dotted: str) -> bool:
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _digest(record: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(record).encode("utf-8")).hexdigest()[:32]


def _header(name: str) -> bool:
    return name == "Op" or name.startswith(("AR_H_", "AR_M_"))


def _flat_time(text: Any) -> str | None:
    """``YYYY-MM-DD HH:MM:SS.ffffff`` (UTC, DMS's header format) → ISO-8601 ``…Z``."""
    if not isinstance(text, str) or not text.strip():
        return None
    value = text.strip().replace(" ", "T", 1)
    if value.endswith("Z") or "+" in value[10:] or "-" in value[10:]:
        return value
    return value + "Z"


class DmsDecoder:
    """Decodes AWS DMS records of either flavour (module doc).

    Args:
        truncate: unused (DMS sends no truncate as a data record); kept for one signature.
    """

    name = "dms"

    def __init__(self, truncate: str = "quarantine") -> None:
        self.truncate = truncate

    def table_of(self, record: Any) -> str | None:
        """``metadata.table-name`` (JSON messages) or ``AR_M_SOURCE_TABLE_NAME`` (flat)."""
        if not isinstance(record, dict):
            return None
        if _is_message(record):
            name = record["metadata"].get("table-name")
        else:
            name = record.get("AR_M_SOURCE_TABLE_NAME")
        return name.strip() if isinstance(name, str) and name.strip() else None

    def skip_of(self, record: Any) -> Skipped | None:
        """A control message (``metadata.record-type`` ``control``), whatever table it names:
        skipped; else None."""
        if (
            isinstance(record, dict)
            and _is_message(record)
            and record["metadata"].get("record-type") == "control"
        ):
            return Skipped("control", "an AWS DMS control record")
        return None

    def decode(self, record: Any, contract: TableContract) -> Decoded:
        """A DMS record → the flat record of ``contract`` (module doc). Never raises."""
        try:
            if not isinstance(record, dict):
                return Rejection("MALFORMED_JSON", "not an AWS DMS record (not a JSON object)")
            if _is_message(record):
                return self._message(record, contract)
            return self._flat(record, contract)
        except Exception as exc:  # a record is data, never a stream-stopping error
            return Rejection("MALFORMED_JSON", f"undecodable AWS DMS record ({type(exc).__name__})")

    @staticmethod
    def _row(row: Any, operation: str, contract: TableContract) -> dict[str, Any] | Rejection:
        """The row's columns (a DELETE: its key columns; any other operation: the whole row,
        a nullable column it leaves out null, module doc), or a rejection when a column has
        the name of a field of the flat record."""
        row = row if isinstance(row, dict) else {}
        if operation == "DELETE":
            keys = [contract.column(k).field for k in contract.keys]
            row = {name: row[name] for name in keys if name in row}
        out = {name: value for name, value in row.items() if not _header(name)}
        reserved = envelope_heads(contract) & set(out)
        if reserved:
            return Rejection(
                "SCHEMA_MISMATCH",
                f"source column {sorted(reserved)[0]} has the name of a field of the flat "
                "record: rename it at the source",
            )
        if operation != "DELETE":
            for column in contract.columns:
                left_out = not _has_path(out, column.field)
                if left_out and column.nullable and column.name not in contract.keys:
                    put_path(out, column.field, None)
        return out

    def _message(self, record: dict[str, Any], contract: TableContract) -> Decoded:
        metadata: dict[str, Any] = record["metadata"]
        if metadata.get("record-type") == "control":
            return Skipped("control", "an AWS DMS control record")
        raw_op = metadata.get("operation")
        op = raw_op.strip().lower() if isinstance(raw_op, str) else ""
        operation = _JSON_OPERATIONS.get(op)
        if operation is None:
            return Rejection(
                "INVALID_OPERATION", "metadata.operation is not load, insert, update or delete"
            )
        flat = self._row(record.get("data"), operation, contract)
        if isinstance(flat, Rejection):
            return flat
        tx, rec = metadata.get("transaction-id"), metadata.get("transaction-record-id")
        if _DIGITS.match(str(tx or "")) and _DIGITS.match(str(rec if rec is not None else "")):
            event_id = f"dms-{int(str(tx)):020d}-{int(str(rec)):010d}"
        else:
            event_id = f"dms-{_digest(record)}"
        is_load = op == "load"
        put_path(flat, contract.event_id_field, event_id)
        put_path(flat, contract.operation_field, operation)
        if metadata.get("timestamp") is not None:
            put_path(flat, contract.timestamp_field, metadata["timestamp"])
        data = record.get("data")
        change_seq = data.get("AR_H_CHANGE_SEQ") if isinstance(data, dict) else None
        if is_load:
            position: Any = LOAD_POSITION
        elif change_seq is not None and str(change_seq).strip():
            position = change_seq  # the task adds the header column: the source's order
        else:
            position = CHANGE_POSITION
        put_path(flat, contract.lsn_field, position)
        out_meta = flat.setdefault("metadata", {})
        if isinstance(out_meta, dict):
            out_meta.setdefault(
                "source_table", f"{metadata.get('schema-name', '')}.{metadata.get('table-name')}"
            )
            out_meta.setdefault("tx_id", None if tx is None else str(tx))
        return flat

    def _flat(self, record: dict[str, Any], contract: TableContract) -> Decoded:
        raw_op = record.get("Op")
        if raw_op is None or (isinstance(raw_op, str) and not raw_op.strip()):
            operation, is_load = "INSERT", True
        elif isinstance(raw_op, str) and raw_op.strip().upper() in _FLAT_OPERATIONS:
            operation, is_load = _FLAT_OPERATIONS[raw_op.strip().upper()], False
        else:
            return Rejection("INVALID_OPERATION", "Op is not I, U or D (AWS DMS flat record)")
        sequence = record.get("AR_H_CHANGE_SEQ")
        if operation == "INSERT" and (sequence is None or not str(sequence).strip()):
            is_load = True  # a full-load row written with Op I (includeOpForFullLoad)
        flat = self._row(record, operation, contract)
        if isinstance(flat, Rejection):
            return flat
        stream_position = record.get("AR_H_STREAM_POSITION")
        if is_load:
            event_id = f"dms-load-{_digest(record)}"
            lsn: Any = "0"
        else:
            lsn = sequence
            if isinstance(stream_position, str) and stream_position.strip():
                event_id = stream_position.strip()
            elif sequence is not None and str(sequence).strip():
                event_id = f"dms-{str(sequence).strip()}"
            else:  # no position (NULL_LSN): an id of its own, not a shared "dms-None"
                event_id = f"dms-{_digest(record)}"
        put_path(flat, contract.event_id_field, event_id)
        put_path(flat, contract.operation_field, operation)
        stamp = _flat_time(record.get("AR_H_TIMESTAMP")) or _flat_time(
            record.get("AR_H_COMMIT_TIMESTAMP")
        )
        if stamp is None and is_load:
            stamp = EPOCH
        if stamp is not None:
            put_path(flat, contract.timestamp_field, stamp)
        if lsn is not None:
            put_path(flat, contract.lsn_field, lsn)
        out_meta = flat.setdefault("metadata", {})
        if isinstance(out_meta, dict):
            table = record.get("AR_M_SOURCE_TABLE_NAME")
            schema = record.get("AR_M_SOURCE_SCHEMA") or ""
            out_meta.setdefault("source_table", f"{schema}.{table}" if table else None)
            tx = record.get("AR_H_TRANSACTION_ID")
            out_meta.setdefault("tx_id", None if tx is None else str(tx))
        return flat


__all__ = ["DmsDecoder"]
