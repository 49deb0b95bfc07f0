"""The retry helper's latency at a light rate against a plain consumer loop (not a test).

    .venv/bin/python -m bench.retry_latency [--messages 40] [--interval 0.2] [--rounds 2]

Starts a local Kafka. Each case reads a fresh 3-partition topic in a new consumer group while
one producer writes ``--messages`` records, one every ``--interval`` seconds, each carrying its
send time; the handler notes when it saw it. Nothing fails, so the helper's proxy is not used
(it is given the broker's address). Cases, alternating in each round:

- ``plain``: a confluent-kafka loop on ``poll(1.0)``, the lowest latency a consumer gets;
- ``helper``: :class:`kdelay.retry.RetryingConsumer` with its defaults (``run``: batches of
  100, a poll timeout of 1 s).

Prints one JSON document: send-to-handler latency p50, p99 and max per case (ms, over every
round's messages), and helper p50 / plain p50.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Message, Producer
from prometheus_client import CollectorRegistry

from bench.harness.proxy_process import local_kafka
from bench.harness.retry_consumer import PARTITIONS, conf
from dev.kafka_tools import create_topic, unique_topic
from kdelay.retry import RetryingConsumer
from kdelay.stats import percentile

JOIN_S = 6.0  # a new group's join and first fetch, before the first record is sent


def _send(bootstrap: str, topic: str, n: int, interval: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for _ in range(n):
        producer.produce(topic, b"%f" % (time.time() * 1000))
        producer.flush(10)
        time.sleep(interval)


def _plain(
    bootstrap: str, topic: str, seen: Callable[[Message], None], stop: threading.Event
) -> None:
    consumer = Consumer(conf(bootstrap))
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen(msg)
                consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()


def _helper(
    bootstrap: str, topic: str, seen: Callable[[Message], None], stop: threading.Event
) -> None:
    with RetryingConsumer(
        conf(bootstrap), bootstrap, [topic], seen, registry=CollectorRegistry()
    ) as rc:
        rc.run(stop=stop)


def measure(
    bootstrap: str,
    loop: Callable[[str, str, Callable[[Message], None], threading.Event], None],
    n: int,
    interval: float,
) -> list[float]:
    """Send-to-handler latencies (ms) of ``n`` records through ``loop``."""
    topic = unique_topic("bench-retry-lat")
    create_topic(bootstrap, topic, PARTITIONS)
    latencies: list[float] = []

    def seen(msg: Message) -> None:
        latencies.append(time.time() * 1000 - float(msg.value() or b"0"))

    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(bootstrap, topic, seen, stop), daemon=True)
    thread.start()
    time.sleep(JOIN_S)
    _send(bootstrap, topic, n, interval)
    deadline = time.monotonic() + 30
    while len(latencies) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    if len(latencies) < n:
        raise RuntimeError(f"{len(latencies)} of {n} records handled within 30 s")
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between records")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cases = {"plain": _plain, "helper": _helper}
    got: dict[str, list[float]] = {name: [] for name in cases}
    with local_kafka(None) as bootstrap:
        for k in range(args.rounds):
            for name in list(cases) if k % 2 == 0 else list(cases)[::-1]:
                got[name] += measure(bootstrap, cases[name], args.messages, args.interval)
    report: dict[str, float | dict[str, float]] = {
        name: {f"p{int(q * 100)}_ms": round(percentile(v, q), 1) for q in (0.5, 0.99)}
        | {"max_ms": round(max(v), 1)}
        for name, v in got.items()
    }
    report["helper_p50_over_plain_p50"] = round(
        percentile(got["helper"], 0.5) / percentile(got["plain"], 0.5), 2
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
