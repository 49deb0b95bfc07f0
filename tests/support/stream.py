"""A steady stream of delayed messages through a proxy, for the failover tests.

Each message carries ``kdelay-id`` ``<prefix>-<n>`` (also its key) and a delay of 500-3000 ms,
about 40 a second, round-robin over ``partitions``; the ids the proxy acknowledged and the
failures are kept, so a test can check that every acknowledged message was delivered.
"""

from __future__ import annotations

import threading
import uuid

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from dev.kafka_tools import Record
from dev.stack import wait_until
from kdelay import headers as h


class DelayedStream(threading.Thread):
    """Produces until :meth:`finish`; ``acked`` and ``failed`` by message id."""

    def __init__(self, proxy: str, topic: str, *, prefix: str, partitions: int) -> None:
        super().__init__(name=f"{prefix}-stream", daemon=True)
        self.topic = topic
        self.prefix = prefix
        self.partitions = partitions
        self.producer = Producer(
            {"bootstrap.servers": proxy, "enable.idempotence": True, "linger.ms": 5}
        )
        self.acked: set[str] = set()
        self.failed: list[tuple[str, KafkaError]] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        msg_id = (msg.key() or b"").decode()
        with self._lock:
            if err is None:
                self.acked.add(msg_id)
            else:
                self.failed.append((msg_id, err))

    def run(self) -> None:
        while not self._halt.is_set():
            i = self.sent
            msg_id = f"{self.prefix}-{i}"
            self.producer.produce(
                self.topic,
                f"value-{i}".encode(),
                msg_id.encode(),
                partition=i % self.partitions,
                headers=[(h.DELAY_MS, str(500 + (i * 37) % 2501).encode()), (h.ID, msg_id)],
                on_delivery=self._on_delivery,
            )
            self.sent += 1
            self.producer.poll(0.025)  # pacing: about 40 messages a second

    def finish(self) -> None:
        """Stop producing and wait until every message is acknowledged (or failed)."""
        self._halt.set()
        self.join(timeout=60)
        assert self.producer.flush(120) == 0, "messages still unacknowledged after 120 s"


def read_deliveries(
    kafka: str, topic: str, want: set[str], *, partitions: int, timeout: float = 300.0
) -> list[Record]:
    """``topic``'s records, read_committed from the beginning, until every id in ``want`` is
    there (``kdelay-id``), plus whatever duplicates had already arrived by then."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"stream-check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # -2: beginning
    records: list[Record] = []

    def ids() -> set[str]:
        for msg in consumer.consume(2000, timeout=0.5):
            if msg.error() is None:
                records.append(Record.of(msg))
        return {(r.header(h.ID) or b"").decode() for r in records}

    try:
        wait_until(
            lambda: want <= ids(),
            timeout=timeout,
            what=f"all {len(want)} acknowledged messages to be delivered",
            interval=0.5,
        )
        ids()  # and whatever duplicates are already there
    finally:
        consumer.close()
    return records
