"""Load and lateness for the delay-service benches: buffer records produced, paced, and read back.

What ``bench.delay_service``, ``bench.delivery``, ``bench.isolation``, ``bench.series`` and
``bench.shards`` share. Buffer records go straight to the buffer topic (no proxy) through one
idempotent confluent-kafka producer (acks=all, ``linger.ms`` 5), partition ``i %``
:data:`~bench.harness.replicas.PARTITIONS`; :func:`paced` spreads them over time from the
caller's thread. A released record's lateness is read from the target topic two ways, each in
ms against its ``kdelay-deliver-at`` header (or a baseline's ``sent-at``): the record's
timestamp (*release*) and the consumer's receipt (*receipt*). :class:`Reader` reads on a thread
of its own, started and fetching before the caller produces; :func:`baseline` is the same
schedule through plain Kafka (produce, then consume), measured in the same run.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.harness.replicas import PARTITIONS, Replicas
from dev.kafka_tools import create_topic
from kdelay.buffer import Scheduled, encode
from kdelay.stats import percentile

#: Percentiles of the kdelay-wide definition; nan (not 0) when a run delivered nothing.
pct = functools.partial(percentile, empty=math.nan)


def producer(bootstrap: str) -> Producer:
    """The benches' idempotent producer (acks=all, ``linger.ms`` 5, a deep local queue)."""
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def produce(
    p: Producer,
    topic: str,
    partition: int,
    enc: tuple[bytes, bytes | None, list[tuple[str, bytes | None]]],
) -> None:
    """Produce ``enc`` (key, value, headers) to ``topic``/``partition``, polling while the
    producer's queue is full."""
    key, value, headers = enc
    while True:
        try:
            p.produce(topic, value, key, partition=partition, headers=list(headers))
        except BufferError:
            p.poll(0.05)
        else:
            return


def produce_buffer(bootstrap: str, topic: str, messages: Iterable[Scheduled]) -> None:
    """Encode ``messages`` as buffer records to ``topic`` as fast as possible; flushed."""
    p = producer(bootstrap)
    for i, m in enumerate(messages):
        enc = encode(m)
        produce(p, topic, i % PARTITIONS, (enc.key, enc.value, list(enc.headers)))
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)


def paced(rate: int, seconds: float, make: Callable[[int], None], p: Producer) -> int:
    """Call make(i) at ``rate`` per second for ``seconds``; returns how many were made."""
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(n):
        target = start + i / rate
        delay = target - time.monotonic()
        if delay > 0.002:
            p.poll(delay)
        make(i)
    p.flush(60)
    return n


@dataclass
class Lateness:
    """Lateness in ms of each record read: by its timestamp and by its receipt."""

    release: list[float]
    receipt: list[float]

    def row(self) -> str:
        return (
            f"{pct(self.release, 0.5):8.1f} {pct(self.release, 0.99):8.1f} "
            f"{max(self.release, default=float('nan')):8.1f} | "
            f"{pct(self.receipt, 0.5):8.1f} {pct(self.receipt, 0.99):8.1f} "
            f"{max(self.receipt, default=float('nan')):8.1f}"
        )


def consume_lateness(
    bootstrap: str, topic: str, n: int, timeout: float, ready: threading.Event | None = None
) -> Lateness:
    """Read ``n`` records of ``topic``; lateness in ms against kdelay-deliver-at (or sent-at).

    Receipt times must not include the reader's own batching: ``consume(N, t)`` waits until N
    records or t have passed, so one record is awaited with ``poll`` and whatever else is
    already fetched is drained with a zero-timeout ``consume``. ``ready`` is set once the
    partitions are assigned and a first fetch round has run, so producing starts after that.
    """
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    c.assign([TopicPartition(topic, p, -2) for p in range(PARTITIONS)])
    c.poll(0.5)  # connect, fetch metadata, start fetching (the topic is still empty)
    if ready is not None:
        ready.set()
    release: list[float] = []
    receipt: list[float] = []
    deadline = time.monotonic() + timeout
    while len(release) < n and time.monotonic() < deadline:
        first = c.poll(0.1)
        if first is None:
            continue
        for msg in [first, *c.consume(10_000, 0)]:
            if msg.error():
                continue
            now = time.time() * 1000
            hdrs = dict(msg.headers() or [])
            due = float(hdrs.get("kdelay-deliver-at") or hdrs.get("sent-at") or 0)
            release.append(msg.timestamp()[1] - due)
            receipt.append(now - due)
    c.close()
    return Lateness(release, receipt)


class Reader:
    """Consumes ``n`` records of ``topic`` on a thread started *before* producing."""

    def __init__(self, bootstrap: str, topic: str, n: int, timeout: float) -> None:
        self.result: Lateness | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(bootstrap, topic, n, timeout, ready), daemon=True
        )
        self._thread.start()
        if not ready.wait(60):
            raise TimeoutError(f"the bench consumer of {topic} did not start within 60 s")

    def _run(
        self, bootstrap: str, topic: str, n: int, timeout: float, ready: threading.Event
    ) -> None:
        self.result = consume_lateness(bootstrap, topic, n, timeout, ready)

    def wait(self) -> Lateness:
        self._thread.join()
        assert self.result is not None
        return self.result


def baseline(bootstrap: str, rate: int, seconds: float) -> Lateness:
    """Plain Kafka at ``rate`` a second for ``seconds``: records produced to a fresh topic,
    read back; lateness against their send time."""
    topic = f"bench-base-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    p = producer(bootstrap)
    reader = Reader(bootstrap, topic, int(rate * seconds), timeout=seconds + 60)
    paced(
        rate, seconds,
        lambda i: produce(p, topic, i % PARTITIONS,
                           (b"k", b"v", [("sent-at", str(time.time() * 1000).encode())])),
        p,
    )  # fmt: skip
    return reader.wait()


def delayed(rs: Replicas, rate: int, seconds: float, delay_ms: int = 1000) -> Lateness:
    """Schedules at ``rate`` a second for ``seconds`` into ``rs``' buffer topic, each due
    ``delay_ms`` after it is made, released by ``rs`` to a fresh topic, read back."""
    topic = f"bench-target-{uuid.uuid4().hex[:8]}"
    create_topic(rs.bootstrap, topic, PARTITIONS)
    p = producer(rs.bootstrap)

    def make(i: int) -> None:
        m = Scheduled(uuid.uuid4().hex, topic, i % PARTITIONS, None, b"v",
                      int(time.time() * 1000) + delay_ms)  # fmt: skip
        enc = encode(m)
        produce(p, rs.buffer, i % PARTITIONS, (enc.key, enc.value, list(enc.headers)))

    reader = Reader(rs.bootstrap, topic, int(rate * seconds), timeout=seconds + 120)
    paced(rate, seconds, make, p)
    return reader.wait()
