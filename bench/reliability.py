"""Reliability under injected faults: one row per case of the table in docs/reliability.md.

    .venv/bin/python -m bench.reliability --case master-kill [--json FILE] [--markdown]
    .venv/bin/python -m bench.reliability --case all --json FILE --doc docs/reliability.md
    .venv/bin/python -m bench.reliability --json FILE --markdown  # the table only

Each case starts its own ZooKeeper, Kafka (3 brokers for broker-kill), proxy and replicas r1-r3
as real processes on loopback (bench/harness/faults.py), then an idempotent confluent-kafka producer
sends --rate delayed messages a second (kdelay-delay-ms 0-5000, a unique kdelay-id each)
through the proxy to a target topic with message.timestamp.type=LogAppendTime for --seconds
(longer when the faults need it: until 10 s after the last one), while a consumer reads that
topic (and the dead-letter topic) from the start. The faults come from 10 s on. After the
stream it drains: at least the longest delay plus 5 s, then until no delivery arrived for 10 s
(60 s while acknowledged messages are missing; at most 180 s). bench/harness/verdict.py judges it by
the broker's clock: lost, duplicates, early, lateness, recovery time (definitions there and in
docs/reliability.md).

Logs stay in --work/<case> (Kafka, ZooKeeper and RocksDB data are removed). Not in make test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from bench.harness import faults as f
from bench.harness.clock_skew import Skew
from bench.harness.faults import Cluster, Event, now_ms
from bench.harness.replicas import PARTITIONS
from bench.harness.verdict import Delivery, Ledger, judge, table, update_doc
from dev.kafka_tools import HeaderList, Record, create_topic, unique_topic
from kdelay import headers as h
from kdelay.buffer import DEAD_LETTER_TOPIC

MAX_DELAY_MS = 5_000
QUIET_S = 10.0
DRAIN_CAP_S = 180.0


@dataclass(frozen=True)
class Case:
    name: str
    fault: str  # one line for the doc
    inject: f.Inject
    brokers: int = 1
    replica_skew: Skew | None = None  # r1's clock, when off: r1 starts first and leads
    proxy_skew: Skew | None = None
    #: "injection" or "end": the reference of the recovery time shown in the table; None: the
    #: fault lasts the whole run, so there is nothing to recover from.
    recovery_from: str | None = "injection"


CASES = {
    c.name: c
    for c in (
        Case(
            "master-kill",
            "SIGKILL the master at 10 s and at 25 s, each restarted 1 s later",
            f.master_kill,
        ),
        Case(
            "all-replicas-kill",
            "SIGKILL r1, r2 and r3 at 10 s, restarted 5 s later",
            f.all_replicas_kill,
        ),
        Case(
            "master-stop",
            "SIGSTOP the master at 10 s for 15 s (session 6 s), then SIGCONT",
            f.master_stop,
        ),
        Case(
            "zk-stop",
            "SIGKILL ZooKeeper at 10 s, restarted on its port and data 20 s later",
            f.zk_stop,
            recovery_from="end",
        ),
        Case(
            "broker-kill",
            "3 brokers, RF 3, min ISR 2: SIGKILL a broker that is not the KRaft "
            "leader at 10 s, restarted 15 s later",
            f.broker_kill,
            brokers=3,
        ),
        Case(
            "proxy-kill",
            "SIGKILL the proxy 5 times, at 10, 15, 20 ... s or once the restarted proxy "
            "served 3 s, each restarted 1 s later",
            f.proxy_kill,
        ),
        Case(
            "master-clock-ahead",
            "the master r1 under faketime +5 s from the start",
            f.clock_skew("master r1 at +5 s (faketime)"),
            replica_skew=Skew(5),
            recovery_from=None,
        ),
        Case(
            "master-clock-ahead-py",
            "the master r1 with Python's time.time/time_ns +5 s from the start",
            f.clock_skew("master r1 at +5 s (Python clock)"),
            replica_skew=Skew(5, "python"),
            recovery_from=None,
        ),
        Case(
            "proxy-clock-behind",
            "the proxy under faketime -5 s from the start",
            f.clock_skew("proxy at -5 s (faketime)"),
            proxy_skew=Skew(-5),
            recovery_from=None,
        ),
        Case(
            "proxy-clock-behind-py",
            "the proxy with Python's time.time/time_ns -5 s from the start",
            f.clock_skew("proxy at -5 s (Python clock)"),
            proxy_skew=Skew(-5, "python"),
            recovery_from=None,
        ),
        Case(
            "poison", "80 garbage records (8 kinds) into __kdelay_buffer at 10 s and 25 s", f.poison
        ),
    )
}


def stream(proxy: str, topic: str, ledger: Ledger, rate: int, halt: threading.Event) -> None:
    """Send ``rate``/s until ``ledger.stream_until``; a producer whose idempotence state turned
    fatal is replaced (its queued records fail and count as not acknowledged), as an application
    would."""
    fatal = threading.Event()

    def on_error(err: KafkaError) -> None:
        with ledger.lock:
            ledger.errors[f"error_cb {err.name()}" + (f": {err.str()}" if err.fatal() else "")] += 1
        if err.fatal():
            fatal.set()

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        msg_id = (msg.key() or b"").decode()
        with ledger.lock:
            if err is None:
                ledger.acked.add(msg_id)
                ledger.ack_ms.append(now_ms())
            else:
                ledger.errors[f"delivery {err.name()}"] += 1

    def make() -> Producer:
        conf = {"bootstrap.servers": proxy, "enable.idempotence": True, "acks": "all"}
        return Producer({**conf, "linger.ms": 5, "error_cb": on_error, "log_level": 0})

    producer = make()
    start = time.monotonic()
    tag = unique_topic("rel")
    n = 0
    while (elapsed := time.monotonic() - start) < ledger.stream_until and not halt.is_set():
        if fatal.is_set():
            producer.purge()
            producer.poll(1)
            producer = make()
            fatal.clear()
            with ledger.lock:
                ledger.fatal += 1
        while n < int(elapsed * rate):
            msg_id, delay, at = f"{tag}-{n}", random.randrange(MAX_DELAY_MS + 1), now_ms()
            hdrs: HeaderList = [(h.DELAY_MS, str(delay).encode()), (h.ID, msg_id.encode())]
            try:
                producer.produce(
                    topic, b"x" * 100, msg_id.encode(), headers=hdrs, on_delivery=on_delivery
                )
            except BufferError:
                with ledger.lock:
                    ledger.errors["local queue full"] += 1
            else:
                with ledger.lock:
                    ledger.sent[msg_id] = (at, delay)
            n += 1
        producer.poll(0.005)
    left = producer.flush(5 if halt.is_set() else 120)
    if left:
        with ledger.lock:
            ledger.errors["unacknowledged after the flush"] += left


def read(bootstrap: str, topic: str, ledger: Ledger, stop: threading.Event) -> None:
    """Every record of ``topic`` (and the dead-letter topic) from the beginning until ``stop``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("rel-reader"),
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        meta = consumer.list_topics(timeout=30).topics
        consumer.assign(
            [
                TopicPartition(t, p, OFFSET_BEGINNING)
                for t in (topic, DEAD_LETTER_TOPIC)
                for p in meta[t].partitions
            ]
        )
        while not stop.is_set():
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                r = Record.of(msg)
                with ledger.lock:
                    ledger.last_delivery = time.monotonic()
                    if r.topic == DEAD_LETTER_TOPIC:
                        src = r.header("kdelay-source") or str(r.offset).encode()
                        ledger.dead_letters.add(src.decode(errors="replace"))
                        continue
                    ledger.deliveries.append(
                        Delivery(
                            (r.header(h.ID) or b"").decode(errors="replace"),
                            int(r.header(h.DELIVER_AT) or b"-1"),
                            r.timestamp_ms,
                            msg.timestamp()[0],
                        )
                    )
    finally:
        consumer.close()


