"""A consumer whose failed messages come back later, the delay kept by kdelay (docs/retry.md).

    kdelay up --proxy-port 9192 --kafka-port 9092 &
    python examples/retry_consumer.py --proxy 127.0.0.1:9192 \\
        --bootstrap-servers 127.0.0.1:9092 --topic orders --group billing --delays 1s,5s
    kdelay send --bootstrap-servers 127.0.0.1:9192 --topic orders "fail: no stock"
    kdelay send --bootstrap-servers 127.0.0.1:9192 --topic orders "order 42"

The handler prints each delivery with its attempt number. It raises for a value that starts
with ``fail``, so that message is retried after 1 s, again after 5 s, then dead-lettered into
``billing.dlq`` with its error; ``--fail-attempts 1`` also fails every message's first attempt,
so each succeeds on its retry. Without ``--delays`` the retries follow RocketMQ's delay levels
3..18 (10 s, 30 s, 1 m, ... 2 h). Stop with Ctrl-C: the offsets of handled messages are
committed, the others are delivered again to the next consumer of the group.
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType

from confluent_kafka import Message

from kdelay import logs
from kdelay.durations import duration_ms
from kdelay.retry import RetryingConsumer, RetryPolicy


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--proxy", required=True, help="the kdelay proxy's Kafka address")
    ap.add_argument("--bootstrap-servers", required=True, help="Kafka, to consume from")
    ap.add_argument("--topic", required=True, action="append", help="a topic (repeatable)")
    ap.add_argument("--group", required=True, help="consumer group id")
    ap.add_argument("--delays", help="backoff per retry, e.g. 1s,5s,1m [delay levels 3..18]")
    ap.add_argument("--fail-attempts", type=int, default=0, help="fail each message's first N")
    args = ap.parse_args()
    logs.configure("INFO", json=False)

    policy = (
        RetryPolicy(delays_ms=[duration_ms(d) for d in args.delays.split(",")])
        if args.delays
        else RetryPolicy()
    )
    consumer: RetryingConsumer

    def handle(msg: Message) -> None:
        attempt = consumer.attempt(msg)
        value = (msg.value() or b"").decode("utf-8", "replace")
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        print(f"{where} attempt {attempt}: {value}", flush=True)  # noqa: T201
        if value.startswith("fail"):
            raise RuntimeError(value)
        if attempt <= args.fail_attempts:
            raise RuntimeError(f"failing attempt {attempt} on purpose")

    consumer = RetryingConsumer(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
        },
        args.proxy,
        args.topic,
        handle,
        policy=policy,
    )
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(  # noqa: T201
        f"consuming {args.topic} and {consumer.retry_topic}; dead letters go to "
        f"{consumer.dead_letter_topic}; {policy.max_attempts} attempts per message"
    )
    with consumer:
        consumer.run(stop)


if __name__ == "__main__":
    main()
