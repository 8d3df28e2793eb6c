"""Pipeline configuration: YAML file + ``${ENV_VAR}`` interpolation + ``CDCFLOW__SECTION__KEY``.

Precedence (highest first): environment overrides ``CDCFLOW__<SECTION>__<KEY>`` (for example
``CDCFLOW__PROCESSING__DELETE_MODE=hard``), then the YAML file, then the defaults below.
Unknown keys are errors that name the key and the file.

Durations are written as ``<number><unit>`` with unit ``ms``, ``s``, ``m``, ``h`` or ``d``
(``30d``, ``5m``, ``10s``), as a plain number of seconds, or as an ISO-8601 duration (``P30D``).
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cdcflow.errors import ConfigError
from cdcflow.model.contracts import CUSTOMERS, TableContract, parse_type

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def parse_duration(value: object) -> timedelta:
    """Parse ``30d`` / ``5m`` / ``10s`` / ``250ms`` / a number of seconds into a timedelta.

    Raises:
        ValueError: the text is not a non-negative duration.
    """
    parsed = _duration(value)
    if parsed < timedelta(0):  # a negative retention or skew would turn the rules around
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return parsed


def _duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):  # NaN, infinite
            raise ValueError(f"not a duration: {value!r}")
        return timedelta(seconds=float(value))
    match = _DURATION.match(str(value))
    if not match:
        try:  # ISO-8601 durations (P30D, PT5M), as pydantic serialises timedeltas
            return TypeAdapter(timedelta).validate_python(str(value).strip())
        except ValidationError:
            raise ValueError(f"not a duration (expected e.g. 30d, 5m, 10s): {value!r}") from None
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PipelineSection(_Section):
    """``pipeline``: name (used as the Delta app-transaction id) and engine."""

    name: str = Field(default="customers", pattern=r"^[A-Za-z0-9_.-]+$")
    engine: Literal["local", "spark"] = "local"


class StorageSection(_Section):
    """``storage``: root of every Delta table (local path or object-store URI)."""

    root: str = "./lakehouse"
    options: dict[str, str] = Field(default_factory=dict)

    @field_validator("root")
    @classmethod
    def _usable_root(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty (a local folder or an object-store URI)")
        if "://" not in value and re.search("%[0-9A-Fa-f]{2}", value):
            raise ValueError(
                "delta-rs reads '%XX' in a local path as an escaped character: choose a root "
                "without it"
            )
        return value


class PostgresSourceSection(_Section):
    """``source.postgres``: the PostgreSQL logical replication source (``source.type: postgres``).

    Connection: ``dsn`` (a libpq connection string or URI, without a password) or ``host``/
    ``port``/``dbname``/``user``. The password is never in the config: it comes from the
    environment variable named by ``password_env`` or the file named by ``password_file`` (or
    libpq's own ``PGPASSWORD``/``.pgpass``). ``slot_name``: the logical replication slot (created
    with ``plugin`` when missing); ``table``: ``schema.table`` whose changes are streamed;
    ``key_column``: its primary-key column holding the customer_id (both for the customers
    table; with a ``tables:`` section the slot streams every declared table, named like its
    contract, from the schema ``schema_name`` (default ``public``; ``*``: any schema):
    docs/postgres.md); ``max_changes_per_batch``:
    upper bound on decoded rows staged per micro-batch (whole transactions are always kept).
    """

    dsn: str = ""
    host: str = "127.0.0.1"
    port: int = Field(default=5432, ge=1, le=65535)
    dbname: str = "postgres"
    user: str = "postgres"
    password_env: str = "CDCFLOW_PG_PASSWORD"
    password_file: str = ""
    slot_name: str = Field(default="cdcflow_customers", pattern=r"^[a-z0-9_]{1,63}$")
    table: str = Field(
        default="public.customers", pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$"
    )
    key_column: str = Field(default="customer_id", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    schema_name: str = Field(default="public", pattern=r"^(\*|[A-Za-z_][A-Za-z0-9_]*)$")
    plugin: Literal["wal2json"] = "wal2json"
    max_changes_per_batch: int = Field(default=10000, ge=1)


class KafkaSourceSection(_Section):
    """``source.kafka``: the Kafka source (``source.type: kafka``, :mod:`cdcflow.sources.kafka`).

    ``bootstrap_servers``: ``host:port[,host:port…]``. ``topics``: topic names; and/or
    ``topic_pattern``: an RE2 pattern a topic name must fully match (topics created while
    running are picked up, as are partitions added to a topic). ``topic_tables``: topic →
    declared table; a topic not listed maps to the last dotted part of its name (Debezium's
    ``<prefix>.<schema>.<table>``). ``starting_offsets``: where a partition seen for the
    first time starts: ``earliest``, ``latest`` or an ISO-8601 instant (the first record at
    or after it). ``group_id``: the consumer group whose committed offsets are updated after
    each committed micro-batch, for monitoring only (empty: no commits); cdcflow's own
    checkpoint is the source of truth. ``options``: librdkafka settings passed through
    (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``…); ``secret_options_env``
    / ``secret_options_file``: a setting → the environment variable / file holding its value
    (``sasl.password``…), never in the config and never logged. ``poll_timeout``: how long a
    trigger waits for the records it planned before failing (the broker is down).
    """

    bootstrap_servers: str = "127.0.0.1:39092"
    topics: list[str] = Field(default_factory=list)
    topic_pattern: str = ""
    topic_tables: dict[str, str] = Field(default_factory=dict)
    starting_offsets: str = "earliest"
    group_id: str = ""
    options: dict[str, str] = Field(default_factory=dict)
    secret_options_env: dict[str, str] = Field(default_factory=dict)
    secret_options_file: dict[str, str] = Field(default_factory=dict)
    poll_timeout: Duration = timedelta(seconds=60)

    @field_validator("starting_offsets")
    @classmethod
    def _start(cls, value: str) -> str:
        if value in ("earliest", "latest"):
            return value
        try:
            instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("earliest, latest or an ISO-8601 instant") from None
        # no offset: UTC, on both engines (never the machine's time zone)
        return value if instant.tzinfo is not None else f"{value}+00:00"

    @field_validator("topic_pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        if value:
            import re2

            options = re2.Options()
            options.log_errors = False
            try:
                re2.compile(value, options)
            except re2.error as exc:
                detail = exc.args[0] if exc.args else exc
                if isinstance(detail, bytes):
                    detail = detail.decode("utf-8", "replace")
                raise ValueError(f"not an RE2 pattern: {detail}") from None
        return value


class SourceSection(_Section):
    """``source``: landing folder of JSON-lines files and the micro-batch size limit.

    ``min_file_age``: a landing file modified more recently than this is left for a later
    trigger (for writers that append in place instead of renaming a finished file; 0 = off).

    ``max_records_per_trigger`` / ``max_bytes_per_trigger`` (default: no limit) bound a
    micro-batch by lines and bytes as well as by ``max_files_per_trigger``: a large file is cut
    at a line boundary and the next micro-batch continues it from that byte (the range is in
    the checkpoint's offset log; :func:`cdcflow.sources.files.cut_landing`). A gzip file is
    never cut. The local engines only (the Spark engine bounds its micro-batches by files).

    ``type: postgres`` stages the changes of a PostgreSQL replication slot into the landing
    folder before each micro-batch (settings in ``postgres``; see ``cdcflow.sources.postgres``).

    ``format``: the records' format — ``flat`` (cdcflow's own, the default), ``debezium``
    (Debezium change-event values) or ``dms`` (AWS DMS records), decoded to the flat record of
    each declared table (:mod:`cdcflow.sources.formats`); a table's own ``format`` overrides it.
    A format other than ``flat`` needs a ``tables:`` section.
    """

    type: Literal["files", "postgres", "kafka"] = "files"
    format: Literal["flat", "debezium", "dms"] = "flat"
    path: str = "./landing"
    max_files_per_trigger: int = Field(default=1000, ge=1)
    max_records_per_trigger: int | None = Field(default=None, ge=1)
    max_bytes_per_trigger: int | None = Field(default=None, ge=1)
    min_file_age: Duration = timedelta(0)
    postgres: PostgresSourceSection = Field(default_factory=PostgresSourceSection)
    kafka: KafkaSourceSection = Field(default_factory=KafkaSourceSection)


class CheckpointSection(_Section):
    """``checkpoint``: where the offset log, commit log and run lock live: a local folder or
    an object-store URI (``s3://``, ``az://``/``abfss://``, ``gs://``; credentials and
    endpoints from ``storage.options`` and the environment). ``lease_ttl``: on an object
    store the run lock is a lease renewed every third of this; a killed run's lease ends
    after it (default 30s). Without ``location``: ``./lakehouse/_checkpoints/customers``, or
    ``<storage.root>/_checkpoints/<pipeline.name>`` when ``storage.root`` is an object-store
    URI."""

    location: str = "./lakehouse/_checkpoints/customers"
    lease_ttl: Duration = timedelta(seconds=30)

    @field_validator("lease_ttl")
    @classmethod
    def _positive_lease(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=3):
            raise ValueError("must be at least 3s (the lease is renewed every third of it)")
        return value


class ProcessingSection(_Section):
    """``processing``: CDC rules (delete mode, validation parameters, lateness)."""

    delete_mode: Literal["soft", "hard"] = "soft"
    tombstone_retention: Duration = timedelta(days=30)
    customer_id_pattern: str = r"^C-[0-9]+$"
    max_clock_skew: Duration = timedelta(minutes=5)
    late_event_threshold: Duration = timedelta(hours=24)

    @field_validator("customer_id_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        # matched by RE2 (linear time, see cdcflow.plan.rules.CustomerIdPattern); it must also
        # be a Python `re` pattern (the common subset), as tools outside the stream compile it
        import re2

        from cdcflow.plan.rules import unsupported_by_re2

        options = re2.Options()
        options.log_errors = False
        try:
            re2.compile(value, options)
        except re2.error as exc:
            raise ValueError(unsupported_by_re2(exc)) from None
        try:
            with warnings.catch_warnings():  # e.g. FutureWarning "Possible nested set"
                warnings.simplefilter("ignore")
                re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class LoggingSection(_Section):
    """``logging``: the log (see :mod:`cdcflow.logs`).

    ``level``: records below it are dropped. ``file``: also append the log there as JSON lines
    (empty: no file; a relative path is resolved against the current folder). The stderr format
    is the command's ``--log-format`` option.
    """

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: str = ""


class GoldSection(_Section):
    """``gold``: when the Gold tables are recomputed (``refresh_every_batches``: after every n-th
    micro-batch; 0 = only by ``cdcflow gold``)."""

    refresh_every_batches: int = Field(default=1, ge=0)


class CatalogSection(_Section):
    """``catalog``: who owns and who reads the pipeline's datasets (``cdcflow catalog``).

    ``owner``: the team or person responsible (e.g. ``data-platform@example.com``);
    ``consumers``: who reads them (teams, dashboards, jobs).
    """

    owner: str = ""
    consumers: list[str] = Field(default_factory=list)


class LineageSection(_Section):
    """``lineage``: OpenLineage run events, START and COMPLETE (or FAIL) per micro-batch, with
    the batch's input and output datasets and their schemas (docs/operations.md).

    ``transport``: ``none`` (default: no events), ``console`` (each event as a log line),
    ``file`` (JSON lines appended to ``file``) or ``http`` (POSTed to ``url`` + ``endpoint``,
    e.g. Marquez; a bearer API key from the environment variable named by ``api_key_env``, never
    from the file). ``namespace``: the jobs' namespace. ``timeout_s``: per HTTP request. A
    lineage backend that fails is logged and never stops the pipeline.
    """

    transport: Literal["none", "console", "file", "http"] = "none"
    url: str = ""
    endpoint: str = "api/v1/lineage"
    file: str = ""
    api_key_env: str = ""
    namespace: str = "cdcflow"
    timeout_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _destination(self) -> LineageSection:
        if self.transport == "http" and not self.url:
            raise ValueError("url: required with transport: http")
        if self.transport == "file" and not self.file:
            raise ValueError("file: required with transport: file")
        return self


class MaintenanceSection(_Section):
    """``maintenance``: ``cdcflow optimize`` and its automatic policy.

    ``time_travel_window`` is how far back Delta time travel (as-of by version, replay) must keep
    working; ``vacuum_retention`` (files older than this are removed) may not be shorter.
    ``optimize_every_batches``: run optimize after every n-th micro-batch (0 = never).
    """

    time_travel_window: Duration = timedelta(days=7)
    vacuum_retention: Duration = timedelta(days=7)
    optimize_every_batches: int = Field(default=0, ge=0)
    zorder_silver_by: list[str] = Field(default_factory=lambda: ["city", "status"])

    @field_validator("vacuum_retention")
    @classmethod
    def _not_below_window(cls, value: timedelta, info: Any) -> timedelta:
        window = info.data.get("time_travel_window")
        if window is not None and value < window:
            raise ValueError(f"must not be shorter than maintenance.time_travel_window ({window})")
        return value


class SnowflakeSection(_Section):
    """``snowflake``: synchronization of Silver/Gold to Snowflake (credentials never here).

    ``mode``: ``off``, ``inline`` (after each micro-batch's Silver commit) or ``standalone``
    (``cdcflow sync snowflake``). ``emulator``: ``auto`` uses the fakesnow emulator when no
    ``SNOWFLAKE_ACCOUNT`` is set, ``on``/``off`` force it. ``emulator_path``: folder of the
    emulator's database files (empty: ``<storage.root>/_snowflake_emulator``; ``:memory:``: none).

    Loading a sync's rows into the stage table: ``load_method`` ``bulk`` writes them as Parquet
    files of at most ``bulk_file_rows`` rows, ``PUT`` s them to a stage and ``COPY INTO`` the
    stage table; ``bind`` inserts them ``load_chunk_rows`` at a time (``executemany``);
    ``auto`` (default) takes ``bulk`` from ``bulk_min_rows`` rows on. ``stage``: the Snowflake
    stage to load through (an internal or external stage you created; empty: the internal
    stage ``CDCFLOW_STAGE``, created when missing).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: Literal["off", "inline", "standalone"] = "off"
    database: str = Field(default="CDCFLOW", pattern=r"^[A-Za-z_][A-Za-z0-9_$]*$")
    schema_name: str = Field(default="PUBLIC", alias="schema", pattern=r"^[A-Za-z_][A-Za-z0-9_$]*$")
    emulator: Literal["auto", "on", "off"] = "auto"
    emulator_path: str = ""
    load_chunk_rows: int = Field(default=2000, ge=1)
    load_method: Literal["auto", "bulk", "bind"] = "auto"
    bulk_min_rows: int = Field(default=500, ge=0)
    bulk_file_rows: int = Field(default=200_000, ge=1)
    stage: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_$.]*)?$")


