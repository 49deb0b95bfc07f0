"""Helpers for delay-service tests: write Scheduled messages into a buffer topic, check delivery.

Target topics are created with :func:`create_target`: ``message.timestamp.type=LogAppendTime``,
so a delivered record's timestamp is the broker's clock, not the releasing master's, and
:func:`assert_not_early` (and the verifier) judge "early" by it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from confluent_kafka import KafkaError, Message, Producer

from kdelay.buffer import BufferRecord, Scheduled, encode, partition_for
from tests.support.kafka_helpers import Record, create_topic

#: Topic config of a target topic whose record timestamps are the broker's append time.
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def create_target(bootstrap: str, name: str, partitions: int = 1) -> None:
    """Create a target topic stamped by the broker (LogAppendTime)."""
    create_topic(bootstrap, name, partitions, config=dict(LOG_APPEND_TIME))


def buffer_partition(msg_id: str, partitions: int) -> int:
    """The buffer partition of every record about an id: the proxy's (Kafka's murmur2 of the
    id), so a cancel follows its message in one partition."""
    return partition_for(msg_id, partitions)


def produce_buffer(
    bootstrap: str, topic: str, partitions: int, records: Iterable[BufferRecord]
) -> None:
    """Write buffer records the way the proxy does (partition by id; acks=all, idempotent)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
    )
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    for record in records:
        enc = encode(record)
        while True:
            try:
                producer.produce(
                    topic,
                    enc.value,
                    enc.key,
                    partition=buffer_partition(record.id, partitions),
                    headers=list(enc.headers),
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0, "buffer records unacknowledged after 60 s"
    assert failures == [], f"buffer writes failed: {failures[:3]}"


def delivered_ids(records: Sequence[Record]) -> Counter[str]:
    return Counter((r.header("kdelay-id") or b"").decode() for r in records)


def assert_delivered_once(messages: Sequence[Scheduled], records: Sequence[Record]) -> None:
    """Every message exactly once, never before its due time, with the right content."""
    counts = delivered_ids(records)
    expected = {m.id: m for m in messages}
    missing = [i for i in expected if counts[i] == 0]
    dupes = {i: c for i, c in counts.items() if c > 1}
    unknown = [i for i in counts if i not in expected]
    assert not missing, f"{len(missing)} missing, e.g. {missing[:5]}"
    assert not dupes, f"{len(dupes)} duplicated, e.g. {list(dupes.items())[:5]}"
    assert not unknown, f"unexpected ids {unknown[:5]}"
    assert_not_early(records)
    for r in records:
        m = expected[(r.header("kdelay-id") or b"").decode()]
        assert (r.topic, r.key, r.value) == (m.topic, m.key, m.value)
        if m.partition >= 0:
            assert r.partition == m.partition
        assert list(r.headers) == [(n, v) for n, v in m.delivered_headers()]


def assert_not_early(records: Sequence[Record]) -> None:
    """No record's timestamp is before its ``kdelay-deliver-at``: the broker's clock on a
    :func:`create_target` topic (on a CreateTime topic, only the master's own claim)."""
    early = [r for r in records if r.timestamp_ms < int(r.header("kdelay-deliver-at") or b"0")]
    assert not early, f"{len(early)} delivered early, e.g. {early[:2]}"
