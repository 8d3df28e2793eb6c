"""OpenLineage run events of each micro-batch (config section ``lineage``).

Per micro-batch one run (a new UUID per attempt) of the job ``<pipeline.name>.micro_batch`` in
``lineage.namespace``: a ``START`` event when the batch starts (its processing time), then
``COMPLETE`` after its commit marker, or ``FAIL`` when it raised. The Spark engine drives its own
micro-batches: both of its events are sent at the commit (``START`` dated with the batch's
processing time). Events follow the OpenLineage spec (https://openlineage.io/docs/spec/object-model)
and are sent by ``openlineage-python`` through the configured transport (console, file, HTTP).

Datasets (naming: https://openlineage.io/docs/spec/naming):

* inputs: the source — landing files (namespace ``file``, name: the folder's absolute path),
  PostgreSQL (``postgres://host:port``, ``<dbname>.<table>``) or Kafka (``kafka://<first
  bootstrap server>``, one dataset per configured topic or the topic pattern);
* outputs: per table (declared, else customers) its Bronze, quarantine, Silver, history and
  outcomes tables, ``audit/batch_log`` (declared tables: also ``audit/table_batch_log``), the
  Gold tables when refreshed per batch (customers) and the Snowflake table of an inline sync
  (``snowflake://<account or emulator>``, ``<database>.<schema>.<table>``). Delta tables:
  namespace ``file`` (or the object store's scheme and bucket), name: the table's path. Each
  Delta dataset carries a ``schema`` facet (column names and Arrow types).

Nothing personal is sent: names, paths, types and times only. Events are sent in order by a
background thread, so a slow or absent backend never delays a micro-batch; a run waits for the
events still queued when it ends, at most ``lineage.timeout_s`` (:meth:`LineageEmitter.flush`).
A transport that fails (backend down, bad URL; HTTP: two retries) is logged as a warning and
the pipeline goes on.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from cdcflow.config import CdcflowConfig
from cdcflow.errors import MissingDependencyError
from cdcflow.logs import get_logger
from cdcflow.report import BatchReport

if TYPE_CHECKING:
    import pyarrow as pa

log = get_logger("lineage")

#: The ``producer`` of every event.
PRODUCER = "https://github.com/cdcflow/cdcflow"


def _delta_dataset(config: CdcflowConfig, name: str) -> tuple[str, str]:
    """(namespace, name) of the Delta table ``name``: ``file`` + its path, or the object
    store's ``scheme://bucket`` + the path in it."""
    uri = config.table_uri(name)
    parsed = urlparse(uri)
    if parsed.scheme and parsed.scheme != "file" and "://" in uri:
        return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")
    return "file", uri


def _source_datasets(config: CdcflowConfig) -> list[tuple[str, str]]:
    source = config.source
    if source.type == "postgres":
        pg = source.postgres
        return [(f"postgres://{pg.host}:{pg.port}", f"{pg.dbname}.{pg.table}")]
    if source.type == "kafka":
        kafka = source.kafka
        server = kafka.bootstrap_servers.split(",")[0].strip()
        topics = kafka.topics or [kafka.topic_pattern]
        return [(f"kafka://{server}", topic) for topic in topics if topic]
    return [("file", str(os.path.abspath(source.path)))]


def _output_specs(config: CdcflowConfig) -> list[Any]:
    """The Delta table specs a micro-batch writes (module doc)."""
    from cdcflow.layers.contract_tables import contract_tables
    from cdcflow.layers.tables import BATCH_LOG

    specs: list[Any] = []
    for contract in config.contracts():
        tables = contract_tables(contract)
        specs += [tables.bronze, tables.quarantine, tables.silver, tables.history, tables.outcomes]
        if config.processing.delete_mode == "hard":
            specs.append(tables.tombstones)
    specs.append(BATCH_LOG)
    if config.tables:
        from cdcflow.engines.local.contracts import TABLE_BATCH_LOG

        specs.append(TABLE_BATCH_LOG)
    elif config.gold.refresh_every_batches:
        from cdcflow.layers.gold import GOLD_TABLES

        specs += list(GOLD_TABLES)
    return specs


