"""Delay-service benchmark: ingest, forward rate, lateness, and a large pending set.

Run: ``.venv/bin/python -m bench.delay_service`` (``--help`` for sizes). It starts its own Kafka
and ZooKeeper through dev.stack and replicas as ``kdelay delay-service`` subprocesses, and
measures, beside a plain Kafka produce->consume baseline from the same run:

- lateness (record timestamp - due time, and consumer receipt - due time) p50/p99/max at
  several rates, with 1 and 3 replicas (``--delivery``: their release mode), each beside the
  same schedule released by the least a releaser does on plain Kafka in the same mode (the
  *floor*, ``bench/harness/release_floor.py``; ``--no-floor`` leaves it out);
- ingest rate of one replica (a fresh replica reading a pre-filled buffer topic, from its
  ``kdelay_replica_ingested_total``), against a plain consumer reading the same records;
- forward rate (a burst of messages all due at once), against the rate the bench itself
  produced the buffer records at (one confluent-kafka producer);
- with a large pending set: store bytes per message, replica RSS, restart-to-first-delivery.

``--replicas ""`` skips the lateness runs (only the one-replica figures). Figures depend on the
machine; the baseline shows what the same machine does without kdelay.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.harness.lateness import (
    Lateness,
    Reader,
    baseline,
    consume_lateness,
    delayed,
    pct,
    produce_buffer,
)
from bench.harness.release_floor import BURST, Floor
from bench.harness.replicas import PARTITIONS, Replicas, kafka_settings
from dev.kafka_tools import create_topic
from dev.stack import LocalKafka, LocalZooKeeper, wait_until
from kdelay.buffer import Scheduled
from kdelay.delay_service.config import DELIVERY_MODES, EXACTLY_ONCE


def plain_consume_per_s(bootstrap: str, topic: str, count: int) -> float:
    """The baseline of one replica's ingest: a plain confluent-kafka consumer reading ``count``
    records of ``topic`` from the start, in batches as ingest does, touching each record's key,
    value and headers (what ingest reads); records per second from the first record on."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-plain-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 50,
    })  # fmt: skip
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen, start = 0, 0.0
        deadline = time.monotonic() + 600
        while seen < count and time.monotonic() < deadline:
            batch = c.consume(2000, timeout=0.5)
            if batch and not start:
                start = time.monotonic()
            for m in batch:
                if m.error() is None:
                    m.key(), m.value(), m.headers(), m.timestamp()
                    seen += 1
        return seen / max(time.monotonic() - start, 1e-3)
    finally:
        c.close()


def floor(
    bootstrap: str, rate: int, n: int, delay_ms: int, mode: str, *, ordered: bool = True
) -> Lateness:
    """``n`` messages at ``rate`` a second released by the least a releaser does
    (``bench/harness/release_floor.py``; ``ordered``: see :class:`Floor`), read back as kdelay's
    releases are."""
    run = Floor(bootstrap, rate, n, delay_ms, mode, ordered=ordered)
    reader = Reader(bootstrap, run.topic, run.n, timeout=n / rate + 600)
    run.start()
    run.join(n / rate + delay_ms / 1000 + 600)
    return reader.wait()


def spread_per_s(lat: Lateness) -> float:
    """Messages a second from the first release of a burst to its last (record timestamps)."""
    spread = max(lat.release, default=0) - min(lat.release, default=0)
    return len(lat.release) / max(spread / 1000, 1e-3)