class ErasureSection(_Section):
    """``erasure``: ``cdcflow erase`` (docs/erasure.md).

    ``key_file``: a file holding the key of the subjects' keyed hash in ``audit/erasure_log``
    (``$CDCFLOW_ERASURE_KEY`` wins over it; neither: a random key kept in the checkpoint).
    """

    key_file: str = ""


class StatusSection(_Section):
    """``status``: the health check of ``cdcflow status --check`` (docs/operations.md).

    ``max_lag``: a table whose p95 end-to-end lag (source event time → Silver commit) over the
    last hour is above it is unhealthy (e.g. ``5m``); unset: only a stopped pipeline is.
    ``status --max-lag`` overrides it.
    """

    max_lag: Duration | None = None


class SparkSection(_Section):
    """``spark``: the Spark engine (``pipeline.engine: spark``; see docs/spark.md).

    ``master``: Spark master URL (``local[2]`` by default; a cluster URL otherwise).
    ``jars_dir``: folder of the Delta jars fetched by ``scripts/spark/fetch-jars.sh``.
    ``conf``: extra Spark configuration entries (key → value), applied last.
    ``codegen_min_bytes``: a micro-batch of landing files smaller than this (bytes read, all
    files together, compressed bytes for ``.jsonl.gz``; default 8 MiB) runs Spark's
    interpreted expressions instead of generated code (``spark.sql.codegen.wholeStage=false``,
    ``spark.sql.codegen.factoryMode=NO_CODEGEN`` for that micro-batch): generating and
    compiling the code of each plan costs more than the rows of a small micro-batch
    (docs/spark.md, "Per micro-batch"). 0: always generate code. Kafka micro-batches, whose
    size is not known before they are read, always generate code, and so does every
    micro-batch when ``conf`` sets either key.
    """

    master: str = "local[2]"
    jars_dir: str = ".spark-jars"
    conf: dict[str, str] = Field(default_factory=dict)
    codegen_min_bytes: int = Field(default=8 * 1024 * 1024, ge=0)


