"""Buffer records written straight to a buffer topic, and a topic read for a while: the
compaction tests (tests/integration/test_cancel_tombstones.py, test_away_rebuild.py) write
cancels and schedules as a proxy would, then watch what the cleaner leaves."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, Message, Producer

from kdelay.buffer import BufferRecord, encode
from tests.support.kafka_helpers import Record, consume_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def write_buffer_records(
    bootstrap: str, topic: str, records: list[tuple[BufferRecord, int]]
) -> None:
    """Write buffer records, each with its timestamp, to partition 0 in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    for record, timestamp in records:
        enc = encode(record)
        producer.produce(
            topic,
            enc.value,
            enc.key,
            partition=0,
            headers=list(enc.headers),
            timestamp=timestamp,
            on_delivery=on_delivery,
        )
    assert producer.flush(60) == 0
    assert failures == [], failures[:3]


def read_for(bootstrap: str, topic: str, seconds: float) -> list[Record]:
    end = time.monotonic() + seconds
    return consume_until(bootstrap, [topic], lambda _r: time.monotonic() > end)
