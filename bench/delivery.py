"""Exactly-once vs at-least-once release: throughput, lateness, failover gap and duplicates.

    .venv/bin/python -m bench.delivery [--rates 1000,5000,20000] [--seconds 10] [--json F]

Starts its own Kafka and ZooKeeper (dev.stack) and, for each ``--delivery`` mode, three
replicas as ``kdelay delay-service`` subprocesses; buffer records are written straight to the
set's buffer topic (as the proxy would), due 1 s later. In the same run it measures:

- a plain Kafka produce -> consume baseline at each rate (receipt - send time);
- per mode and rate, release lateness (record timestamp - due time; LogAppendTime targets, so
  the broker's clock) p50/p99/max and receipt lateness, read_committed;
- per mode, the forward rate: a burst of ``--burst`` messages all due at once;
- per mode, one master SIGKILL mid-stream (``--failover-rate`` msg/s): the failover gap (the
  longest stretch without a delivery around the kill, by the broker's clock) and duplicates
  seen by a read_committed and by a read_uncommitted consumer.

Not part of ``make test``. Figures depend on the machine: compare modes with each other and
with the baseline of the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.harness.lateness import baseline, consume_lateness, delayed, pct, produce_buffer
from bench.harness.replicas import PARTITIONS, Replicas, kafka_settings
from dev.kafka_tools import create_topic
from dev.stack import LocalKafka, LocalZooKeeper, wait_until
from kdelay.buffer import Scheduled

MODES = ("at-least-once", "exactly-once")
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def read_all(
    bootstrap: str, topic: str, isolation: str, want: int, timeout: float
) -> list[tuple[str, int]]:
    """(kdelay-id, record timestamp) of every record of ``topic`` until ``want`` distinct ids
    were seen and nothing new came for 5 s, or ``timeout``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.assign([TopicPartition(topic, p, -2) for p in range(PARTITIONS)])
    out: list[tuple[str, int]] = []
    ids: set[str] = set()
    deadline = time.monotonic() + timeout
    last_new = time.monotonic()
    while time.monotonic() < deadline and (len(ids) < want or time.monotonic() - last_new < 5):
        for msg in c.consume(10_000, 0.5):
            if msg.error():
                continue
            raw = dict(msg.headers() or []).get("kdelay-id")
            ident = raw.decode() if isinstance(raw, bytes) else str(raw)
            out.append((ident, msg.timestamp()[1]))
            ids.add(ident)
            last_new = time.monotonic()
    c.close()
    return out


def failover(rs: Replicas, rate: int, seconds: float) -> dict[str, float | int]:
    """A steady stream; the master is SIGKILLed at a third of it."""
    topic = f"bench-failover-{uuid.uuid4().hex[:8]}"
    create_topic(rs.bootstrap, topic, PARTITIONS, config=LOG_APPEND_TIME)
    start = int(time.time() * 1000) + 3_000
    n = int(rate * seconds)
    produce_buffer(rs.bootstrap, rs.buffer, (
        Scheduled(f"f{i}", topic, i % PARTITIONS, None, b"v", start + int(i * 1000 / rate))
        for i in range(n)
    ))  # fmt: skip
    master = rs.wait_master()
    kill_at = start + int(seconds * 1000 / 3)
    wait_until(lambda: time.time() * 1000 >= kill_at, timeout=120, what="mid-stream", interval=0.01)
    proc = rs.procs[master]
    proc.kill()
    killed_ms = int(time.time() * 1000)
    rs.wait_master(timeout=120)
    committed = read_all(rs.bootstrap, topic, "read_committed", n, timeout=seconds + 180)
    uncommitted = read_all(rs.bootstrap, topic, "read_uncommitted", n, timeout=seconds + 180)
    rs.start(master)  # back as a follower for the next case
    stamps = sorted(ts for _, ts in committed)
    around = [t for t in stamps if killed_ms - 5_000 <= t <= killed_ms + 60_000]
    gap = max((b - a for a, b in itertools.pairwise(around)), default=0)
    counts_c, counts_u = Counter(i for i, _ in committed), Counter(i for i, _ in uncommitted)
    return {
        "messages": n,
        "delivered_read_committed": len(counts_c),
        "lost": n - len(counts_c),
        "duplicates_read_committed": sum(c - 1 for c in counts_c.values()),
        "duplicates_read_uncommitted": sum(c - 1 for c in counts_u.values()),
        "failover_gap_ms": gap,
    }


def burst(rs: Replicas, n: int) -> float:
    """Messages forwarded per second when ``n`` fall due at once."""
    topic = f"bench-burst-{uuid.uuid4().hex[:8]}"
    create_topic(rs.bootstrap, topic, PARTITIONS, config=LOG_APPEND_TIME)
    due = int(time.time() * 1000) + 5_000
    produce_buffer(rs.bootstrap, rs.buffer, (
        Scheduled(f"b{i}", topic, i % PARTITIONS, None, b"v", due) for i in range(n)
    ))  # fmt: skip
    lat = consume_lateness(rs.bootstrap, topic, n, timeout=600)
    spread_ms = max(lat.release, default=0) - min(lat.release, default=0)
    return n / max(spread_ms / 1000, 1e-3)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,5000,20000")
    ap.add_argument("--seconds", type=float, default=10.0, help="per rate")
    ap.add_argument("--burst", type=int, default=50_000, help="messages due at once")
    ap.add_argument("--failover-rate", type=int, default=2_000)
    ap.add_argument("--failover-seconds", type=float, default=15.0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    rates = [int(x) for x in args.rates.split(",")]
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-delivery-"))
    kafka = LocalKafka(base / "kafka", settings=kafka_settings())
    zk = LocalZooKeeper(base / "zk")
    results: dict[str, object] = {}
    try:
        kafka.start()
        zk.start()
        bs = kafka.bootstrap_servers
        for rate in rates:
            b = baseline(bs, rate, args.seconds)
            results[f"baseline/{rate}"] = {
                "receipt_ms": [pct(b.receipt, 0.5), pct(b.receipt, 0.99)]
            }
            p50, p99 = pct(b.receipt, 0.5), pct(b.receipt, 0.99)
            print(f"baseline {rate}/s: receipt p50/p99 {p50:.1f}/{p99:.1f} ms", flush=True)
        for mode in MODES:
            rs = Replicas(base / mode, bs, zk.connect_string, 3, ("--delivery", mode))
            try:
                rs.start_all()
                rs.wait_master()
                for rate in rates:
                    lat = delayed(rs, rate, args.seconds)
                    row = {
                        "release_ms": [
                            pct(lat.release, 0.5),
                            pct(lat.release, 0.99),
                            max(lat.release, default=0),
                        ],
                        "receipt_ms": [
                            pct(lat.receipt, 0.5),
                            pct(lat.receipt, 0.99),
                            max(lat.receipt, default=0),
                        ],
                        "delivered": len(lat.release),
                        "expected": int(rate * args.seconds),
                    }
                    results[f"{mode}/{rate}"] = row
                    print(f"{mode} {rate}/s: {json.dumps(row)}", flush=True)
                fwd = burst(rs, args.burst)
                results[f"{mode}/forward_per_s"] = fwd
                print(f"{mode} forward rate: {fwd:,.0f} msg/s", flush=True)
                fo = failover(rs, args.failover_rate, args.failover_seconds)
                results[f"{mode}/failover"] = fo
                print(f"{mode} failover: {json.dumps(fo)}", flush=True)
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
