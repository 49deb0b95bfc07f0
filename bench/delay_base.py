"""When does a delay start? The drift of the delay base under backpressure (not a test).

    .venv/bin/python -m bench.delay_base [--bootstrap HOST:PORT] [--records 100000]
        [--size 512] [--rate 0]

A delay (``kdelay-delay-ms``, ``kdelay-delay-level``) counts from the broker's append time of
the message's buffer record (``__kdelay_buffer`` is ``LogAppendTime``; README "Guarantees").
When producers send faster than the proxy writes, requests queue (in the client, in the socket,
in the proxy) and that append time drifts past the moment the client sent the record. This
measures the drift: a confluent-kafka producer (idempotent, acks=all) offers ``--records``
delayed records (2 s delay) through a ``kdelay proxy`` as fast as it can (or at ``--rate``
records/s), each carrying its creation time (the producer's record timestamp, also in a
header, as the buffer record's own timestamp is the broker's); then the buffer topic is read
back and, per record, *buffer append time - creation time* is reported: p50, p99 and max, over
all records and over the first and the last tenth sent. Also the offered and acknowledged rates.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from bench.harness.proxy_process import local_kafka, proxy_process
from dev.kafka_tools import create_topic, unique_topic
from kdelay import buffer
from kdelay import headers as h
from kdelay.stats import percentile

CREATED = "bench-created-ms"
RUN = "bench-run"


def offer(address: str, topic: str, args: argparse.Namespace, run: str) -> tuple[float, float]:
    """Produce ``args.records`` delayed records; the seconds spent offering them and until all
    were acknowledged."""
    n, size, rate = args.records, args.size, args.rate
    producer = Producer(
        {
            "bootstrap.servers": address,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": max(n, 100_000),
            "queue.buffering.max.kbytes": 4 * 1024 * 1024,
            "message.timeout.ms": 600_000,
        }
    )
    value = os.urandom(size)
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err.str())

    began = time.monotonic()
    for i in range(n):
        if rate > 0:
            wait = began + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        created = time.time_ns() // 1_000_000
        headers: list[tuple[str, str | bytes | None]] = [
            (h.DELAY_MS, b"2000"),
            (CREATED, str(created).encode()),
            (RUN, run.encode()),
        ]
        while True:
            try:
                producer.produce(
                    topic, value, timestamp=created, headers=headers, on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    offered = time.monotonic() - began
    if producer.flush(600) or errors:
        raise RuntimeError(
            f"{producer.flush(0)} unacknowledged, {len(errors)} errors: {errors[:3]}"
        )
    return offered, time.monotonic() - began


def drifts(bootstrap: str, n: int, run: str) -> list[tuple[int, int]]:
    """(creation ms, append ms - creation ms) of this run's ``n`` buffer records."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    meta = consumer.list_topics(buffer.BUFFER_TOPIC, timeout=10)
    parts = meta.topics[buffer.BUFFER_TOPIC].partitions
    consumer.assign([TopicPartition(buffer.BUFFER_TOPIC, p, -2) for p in parts])
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + 300
    try:
        while len(out) < n and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    continue
                found = dict(msg.headers() or [])
                if found.get(RUN) != run.encode():
                    continue
                created = int(found[CREATED] or b"0")
                out.append((created, msg.timestamp()[1] - created))
    finally:
        consumer.close()
    return out


def _stats(values: list[int]) -> str:
    ordered = sorted(float(v) for v in values)
    p50, p99 = percentile(ordered, 0.5), percentile(ordered, 0.99)
    return f"{p50:,.0f} | {p99:,.0f} | {ordered[-1]:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=None, help="an existing Kafka (default: start one)")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=512, help="value bytes")
    ap.add_argument("--rate", type=float, default=0, help="records/s offered (0: no limit)")
    args = ap.parse_args()
    run = uuid.uuid4().hex
    with local_kafka(args.bootstrap) as bootstrap, proxy_process(bootstrap) as proxy:
        target = unique_topic("bench-base")
        create_topic(bootstrap, target, partitions=3)
        offered_s, acked_s = offer(proxy.kafka, target, args, run)
        got = drifts(bootstrap, args.records, run)
    if len(got) < args.records:
        raise RuntimeError(f"read {len(got)} of {args.records} buffer records back")
    got.sort()
    tenth = max(1, len(got) // 10)
    n = args.records
    print(
        f"{n:,} delayed records of {args.size} B: offered in {offered_s:.1f} s "
        f"({n / offered_s:,.0f}/s), all acknowledged after {acked_s:.1f} s ({n / acked_s:,.0f}/s)"
    )
    print()
    print("| records | drift p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    for label, part in (
        ("all", got),
        ("first tenth sent", got[:tenth]),
        ("last tenth sent", got[-tenth:]),
    ):
        print(f"| {label} | {_stats([d for _, d in part])} |")
    print()
    print("drift = buffer record's append time (LogAppendTime) - the producer's record creation")


if __name__ == "__main__":
    main()