class LineageEmitter:
    """Sends the OpenLineage events of a pipeline's micro-batches (module doc).

    Args:
        config: the pipeline's config; ``config.lineage`` says where events go.

    Raises:
        MissingDependencyError: ``openlineage-python`` is not installed.
    """

    def __init__(self, config: CdcflowConfig) -> None:
        try:
            from openlineage.client import OpenLineageClient
        except ImportError as exc:  # pragma: no cover - a dependency of the package
            raise MissingDependencyError(
                "lineage needs openlineage-python: pip install openlineage-python"
            ) from exc
        self.config = config
        settings = config.lineage
        self.namespace = settings.namespace
        self.job = f"{config.pipeline.name}.micro_batch"
        self.client = OpenLineageClient(config={"transport": self._transport()})
        self._runs: dict[int, str] = {}  # batch id -> the run id of its attempt
        self._inputs, self._outputs = self._datasets()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._sender = threading.Thread(target=self._send, name="cdcflow-lineage", daemon=True)
        self._sender.start()

    def _send(self) -> None:
        """The sender thread: each queued event in order."""
        while True:
            state, batch_id, event = self._queue.get()
            try:
                self.client.emit(event)
            except Exception as exc:  # a lineage backend never stops the pipeline
                log.warning(
                    "lineage event not sent",
                    extra={"state": state, "batch_id": batch_id, "error": type(exc).__name__},
                )
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued event is sent (or given up).

        Args:
            timeout_s: the longest wait, seconds (default ``lineage.timeout_s``).

        Returns:
            True when nothing is left in the queue.
        """
        deadline = time.monotonic() + (timeout_s or self.config.lineage.timeout_s)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        left = self._queue.unfinished_tasks
        if left:
            log.warning("lineage events not sent when the run ended", extra={"events": left})
        return not left

    def _transport(self) -> dict[str, Any]:
        settings = self.config.lineage
        if settings.transport == "console":
            return {"type": "console"}
        if settings.transport == "file":
            return {"type": "file", "log_file_path": settings.file, "append": True}
        transport: dict[str, Any] = {
            "type": "http",
            "url": settings.url,
            "endpoint": settings.endpoint,
            "timeout": settings.timeout_s,
            "retry": {"total": 2, "backoff_factor": 0.2},
        }
        key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
        if key:  # from the environment only; never logged
            transport["auth"] = {"type": "api_key", "apiKey": key}
        return transport

    def _datasets(self) -> tuple[list[Any], list[Any]]:
        from openlineage.client.event_v2 import InputDataset, OutputDataset

        sources = _source_datasets(self.config)
        inputs = [InputDataset(namespace=ns, name=name) for ns, name in sources]
        outputs = []
        for spec in _output_specs(self.config):
            namespace, name = _delta_dataset(self.config, spec.name)
            facets = {"schema": _schema(spec.schema)}
            outputs.append(OutputDataset(namespace=namespace, name=name, facets=facets))
        snowflake = self.config.snowflake
        if snowflake.mode == "inline":
            account = os.environ.get("SNOWFLAKE_ACCOUNT", "") or "fakesnow-emulator"
            for contract in self.config.contracts():
                target = contract.table_names.snowflake
                name = f"{snowflake.database}.{snowflake.schema_name}.{target}"
                outputs.append(OutputDataset(namespace=f"snowflake://{account}", name=name))
        return inputs, outputs

    def start(self, batch_id: int, started_at: datetime) -> None:
        """Send ``START`` for a new attempt at micro-batch ``batch_id`` (its processing time)."""
        self._runs[batch_id] = str(uuid.uuid4())
        self._emit("START", batch_id, started_at)

    def complete(self, report: BatchReport) -> None:
        """Send ``COMPLETE`` for a committed micro-batch (``START`` first when none was sent:
        the Spark engine)."""
        if report.batch_id not in self._runs:
            self.start(report.batch_id, report.started_at)
        self._emit("COMPLETE", report.batch_id, datetime.now(UTC))
        self._runs.pop(report.batch_id, None)

    def fail(self, batch_id: int | None) -> None:
        """Send ``FAIL`` for the attempt at ``batch_id`` (None: a batch not known yet)."""
        if batch_id is None or batch_id not in self._runs:
            batch_id = -1 if batch_id is None else batch_id
            self._runs[batch_id] = str(uuid.uuid4())
        self._emit("FAIL", batch_id, datetime.now(UTC))
        self._runs.pop(batch_id, None)

    def _emit(self, state: str, batch_id: int, when: datetime) -> None:
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

        event = RunEvent(
            eventType=RunState(state),
            eventTime=when.astimezone(UTC).isoformat(),
            run=Run(runId=self._runs[batch_id]),
            job=Job(namespace=self.namespace, name=self.job),
            producer=PRODUCER,
            inputs=self._inputs,
            outputs=self._outputs,
        )
        self._queue.put((state, batch_id, event))


def _schema(schema: pa.Schema) -> Any:
    from openlineage.client.facet_v2 import schema_dataset

    return schema_dataset.SchemaDatasetFacet(
        fields=[
            schema_dataset.SchemaDatasetFacetFields(name=field.name, type=str(field.type))
            for field in schema
        ]
    )


__all__ = ["PRODUCER", "LineageEmitter"]
