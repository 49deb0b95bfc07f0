"""Helpers for delay-service tests: write Scheduled messages into a buffer topic, check delivery."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Sequence

from confluent_kafka import KafkaError, Message, Producer

from kdelay.buffer import BufferRecord, Scheduled, encode
from tests.support.kafka_helpers import Record


def buffer_partition(msg_id: str, partitions: int) -> int:
    """The buffer partition of an id (any stable function will do for tests)."""
    return zlib.crc32(msg_id.encode()) % partitions


def produce_buffer(
    bootstrap: str, topic: str, partitions: int, records: Iterable[BufferRecord]
) -> None:
    """Write buffer records the way the proxy does (key = id; acks=all, idempotent)."""
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
    early = [r for r in records if r.timestamp_ms < int(r.header("kdelay-deliver-at") or b"0")]
    assert not early, f"{len(early)} delivered early, e.g. {early[:2]}"
