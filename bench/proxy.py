"""Proxy vs direct production to Kafka, in the same run (not a test).

    .venv/bin/python -m bench.proxy [--bootstrap HOST:PORT] [--records N]
        [--rate-seconds S] [--rate-rounds R] [--skip-java] [--workers 1,2]

Starts a local Kafka (unless --bootstrap names one) and ``kdelay proxy`` as a subprocess, then
for confluent-kafka (this process) and the Java producer (kafka-tools' ProducerPerformance):
throughput and ack latency p50/p99, direct vs through the proxy, immediate and delayed (and
delayed with a ``kdelay-id`` of its own, a message its producer may cancel), 100 B and 1 KB
values; and the p99 added at a fixed 10k msg/s, direct and through the proxy run back to
back in each of ``--rate-rounds`` rounds. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.harness.proxy_process import local_kafka, proxy_process
from bench.harness.replicas import tree_cpu_seconds
from bench.harness.timed_produce import KINDS, timed_produce
from dev.kafka_tools import create_topic, unique_topic
from kdelay import jars


@dataclass
class Result:
    client: str
    path: str
    kind: str
    size: int
    msgs_per_s: float
    p50_ms: float
    p99_ms: float
    proxy_cpu_us: float | None = None  # the proxy's CPU time (all its processes) a record


def _result(client: str, path: str, kind: str, size: int, r: tuple[float, float, float]) -> Result:
    return Result(client, path, kind, size, r[0], r[1], r[2])


_PERF = re.compile(
    r"([\d.]+) records/sec .*?([\d.]+) ms avg latency.*?(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th"
)


def java_run(
    bootstrap: str, topic: str, n: int, size: int, rate: int = -1
) -> tuple[float, float, float]:
    """kafka-tools' ProducerPerformance (idempotent by default): msg/s, p50 and p99 (ms)."""
    out = subprocess.run(
        [
            str(jars.java_executable()),
            "-Xmx512m",
            "-cp",
            jars.classpath("kafka"),
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            topic,
            "--num-records",
            str(n),
            "--record-size",
            str(size),
            "--throughput",
            str(rate),
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=all",
            "linger.ms=5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    m = _PERF.findall(out)
    if not m:
        raise RuntimeError(f"unexpected ProducerPerformance output:\n{out[-2000:]}")
    rps, _avg, p50, _p95, p99 = m[-1]
    return float(rps), float(p50), float(p99)


def clients_run(
    bootstrap: str, topic: str, n: int, size: int, *, kind: str, clients: int
) -> tuple[float, float, float]:
    """:func:`confluent_run` in ``clients`` processes at once, ``n`` records in all (one
    connection each: the kernel spreads connections, not records, over proxy workers):
    summed msg/s, and the highest p50 and p99 of any client."""
    if clients == 1:
        return timed_produce(bootstrap, topic, n, size, kind=kind)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(clients) as pool:
        runs = pool.starmap(_client, [(bootstrap, topic, n // clients, size, kind)] * clients)
    return sum(r[0] for r in runs), max(r[1] for r in runs), max(r[2] for r in runs)


def _client(bootstrap: str, topic: str, n: int, size: int, kind: str) -> tuple[float, float, float]:
    return timed_produce(bootstrap, topic, n, size, kind=kind)


@dataclass
class RatePair:
    """One round of the fixed-rate cell: direct and through the proxy back to back, so both see
    the broker in the same state (the proxy's cell used to follow its own throughput cells,
    100,000 Java records among them, and the direct one the direct cells)."""

    client: str
    path: str
    round: int
    direct: Result
    proxy: Result


def rate_pairs(
    direct: str, via: str, path: str, topic: str, *, n: int, rounds: int, java: bool
) -> list[RatePair]:
    """``rounds`` pairs of 10k msg/s runs per client, the order alternating (direct first in
    odd rounds, the proxy first in even ones), after a pause that lets the throughput cells'
    work settle."""
    runs: list[tuple[str, Callable[[str], tuple[float, float, float]]]] = [
        ("confluent-kafka@10k/s",
         lambda bs: timed_produce(bs, topic, n, 100, kind="immediate", rate=10_000)),
    ]  # fmt: skip
    if java:
        runs.append(("java@10k/s", lambda bs: java_run(bs, topic, n, 100, rate=10_000)))
    pairs: list[RatePair] = []
    time.sleep(2)
    for k in range(1, rounds + 1):
        for client, run in runs:
            order = [("direct", direct), (path, via)]
            got = {p: run(bs) for p, bs in (order if k % 2 else order[::-1])}
            pairs.append(
                RatePair(
                    client,
                    path,
                    k,
                    _result(client, "direct", "immediate", 100, got["direct"]),
                    _result(client, path, "immediate", 100, got[path]),
                )
            )
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=None, help="an existing Kafka (default: start one)")
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--rate-seconds", type=int, default=5, help="length of the 10k msg/s run")
    ap.add_argument(
        "--rate-rounds", type=int, default=2, help="direct/proxy pairs of the 10k msg/s run"
    )
    ap.add_argument("--skip-java", action="store_true")
    ap.add_argument(
        "--workers", default="1", help="proxy worker counts to measure, comma-separated (1,2)"
    )
    ap.add_argument(
        "--clients", type=int, default=1, help="confluent-kafka producer processes at once"
    )
    args = ap.parse_args()
    results: list[Result] = []
    pairs: list[RatePair] = []
    counts = [int(w) for w in args.workers.split(",")]
    client = "confluent-kafka" if args.clients == 1 else f"confluent-kafka x{args.clients}"
    with local_kafka(args.bootstrap) as direct:
        topics = {size: unique_topic("bench") for size in (100, 1024)}
        for topic in topics.values():
            create_topic(direct, topic, partitions=3)
        rate_topic = unique_topic("bench-rate")
        create_topic(direct, rate_topic, partitions=3)
        n = 10_000 * args.rate_seconds
        for size, topic in topics.items():
            r = clients_run(
                direct, topic, args.records, size, kind="immediate", clients=args.clients
            )
            results.append(_result(client, "direct", "immediate", size, r))
            if not args.skip_java:
                results.append(_result("java", "direct", "immediate", size,
                                       java_run(direct, topic, args.records, size)))  # fmt: skip
        for workers in counts:
            path = "proxy" if workers == 1 else f"proxy, {workers} workers"
            with proxy_process(direct, "--workers", str(workers)) as running:
                via = running.kafka
                for size, topic in topics.items():
                    for kind in KINDS:
                        cpu = tree_cpu_seconds(running.pid)
                        r = clients_run(via, topic, args.records, size,
                                        kind=kind, clients=args.clients)  # fmt: skip
                        cpu = tree_cpu_seconds(running.pid) - cpu
                        results.append(_result(client, path, kind, size, r))
                        # each client sends its share and one warm-up record
                        sent = (args.records // args.clients + 1) * args.clients
                        results[-1].proxy_cpu_us = cpu / sent * 1e6
                    if not args.skip_java:
                        r = java_run(via, topic, args.records, size)
                        results.append(_result("java", path, "immediate", size, r))
                pairs += rate_pairs(
                    direct,
                    via,
                    path,
                    rate_topic,
                    n=n,
                    rounds=args.rate_rounds,
                    java=not args.skip_java,
                )
    print("| client | path | kind | size | msg/s | p50 ms | p99 ms | proxy CPU µs a record |")
    print("|---|---|---|---|---|---|---|---|")
    for res in results + [r for pair in pairs for r in (pair.direct, pair.proxy)]:
        proxy_cpu = "" if res.proxy_cpu_us is None else f"{res.proxy_cpu_us:.1f}"
        print(
            f"| {res.client} | {res.path} | {res.kind} | {res.size} | {res.msgs_per_s:,.0f} "
            f"| {res.p50_ms:.1f} | {res.p99_ms:.1f} | {proxy_cpu} |"
        )
    direct_by = {(x.client, x.size): x for x in results if x.path == "direct"}
    print()
    for res in results:
        d = direct_by.get((res.client, res.size))
        if res.path.startswith("proxy") and d is not None:
            print(
                f"- {res.client} {res.path} {res.kind} {res.size} B: throughput ratio "
                f"{res.msgs_per_s / d.msgs_per_s:.2f}"
            )
    for pair in pairs:
        d, p = pair.direct, pair.proxy
        print(
            f"- {pair.client} {pair.path}, round {pair.round}: p99 added "
            f"{p.p99_ms - d.p99_ms:+.1f} ms ({d.p99_ms:.1f} -> {p.p99_ms:.1f}), "
            f"p50 added {p.p50_ms - d.p50_ms:+.1f} ms"
        )
    for client, path in dict.fromkeys((pair.client, pair.path) for pair in pairs):
        added = [
            p.proxy.p99_ms - p.direct.p99_ms for p in pairs if (p.client, p.path) == (client, path)
        ]
        print(
            f"- {client} {path}: median p99 added of the rounds {statistics.median(added):+.1f} ms"
        )


if __name__ == "__main__":
    main()
