"""A RetryingConsumer in its own process, for tests that SIGKILL it between attempts.

    python -m tests.support.retry_consumer --bootstrap K --proxy P --topic T --group G
        --delays-ms 5000,500 --fail-until 1 --log deliveries.jsonl [--offset-reset latest]

Each delivery appends one JSON line to ``--log`` *before* the handler decides (topic,
partition, offset, attempt, key, value, headers), flushed, so a killed process's log says what
it was given. The handler fails while the delivery's attempt is at most ``--fail-until``.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path
from types import FrameType

from confluent_kafka import Message

from dev.kafka_tools import Record
from kdelay import logs
from kdelay.retry import RetryingConsumer, RetryPolicy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--delays-ms", required=True, help="comma-separated")
    ap.add_argument("--fail-until", type=int, default=0)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--offset-reset", default="earliest")
    args = ap.parse_args()
    logs.configure("INFO")
    stop = threading.Event()

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    out = args.log.open("a")
    holder: list[RetryingConsumer] = []

    def handle(msg: Message) -> None:
        attempt = holder[0].attempt(msg)
        r = Record.of(msg)
        line = {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "attempt": attempt,
            "key": (r.key or b"").decode(),
            "value": (r.value or b"").decode(),
            "headers": {k: (v or b"").decode() for k, v in r.headers},
        }
        out.write(json.dumps(line) + "\n")
        out.flush()
        if attempt <= args.fail_until:
            raise RuntimeError(f"failing attempt {attempt} on purpose")

    consumer = RetryingConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": args.offset_reset,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        },
        args.proxy,
        [args.topic],
        handle,
        policy=RetryPolicy(delays_ms=[int(d) for d in args.delays_ms.split(",")]),
    )
    holder.append(consumer)
    with consumer:
        consumer.run(stop, poll_timeout=0.2)
    out.close()


if __name__ == "__main__":
    main()