def phase_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The master's exactly-once rounds between two readings of
    ``kdelay_replica_round_phase_seconds``: ``rounds`` (how many), then each phase's mean ms."""
    out: dict[str, float] = {}
    for phase, (count, total) in after.items():
        count0, total0 = before.get(phase, (0.0, 0.0))
        if phase == "send":
            out["rounds"] = count - count0
        out[phase] = (total - total0) / max(count - count0, 1) * 1000
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,5000,20000")
    ap.add_argument("--replicas", default="1,3")
    ap.add_argument("--seconds", type=float, default=10.0, help="per rate")
    ap.add_argument(
        "--delay-ms",
        type=int,
        default=1000,
        help="delay of the rate runs' messages (0: due on arrival)",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds of unmeasured load at the first rate before each replica set's runs (a "
        "fresh broker's first run was the slowest)",
    )
    ap.add_argument(
        "--delivery",
        default=EXACTLY_ONCE,
        choices=DELIVERY_MODES,
        help="the replicas' release mode in the lateness runs (--delivery of kdelay "
        "delay-service), and the floor's",
    )
    ap.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="beside each lateness run, the same schedule released by the least a releaser "
        "does on plain Kafka (bench/harness/release_floor.py)",
    )
    ap.add_argument(
        "--ordered-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at-least-once: the floor waits for each round's acknowledgements, keeping the "
        "order kdelay keeps (--no-ordered-floor: the least any producer does)",
    )
    ap.add_argument("--burst", type=int, default=50_000, help="messages due at once")
    ap.add_argument("--pending", type=int, default=1_000_000, help="large pending set")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-"))
    kafka = LocalKafka(base / "kafka", settings=kafka_settings())
    zk = LocalZooKeeper(base / "zk")
    results: dict[str, object] = {}
    try:
        kafka.start()
        zk.start()
        bs = kafka.bootstrap_servers
        print(f"{args.delivery}\n{'run':24} {'release p50/p99/max ms':>28} | "
              f"{'receipt p50/p99/max ms':>26}")  # fmt: skip
        for n_rep in [int(x) for x in args.replicas.split(",") if x]:
            rs = Replicas(base / f"set-{n_rep}", bs, zk.connect_string, n_rep,
                          ("--delivery", args.delivery))  # fmt: skip
            try:
                rs.start_all()
                rs.wait_master()
                rates = [int(x) for x in args.rates.split(",") if x]
                if rates and args.warmup > 0:
                    delayed(rs, rates[0], args.warmup, args.delay_ms)  # not measured
                for rate in rates:
                    base_l = baseline(bs, rate, args.seconds)
                    print(f"{'baseline ' + str(rate) + '/s':24} {base_l.row()}")
                    sent = int(rate * args.seconds)
                    floor_l = None
                    if args.floor:
                        floor_l = floor(bs, rate, sent, args.delay_ms, args.delivery,
                                        ordered=args.ordered_floor)  # fmt: skip
                        print(f"{'floor ' + str(rate) + '/s':24} {floor_l.row()}")
                    master = rs.wait_master()
                    cpu0 = {n: rs.cpu_seconds(n) for n in rs.procs}
                    phases0 = rs.round_phases(master)
                    lat = delayed(rs, rate, args.seconds, args.delay_ms)
                    cpu1 = {n: rs.cpu_seconds(n) for n in rs.procs}
                    rounds = phase_means(phases0, rs.round_phases(master))
                    # CPU-µs per message of each replica over the run (master and followers).
                    us = {n: (cpu1[n] - cpu0[n]) * 1e6 / max(sent, 1) for n in cpu0}
                    followers = [v for n, v in us.items() if n != master]
                    cpu = {"master": us[master]} | (
                        {"follower": sum(followers) / len(followers)} if followers else {}
                    )
                    print(f"{f'{n_rep} replica(s) {rate}/s':24} {lat.row()}  "
                          + " ".join(f"{k} {v:.0f} CPU-us/msg" for k, v in cpu.items()),
                          flush=True)  # fmt: skip
                    print(f"{'':24} master's rounds, mean ms: "
                          + " ".join(f"{k} {v:.1f}" for k, v in rounds.items()))  # fmt: skip
                    results[f"{n_rep}x{rate}"] = {
                        "baseline_receipt_ms": [pct(base_l.receipt, q) for q in (0.5, 0.99)],
                        "floor_release_ms": None if floor_l is None else [
                            pct(floor_l.release, 0.5), pct(floor_l.release, 0.99),
                            max(floor_l.release, default=0)],
                        "release_ms": [pct(lat.release, 0.5), pct(lat.release, 0.99),
                                       max(lat.release, default=0)],
                        "receipt_ms": [pct(lat.receipt, 0.5), pct(lat.receipt, 0.99),
                                       max(lat.receipt, default=0)],
                        "delivered": len(lat.release),
                        "expected": sent,
                        "cpu_us_per_msg": cpu,
                        "master_round_mean_ms": rounds,
                    }  # fmt: skip
            finally:
                rs.close()
        results.update(rates_and_pending(base, bs, zk.connect_string, args))
    finally:
        kafka.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def rates_and_pending(base: Path, bs: str, zk: str, args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    rs = Replicas(base / "big", bs, zk, 1)
    try:
        # Ingest rate: a fresh replica reads a pre-filled buffer topic.
        create_topic(bs, rs.buffer, PARTITIONS)
        far = int(time.time() * 1000) + 30 * 24 * 3600 * 1000
        target = f"bench-big-{uuid.uuid4().hex[:8]}"
        create_topic(bs, target, PARTITIONS)
        t0 = time.monotonic()
        produce_buffer(bs, rs.buffer, (
            Scheduled(f"p{i}", target, i % PARTITIONS, None, b"x" * 100, far + i)
            for i in range(args.pending)
        ))  # fmt: skip
        produce_s = time.monotonic() - t0
        t0 = time.monotonic()
        rs.start("r1")
        # The replica's own ingest rate, from its counter: between the first sample that shows
        # records ingested and the one that shows them all (the start-up is not counted).
        samples: list[tuple[float, float]] = []

        def ingested_all() -> bool:
            n = rs.metric_sum("r1", "kdelay_replica_ingested_total")
            if not math.isnan(n) and n > 0:
                samples.append((time.monotonic(), n))
            return bool(n >= args.pending)

        wait_until(
            ingested_all, timeout=1800, what="the replica to ingest the pending set", interval=0.2
        )
        wait_until(
            lambda: rs.status().get("r1", {}).get("role") == "master",
            timeout=600,
            what="the replica to become master",
            interval=0.2,
        )
        ingest_s = time.monotonic() - t0
        (t_first, n_first), (t_last, n_last) = samples[0], samples[-1]
        ingest_per_s = (n_last - n_first) / max(t_last - t_first, 1e-3)
        out["pending_messages"] = args.pending
        produce_per_s = args.pending / produce_s
        out["buffer_produce_per_s"] = produce_per_s
        out["ingest_per_s_incl_startup"] = args.pending / ingest_s
        plain_per_s = plain_consume_per_s(bs, rs.buffer, args.pending)
        out["ingest_per_s"] = ingest_per_s
        out["plain_consume_per_s"] = plain_per_s
        out["ingest_vs_plain_consume"] = ingest_per_s / plain_per_s
        rs.procs["r1"].stop(grace=60)  # graceful: flushed memtables show the real SST size
        rs.start("r1")
        rs.wait_master(600)
        wait_until(
            lambda: rs.metric("r1", "kdelay_replica_store_bytes") > 0,
            timeout=30,
            what="the store size gauge",
        )
        out["store_bytes_per_message"] = rs.metric("r1", "kdelay_replica_store_bytes") / max(
            1, args.pending
        )
        out["replica_rss_bytes"] = rs.rss_bytes("r1")
        # Forward rate: a burst all due at the same moment.
        due = int(time.time() * 1000) + 5_000
        burst_topic = f"bench-burst-{uuid.uuid4().hex[:8]}"
        create_topic(bs, burst_topic, PARTITIONS)
        produce_buffer(bs, rs.buffer, (
            Scheduled(f"b{i}", burst_topic, i % PARTITIONS, None, b"v", due)
            for i in range(args.burst)
        ))  # fmt: skip
        cpu_before = rs.cpu_seconds("r1")
        lat = consume_lateness(bs, burst_topic, args.burst, timeout=600)
        forward_per_s = spread_per_s(lat)
        out["forward_per_s"] = forward_per_s
        # The replica's CPU from the burst's last buffer record acknowledged to its last
        # release (what ingest had left of the burst included), a message: steadier than the
        # rate on a shared machine.
        out["forward_cpu_us_per_msg"] = (rs.cpu_seconds("r1") - cpu_before) * 1e6 / args.burst
        out["forward_vs_buffer_produce"] = forward_per_s / produce_per_s
        if args.floor:
            # The same burst released by the least an exactly-once releaser does.
            floor_per_s = spread_per_s(floor(bs, BURST, args.burst, 1000, EXACTLY_ONCE))
            out["forward_floor_per_s"] = floor_per_s
            out["forward_vs_floor"] = forward_per_s / floor_per_s
        # Restart with the big pending set: time from process start to the first delivery.
        rs.procs["r1"].stop(grace=60)
        first = f"bench-first-{uuid.uuid4().hex[:8]}"
        create_topic(bs, first, PARTITIONS)
        produce_buffer(bs, rs.buffer, [Scheduled("first", first, 0, None, b"v", 0)])
        t0 = time.monotonic()
        rs.start("r1")
        consume_lateness(bs, first, 1, timeout=600)
        out["restart_to_first_delivery_s"] = time.monotonic() - t0
    finally:
        rs.close()
    for k, v in out.items():
        print(f"{k:32} {v:,.1f}" if isinstance(v, float) else f"{k:32} {v}")
    return out


if __name__ == "__main__":
    main()
