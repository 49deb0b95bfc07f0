"""Soak: a steady stream of delayed messages for a long time, with producers coming and going.

    .venv/bin/python -m bench.soak [--minutes 30] [--rate 2000] [--producer-every 5] [--out DIR]

Starts the whole local stack (ZooKeeper, Kafka, the proxy, 3 replicas) as ``kdelay up`` does,
then sends ``--rate`` delayed messages a second through the proxy (delays 0 to 5 s, idempotent
producers, a *new* producer — hence a new producer id — every ``--producer-every`` seconds) to
a target topic with ``message.timestamp.type=LogAppendTime``. A consumer reads the target the
whole time. Every 10 s the resident set size of the proxy and of each replica is sampled.

At the end (after a drain that lasts until everything acknowledged was delivered, or nothing
new arrived for 60 s) it reports: sent, acknowledged,
delivered, lost (acknowledged, never delivered), duplicates, early (broker append time before
the due time in the record's ``kdelay-deliver-at`` header), lateness p50/p99/max by the
broker's clock, and RSS start/end/max per process; a PNG of RSS over time and a JSON file go to
``--out``. Not part of ``make test``: it runs for half an hour.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, Producer

from bench.harness.replicas import rss_bytes
from dev.kafka_tools import create_topic, unique_topic
from dev.stack.stack import LocalStack, StackOptions
from kdelay import headers as h
from kdelay.stats import percentile

SAMPLE_S = 10.0
MAX_DELAY_MS = 5_000
DRAIN_IDLE_S = 60.0


@dataclass
class Tally:
    """What the producers and the consumer saw; shared by their threads under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    acked: set[str] = field(default_factory=set)
    failed: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    early: int = 0
    lateness_ms: list[float] = field(default_factory=list)


def _send(  # noqa: PLR0917 - one thread body, called once
    proxy: str, topic: str, tally: Tally, rate: int, seconds: float, every: float
) -> None:
    """Send at ``rate``/s for ``seconds``, with a fresh idempotent producer every ``every`` s."""

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        with tally.lock:
            if err is None and key is not None:
                tally.acked.add(key.decode())
            else:
                tally.failed += 1

    start = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - start) < seconds:
        producer = Producer(
            {
                "bootstrap.servers": proxy,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
            }
        )
        until = min(seconds, elapsed + every)
        while (elapsed := time.monotonic() - start) < until:
            due = int(elapsed * rate)
            while n < due:
                msg_id = f"soak-{n}"
                delay = random.randrange(MAX_DELAY_MS)
                producer.produce(
                    topic,
                    b"x" * 100,
                    msg_id.encode(),
                    headers=[(h.DELAY_MS, str(delay).encode()), (h.ID, msg_id.encode())],
                    on_delivery=on_delivery,
                )
                n += 1
                producer.poll(0)
            time.sleep(0.005)
        producer.flush(60)
        with tally.lock:
            tally.sent = n


def _consume(bootstrap: str, topic: str, tally: Tally, stop: threading.Event) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("soak-reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                hdrs: dict[str, bytes] = {}
                for name, value in list(msg.headers() or []):
                    if isinstance(value, bytes):
                        hdrs[str(name)] = value
                msg_id = hdrs.get(h.ID, b"").decode()
                due = int(hdrs.get(h.DELIVER_AT, b"0"))
                appended = msg.timestamp()[1]
                with tally.lock:
                    tally.seen[msg_id] += 1
                    if appended < due:
                        tally.early += 1
                    if tally.seen[msg_id] == 1:
                        tally.lateness_ms.append(float(appended - due))
    finally:
        consumer.close()


def _chart(samples: list[dict[str, float]], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    minutes = [s["t"] / 60 for s in samples]
    for name in names:
        ax.plot(minutes, [s[name] / 2**20 for s in samples], label=name)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("kdelay soak: resident set size")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=2000, help="delayed messages per second")
    ap.add_argument("--producer-every", type=float, default=5.0, help="seconds per producer")
    ap.add_argument("--out", type=Path, default=Path("reports/soak"))
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(StackOptions(data_dir=out / "data", state_file=out / "up.json"))
    stack.start()
    tally = Tally()
    stop = threading.Event()
    samples: list[dict[str, float]] = []
    try:
        topic = unique_topic("soak")
        create_topic(stack.bootstrap, topic, 4, config={"message.timestamp.type": "LogAppendTime"})
        reader = threading.Thread(target=_consume, args=(stack.bootstrap, topic, tally, stop))
        reader.start()
        seconds = args.minutes * 60
        sender = threading.Thread(
            target=_send,
            args=(
                f"127.0.0.1:{stack.proxy_port}",
                topic,
                tally,
                args.rate,
                seconds,
                args.producer_every,
            ),
        )
        t0 = time.monotonic()
        sender.start()
        names = ["proxy", *(r.name for r in stack.replicas)]
        while sender.is_alive() or time.monotonic() - t0 < seconds:
            procs = [stack.proxy, *(r.process for r in stack.replicas)]
            row = {"t": time.monotonic() - t0}
            row.update({n: float(rss_bytes(p.pid)) for n, p in zip(names, procs, strict=True) if p})
            samples.append(row)
            with tally.lock:
                done = len(tally.acked)
            print(f"{row['t'] / 60:5.1f} min  acked {done}  " + "  ".join(
                f"{n} {row[n] / 2**20:.0f} MiB" for n in names
            ), flush=True)  # fmt: skip
            sender.join(SAMPLE_S)
        # Drain: until everything acknowledged arrived, or nothing new for DRAIN_IDLE_S (a
        # backlog still draining is late, not lost; only what never comes is lost).
        last_seen, idle_since = -1, time.monotonic()
        while time.monotonic() - idle_since < DRAIN_IDLE_S:
            with tally.lock:
                if tally.acked <= set(tally.seen):
                    break
                seen = len(tally.seen)
            if seen != last_seen:
                last_seen, idle_since = seen, time.monotonic()
            time.sleep(1)
        stop.set()
        reader.join()
    finally:
        stop.set()
        stack.stop()
    with tally.lock:
        lost = len(tally.acked - set(tally.seen))
        dupes = sum(c - 1 for c in tally.seen.values() if c > 1)
        lat = tally.lateness_ms
        report = {
            "minutes": args.minutes,
            "rate": args.rate,
            "producer_every_s": args.producer_every,
            "sent": tally.sent,
            "acknowledged": len(tally.acked),
            "failed_sends": tally.failed,
            "delivered": len(tally.seen),
            "lost": lost,
            "duplicates": dupes,
            "early_by_broker_time": tally.early,
            "lateness_ms": {
                "p50": percentile(lat, 0.5),
                "p99": percentile(lat, 0.99),
                "max": max(lat, default=0.0),
            },
            "rss_mib": {
                n: {
                    "start": samples[0][n] / 2**20,
                    "end": samples[-1][n] / 2**20,
                    "max": max(s[n] for s in samples) / 2**20,
                }
                for n in names
            },
        }
    (out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "rss.json").write_text(json.dumps(samples) + "\n")
    _chart(samples, names, out / "rss.png")
    print(json.dumps(report, indent=2))
    print(f"chart: {out / 'rss.png'}")


if __name__ == "__main__":
    main()
