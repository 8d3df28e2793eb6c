"""wal2json decoding without a server: pure LSN and ordering checks (no postgres marker)."""

from __future__ import annotations

import json

from cdcflow.model.events import sequence_of
from cdcflow.model.lsn import parse_lsn
from cdcflow.plan.rules import parse_event_timestamp
from cdcflow.sources.postgres_decode import decode_rows
from tests.test_postgres import _change


def test_lsn_past_4gib_orders_numerically_in_events_and_files() -> None:
    """Changes on both sides of 0/FFFFFFFF keep WAL order in metadata.lsn and sequences."""
    begin = json.dumps({"action": "B", "xid": 9, "lsn": "1/10", "nextlsn": "1/40"})
    rows = [
        ("0/FFFFFF00", begin),
        ("0/FFFFFF00", _change("U", "0/FFFFFF00", "C-1", city="Lyon")),
        ("1/8", _change("D", "1/8", "C-1")),
        ("1/20", _change("I", "1/20", "C-1", status="ACTIVE", city="Nice")),
        ("1/40", json.dumps({"action": "C", "xid": 9, "lsn": "1/10", "nextlsn": "1/40"})),
    ]
    decoded = decode_rows(rows)
    assert decoded.end_lsn == parse_lsn("1/40") == (1 << 32) + 0x40
    events = decoded.events
    assert [e["operation"] for e in events] == ["UPDATE", "DELETE", "INSERT"]
    assert [e["metadata"]["lsn"] for e in events] == ["0/FFFFFF00", "1/8", "1/20"]
    assert [e["event_id"] for e in events] == ["pg-1/10-000000", "pg-1/10-000001", "pg-1/10-000002"]
    # "1/8" < "0/FFFFFF00" as text, but the sequences order numerically
    sequences = [
        sequence_of(
            parse_lsn(e["metadata"]["lsn"]),
            parse_event_timestamp(e["event_timestamp"]),
            e["event_id"],
        )
        for e in events
    ]
    assert sequences == sorted(sequences)
    assert events[0]["event_timestamp"] == "2025-05-12T08:00:00.500000Z"
    assert "city" not in events[1] and events[2]["city"] == "Nice"
    # landing file names (16 hex digits per LSN) also sort numerically
    names = [f"pg_{n:016X}" for n in (parse_lsn("0/FFFFFFFF"), parse_lsn("1/0"), parse_lsn("A/0"))]
    assert names == sorted(names)
    # a re-read decodes to identical events (deterministic ids and content)
    assert decode_rows(rows).events == events