def _prune(work: Path) -> None:
    """Drop the data (Kafka logs, ZooKeeper snapshots, RocksDB); keep the processes' logs."""
    for d in [*work.glob("kafka/node-*/logs"), work / "zk" / "data", *work.glob("set/r*")]:
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def run_case(case: Case, work: Path, rate: int, seconds: float) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cluster = Cluster(work, case.brokers, case.replica_skew, case.proxy_skew)
    ledger, events = Ledger(), list[Event]()
    stop, halt = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    began = time.monotonic()
    try:
        cluster.start()
        print(f"[{case.name}] cluster up in {time.monotonic() - began:.0f} s", flush=True)
        rf = min(3, case.brokers)
        config = {"message.timestamp.type": "LogAppendTime", "min.insync.replicas": str(min(2, rf))}
        topic = unique_topic(f"rel-{case.name}")
        create_topic(cluster.bootstrap, topic, PARTITIONS, replication=rf, config=config)
        threads = [
            threading.Thread(target=read, args=(cluster.bootstrap, topic, ledger, stop)),
            threading.Thread(
                target=stream, args=(cluster.proxy_address, topic, ledger, rate, halt)
            ),
        ]
        t0, start_ms = time.monotonic(), now_ms()
        for t in threads:
            t.start()

        def at(second: float) -> None:
            time.sleep(max(0.0, t0 + second - time.monotonic()))
            with ledger.lock:
                acked, got = len(ledger.acked), len(ledger.deliveries)
            print(f"[{case.name}] {second:4.0f} s  acked {acked}  delivered {got}", flush=True)

        case.inject(cluster, at, events)
        # The stream goes on for --seconds, and for 10 s after the last fault at least.
        ledger.stream_until = max(seconds, time.monotonic() - t0 + 10)
        for e in events:
            print(f"[{case.name}] event: {e.what} at +{(e.at_ms - start_ms) / 1000:.1f} s")
        threads[1].join()
        end_ms, stream_end = now_ms(), time.monotonic()
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with ledger.lock:
                quiet = now - ledger.last_delivery
                # Quiet for 10 s, or for 60 s while acknowledged ids are still missing.
                wanted = QUIET_S if ledger.acked <= {d.msg_id for d in ledger.deliveries} else 60
            if now - stream_end > DRAIN_CAP_S or (
                now - stream_end > MAX_DELAY_MS / 1000 + 5 and quiet >= wanted
            ):
                break
        drained = time.monotonic() - stream_end
        master = cluster.status().get("master")
    finally:
        stop.set()
        halt.set()
        for t in reversed(threads):
            t.join(timeout=180)
        cluster.stop()
        _prune(work)
    result = {
        "case": case.name,
        "fault": case.fault,
        "recovery_from": case.recovery_from,
        "events": [dataclasses.asdict(e) for e in events],
        "master_at_end": master,
        "stream_start_ms": start_ms,
        "rate": rate,
        "seconds": round(ledger.stream_until, 1),
        "drain_s": round(drained, 1),
        **judge(ledger, events, (start_ms, end_ms)),
        **provenance(),
        "logs": str(work),
    }
    print(json.dumps(result, indent=1), flush=True)
    return result


