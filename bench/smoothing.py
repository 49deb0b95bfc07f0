"""Release-smoothing benchmark: a steady topic's lateness while a burst of another topic falls due
at once, with that burst released unthrottled and throttled to a rate limit, in the same run.

Run: ``.venv/bin/python -m bench.smoothing`` (``--help`` for sizes). It starts a one-broker Kafka
and ZooKeeper through dev.stack; each mode gets a fresh replica set (one ``kdelay
delay-service`` subprocess, its own ZooKeeper root and buffer topic) and fresh target topics:

- ``alone``: only B, a steady stream: ``--b-rate`` messages a second due over ``--b-seconds``;
- ``burst``: the same B, and ``--burst`` messages of A all due at one instant in the middle of
  B's window, no limit;
- ``throttled``: the same, A limited to ``--limit`` messages a second (``release_rate_limits``
  in a ``--config`` file), B unlimited.

A backlog: with ``--measure-s S``, A's achieved rate in ``throttled`` is measured over S
seconds starting a second after its first release, without waiting for the whole burst to
drain (a burst of 1M at 200/s drains in 83 minutes); give a burst many times
``--scan-skip-limit`` (in ``--replica-args``), so the master's pass over it takes many rounds,
and a ``--lead-ms`` long enough for the replica to ingest it before it falls due. E.g.
``--modes alone,throttled --burst 200000 --limit 200 --measure-s 60 --b-seconds 90
--lead-ms 90000 --replica-args "--scan-skip-limit 10000"``.

Every record is in the buffer before the first falls due. Lateness is record timestamp -
``kdelay-deliver-at``: by the broker's clock for B (``message.timestamp.type=LogAppendTime``),
by the release time the master stamps for A (CreateTime: the first records' append waits for
the new topic's metadata, which would shorten A's spread). A's spread is its last release
minus its first; its achieved rate is (count - burst) / spread (with ``--measure-s``: the count
in the window over its length), and ``rate_vs_limit`` that over the limit; the replica's
``kdelay_replica_release_throttled_total`` counts the releases the limit held back. The ratio
compares B's p99 in each mode with ``alone``: smoothing should bring it back to about 1, a burst
without it pushes B behind A's backlog. Figures depend on the machine.
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

from bench.harness.lateness import pct, produce_buffer
from bench.harness.replicas import PARTITIONS, Replicas, kafka_settings
from dev.kafka_tools import Record, consume_until, create_topic
from dev.stack import LocalKafka, LocalZooKeeper
from kdelay.buffer import Scheduled
from kdelay.delay_service.release.smoothing import BURST_S

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
MODES = ("alone", "burst", "throttled")


def released(bs: str, topic: str, n: int, timeout: float) -> list[Record]:
    """The first record of each of ``n`` ids on ``topic``, read_committed (an aborted round's
    records are not counted, nor a duplicate)."""
    records = consume_until(
        bs,
        [topic],
        lambda r: len({x.header("kdelay-id") for x in r}) >= n,
        timeout=timeout,
        config={"isolation.level": "read_committed"},
    )
    first: dict[bytes | None, Record] = {}
    for r in records:
        first.setdefault(r.header("kdelay-id"), r)
    return list(first.values())


def released_over(bs: str, topic: str, span_ms: int, timeout: float) -> list[Record]:
    """``topic``'s records, read_committed, until *every* partition has one released
    ``span_ms`` after the first of all. (Until one of any partition was, as before 2026-12-07,
    stopped the read as soon as the first partition's fetch reached the window's end: the
    window then held about one partition's releases, and a throttled topic releasing at its
    limit measured 0.29 of it.)"""
    first = math.inf  # the first release time read so far
    last: dict[int, int] = dict.fromkeys(range(PARTITIONS), -1)  # the last, per partition
    seen = 0

    def spanned(records: list[Record]) -> bool:
        nonlocal seen, first
        for r in records[seen:]:
            first = min(first, r.timestamp_ms)
            last[r.partition] = max(last.get(r.partition, -1), r.timestamp_ms)
        seen = len(records)
        return min(last.values()) - first >= span_ms

    config: dict[str, str | int | bool] = {"isolation.level": "read_committed"}
    return consume_until(bs, [topic], spanned, timeout=timeout, config=config)


def window_rate(records: list[Record], skip_s: float, measure_s: float) -> tuple[float, int]:
    """Releases per second in [first + ``skip_s``, first + ``skip_s`` + ``measure_s``), and
    how many fell in it (duplicates from an aborted round's retry excepted)."""
    first = min(r.timestamp_ms for r in records)
    lo, hi = first + skip_s * 1000, first + (skip_s + measure_s) * 1000
    ids = {r.header("kdelay-id") for r in records if lo <= r.timestamp_ms < hi}
    return len(ids) / measure_s, len(ids)


def lateness(records: list[Record]) -> list[float]:
    return [float(r.timestamp_ms - int(r.header("kdelay-deliver-at") or b"0")) for r in records]


def figures(rel: list[float]) -> dict[str, float]:
    return {
        "delivered": len(rel),
        "p50_ms": pct(rel, 0.5),
        "p99_ms": pct(rel, 0.99),
        "max_ms": max(rel, default=float("nan")),
    }


def run_mode(
    base: Path, bs: str, zk: str, mode: str, args: argparse.Namespace
) -> tuple[dict[str, object], float]:
    """One mode on a fresh replica set and fresh topics; its figures and B's p99 in ms."""
    suffix = f"{mode}-{uuid.uuid4().hex[:8]}"
    topic_a, topic_b = f"smooth-a-{suffix}", f"smooth-b-{suffix}"
    create_topic(bs, topic_a, PARTITIONS)  # CreateTime: the master's release time, exactly
    create_topic(bs, topic_b, PARTITIONS, config=LOG_APPEND_TIME)
    extra: tuple[str, ...] = tuple(args.replica_args.split())
    if mode == "throttled":
        config = base / f"{suffix}.json"
        config.write_text(json.dumps({"release_rate_limits": {topic_a: args.limit}}))
        extra = (*extra, "--config", str(config))
    rs = Replicas(base / suffix, bs, zk, 1, extra)
    try:
        rs.start_all()
        rs.wait_master()
        n_b = int(args.b_rate * args.b_seconds)
        n_a = 0 if mode == "alone" else args.burst
        drain_s = n_a / args.limit if mode == "throttled" else 0.0
        start = int(time.time() * 1000) + args.lead_ms
        burst_at = start + int(args.b_seconds * 1000) // 2
        b = (
            Scheduled(
                f"b-{i}", topic_b, i % PARTITIONS, None, b"b", start + int(i * 1000 / args.b_rate)
            )
            for i in range(n_b)
        )
        a = (Scheduled(f"a-{i}", topic_a, i % PARTITIONS, None, b"a", burst_at) for i in range(n_a))
        produce_buffer(bs, rs.buffer, [*a, *b])
        late = max(0, int(time.time() * 1000) - start)
        b_wait = args.lead_ms / 1000 + args.b_seconds + (args.measure_s or drain_s) + 120
        lat_b = lateness(released(bs, topic_b, n_b, b_wait))
        out: dict[str, object] = {"mode": mode, "b": figures(lat_b), "produced_late_ms": late}
        if n_a and mode == "throttled" and args.measure_s:
            span_ms = int((1 + args.measure_s) * 1000)
            got_a = released_over(bs, topic_a, span_ms, args.measure_s + 600)
            rate, in_window = window_rate(got_a, 1.0, args.measure_s)
            out["a"] = {
                "backlog": n_a,
                "measured_s": args.measure_s,
                "released_in_window": in_window,
                "rate_per_s": rate,
                "rate_vs_limit": round(rate / args.limit, 3),
            }
        elif n_a:
            got_a = released(bs, topic_a, n_a, drain_s + 180)
            stamps = [r.timestamp_ms for r in got_a]
            spread_s = (max(stamps) - min(stamps)) / 1000
            after_burst = len(stamps) - args.limit * BURST_S
            rate = after_burst / spread_s if spread_s else float("nan")
            out["a"] = {
                **figures(lateness(got_a)),
                "spread_s": spread_s,
                "rate_per_s": rate,
                "rate_vs_limit": round(rate / args.limit, 3) if mode == "throttled" else None,
            }
            out["throttled_total"] = rs.metric_sum("r1", "kdelay_replica_release_throttled_total")
        aborted = 'kdelay_replica_transactions_total{outcome="aborted"}'
        count = rs.metric("r1", aborted)
        out["transactions_aborted"] = 0.0 if math.isnan(count) else count  # no child: none
        return out, pct(lat_b, 0.99)
    finally:
        rs.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst", type=int, default=20_000, help="A's messages, all due at once")
    ap.add_argument("--limit", type=float, default=2_000.0, help="A's rate limit, messages/s")
    ap.add_argument("--b-rate", type=int, default=200, help="B's messages per second")
    ap.add_argument("--b-seconds", type=float, default=20.0, help="B's window")
    ap.add_argument("--lead-ms", type=int, default=8_000, help="first due time after start")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    ap.add_argument(
        "--measure-s",
        type=float,
        default=0.0,
        help="throttled: A's rate over this many seconds, not its whole drain (0: whole drain)",
    )
    ap.add_argument(
        "--replica-args", default="", help="more flags for each replica (--scan-skip-limit N)"
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-smooth-"))
    kafka = LocalKafka(base / "kafka", settings=kafka_settings())
    zk = LocalZooKeeper(base / "zk")
    results: dict[str, object] = {
        "burst": args.burst,
        "limit_per_s": args.limit,
        "replica_args": args.replica_args,
    }
    b_p99: dict[str, float] = {}
    try:
        kafka.start()
        zk.start()
        for mode in args.modes.split(","):
            found, b_p99[mode] = run_mode(
                base, kafka.bootstrap_servers, zk.connect_string, mode, args
            )
            results[mode] = found
            print(json.dumps(found), flush=True)
    finally:
        kafka.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    if "alone" in b_p99:
        for mode in ("burst", "throttled"):
            if mode in b_p99:
                ratio = b_p99[mode] / max(b_p99["alone"], 1.0)
                results[f"b_p99_ratio_{mode}_vs_alone"] = round(ratio, 2)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
