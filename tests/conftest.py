"""Shared helpers: a pipeline in a temporary folder, landing-file writer, table readers."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, settings

from cdcflow.config import CdcflowConfig
from cdcflow.engines.local.delta import read_arrow
from cdcflow.pipeline import Pipeline, Trigger
from cdcflow.plan.reference import SILVER_COLUMNS
from tests.oracle import Expected, Oracle

#: Hypothesis profiles: ``ci`` (default; derandomized, so every CI run checks the same
#: examples) and ``deep`` (many random examples: ``pytest --hypothesis-profile=deep``, or
#: ``HYPOTHESIS_PROFILE=deep``); ``noshrink`` (below). Tests that set ``max_examples``
#: themselves keep their count.
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile(
    "ci", max_examples=30, derandomize=True, deadline=None, suppress_health_check=_QUIET
)
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=_QUIET)
#: ``ci``'s examples without shrinking: a quick yes/no when checking that a planted bug is caught
settings.register_profile(
    "noshrink",
    parent=settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

NOW = datetime.now(UTC).replace(microsecond=0)
REPO = Path(__file__).resolve().parents[1]
PG_PORT = int(os.environ.get("CDCFLOW_PG_PORT", "55432"))
KAFKA_PORT = int(os.environ.get("CDCFLOW_KAFKA_PORT", "39092"))
BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"

#: The Spark master of the Spark tests: ``local[2]``, or the URL of the standalone cluster of
#: ``scripts/spark/cluster.sh`` (``spark://127.0.0.1:<port>``), which
#: tests/test_spark_cluster.py sets for a second run of the Spark conformance and crash tests.
SPARK_MASTER = os.environ.get("CDCFLOW_TEST_SPARK_MASTER", "local[2]")
#: Settings of an application on that cluster: two executors of one core (one on each worker,
#: in JVMs of their own) and little memory, so that two applications (the shared session and a
#: killed child's) fit on the two workers at once; the driver on 127.0.0.1 only.
CLUSTER_CONF = {
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.executor.memory": "512m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def spark_section() -> dict[str, Any]:
    """The ``spark`` config section of the tests' pipelines: :data:`SPARK_MASTER`, with
    :data:`CLUSTER_CONF` when that is a cluster."""
    conf = {} if SPARK_MASTER.startswith("local") else dict(CLUSTER_CONF)
    return {"master": SPARK_MASTER, "conf": conf}


#: pytest-xdist groups (``make test`` runs ``-n 3 --dist loadgroup``): every test of a group runs
#: on the same worker, so one JVM serves all Spark tests, one worker talks to the PostgreSQL
#: server, and the docs walk-through (its own Spark and PostgreSQL) runs beside the rest. The
#: Spark crash chain (the longest test) has a worker and a SparkSession of its own.
XDIST_GROUPS = {
    "spark_crash": "spark_crash",
    "spark_cluster": "spark_cluster",
    "spark": "spark",
    "kafka": "kafka_broker",
    "postgres": "pg_server",
    "docs": "docs",
    "objectstore": "object_store",
}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Put a test of a group (its marker, or the group's session fixture) in its xdist group.

    Done as each test is collected: xdist reads the groups in its own
    pytest_collection_modifyitems, which may run before this conftest's.
    """
    fixtures = getattr(item, "fixturenames", ())
    for group, fixture in XDIST_GROUPS.items():
        if item.get_closest_marker(group) is not None or fixture in fixtures:
            item.add_marker(pytest.mark.xdist_group(group))
            return


