"""Kafka source: stage the records of Kafka topics as landing files, exactly once.

``source.type: kafka`` reuses the whole file pipeline, as the PostgreSQL source does. Before
each micro-batch is planned, :meth:`KafkaSource.stage`:

1. lists the topics (``source.kafka.topics`` and/or ``topic_pattern``) and their partitions
   (new topics and partitions are picked up at every trigger);
2. **plans** the next range of every partition, ``[from, until)``: ``from`` is where the last
   staged range ended (the partitions of the first trigger start at ``starting_offsets``; a
   topic or partition that appears later starts at its beginning, as Spark's Kafka source
   does),
   ``until`` the partition's high watermark now, the ranges together cut to
   ``source.max_records_per_trigger`` records;
3. writes the plan — topic, partition, from, until, and the landing file that will hold it —
   to the **write-ahead state** ``<checkpoint.location>/kafka_source.json`` (atomically)
   before reading a record;
4. reads exactly those ranges with ``confluent-kafka`` (librdkafka; ``assign``, never a
   subscription) and writes them atomically to one landing file,
   ``kafka_<first batch of the plan, 8 digits>.jsonl``.

Crash safety: a plan whose file is missing (a crash between 3 and 4) is read again — the same
ranges of an immutable log give the same file; a staged file not yet committed is not staged
again (the pipeline processes it first). The Delta app transactions make a re-run of a batch
write nothing twice; so every Kafka record reaches Bronze, a quarantine or
``audit/skipped_records`` exactly once. Consumer-group offsets (``group_id``) are committed
after a batch's commit marker, for monitoring only, never read back.

Each line of a staged file is one Kafka record in an envelope, ``{"_kafka": {"topic",
"partition", "offset", "timestamp"}, "value": <the value's JSON, byte for byte>}`` (a value
that is not JSON: ``"value_text"``, with ``"value_error"`` when its bytes are not UTF-8; a
null value, the Kafka tombstone: ``"value": null``), so
Bronze's ``raw_payload`` and a quarantined ``raw_line`` name the record's position. The router
(:mod:`cdcflow.plan.routing`) unwraps it, takes the table from the topic
(``source.kafka.topic_tables``, else the last dotted part of the topic name) and decodes the
value in that table's format. Raw newlines between JSON tokens (pretty-printed values) become
spaces, the same JSON.

Records deleted by retention before they were read, offsets that went back, a topic deleted
and created again (its topic id, recorded in the state, changed) and a compacted topic
(``cleanup.policy`` with ``compact``: compaction removes changes no offset shows) are a
:class:`KafkaSourceError` (the range cannot be read exactly once), never skipped silently.
A trigger waits ``poll_timeout`` at most for the next record of its planned ranges (the wait
starts over with each record). The connection settings' secrets come from environment
variables or files and are never logged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from cdcflow.errors import CdcflowError, ConfigError, MissingDependencyError
from cdcflow.logs import get_logger
from cdcflow.sources.postgres import write_text_atomic as _write_atomic
from cdcflow.state.storage import open_storage

if TYPE_CHECKING:
    from cdcflow.config import CdcflowConfig, KafkaSourceSection
    from cdcflow.state.checkpoint import BatchOffsets, Checkpoint

log = get_logger("sources.kafka")

STATE_FILE = "kafka_source.json"
INSTALL_HINT = "the Kafka source needs confluent-kafka: pip install 'cdcflow[kafka]'"
#: The envelope field of a staged Kafka record (a name no contract column can take).
ENVELOPE = "_kafka"


class KafkaSourceError(CdcflowError):
    """The Kafka source cannot reach the broker, or cannot read a planned range exactly (a
    runtime failure: the CLI exits 1)."""

    exit_code = 1


def require_kafka() -> Any:
    """The ``confluent_kafka`` module.

    Raises:
        MissingDependencyError: confluent-kafka is not installed (the message says how).
    """
    try:
        import confluent_kafka
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    return confluent_kafka


def client_settings(settings: KafkaSourceSection, file: str = "") -> dict[str, Any]:
    """librdkafka settings: ``bootstrap.servers``, the pass-through ``options`` and the secret
    options read from their environment variables / files.

    Raises:
        ConfigError: a secret's environment variable is unset or its file unreadable (the
            message names the key, never a value).
    """
    where = f" ({file})" if file else ""
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, **settings.options}
    for option, variable in settings.secret_options_env.items():
        if variable not in os.environ:
            raise ConfigError(
                f"source.kafka.secret_options_env.{option}{where}: environment variable "
                f"{variable} is not set"
            )
        conf[option] = os.environ[variable]
    for option, path in settings.secret_options_file.items():
        try:
            conf[option] = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"source.kafka.secret_options_file.{option}{where}: cannot read {path} "
                f"({exc.strerror})"
            ) from None
    return conf


@dataclass(frozen=True, slots=True)
class Range:
    """The offsets ``[start, until)`` of one partition planned for a staged file."""

    topic: str
    partition: int
    start: int
    until: int

    def to_json(self) -> list[Any]:
        return [self.topic, self.partition, self.start, self.until]

    @classmethod
    def from_json(cls, data: list[Any]) -> Range:
        return cls(str(data[0]), int(data[1]), int(data[2]), int(data[3]))


@dataclass(frozen=True, slots=True)
class Plan:
    """One staged file and the ranges it holds (an entry of the write-ahead state)."""

    path: str
    ranges: tuple[Range, ...]

    @property
    def records(self) -> int:
        """Offsets covered (an upper bound on records: transaction markers take offsets)."""
        return sum(r.until - r.start for r in self.ranges)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ranges": [r.to_json() for r in self.ranges]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(str(data["path"]), tuple(Range.from_json(r) for r in data["ranges"]))


def envelope_line(
    topic: str, partition: int, offset: int, timestamp: int | None, value: Any
) -> str:
    """One staged line: the record's position and its value (module doc).

    Args:
        value: the record's value bytes, or None (a tombstone).
    """
    head = json.dumps(
        {"topic": topic, "partition": partition, "offset": offset, "timestamp": timestamp},
        separators=(",", ":"),
    )
    if value is None:
        return f'{{"{ENVELOPE}":{head},"value":null}}'
    raw = bytes(value)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # quarantined as a landing line that is not UTF-8 is
        text = raw.decode("utf-8", "backslashreplace")
        error = json.dumps(f"not valid UTF-8 at byte {exc.start}")
        return f'{{"{ENVELOPE}":{head},"value_text":{json.dumps(text)},"value_error":{error}}}'
    text = text.removeprefix("\ufeff")  # a byte order mark, ignored as at a file's start
    try:
        orjson.loads(text)
        valid = True
    except orjson.JSONDecodeError:  # what the record parser accepts beyond orjson, no more
        from cdcflow.plan.rules import Rejection, parse_record

        valid = not isinstance(parse_record('{"v":' + text + "}"), Rejection)
    if valid:
        body = text.replace("\r", " ").replace("\n", " ")  # only whitespace between tokens
        return f'{{"{ENVELOPE}":{head},"value":{body}}}'
    return f'{{"{ENVELOPE}":{head},"value_text":{json.dumps(text)}}}'


def topic_table(settings: KafkaSourceSection, topic: str) -> str:
    """The declared table a topic feeds: ``topic_tables``, else its last dotted part."""
    return settings.topic_tables.get(topic, topic.rsplit(".", 1)[-1])


class KafkaSource:
    """Stages Kafka records as landing files (see module doc).

    Args:
        config: the pipeline configuration (``source.kafka``, ``source.path``,
            ``source.max_records_per_trigger``, ``checkpoint.location``).
    """

    def __init__(self, config: CdcflowConfig) -> None:
        self.config = config
        self.settings = config.source.kafka
        self.landing = Path(config.source.path)
        #: the write-ahead state's store: the checkpoint's (a local folder or an object store)
        self.state = open_storage(config.checkpoint.location, config.storage.options)
        self.state_path = f"{config.checkpoint.location.rstrip('/')}/{STATE_FILE}"
        self.max_records = config.source.max_records_per_trigger
        self._conf = client_settings(self.settings, config.file)
        #: the topics the last trigger found (for the CLI's "nothing new" line)
        self.matched_topics: list[str] | None = None
        #: topic → its id when first read (a topic deleted and created again has another)
        self._topic_ids: dict[str, str] = {}
        #: topics whose cleanup.policy this process has checked
        self._policy_checked: set[str] = set()
        self._pattern: Any = None
        if self.settings.topic_pattern:
            from cdcflow.model.contracts import compile_re2

            self._pattern = compile_re2(self.settings.topic_pattern)

    # -- state ------------------------------------------------------------------------------
    def _load(self) -> tuple[dict[str, int], list[Plan]]:
        """``(next offset per "topic:partition", plans)`` of the write-ahead state (and the
        topic ids it recorded, kept in ``self._topic_ids``)."""
        try:
            raw = self.state.read(STATE_FILE)
            if raw is None:
                self._topic_ids = {}
                return {}, []
            data = json.loads(raw.decode("utf-8"))
            self._topic_ids = {str(k): str(v) for k, v in data.get("topic_ids", {}).items()}
            return (
                {str(k): int(v) for k, v in data["next"].items()},
                [Plan.from_json(p) for p in data["plans"]],
            )
        except Exception as exc:  # any shape but the one written: say which file
            raise KafkaSourceError(
                f"{self.state_path}: unreadable source state ({type(exc).__name__}); restore it "
                "or remove it to read every topic again (re-deliveries are exact duplicates)"
            ) from None

    def _save(self, positions: dict[str, int], plans: list[Plan]) -> None:
        payload = {
            "next": positions,
            "plans": [p.to_json() for p in plans],
            "topic_ids": self._topic_ids,
        }
        self.state.replace(STATE_FILE, json.dumps(payload, indent=1, sort_keys=True).encode())

    # -- broker -----------------------------------------------------------------------------
    def _consumer(self) -> Any:
        kafka = require_kafka()
        conf = {
            **self._conf,
            "group.id": self.settings.group_id or f"cdcflow-{self.config.pipeline.name}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "logger": _Silent(),
        }
        try:
            return kafka.Consumer(conf)
        except kafka.KafkaException as exc:
            raise KafkaSourceError(f"cannot create a Kafka consumer: {exc}") from None

    def _timeout(self) -> float:
        return self.settings.poll_timeout.total_seconds()

    def _partitions(self, consumer: Any) -> list[tuple[str, int]]:
        """Every (topic, partition) of the configured topics the broker has now."""
        kafka = require_kafka()
        try:
            metadata = consumer.list_topics(timeout=min(self._timeout(), 15.0))
        except kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
            raise KafkaSourceError(
                f"cannot reach Kafka at {self.settings.bootstrap_servers} ({reason}): check "
                "source.kafka.bootstrap_servers, that the broker runs, and source.kafka.options "
                "(security.protocol, SASL/SSL settings)"
            ) from None
        wanted = set(self.settings.topics)
        found = []
        for name, topic in metadata.topics.items():
            if name.startswith("__") or topic.error is not None:
                continue
            if name in wanted or (
                self._pattern is not None and self._pattern.fullmatch(name) is not None
            ):
                found += [(name, p) for p in topic.partitions]
        self.matched_topics = sorted({name for name, _ in found})
        if not found:
            log.warning(
                "no Kafka topic matches source.kafka topics / topic_pattern",
                extra={"bootstrap_servers": self.settings.bootstrap_servers},
            )
        return sorted(found)

    def _watermarks(self, consumer: Any, topic: str, partition: int) -> tuple[int, int]:
        kafka = require_kafka()
        try:
            low, high = consumer.get_watermark_offsets(
                kafka.TopicPartition(topic, partition), timeout=self._timeout(), cached=False
            )
        except kafka.KafkaException as exc:
            raise KafkaSourceError(
                f"cannot read the offsets of {topic}[{partition}]: {exc}"
            ) from None
        return int(low), int(high)

    def _check_topics(self, topics: list[str]) -> None:
        """Stop on a topic that cannot be read exactly once: one deleted and created again
        since cdcflow first read it (its topic id changed: the new topic's records below the
        old position would be skipped), or one whose ``cleanup.policy`` compacts (compaction
        may remove a change — a delete before its tombstone — before cdcflow reads it, which
        no offset shows). Records the ids of topics seen for the first time.

        Raises:
            KafkaSourceError: either case (the message says what to do).
        """
        if not topics:
            return
        kafka = require_kafka()
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({k: v for k, v in self._conf.items() if k != "logger"})
        timeout = min(self._timeout(), 15.0)
        try:
            described = admin.describe_topics(
                kafka.TopicCollection(topics), request_timeout=timeout
            )
            ids = {name: str(future.result().topic_id) for name, future in described.items()}
            unchecked = [t for t in topics if t not in self._policy_checked]
            policies: dict[str, str] = {}
            if unchecked:
                resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in unchecked]
                for resource, future in admin.describe_configs(
                    resources, request_timeout=timeout
                ).items():
                    entry = future.result().get("cleanup.policy")
                    policies[resource.name] = str(entry.value) if entry is not None else ""
        except kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
            raise KafkaSourceError(
                f"cannot describe the topics {', '.join(topics)} ({reason}): cdcflow needs the "
                "Describe and DescribeConfigs permissions on the topics it reads"
            ) from None
        for topic, policy in policies.items():
            if "compact" in policy.split(","):
                raise KafkaSourceError(
                    f"topic {topic} has cleanup.policy={policy}: compaction can remove a change "
                    "(a delete, before its tombstone) before cdcflow reads it, silently; use "
                    "cleanup.policy=delete (retention) for change-event topics"
                )
            self._policy_checked.add(topic)
        for topic, topic_id in ids.items():
            known = self._topic_ids.get(topic)
            if known is not None and known != topic_id:
                raise KafkaSourceError(
                    f"topic {topic} was deleted and created again (its topic id changed): the "
                    "offsets cdcflow keeps belong to the old topic, so records of the new one "
                    "would be skipped or read twice; re-snapshot the table, then reset the source "
                    f"state ({self.state_path})"
                )
            self._topic_ids[topic] = topic_id

    def _first_offset(self, consumer: Any, topic: str, partition: int) -> int:
        """Where a partition seen for the first time starts (``starting_offsets``)."""
        low, high = self._watermarks(consumer, topic, partition)
        start = self.settings.starting_offsets
        if start == "earliest":
            return low
        if start == "latest":
            return high
        kafka = require_kafka()
        instant = datetime.fromisoformat(start.replace("Z", "+00:00"))
        millis = int(instant.timestamp() * 1000)
        found = consumer.offsets_for_times(
            [kafka.TopicPartition(topic, partition, millis)], timeout=self._timeout()
        )
        offset = found[0].offset
        return high if offset < 0 else int(offset)

    def _plan(self, consumer: Any, positions: dict[str, int], name: str) -> Plan:
        """The next ranges of every partition (updates ``positions`` for new partitions)."""
        budget = self.max_records
        ranges = []
        first_trigger = not positions
        partitions = self._partitions(consumer)
        self._check_topics(sorted({topic for topic, _ in partitions}))
        for topic, partition in partitions:
            tp = f"{topic}:{partition}"
            low, high = self._watermarks(consumer, topic, partition)
            if tp not in positions:
                # starting_offsets for the partitions of the first trigger; a topic or a
                # partition that appears later is read from its beginning (nothing skipped)
                first = self._first_offset(consumer, topic, partition) if first_trigger else low
                positions[tp] = first
            start = positions[tp]
            if start < low:
                raise KafkaSourceError(
                    f"{topic}[{partition}]: offsets {start}..{low - 1} were deleted by retention "
                    "before cdcflow read them; re-snapshot the table, then reset the source state "
                    f"({self.state_path})"
                )
            if start > high:
                raise KafkaSourceError(
                    f"{topic}[{partition}]: its offsets went back from {start} to {high} (the "
                    "topic was deleted and created again?); the records after the reset were not "
                    f"read: re-snapshot the table, then reset the source state ({self.state_path})"
                )
            until = high
            if budget is not None:  # a partition past the budget keeps its position for later
                until = min(until, start + max(budget, 0))
            if until > start:
                ranges.append(Range(topic, partition, start, until))
                if budget is not None:
                    budget -= until - start
        return Plan(str((self.landing / name).resolve()), tuple(ranges))

    def _read(self, consumer: Any, plan: Plan) -> list[str]:
        """The records of ``plan``'s ranges, in partition then offset order, as staged lines.

        Raises:
            KafkaSourceError: a range cannot be read completely within ``poll_timeout``.
        """
        import time

        kafka = require_kafka()
        pending = {(r.topic, r.partition): r for r in plan.ranges}
        lines: dict[tuple[str, int], list[str]] = {key: [] for key in pending}
        consumer.assign([kafka.TopicPartition(r.topic, r.partition, r.start) for r in plan.ranges])
        deadline = time.monotonic() + self._timeout()
        try:
            while pending:
                if time.monotonic() > deadline:
                    missing = ", ".join(f"{t}[{p}]" for t, p in pending)
                    raise KafkaSourceError(
                        f"no record of the planned range of {missing} arrived for "
                        f"source.kafka.poll_timeout ({self._timeout():g} s): is the broker up? "
                        "(records deleted by retention meanwhile cannot be read either)"
                    )
                message = consumer.poll(1.0)
                if message is None:
                    self._done_by_position(consumer, pending)
                    continue
                deadline = time.monotonic() + self._timeout()  # progress: the wait starts over
                key = (message.topic(), message.partition())
                error = message.error()
                if error is not None:
                    if error.code() == kafka.KafkaError._PARTITION_EOF:
                        self._done_by_position(consumer, pending)
                        continue
                    if error.retriable() or not error.fatal():
                        log.warning("kafka consumer error, retrying", extra={"error": error.str()})
                        continue
                    raise KafkaSourceError(f"Kafka consumer error: {error.str()}")
                wanted = pending.get(key)
                if wanted is None or message.offset() < wanted.start:
                    continue
                if message.offset() >= wanted.until:
                    del pending[key]
                    consumer.pause([kafka.TopicPartition(key[0], key[1])])
                    continue
                stamp = message.timestamp()
                lines[key].append(
                    envelope_line(
                        key[0],
                        key[1],
                        message.offset(),
                        stamp[1] if stamp[0] != kafka.TIMESTAMP_NOT_AVAILABLE else None,
                        message.value(),
                    )
                )
                if message.offset() >= wanted.until - 1:
                    del pending[key]
                    consumer.pause([kafka.TopicPartition(key[0], key[1])])
        finally:
            consumer.unassign()
        return [line for r in plan.ranges for line in lines[(r.topic, r.partition)]]

    @staticmethod
    def _done_by_position(consumer: Any, pending: dict[tuple[str, int], Range]) -> None:
        """Drop the ranges the consumer has passed (a range ending in transaction markers)."""
        if not pending:
            return
        kafka = require_kafka()
        for tp in consumer.position([kafka.TopicPartition(t, p) for t, p in pending]):
            key = (tp.topic, tp.partition)
            if key in pending and tp.offset >= pending[key].until:
                del pending[key]

    # -- pipeline hooks ---------------------------------------------------------------------
    def stage(self, checkpoint: Checkpoint) -> Plan | None:
        """Stage the next records of every partition as one landing file (module doc).

        Returns:
            The staged plan, or None when a staged file is still pending or nothing is new.

        Raises:
            KafkaSourceError: the broker cannot be reached, or a planned range cannot be read.
            MissingDependencyError: confluent-kafka is not installed.
        """
        from cdcflow.sources.postgres import committed_paths
        from cdcflow.state.faults import crash_point

        positions, plans = self._load()
        committed = committed_paths(checkpoint)
        waiting = [p for p in plans if p.path not in committed]
        consumer = self._consumer()
        try:
            for plan in waiting:
                if Path(plan.path).exists():
                    return None  # the pipeline takes it first
            if waiting:  # planned, not written: the same ranges again
                plan = waiting[0]
            else:
                last = checkpoint.last_batch()
                name = f"kafka_{(last + 1) if last is not None else 0:08d}.jsonl"
                while str((self.landing / name).resolve()) in {p.path for p in plans}:
                    name = f"{name.removesuffix('.jsonl')}_.jsonl"
                plan = self._plan(consumer, positions, name)
                if not plan.ranges:
                    self._save(positions, [p for p in plans if p.path not in committed])
                    return None
                for r in plan.ranges:
                    positions[f"{r.topic}:{r.partition}"] = r.until
                plans = [*(p for p in plans if p.path not in committed), plan]
                self._save(positions, plans)  # the write-ahead: before a record is read
            batch = int(Path(plan.path).name.split("_")[1].split(".")[0])
            crash_point("after_source_plan", batch)
            lines = self._read(consumer, plan)
        finally:
            consumer.close()
        self.landing.mkdir(parents=True, exist_ok=True)
        _write_atomic(Path(plan.path), "".join(line + "\n" for line in lines))
        crash_point("after_source_staged", batch)
        log.info(
            "staged records from Kafka",
            extra={
                "file": Path(plan.path).name,
                "records": len(lines),
                "ranges": [r.to_json() for r in plan.ranges],
            },
        )
        return plan

    def pending(self, checkpoint: Checkpoint) -> int:
        """Records the pipeline has not committed yet: offsets of the topics beyond the staged
        ranges, plus the offsets of staged files whose micro-batch is not committed.

        Raises:
            KafkaSourceError: the broker cannot be reached.
        """
        from cdcflow.sources.postgres import committed_paths

        positions, plans = self._load()
        committed = committed_paths(checkpoint)
        count = sum(p.records for p in plans if p.path not in committed)
        consumer = self._consumer()
        try:
            for topic, partition in self._partitions(consumer):
                low, high = self._watermarks(consumer, topic, partition)
                count += max(0, high - positions.get(f"{topic}:{partition}", low))
        finally:
            consumer.close()
        return count

    def acknowledge(self, offsets: BatchOffsets) -> None:
        """After a batch's commit marker: commit its ranges' ends to the consumer group, for
        monitoring only (a failure is a warning: cdcflow never reads these offsets)."""
        if not self.settings.group_id:
            return
        paths = {f.path for f in offsets.files if not f.cut}  # a cut file: its last part
        _, plans = self._load()
        ranges = [r for p in plans if p.path in paths for r in p.ranges]
        if not ranges:
            return
        kafka = require_kafka()
        consumer = self._consumer()
        try:
            consumer.commit(
                offsets=[kafka.TopicPartition(r.topic, r.partition, r.until) for r in ranges],
                asynchronous=False,
            )
        except kafka.KafkaException as exc:
            log.warning("consumer group offsets not committed", extra={"error": str(exc)})
        finally:
            consumer.close()


class _Silent:
    """A librdkafka logger that forwards to cdcflow's log at debug level (no secrets: the
    client never logs its configuration values)."""

    def log(self, level: int, message: str, *args: Any) -> None:
        log.debug("librdkafka: %s", message % args if args else message)


__all__ = [
    "ENVELOPE",
    "KafkaSource",
    "KafkaSourceError",
    "Plan",
    "Range",
    "client_settings",
    "envelope_line",
    "topic_table",
]
