"""One idempotent librdkafka producer's throughput and acknowledgement latency, as the proxy
benches measure it (``bench.proxy``, ``bench.sasl_produce``): a warm-up record (metadata,
producer id, a SASL login), then ``n`` records, paced at ``rate`` when given.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, Message, Producer

from kdelay import headers as h
from kdelay.stats import percentile

#: What the benches send: plain records, delayed ones (an hour), delayed ones with their own id.
KINDS = ("immediate", "delayed", "delayed with id")


def timed_produce(
    bootstrap: str,
    topic: str,
    n: int,
    size: int,
    *,
    kind: str,
    rate: float | None = None,
    conf: Mapping[str, str] | None = None,
) -> tuple[float, float, float]:
    """Throughput (msg/s) and ack latency p50/p99 (ms) of ``n`` records of ``size`` bytes of
    ``kind`` (:data:`KINDS`); ``conf`` adds producer settings (security)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            **(conf or {}),
        }
    )
    value = os.urandom(size)
    latencies: list[float] = []
    errors: list[KafkaError] = []
    headers: list[tuple[str, str | bytes | None]] = (
        [] if kind == "immediate" else [(h.DELAY_MS, b"3600000")]
    )
    with_id = kind == "delayed with id"

    def report(start: float) -> Callable[[KafkaError | None, Message], None]:
        def cb(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)
            latencies.append((time.perf_counter() - start) * 1000)

        return cb

    producer.produce(topic, value, headers=headers)  # warm-up: login, metadata, producer id
    producer.flush(60)
    began = time.perf_counter()
    for i in range(n):
        if rate is not None:
            due = began + i / rate
            while time.perf_counter() < due:
                producer.poll(0)
        while True:
            try:
                own = [*headers, (h.ID, uuid.uuid4().hex.encode())] if with_id else headers
                producer.produce(topic, value, headers=own, on_delivery=report(time.perf_counter()))
                break
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    p50, p99 = (percentile(latencies, q, empty=math.nan) for q in (0.5, 0.99))
    return n / elapsed, p50, p99
