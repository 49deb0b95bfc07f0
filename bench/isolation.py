"""Isolation benchmark: a healthy target's lateness while another target's partitions are
leaderless, against its lateness with no failure and against plain Kafka, in the same run.

Run: ``.venv/bin/python -m bench.isolation`` (``--help`` for sizes). It starts a 3-broker Kafka
and ZooKeeper through dev.stack and one replica as a ``kdelay delay-service`` subprocess.
Topic X lives on broker 3 only (replication 1); topic Y, the buffer topic, the dead-letter topic
and the plain-Kafka baseline topic live on brokers 1 and 2, so stopping broker 3 touches X alone.

- phase A: scheduled messages at a steady rate, half to X, half to Y; no failure;
- phase B: broker 3 stopped (X leaderless), the same load; then broker 3 returns and X drains.

Lateness is by the broker's clock: X and Y use ``message.timestamp.type=LogAppendTime``, so
lateness = record timestamp - ``kdelay-deliver-at``; receipt lateness = consumer receipt time -
due time. The baseline is a plain produce -> consume on its own topic during each phase
(timestamp and receipt against the send time). Figures depend on the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.harness.lateness import Lateness, Reader, paced, produce, producer
from bench.harness.replicas import PARTITIONS, Replicas
from dev.stack import KafkaSettings, LocalKafka, LocalZooKeeper, wait_until
from kdelay.buffer import DEAD_LETTER_TOPIC, Scheduled, encode
from kdelay.stats import percentile
from kdelay.topics import BUFFER_TOPIC_CONFIG

pct = functools.partial(percentile, empty=math.nan)
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
FAILING = 2  # LocalKafka.nodes index of the broker that holds X: broker id 3


def create(admin: AdminClient, name: str, brokers: list[int], config: dict[str, str]) -> None:
    """``name`` with PARTITIONS partitions whose replicas are exactly ``brokers``."""
    assignment = [brokers[i % len(brokers) :] + brokers[: i % len(brokers)] for i in range(4)]
    topic = NewTopic(name, PARTITIONS, replica_assignment=assignment[:PARTITIONS], config=config)
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=30)
    wait_until(
        lambda: (
            (meta := admin.list_topics(name, timeout=5).topics.get(name)) is not None
            and meta.error is None
            and len(meta.partitions) == PARTITIONS
            and all(p.leader >= 0 for p in meta.partitions.values())
        ),
        timeout=30,
        what=f"topic {name} to have leaders",
    )


def summary(lat: Lateness, expected: int) -> dict[str, object]:
    return {
        "delivered": len(lat.release),
        "expected": expected,
        "release_ms": [pct(lat.release, 0.5), pct(lat.release, 0.99), max(lat.release, default=0)],
        "receipt_ms": [pct(lat.receipt, 0.5), pct(lat.receipt, 0.99), max(lat.receipt, default=0)],
    }


def phase(
    bs: str, buffer: str, topics: tuple[str, str, str], *, rate: int, seconds: float, delay_ms: int
) -> tuple[Reader, Lateness, Lateness]:
    """Schedule ``rate``/s for ``seconds`` (X and Y alternately) beside a plain-Kafka baseline
    at ``rate``/2; returns X's reader (still running) and Y's and the baseline's lateness."""
    x, y, plain = topics
    n = int(rate * seconds)
    half = n // 2
    x_reader = Reader(bs, x, n - half, timeout=seconds + 300)
    y_reader = Reader(bs, y, half, timeout=seconds + 120)
    base_reader = Reader(bs, plain, half, timeout=seconds + 120)
    base_p: Producer = producer(bs)

    def base_make(i: int) -> None:
        sent = str(time.time() * 1000).encode()
        produce(base_p, plain, i % PARTITIONS, (b"k", b"v", [("sent-at", sent)]))

    base_thread = threading.Thread(
        target=paced, args=(rate // 2, seconds, base_make, base_p), daemon=True
    )
    base_thread.start()
    p = producer(bs)

    def make(i: int) -> None:
        target = x if i % 2 == 0 else y
        due = int(time.time() * 1000) + delay_ms
        enc = encode(Scheduled(uuid.uuid4().hex, target, (i // 2) % PARTITIONS, None, b"v", due))
        produce(p, buffer, i % PARTITIONS, (enc.key, enc.value, list(enc.headers)))

    paced(rate, seconds, make, p)
    base_thread.join()
    return x_reader, y_reader.wait(), base_reader.wait()


def row(name: str, lat: Lateness, expected: int) -> str:
    return f"{name:34} {lat.row()}  {len(lat.release):>6}/{expected}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=200, help="scheduled messages per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase")
    ap.add_argument("--delay-ms", type=int, default=1_000)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-iso-"))
    kafka = LocalKafka(
        base / "kafka", nodes=3, settings=KafkaSettings(heap_mb=512, auto_create_topics=False)
    )
    zk = LocalZooKeeper(base / "zk")
    results: dict[str, object] = {}
    half = int(args.rate * args.seconds) // 2
    try:
        kafka.start()
        zk.start()
        bs = kafka.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bs})
        rs = Replicas(base / "set", bs, zk.connect_string, 1)
        # Fresh topics per phase: each phase's readers see only that phase's records.
        phases = {}
        for name in ("a", "b"):
            suffix = f"{name}-{uuid.uuid4().hex[:8]}"
            x, y, plain = f"iso-x-{suffix}", f"iso-y-{suffix}", f"iso-plain-{suffix}"
            create(admin, x, [3], LOG_APPEND_TIME)
            create(admin, y, [1, 2], LOG_APPEND_TIME)
            create(admin, plain, [1, 2], LOG_APPEND_TIME)
            phases[name] = (x, y, plain)
        create(admin, rs.buffer, [1, 2], BUFFER_TOPIC_CONFIG)
        if DEAD_LETTER_TOPIC not in admin.list_topics(timeout=10).topics:
            create(admin, DEAD_LETTER_TOPIC, [1, 2], {})
        try:
            rs.start_all()
            rs.wait_master()
            head = f"{'run':34} {'release p50/p99/max ms':>28} | {'receipt p50/p99/max ms':>26}"
            print(head)
            x_a, y_a, base_a = phase(
                bs,
                rs.buffer,
                phases["a"],
                rate=args.rate,
                seconds=args.seconds,
                delay_ms=args.delay_ms,
            )
            lat_x_a = x_a.wait()
            print(row("A baseline (plain Kafka)", base_a, half))
            print(row("A healthy Y (no failure)", y_a, half))
            print(row("A X (no failure)", lat_x_a, half), flush=True)
            kafka.stop_node(FAILING)
            x_b, y_b, base_b = phase(
                bs,
                rs.buffer,
                phases["b"],
                rate=args.rate,
                seconds=args.seconds,
                delay_ms=args.delay_ms,
            )
            held = rs.metric("r1", "kdelay_replica_targets_held")
            print(row("B baseline (plain Kafka)", base_b, half))
            print(row("B healthy Y (X leaderless)", y_b, half), flush=True)
            kafka.start_node(FAILING)
            kafka.wait_ready(3)
            lat_x_b = x_b.wait()  # Reader of X from phase B: catches up once broker 3 is back
            print(row("B X (leaderless, then back)", lat_x_b, half))
            print(f"targets held at the end of phase B: {held:.0f}")
            results = {
                "rate_per_s": args.rate,
                "seconds_per_phase": args.seconds,
                "delay_ms": args.delay_ms,
                "A": {
                    "baseline": summary(base_a, half),
                    "healthy": summary(y_a, half),
                    "x": summary(lat_x_a, half),
                },
                "B": {
                    "baseline": summary(base_b, half),
                    "healthy": summary(y_b, half),
                    "x": summary(lat_x_b, half),
                    "targets_held": held,
                },
            }
        finally:
            rs.close()
    finally:
        kafka.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