class CdcflowConfig(BaseSettings):
    """The whole configuration of one pipeline."""

    model_config = SettingsConfigDict(
        env_prefix="CDCFLOW__", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    source: SourceSection = Field(default_factory=SourceSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    processing: ProcessingSection = Field(default_factory=ProcessingSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    #: the YAML file this config was loaded from ('' when built in code), for messages
    _file: str = PrivateAttr(default="")
    snowflake: SnowflakeSection = Field(default_factory=SnowflakeSection)
    gold: GoldSection = Field(default_factory=GoldSection)
    maintenance: MaintenanceSection = Field(default_factory=MaintenanceSection)
    lineage: LineageSection = Field(default_factory=LineageSection)
    catalog: CatalogSection = Field(default_factory=CatalogSection)
    spark: SparkSection = Field(default_factory=SparkSection)
    status: StatusSection = Field(default_factory=StatusSection)
    erasure: ErasureSection = Field(default_factory=ErasureSection)
    #: Table contracts (:mod:`cdcflow.model.contracts`); none declared = the shipped customers
    #: contract with this config's ``processing`` settings (see :meth:`contracts`).
    tables: list[TableContract] = Field(default_factory=list)

    @field_validator("tables")
    @classmethod
    def _consistent_tables(cls, tables: list[TableContract]) -> list[TableContract]:
        """Table names are unique; a ``references: <table>.<column>`` names a declared table
        and one of its columns of the same type."""
        names = [t.name for t in tables]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tables declared twice: {', '.join(twice)}")
        by_name = {t.name: t for t in tables}
        for table in tables:
            for spec in table.columns:
                if spec.references is None:
                    continue
                about = f"table {table.name}: column {spec.name} references {spec.references}"
                target_name, column = spec.references.split(".", 1)
                target = by_name.get(target_name)
                if target is None:
                    close = difflib.get_close_matches(target_name, names, n=1, cutoff=0.6)
                    hint = f", did you mean {close[0]}?" if close else ""
                    raise ValueError(
                        f"{about}, but no table {target_name} is declared "
                        f"(declared: {', '.join(names)}){hint}"
                    )
                columns = [c.name for c in target.columns]
                if column not in columns:
                    close = difflib.get_close_matches(column, columns, n=1, cutoff=0.6)
                    hint = f", did you mean {close[0]}?" if close else ""
                    raise ValueError(
                        f"{about}, but table {target_name} has no column {column}{hint}"
                    )
                other = target.column(column).type
                if parse_type(other) != parse_type(spec.type):
                    raise ValueError(
                        f"{about}, whose type {other} differs from the column's type {spec.type}"
                    )
        return tables

    @model_validator(mode="after")
    def _formats_need_tables(self) -> CdcflowConfig:
        """A record format other than ``flat`` is decoded per declared table; so is a topic."""
        if self.source.type == "kafka" and not self.tables:
            raise ValueError(
                "source.type: kafka maps each topic to a declared table: add a tables: section"
            )
        if self.source.type == "kafka" and not (
            self.source.kafka.topics or self.source.kafka.topic_pattern
        ):
            raise ValueError("source.kafka.topics: name the topics (or a topic_pattern)")
        if self.source.format != "flat" and not self.tables:
            raise ValueError(
                f"source.format: {self.source.format} records are decoded per declared table: "
                "add a tables: section (the shipped customers table reads the flat format)"
            )
        return self

    @model_validator(mode="after")
    def _object_store_checkpoint(self) -> CdcflowConfig:
        """An object-store checkpoint holds the offsets, commits and lease of either engine, the
        PostgreSQL / Kafka sources' state (their staged files stay in the local ``source.path``),
        and the Spark engine's streaming checkpoint through the S3A connector: on S3, with the
        tables on S3 too."""
        from cdcflow.state.storage import is_object_uri

        if is_object_uri(self.storage.root) and "location" not in self.checkpoint.model_fields_set:
            # a lakehouse on an object store keeps its checkpoint beside it, never in a local
            # folder of whatever directory a command runs from (a run from another directory
            # would start an empty checkpoint against the same tables)
            self.checkpoint.location = (
                f"{self.storage.root.rstrip('/')}/_checkpoints/{self.pipeline.name}"
            )
        if not is_object_uri(self.checkpoint.location):
            return self

        def on_s3(location: str) -> bool:
            return location.lower().startswith(("s3://", "s3a://"))

        if self.pipeline.engine == "spark" and not (
            on_s3(self.checkpoint.location) and on_s3(self.storage.root)
        ):
            raise ValueError(
                "checkpoint.location: the Spark engine keeps its checkpoint on an object store "
                "only on S3 (s3://, through the S3A connector) with storage.root on S3 too; "
                "otherwise on a local or mounted folder"
            )
        return self

    def contracts(self) -> list[TableContract]:
        """The pipeline's table contracts, in declared order.

        Without a ``tables:`` section: the shipped customers contract
        (:data:`cdcflow.model.contracts.CUSTOMERS`) with ``processing.delete_mode``,
        ``processing.customer_id_pattern`` and ``processing.tombstone_retention``.
        """
        if self.tables:
            return list(self.tables)
        processing = self.processing
        return [
            CUSTOMERS.model_copy(
                update={
                    "delete_mode": processing.delete_mode,
                    "key_patterns": {"customer_id": processing.customer_id_pattern},
                    "tombstone_retention_days": processing.tombstone_retention.days,
                }
            )
        ]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides win over the YAML file (passed as init kwargs).
        return (env_settings, init_settings)

    @property
    def file(self) -> str:
        """The YAML file the config was loaded from ('' when it was built in code)."""
        return self._file

    def table_uri(self, name: str) -> str:
        """URI of the Delta table ``name`` (e.g. ``silver/customers``) under ``storage.root``."""
        root = self.storage.root.rstrip("/")
        if "://" in root:
            return f"{root}/{name}"
        return str(Path(root).resolve() / name)


def _interpolate(value: Any, file: Path) -> Any:
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{file}: environment variable ${{{name}}} is not set")

        return _ENV_REF.sub(repl, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, file) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, file) for v in value]
    return value


def _resolve_relative(raw: dict[str, Any], base: Path) -> None:
    """Resolve relative local paths against the config file's folder."""
    for section, key in (
        ("storage", "root"),
        ("source", "path"),
        ("checkpoint", "location"),
        ("logging", "file"),
    ):
        sect = raw.get(section)
        if isinstance(sect, dict) and isinstance(sect.get(key), str):
            val = sect[key]
            if val and "://" not in val and not os.path.isabs(val):
                sect[key] = str((base / val).resolve())


def load_config(path: str | Path) -> CdcflowConfig:
    """Load, interpolate and validate a YAML config file.

    Relative paths in ``storage.root``, ``source.path`` and ``checkpoint.location`` are resolved
    against the current working directory (the folder the command runs in).

    Args:
        path: the YAML file.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: the file is missing or unreadable, is not a YAML mapping, references an unset
            environment variable, or has an unknown or invalid key (the message names the key and
            the file).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: not a UTF-8 text file (invalid byte at offset {exc.start})"
        ) from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections")
    raw = _interpolate(raw, file)
    origins = _include_tables(raw, file)
    _resolve_relative(raw, Path.cwd())
    overrides = _env_overrides()
    try:
        config = CdcflowConfig(**raw)
        config._file = str(file)
        return config
    except ValidationError as exc:
        problems = []
        errors = exc.errors()
        # an error of a key holding another error's key follows from it (a column whose type
        # is refused leaves `columns` empty: "at least 1 item"); the inner one says what to fix
        inner = [tuple(e["loc"]) for e in errors]
        for err in errors:
            here = tuple(err["loc"])
            if any(len(other) > len(here) and other[: len(here)] == here for other in inner):
                continue
            loc = tuple(str(p).lower() for p in err["loc"])
            key = _key_text(err["loc"], raw)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key" + _suggestion(loc)
            origin = next(
                (name for path, name in overrides.items() if loc[: len(path)] == path), None
            )
            where = f"environment variable {origin}: " if origin else ""
            index = err["loc"][1] if len(err["loc"]) > 1 and loc[0] == "tables" else None
            table_file = origins.get(index) if isinstance(index, int) else None
            within = f" (table file {table_file})" if table_file is not None else ""
            problems.append(f"{where}key '{key}'{within}: {msg}")
        raise ConfigError(f"{file}: " + "; ".join(problems)) from None


def _include_tables(raw: dict[str, Any], file: Path) -> dict[int, Path]:
    """Replace each ``tables:`` item that is a path by the contract(s) of that YAML file.

    A table file holds one table contract (a mapping) or a list of them; a relative path is
    relative to the folder of the config file naming it. ``${VAR}`` references are expanded
    as in the config.

    Returns:
        The index in the expanded ``tables`` list → the file it came from (errors name it).

    Raises:
        ConfigError: a table file is missing, unreadable, not YAML or not contracts (the
            message names the config, the item and the file).
    """
    tables = raw.get("tables")
    if not isinstance(tables, list):
        return {}
    expanded: list[Any] = []
    origins: dict[int, Path] = {}
    for index, entry in enumerate(tables):
        if not isinstance(entry, str):
            expanded.append(entry)
            continue
        path = Path(entry) if Path(entry).is_absolute() else file.parent / entry
        where = f"{file}: key 'tables[{index}]'"
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"{where}: cannot read the table file {path} ({exc.strerror})"
            ) from None
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(f"{where}: table file {path} is not valid YAML ({problem})") from None
        items = loaded if isinstance(loaded, list) else [loaded]
        for item in items:
            if not isinstance(item, dict):
                raise ConfigError(
                    f"{where}: table file {path} must hold a table contract (a mapping) or a "
                    "list of them"
                )
            origins[len(expanded)] = path
            expanded.append(_interpolate(item, path))
    raw["tables"] = expanded
    return origins


def _key_text(loc: tuple[Any, ...], raw: Any) -> str:
    """A config key path as the user wrote it: list items by their ``name`` when they have one
    (``tables[accounts].columns[flagged].type``), else by index (``tables[0]``)."""
    text, node = "", raw
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            text += f"[{name}]" if isinstance(name, str) else f"[{part}]"
            node = item
        else:
            text += ("." if text else "") + str(part).lower()
            node = node.get(part) if isinstance(node, dict) else None
    return text


def _known_keys(loc: tuple[str, ...]) -> list[str]:
    """Keys allowed next to the last part of ``loc`` (its section's fields and aliases)."""
    model: Any = CdcflowConfig
    for part in loc[:-1]:
        if part.isdigit():  # an item of a list of models: same model
            continue
        fields = {name: info for name, info in model.model_fields.items()}
        fields.update({info.alias: info for info in model.model_fields.values() if info.alias})
        info = fields.get(part)
        annotation = info.annotation if info is not None else None
        args = getattr(annotation, "__args__", ())
        if getattr(annotation, "__origin__", None) in (list, tuple) and args:
            annotation = args[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    keys = [info.alias or name for name, info in model.model_fields.items()]
    return keys


def _suggestion(loc: tuple[str, ...]) -> str:
    """``, did you mean <key>?`` for the known key closest to an unknown one (or empty)."""
    if not loc:
        return ""
    close = difflib.get_close_matches(loc[-1], _known_keys(loc), n=1, cutoff=0.6)
    return f", did you mean {close[0]}?" if close else ""


def _env_overrides() -> dict[tuple[str, ...], str]:
    """``CDCFLOW__SECTION__KEY`` variables by config path; unknown sections are errors.

    Raises:
        ConfigError: a variable names a section the configuration does not have.
    """
    found: dict[tuple[str, ...], str] = {}
    for name in os.environ:
        if not name.upper().startswith("CDCFLOW__"):
            continue
        path = tuple(part.lower() for part in name.split("__")[1:] if part)
        if not path or path[0] not in CdcflowConfig.model_fields:
            hint = _suggestion(path[:1]) if path else ""
            raise ConfigError(f"environment variable {name}: unknown config section{hint}")
        found[path] = name
    return found
