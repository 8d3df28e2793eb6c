"""OpenLineage run events of the micro-batches, received by a loopback HTTP endpoint (the
``http`` transport of openlineage-python, as Marquez receives them) and checked as a graph:
landing folder → each table the batch writes, with the tables' real schemas."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdcflow.config import CdcflowConfig
from cdcflow.errors import CdcflowError
from cdcflow.generator import GeneratorConfig, generate
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.state.checkpoint import Checkpoint


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A lineage endpoint on 127.0.0.1: (its URL, the events it received, in order)."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            assert self.path == "/api/v1/lineage"
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()


def _config(root: Path, url: str) -> CdcflowConfig:
    return CdcflowConfig(
        pipeline={"name": "customers"},
        storage={"root": str(root / "lake")},
        source={"path": str(root / "landing"), "max_files_per_trigger": 2},
        checkpoint={"location": str(root / "checkpoint")},
        lineage={"transport": "http", "url": url, "namespace": "tests"},
    )


def test_each_micro_batch_is_a_run_from_the_landing_folder_to_its_tables(
    tmp_path: Path, receiver: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = receiver
    generate(tmp_path / "landing", GeneratorConfig(events=200, customers=30, files=4, seed=5))
    config = _config(tmp_path, url)
    reports = Pipeline(config).run(Trigger.parse("available-now"))
    assert [r.batch_id for r in reports] == [0, 1]

    assert [e["eventType"] for e in received] == ["START", "COMPLETE", "START", "COMPLETE"]
    runs = [e["run"]["runId"] for e in received]
    assert runs[0] == runs[1] != runs[2] == runs[3]  # one run per micro-batch
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    for batch_id, start in ((0, received[0]), (1, received[2])):
        recorded = checkpoint.offsets(batch_id).processing_time
        assert start["eventTime"] == recorded.isoformat()  # START: the batch's processing time
    for event in received:
        job = event["job"]
        assert (job["namespace"], job["name"]) == ("tests", "customers.micro_batch")
        inputs = [(i["namespace"], i["name"]) for i in event["inputs"]]
        assert inputs == [("file", str(tmp_path / "landing"))]
        outputs = {o["name"]: o for o in event["outputs"]}
        for table in (
            "bronze/customer_events",
            "quarantine/customer_events",
            "silver/customers",
            "silver/customer_history",
            "audit/event_outcomes",
            "audit/batch_log",
            "gold/active_customers",
        ):
            path = config.table_uri(table)
            assert outputs[path]["namespace"] == "file"
            fields = [f["name"] for f in outputs[path]["facets"]["schema"]["fields"]]
            # the facet's columns are the written table's, in order
            assert fields == DeltaTable(path).schema().to_arrow().names, table
        assert "silver/customer_tombstones" not in " ".join(outputs)  # soft mode: not written
    text = json.dumps(received)
    assert "@example.com" not in text  # names, paths, types and times only


def test_a_failed_micro_batch_sends_fail_and_a_dead_backend_stops_nothing(
    tmp_path: Path, receiver: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = receiver
    generate(tmp_path / "landing", GeneratorConfig(events=100, customers=20, files=2, seed=6))
    pipeline = Pipeline(_config(tmp_path, url))

    def broken(offsets: Any) -> Any:
        raise CdcflowError("disk full")

    monkeypatch.setattr(pipeline.engine, "run_batch", broken)
    with pytest.raises(CdcflowError, match="disk full"):
        pipeline.run(Trigger.parse("available-now"))
    assert [e["eventType"] for e in received] == ["START", "FAIL"]
    assert received[0]["run"]["runId"] == received[1]["run"]["runId"]

    # the backend gone: the re-run of the batch completes all the same
    dead = _config(tmp_path, "http://127.0.0.1:9")  # discard port: nothing listens
    reports = Pipeline(dead).run(Trigger.parse("available-now"))
    assert [r.batch_id for r in reports] == [0]
    assert Checkpoint(tmp_path / "checkpoint").is_committed(0)


def test_http_transport_needs_a_url() -> None:
    with pytest.raises(ValueError, match="url: required"):
        CdcflowConfig(lineage={"transport": "http"})
