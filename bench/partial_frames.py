"""Partial frames vs the proxy's memory: with ``max_buffered_request_bytes`` and without (not a
test).

    .venv/bin/python -m bench.partial_frames [--bootstrap HOST:PORT] [--connections 10]
        [--announce-mib 99] [--send-mib 90] [--attack-seconds 20] [--cap-mib 256]

Starts a local Kafka (unless --bootstrap names one), then twice, in one run: a ``kdelay proxy``
with ``--max-buffered-request-bytes`` at ``--cap-mib`` (the default, 256 MiB), and one with it
set huge (the "before": no global cap). Each time a normal producer (confluent-kafka,
acks=all, one 100-byte record every 10 ms) produces through the proxy for the whole run while,
after a 3 s warm-up, ``--connections`` raw connections each send a 4-byte size prefix
announcing ``--announce-mib`` MiB and then slowly (1 MiB every 0.1 s) ``--send-mib`` MiB of it,
never the rest. Reports the proxy's peak RSS (VmRSS of /proc/<pid>/status, sampled every 50 ms),
the bytes the attackers got in, the most requests waiting for memory, and the normal
producer's produce latency (p50, p99, max) and acknowledgements during the attack. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer

from bench.harness.proxy_process import RunningProxy, local_kafka, proxy_process
from bench.harness.replicas import rss_bytes
from dev.kafka_tools import create_topic, unique_topic
from kdelay.stats import percentile

MIB = 1024 * 1024
WARMUP_S = 3.0
SAMPLE_S = 0.05
HUGE = 1 << 40  # "no cap": a terabyte


@dataclass
class Producing:
    """The normal producer's acknowledgements: (sent at, latency s), and errors."""

    acks: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def produce(address: str, topic: str, stop: threading.Event, out: Producing) -> None:
    """One small record every 10 ms until ``stop``; each ack's latency into ``out``."""
    producer = Producer({"bootstrap.servers": address, "linger.ms": 0, "acks": "all"})

    def report(sent: float) -> Callable[[KafkaError | None, Message], None]:
        def cb(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                out.errors.append(err.str())
            else:
                out.acks.append((sent, time.monotonic() - sent))

        return cb

    next_at = time.monotonic()
    while not stop.is_set():
        sent = time.monotonic()
        producer.produce(topic, b"x" * 100, on_delivery=report(sent))
        next_at += 0.01
        while (left := next_at - time.monotonic()) > 0:
            producer.poll(left)  # serves acknowledgements meanwhile
    producer.flush(60)


def attack(address: str, announce: int, send: int, stop: threading.Event, sent: list[int]) -> None:
    """One connection: a size prefix announcing ``announce`` bytes, then ``send`` of them
    slowly; blocked writes (the proxy not reading) just wait. ``sent[0]`` counts bytes out."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(0.2)
        sock.sendall(struct.pack(">i", announce))
        chunk = b"\0" * MIB
        while sent[0] < send and not stop.is_set():
            view = memoryview(chunk)
            while view and not stop.is_set():
                try:
                    n = sock.send(view)
                except TimeoutError:
                    continue  # the proxy is not reading this connection: backpressure
                except OSError:
                    return  # closed by the proxy
                view = view[n:]
                sent[0] += n
            stop.wait(0.1)
        stop.wait()


def _gauge(http: str, name: str) -> float:
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    return 0.0


@dataclass
class Result:
    label: str
    cap: int
    rss_before: int
    rss_peak: int
    attacker_bytes: int
    waiting_max: float
    acks: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    warmup_max_ms: float


def run(proxy: RunningProxy, label: str, cap: int, topic: str, args: argparse.Namespace) -> Result:
    stop_producer, stop_attack = threading.Event(), threading.Event()
    producing = Producing()
    producer = threading.Thread(
        target=produce, args=(proxy.kafka, topic, stop_producer, producing), daemon=True
    )
    producer.start()
    time.sleep(WARMUP_S)
    rss_before = rss_bytes(proxy.pid)
    counters = [[0] for _ in range(args.connections)]
    attackers = [
        threading.Thread(
            target=attack,
            args=(proxy.kafka, args.announce_mib * MIB, args.send_mib * MIB, stop_attack, c),
            daemon=True,
        )
        for c in counters
    ]
    began = time.monotonic()
    for t in attackers:
        t.start()
    peak, waiting_max = rss_before, 0.0
    next_gauge = began
    while time.monotonic() - began < args.attack_seconds:
        peak = max(peak, rss_bytes(proxy.pid))
        if time.monotonic() >= next_gauge:
            waiting_max = max(
                waiting_max, _gauge(proxy.http, "kdelay_proxy_buffered_request_waiting")
            )
            next_gauge += 1.0
        time.sleep(SAMPLE_S)
    ended = time.monotonic()
    stop_attack.set()
    for t in attackers:
        t.join(10)
    stop_producer.set()
    producer.join(60)
    during = [lat for sent, lat in producing.acks if began <= sent <= ended]
    lat_ms = sorted(x * 1000 for x in during) or [0.0]
    warmup = [lat * 1000 for sent, lat in producing.acks if sent < began] or [0.0]
    return Result(
        label,
        cap,
        rss_before,
        peak,
        sum(c[0] for c in counters),
        waiting_max,
        len(during),
        len(producing.errors),
        percentile(lat_ms, 0.5),
        percentile(lat_ms, 0.99),
        lat_ms[-1],
        max(warmup),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=None, help="an existing Kafka (default: start one)")
    ap.add_argument("--connections", type=int, default=10)
    ap.add_argument("--announce-mib", type=int, default=99)
    ap.add_argument("--send-mib", type=int, default=90)
    ap.add_argument("--attack-seconds", type=float, default=20.0)
    ap.add_argument("--cap-mib", type=int, default=256)
    ap.add_argument("--only", choices=("cap", "nocap"), default=None, help="run one side only")
    args = ap.parse_args()
    results = []
    with local_kafka(args.bootstrap) as bootstrap:
        topic = unique_topic("bench-frames")
        create_topic(bootstrap, topic, partitions=1)
        runs = [("cap", "with the cap", args.cap_mib * MIB), ("nocap", "no cap (before)", HUGE)]
        for key, label, cap in runs:
            if args.only not in (None, key):
                continue
            setting = ("--max-buffered-request-bytes", str(cap))
            with proxy_process(bootstrap, *setting) as proxy:
                results.append(run(proxy, label, cap, topic, args))
    print(
        f"{args.connections} connections x {args.announce_mib} MiB announced, {args.send_mib} MiB "
        f"sent slowly each, for {args.attack_seconds:.0f} s; a producer sends 100 records/s"
    )
    print()
    print(
        "| run | max_buffered_request_bytes | proxy RSS before | proxy peak RSS | attacker bytes "
        "in | most waiting | producer acks | errors | p50 ms | p99 ms | max ms | max ms before |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cap = f"{r.cap // MIB:,} MiB" if r.cap < HUGE else "1 TiB"
        print(
            f"| {r.label} | {cap} | {r.rss_before / MIB:,.0f} MiB | {r.rss_peak / MIB:,.0f} MiB "
            f"| {r.attacker_bytes / MIB:,.0f} MiB | {r.waiting_max:.0f} | {r.acks} | {r.errors} "
            f"| {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.max_ms:.1f} | {r.warmup_max_ms:.1f} |"
        )


if __name__ == "__main__":
    main()