def provenance() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    dirty = "+uncommitted" if git("status", "--porcelain", "--untracked-files=no") else ""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git("rev-parse", "--short", "HEAD") + dirty,
        "cores": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--case", choices=[*CASES, "all"], help="the case to run (all: one by one)")
    ap.add_argument("--rate", type=int, default=500, help="delayed messages per second [500]")
    ap.add_argument(
        "--seconds", type=float, default=40.0, help="length of the stream at least [40]"
    )
    ap.add_argument("--work", type=Path, default=Path("reports/reliability"), help="logs go here")
    ap.add_argument("--json", type=Path, help="merge the rows into this file (by case)")
    ap.add_argument("--markdown", action="store_true", help="print the table (of --json's rows)")
    ap.add_argument("--doc", type=Path, help="rewrite the table section of this file")
    args = ap.parse_args(argv)
    rows: dict[str, dict[str, Any]] = {}
    if args.json is not None and args.json.exists():
        rows = json.loads(args.json.read_text())["cases"]
    names = list(CASES) if args.case == "all" else [args.case] if args.case else []
    for name in names:
        try:
            rows[name] = run_case(CASES[name], args.work / name, args.rate, args.seconds)
        except Exception as exc:  # noqa: BLE001 - one failed case must not hide the others
            traceback.print_exc()
            rows[name] = {"case": name, "error": f"{type(exc).__name__}: {exc}"[:200]}
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"cases": rows}, indent=1) + "\n")
    ordered = [rows[n] for n in CASES if n in rows]
    if args.markdown:
        print(table(ordered))
    if args.doc is not None:
        update_doc(args.doc, table(ordered))
    if not names and not (args.markdown or args.doc):
        ap.error("give --case, or --markdown/--doc with --json")


if __name__ == "__main__":
    main()
