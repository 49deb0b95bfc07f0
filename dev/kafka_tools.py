"""Kafka client helpers for tests and benchmarks: unique topics, topic creation, produce-all,
consume-until-with-deadline.

Here rather than under ``tests/`` because ``bench/`` uses them too and must not import tests;
``tests/support/kafka_helpers.py`` re-exports them. Each call opens and closes its own clients.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdelay.errors import InfrastructureError

#: Headers as confluent-kafka takes them when producing.
HeaderList = list[tuple[str, str | bytes | None]]


def produce_all(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None, HeaderList]],
    **conf: str | int | bool,
) -> None:
    """Produce ``records`` (key, value, headers) with acks=all and fail on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **conf})
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    for key, value, headers in records:
        producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
    remaining = producer.flush(60)
    if remaining:
        raise InfrastructureError(f"{remaining} records still unacknowledged after 60 s")
    if failures:
        raise InfrastructureError(f"delivery failed: {failures[:3]}")


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` and wait until its metadata shows every partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication, config=config or {})], operation_timeout=timeout
    )
    futures[name].result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=5).topics.get(name)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.05)
    raise TimeoutError(f"topic {name} did not show {partitions} partitions within {timeout} s")


def _headers(msg: Message) -> tuple[tuple[str, bytes | None], ...]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in items)


@dataclass(frozen=True)
class Record:
    """A consumed record, detached from librdkafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int

    @classmethod
    def of(cls, msg: Message) -> Record:
        """Copy what a test looks at out of a librdkafka message."""
        return cls(
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=msg.key(),
            value=msg.value(),
            headers=_headers(msg),
            timestamp_ms=msg.timestamp()[1],
        )

    def header(self, name: str) -> bytes | None:
        """The first header called ``name``, or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


def consume_until(
    bootstrap: str,
    topics: Sequence[str],
    done: Callable[[list[Record]], bool],
    *,
    timeout: float = 60.0,
    group: str | None = None,
    config: dict[str, str | int | bool] | None = None,
) -> list[Record]:
    """Read ``topics`` from the beginning until ``done(records)`` holds or ``timeout`` passes.

    Without ``group`` the partitions are assigned manually (no group, no commits). Raises
    TimeoutError with what was read so far when the condition never holds.
    """
    conf: dict[str, str | int | bool] = {
        "bootstrap.servers": bootstrap,
        "group.id": group or f"probe-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        **(config or {}),
    }
    consumer = Consumer(conf)
    records: list[Record] = []
    try:
        if group is None:
            admin_meta = consumer.list_topics(timeout=10)
            assignment = [
                TopicPartition(t, p, -2)  # -2: OFFSET_BEGINNING
                for t in topics
                for p in admin_meta.topics[t].partitions
            ]
            consumer.assign(assignment)
        else:
            consumer.subscribe(list(topics))
        deadline = time.monotonic() + timeout
        while not done(records):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"condition not met within {timeout} s after {len(records)} records "
                    f"from {list(topics)}"
                )
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is None:
                    records.append(Record.of(msg))
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
        if group is not None and records:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return records


def read_to_end(bootstrap: str, topics: Sequence[str], *, timeout: float = 120.0) -> list[Record]:
    """Every record now in ``topics``, read_committed: until each partition reports its end.

    The end is where a read_committed consumer stops (the last stable offset); transaction
    markers take offsets too, so counting ``high - low`` records would wait for ever.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-to-end-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    records: list[Record] = []
    try:
        meta = consumer.list_topics(timeout=10)
        parts = {(t, p) for t in topics for p in meta.topics[t].partitions}
        consumer.assign([TopicPartition(t, p, -2) for t, p in parts])
        deadline = time.monotonic() + timeout
        while parts:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sorted(parts)[:5]} not read to the end within {timeout} s")
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is None:
                    records.append(Record.of(msg))
                elif err.code() == KafkaError._PARTITION_EOF:
                    parts.discard((msg.topic() or "", msg.partition() or 0))
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()
    return records