#: Order of the work units handed to the xdist workers (``--no-loadscope-reorder``: in
#: collection order): the long serial groups first, each starting at once on a worker of its
#: own (the Spark crash chain, ~500 s, used to start only after a few hundred short tests and
#: finish alone at the end), then the short tests filling the workers as they free up.
GROUP_ORDER = (
    "spark_crash",
    "spark_cluster",
    "spark",
    "docs",
    "kafka",
    "postgres",
    "objectstore",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`GROUP_ORDER` first, in that order (stable otherwise)."""

    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        name = marker.args[0] if marker is not None and marker.args else None
        return GROUP_ORDER.index(name) if name in GROUP_ORDER else len(GROUP_ORDER)

    items.sort(key=rank)


#: Services a test fixture started, stopped when the whole run ends: one line of JSON per stop
#: command (``{"argv": [...], "env": {...}}``). Under xdist each worker has its own session,
#: and a worker whose session ends first must not stop a broker or server that the tests of
#: another worker still use; so the stops run once, in the controller's
#: :func:`pytest_sessionfinish` (in a run without xdist: the one process's).
#: (A nested run, tests/test_spark_cluster.py's, has a file of its own:
#: ``$CDCFLOW_TEST_STOPS_FILE``.)
STOPS_FILE = Path(os.environ.get("CDCFLOW_TEST_STOPS_FILE") or REPO / ".pytest-service-stops")


def stop_after_run(argv: list[str], env: dict[str, str]) -> None:
    """Have the controller run ``argv`` (in the repository, with the ``CDCFLOW_*`` variables of
    ``env``) when the test run ends."""
    kept = {k: v for k, v in env.items() if k.startswith("CDCFLOW_")}
    with STOPS_FILE.open("a") as out:
        out.write(json.dumps({"argv": argv, "env": kept}) + "\n")


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The controller forgets the stops of an earlier run that did not reach its end."""
    if _is_controller(session.config):
        STOPS_FILE.unlink(missing_ok=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every process removes the stage folder fakesnow made when a test imported it
    (``/tmp/fakesnow_bucket_*``; an xdist worker leaves with ``os._exit``, so no exit handler
    runs); the controller then stops what the fixtures started (Connect before its broker:
    last first)."""
    import shutil
    import sys

    stage = sys.modules.get("fakesnow.transforms.stage")
    if stage is not None:
        shutil.rmtree(stage.LOCAL_BUCKET_PATH, ignore_errors=True)
    if not _is_controller(session.config) or not STOPS_FILE.exists():
        return
    stops = [json.loads(line) for line in STOPS_FILE.read_text().splitlines() if line]
    STOPS_FILE.unlink(missing_ok=True)
    for stop in reversed(stops):
        subprocess.run(
            stop["argv"], env={**os.environ, **stop["env"]}, cwd=REPO,
            capture_output=True, timeout=180, check=False,
        )  # fmt: skip


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The local PostgreSQL of ``scripts/postgres`` (port ``$CDCFLOW_PG_PORT``, default 55432,
    data ``$CDCFLOW_PG_DATA``, default ``<repo>/.pgdata``); yields the admin DSN.

    Reuses a running server (``make test`` starts one with ``scripts/with-services.sh``);
    otherwise starts it and stops it at the end of the test run, deleting its data folder when
    this fixture created it (start.sh may have put it under /var/tmp). Fails — never skips —
    when the server cannot start, with start.sh's reason (e.g. wal2json not installed).
    """
    env = {**os.environ, "CDCFLOW_PG_PORT": str(PG_PORT)}
    env.setdefault("CDCFLOW_PG_DATA", str(REPO / ".pgdata"))
    created = not (Path(env["CDCFLOW_PG_DATA"]) / "PG_VERSION").exists()
    done = subprocess.run(
        ["bash", str(REPO / "scripts/postgres/start.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (
        f"PostgreSQL did not start (`make test` installs it with scripts/postgres/install.sh):"
        f"\n{done.stdout}\n{done.stderr}"
    )
    if "postgres: started" in done.stdout:
        stop_after_run(["bash", "scripts/postgres/stop.sh", *(["--purge"] if created else [])], env)
    yield done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """The broker of ``scripts/kafka/start.sh`` (installed from Maven on first use); stopped at
    the end of the test run when this fixture started it. Fails — never skips — when it cannot
    start."""
    env = {**os.environ, "CDCFLOW_KAFKA_PORT": str(KAFKA_PORT)}
    done = subprocess.run(
        ["bash", str(REPO / "scripts/kafka/start.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, f"Kafka did not start:\n{done.stdout}\n{done.stderr}"
    if "kafka: started" in done.stdout:
        stop_after_run(["bash", "scripts/kafka/stop.sh"], env)
    yield BOOTSTRAP


@pytest.fixture(scope="session")
def kafka_connect(kafka_broker: str) -> Iterator[str]:
    """Kafka Connect standalone with the Debezium PostgreSQL plugin (``start.sh --connect``);
    only Connect is stopped at the end of the run when this fixture started it."""
    env = {**os.environ, "CDCFLOW_KAFKA_PORT": str(KAFKA_PORT)}
    done = subprocess.run(
        ["bash", str(REPO / "scripts/kafka/start.sh"), "--connect"],
        env=env, capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, f"Kafka Connect did not start:\n{done.stdout}\n{done.stderr}"
    if "connect: started" in done.stdout:
        stop_after_run(["bash", "scripts/kafka/stop.sh", "--connect"], env)
    yield "127.0.0.1:38083"


@pytest.fixture(scope="session")
def emulator() -> Iterator[dict[str, Any]]:
    """The fakesnow HTTP server on a free port of 127.0.0.1, in memory, for the whole session
    (of one xdist worker)."""
    from cdcflow.sinks.snowflake.connection import (
        remove_stage_folders,
        start_emulator,
        stop_emulator,
    )

    kwargs = start_emulator(":memory:")
    yield kwargs
    stop_emulator()
    remove_stage_folders()


def require_spark() -> None:
    """Fail (never skip) when the Spark extra is missing: a skipped Spark test would let a
    Spark regression pass unseen. ``make test`` installs it."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        pytest.fail(
            "the spark extra is not installed: run `make test` (or `uv sync --extra spark`)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession every Spark test shares (started on first use), on
    :data:`SPARK_MASTER`, with the S3A connector's jars (a storage root on S3): the tests of
    the Spark engine on the local S3 server use it too (the endpoint and keys are set on it when
    their engine starts: engines/spark/session.py)."""
    require_spark()
    from cdcflow.config import SparkSection, StorageSection
    from cdcflow.engines.spark.session import get_session

    session = get_session(
        SparkSection(**spark_section()), StorageSection(root=f"{STORE_ROOTS['s3']}/spark")
    )
    yield session
    session.stop()


class Lake:
    """A pipeline rooted in a temporary folder."""

    def __init__(
        self, root: Path, mode: str = "soft", max_files: int = 1000, store: str | None = None
    ) -> None:
        """``store``: an object-store prefix (``s3://bucket/prefix``) for the tables and the
        checkpoint instead of ``root`` (the landing folder stays under ``root``)."""
        self.root = root
        self.landing = root / "landing"
        self.landing.mkdir(parents=True, exist_ok=True)
        self.files_written = 0
        self.mode = mode
        lake = f"{store.rstrip('/')}/lake" if store else str(root / "lake")
        self.config = CdcflowConfig(
            storage={"root": lake},
            source={"path": str(self.landing), "max_files_per_trigger": max_files},
            checkpoint={"location": f"{lake}/_checkpoints/customers"},
            processing={"delete_mode": mode},
            spark=spark_section(),
        )
        self.arrival: list[str | bytes] = []
        #: (landing file name, 1-based line number) of every line of ``arrival``
        self.positions: list[tuple[str, int]] = []

    def write(self, records: Iterable[dict[str, Any] | str | bytes], gz: bool = False) -> Path:
        """Write one landing file (mtime after every earlier file)."""
        self.files_written += 1
        path = self.landing / (f"f{self.files_written:05d}.jsonl" + (".gz" if gz else ""))
        lines = []
        for record in records:
            if isinstance(record, dict):
                line: str | bytes = json.dumps(record)
            else:
                line = record
            self.arrival.append(line)
            self.positions.append((path.name, len(lines) + 1))
            lines.append(line.encode() if isinstance(line, str) else line)
        data = b"\n".join(lines) + b"\n"
        if gz:
            import gzip

            path.write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)
        stamp = 1_700_000_000 + self.files_written
        os.utime(path, (stamp, stamp))
        return path

    def write_stream(self, records: list[Any], cuts: list[int], seed: int) -> None:
        """Shuffle ``records`` (seeded) and write them as files of ``cuts`` sizes, cycling."""
        random.Random(seed).shuffle(records)
        start, cut = 0, 0
        while start < len(records):
            size = cuts[cut % len(cuts)]
            self.write(records[start : start + size])
            start, cut = start + size, cut + 1

    def run(self, trigger: str = "available-now") -> list[Any]:
        return Pipeline(self.config).run(Trigger.parse(trigger))

    def table(self, name: str) -> pl.DataFrame:
        frame = pl.from_arrow(read_arrow(DeltaTable(self.config.table_uri(name))))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def silver(self) -> dict[str, dict[str, Any]]:
        rows = self.table("silver/customers").select(SILVER_COLUMNS).to_dicts()
        return {row["customer_id"]: row for row in rows}

    def expected(self) -> Expected:
        """Silver and tombstones by the independent oracle (``tests/oracle.py``) from every
        line written so far, in arrival order."""
        return Oracle().silver(self.arrival, self.mode)

    def verdicts(self) -> list[tuple[int, str, Any]]:
        """The oracle's verdict on every non-blank line written so far (see ``Oracle.judge``)."""
        return Oracle().judge(self.arrival)

    def outcomes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in (
            self.table("audit/event_outcomes")
            .sort("batch_id", "source_file", "source_line")
            .to_dicts()
        ):
            out.setdefault(row["event_id"], []).append(row["outcome"])
        return out

    def quarantine_reasons(self) -> list[str]:
        return (
            self.table("quarantine/customer_events")
            .sort("source_file", "source_line")["failure_reason"]
            .to_list()
        )


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "soft")


@pytest.fixture
def hard_lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "hard", mode="hard")


def ev(
    event_id: str,
    customer_id: str,
    operation: str,
    lsn: Any,
    minutes_ago: float = 60,
    **attrs: Any,
) -> dict[str, Any]:
    """A flat-format event; attributes given as keyword arguments (partial by default)."""
    ts = (NOW - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")
    return {
        "event_id": event_id,
        "customer_id": customer_id,
        "operation": operation,
        "event_timestamp": ts,
        **attrs,
        "metadata": {"source_table": "customers", "lsn": lsn, "tx_id": f"TX-{event_id}"},
    }


def full(**overrides: Any) -> dict[str, Any]:
    """A full attribute image."""
    base = {
        "customer_name": "Aarav Sharma",
        "email": "aarav@example.com",
        "phone": "+91-9876543210",
        "city": "Bengaluru",
        "country": "India",
        "status": "ACTIVE",
    }
    base.update(overrides)
    return base


def _start_object_server(kind: str) -> str:
    """Start (if needed) a server of ``scripts/objectstore/server.sh``; its endpoint URL.

    A server this run started is stopped when the test run ends (by the xdist controller).
    """
    script = ["bash", "scripts/objectstore/server.sh"]
    status = subprocess.run([*script, "status", kind], cwd=REPO, capture_output=True, check=False)
    out = subprocess.run(
        [*script, "start", kind],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"the {kind} server did not start: {out.stderr[-2000:]}"
    if status.returncode != 0:  # it was not running: this run started it
        stop_after_run([*script, "stop", kind], dict(os.environ))
    return out.stdout.strip().splitlines()[-1].split(": ", 1)[1]


#: the Azure Storage emulator's well-known development account (Azurite's documentation)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@pytest.fixture(scope="session")
def s3_server() -> str:
    """The local S3-compatible server (moto, started by ``scripts/objectstore/server.sh``),
    with the environment every client reads (``AWS_*``: delta-rs, obstore, a child ``cdcflow``)
    pointing at it and one bucket, ``cdcflow-tests``. Returns the endpoint URL."""
    import urllib.error
    import urllib.request

    endpoint = _start_object_server("s3")
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="cdcflow-test",
        AWS_SECRET_ACCESS_KEY="cdcflow-test",
        AWS_REGION="us-east-1",
    )
    request = urllib.request.Request(f"{endpoint}/cdcflow-tests", method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=30):
            pass
    except urllib.error.HTTPError as exc:  # 409: it exists (a server of an earlier session)
        assert exc.code == 409, exc
    return endpoint


@pytest.fixture(scope="session")
def azurite_server() -> str:
    """The Azure Storage emulator Azurite (npm, started by ``scripts/objectstore/server.sh``),
    with the ``AZURE_*`` environment of its development account and one container,
    ``cdcflow-tests``. Returns the blob endpoint URL."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    endpoint = _start_object_server("azurite")
    os.environ.update(
        AZURE_STORAGE_USE_EMULATOR="true",
        AZURITE_BLOB_STORAGE_URL=endpoint,
        AZURE_STORAGE_ACCOUNT_NAME=AZURITE_ACCOUNT,
        AZURE_STORAGE_ACCOUNT_KEY=AZURITE_KEY,
        AZURE_ALLOW_HTTP="true",
    )
    client = BlobServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )
    with contextlib.suppress(ResourceExistsError):
        client.create_container("cdcflow-tests")
    return endpoint


#: URI scheme and bucket/container of each object-store server's test data
STORE_ROOTS = {"s3": "s3://cdcflow-tests", "azurite": "az://cdcflow-tests"}


@pytest.fixture(params=sorted(STORE_ROOTS), scope="module")
def object_store(request: pytest.FixtureRequest) -> str:
    """Each object-store server in turn (its fixture started): ``s3`` or ``azurite``."""
    request.getfixturevalue(f"{request.param}_server")
    return str(request.param)


def fresh_prefix(store: str, name: str) -> str:
    """A new prefix on ``store`` (``s3``/``azurite``): ``<bucket URI>/<name>-<random>``."""
    import re
    import uuid

    clean = re.sub(r"[^A-Za-z0-9-]+", "-", name)[:60]
    return f"{STORE_ROOTS[store]}/{clean}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store_prefix(object_store: str, request: pytest.FixtureRequest) -> str:
    """A fresh prefix on the current object-store server."""
    return fresh_prefix(object_store, request.node.name)
