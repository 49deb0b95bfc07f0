"""The retry helper's throughput against a plain consumer loop, in the same run (not a test).

    .venv/bin/python -m bench.retry_helper [--messages 50000] [--batch 100] [--rounds 3] [--json F]

Starts the stack ``kdelay up`` starts (:class:`dev.stack.stack.LocalStack`: ZooKeeper,
Kafka, the proxy, one replica). Each case reads a fresh 3-partition topic of ``--messages``
records produced straight to Kafka, in a new consumer group, and times from the first message
to the last one handled (the group join is not counted):

- ``plain``: a confluent-kafka consumer loop that calls the handler on ``consume(--batch)`` and
  commits the batch's offsets synchronously, as the helper does; a failure is only counted.
- ``helper``: :class:`kdelay.retry.RetryingConsumer` with the same batch size; a failure is
  produced through the proxy to the retry topic (``delays_ms=[0]``), awaited, then committed.

Two handlers: one that always succeeds, and one that fails every tenth message once. For the
latter the helper's time is given twice: until every message had its first delivery
(``main``), and until every message succeeded, the retries back through the replica (``all``).
Each round measures plain and helper back to back on fresh topics, in alternating order.
Prints one JSON document: messages per second per case (median of ``--rounds``), and each
helper/plain ratio as the median of its per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from bench.harness.retry_consumer import PARTITIONS, conf
from dev.kafka_tools import create_topic, unique_topic
from dev.stack.stack import LocalStack, StackOptions
from kdelay import logs
from kdelay.retry import RetryingConsumer, RetryPolicy

TIMEOUT_S = 600.0


def fill(bootstrap: str, n: int, size: int) -> str:
    """A fresh topic holding ``n`` records whose values start with their index."""
    topic = unique_topic("bench-retry")
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    pad = b"x" * size
    for i in range(n):
        while True:
            try:
                producer.produce(topic, b"%d:" % i + pad, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("records not acknowledged")
    return topic


def failing(every: int) -> Callable[[Message, int], None]:
    """A handler failing attempt 1 of every ``every``-th message (never, for 0)."""

    def handle(msg: Message, attempt: int) -> None:
        index = int((msg.value() or b"0:").split(b":", 1)[0])
        if every and attempt == 1 and index % every == 0:
            raise RuntimeError(f"message {index} fails once")

    return handle


def plain(bootstrap: str, topic: str, n: int, batch: int, every: int) -> float:
    """Messages per second of a plain loop committing each batch synchronously."""
    handle = failing(every)
    consumer = Consumer(conf(bootstrap))
    consumer.subscribe([topic])
    done = failures = 0
    began = 0.0
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while done < n and time.monotonic() < deadline:
            msgs = consumer.consume(batch, 0.5)
            if msgs and not began:
                began = time.monotonic()
            offsets: dict[tuple[str, int], int] = {}
            for msg in msgs:
                if msg.error() is not None:
                    continue
                try:
                    handle(msg, 1)
                except RuntimeError:
                    failures += 1
                offsets[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
                done += 1
            if offsets:
                tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
                consumer.commit(offsets=tps, asynchronous=False)
        elapsed = time.monotonic() - began
    finally:
        consumer.close()
    if done < n:
        raise RuntimeError(f"plain loop handled {done} of {n}")
    return n / elapsed


def helper(
    bootstrap: str, proxy: str, topic: str, *, n: int, batch: int, every: int
) -> tuple[float, float]:
    """Messages per second of the helper: until each had its first delivery, and until each
    succeeded."""
    handle = failing(every)
    first = succeeded = 0
    began = main_done = 0.0

    def handler(msg: Message) -> None:
        nonlocal first, succeeded, began, main_done
        if not began:
            began = time.monotonic()
        attempt = rc.attempt(msg)
        if attempt == 1:
            first += 1
            if first == n:
                main_done = time.monotonic()
        handle(msg, attempt)
        succeeded += 1

    rc = RetryingConsumer(
        conf(bootstrap), proxy, [topic], handler,
        policy=RetryPolicy(delays_ms=[0]), batch_size=batch, registry=CollectorRegistry(),
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    with rc:
        while succeeded < n and time.monotonic() < deadline:
            rc.poll_once(0.5)
    ended = time.monotonic()
    if succeeded < n:
        raise RuntimeError(f"helper: {succeeded} of {n} succeeded")
    return n / (main_done - began), n / (ended - began)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=100, help="messages per poll and commit")
    ap.add_argument("--size", type=int, default=256, help="value bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    logs.configure("WARNING")  # to stderr: stdout is the report
    n, batch = args.messages, args.batch
    runs: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)
        print(f"{name}: {value:,.0f} msg/s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="kdelay-bench-retry-") as tmp:
        data = Path(tmp)
        stack = LocalStack(
            StackOptions(replicas=1, data_dir=data / "data", state_file=data / "up.json"),
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        try:
            stack.start()
            bs, proxy = stack.bootstrap, f"127.0.0.1:{stack.proxy_port}"
            for i in range(args.rounds):
                for every in (0, 10):
                    # Each pair on fresh topics, back to back; the order alternates by round so
                    # that a machine getting busier or quieter favours neither side.
                    label = "ok" if every == 0 else "fail10"
                    sides = ["plain", "helper"] if i % 2 == 0 else ["helper", "plain"]
                    for side in sides:
                        topic = fill(bs, n, args.size)
                        if side == "plain":
                            record(f"plain_{label}", plain(bs, topic, n, batch, every))
                            continue
                        main_rate, all_rate = helper(
                            bs, proxy, topic, n=n, batch=batch, every=every
                        )
                        record(f"helper_{label}" if every == 0 else "helper_fail10_main", main_rate)
                        if every:
                            record("helper_fail10_all", all_rate)
                        gc.collect()  # each consumer and its handler refer to each other
        finally:
            stack.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}

    def ratio(helper_case: str, plain_case: str) -> float:
        """The median over rounds of helper / plain, each pair measured back to back."""
        pairs = zip(runs[helper_case], runs[plain_case], strict=True)
        return round(statistics.median(a / b for a, b in pairs), 3)

    report = {
        "messages": n,
        "batch": batch,
        "rounds": args.rounds,
        "per_s_median": {k: round(v) for k, v in med.items()},
        "ratio_ok": ratio("helper_ok", "plain_ok"),
        "ratio_fail10_main": ratio("helper_fail10_main", "plain_fail10"),
        "ratio_fail10_all": ratio("helper_fail10_all", "plain_fail10"),
        "runs": {k: [round(x) for x in v] for k, v in runs.items()},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
