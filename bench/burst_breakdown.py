"""Where the demo's lateness goes: each message of ``make demo``'s burst, stage by stage.

    .venv/bin/python -m bench.burst_breakdown [--busy N] [--json F]

Starts the stack ``make demo`` starts (``kdelay up``: 3 replicas), sends the demo's burst
(dev/demo.py: 5,000 messages, delays 0-10 s) through the proxy, then reads every delivered
record (read_committed) and the buffer topic, and splits each message's lateness (its target
record's LogAppendTime minus its due time: the verifier's measure) in two:

- *proxy*: the buffer record's append time minus the time the demo's producer sent it;
- *service*: the target append time minus the later of the due time and the buffer append
  (ingest, the master's rounds, the release).

Reported for all messages and by due time after the first send, so a slow start (the first
second of the burst) shows apart from the steady state. ``--busy N`` runs N busy loops (one
core each) throughout, as a busy machine would be. ``cpu_seconds``: what each process
of the stack spent from the first send to the last delivery, a JVM's JIT compiler threads
apart (``kafka jit``). Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.harness.replicas import stat_cpu_seconds
from dev import demo
from dev.stack import wait_until
from dev.stack.leftovers import managed
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC, ROUTE_HEADER
from kdelay.stats import percentile

#: Due time after the first send, ms: the rows of the breakdown.
WINDOWS = ((0, 500), (500, 1000), (1000, 2000), (2000, 4000), (4000, 20_000))


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    sent_ms: int  # the demo producer's clock, in the record's value
    due_ms: int  # kdelay-deliver-at of the delivered record
    buffered_ms: int  # the buffer record's LogAppendTime
    delivered_ms: int  # the target record's LogAppendTime


#: Which process of the stack a command line is (the first fragment it contains).
_ROLES = (("kafka.Kafka", "kafka"), ("ZooKeeperServerMain", "zookeeper"), (" proxy ", "proxy"))


def _role(cmdline: str) -> str | None:
    if "--name " in cmdline:
        return cmdline.split("--name ", 1)[1].split(maxsplit=1)[0]  # a replica
    return next((role for part, role in _ROLES if part in cmdline), None)


def stack_cpu(owner: int) -> dict[str, float]:
    """CPU-seconds so far of each process ``owner`` (kdelay up) started, by role; a JVM's JIT
    compiler threads (C1, C2) apart as ``<role> jit``: the process's total less its other
    threads (HotSpot starts and ends compiler threads as work comes, and an ended thread's
    time is only in the process's total)."""
    out: dict[str, float] = collections.defaultdict(float)
    for m in managed():
        if m.owner != owner or (role := _role(m.cmdline)) is None:
            continue
        proc = Path(f"/proc/{m.pid}")
        try:
            total = stat_cpu_seconds((proc / "stat").read_text())
            if role in ("kafka", "zookeeper"):
                stats = [(task / "stat").read_text() for task in (proc / "task").iterdir()]
                other = sum(
                    stat_cpu_seconds(st) for st in stats if "CompilerThre" not in st.split(")")[0]
                )
                out[f"{role} jit"] += total - other
                total = other
            out[role] += total
        except (OSError, ValueError):
            continue  # gone meanwhile
    return out


def _spin() -> None:
    while True:
        pass


def _delivered(kafka: str) -> dict[str, tuple[int, int, int]]:
    """id -> (sent, due, delivered) of every demo message on the target topics."""
    c = Consumer({
        "bootstrap.servers": kafka,
        "group.id": "bench-burst-breakdown",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    })  # fmt: skip
    c.assign([TopicPartition(t, p, 0) for t in demo.TOPICS for p in range(demo.PARTITIONS)])
    out: dict[str, tuple[int, int, int]] = {}
    idle = 0
    try:
        while len(out) < demo.MESSAGES and idle < 20:
            batch = c.consume(1000, timeout=0.5)
            idle = 0 if batch else idle + 1
            for m in batch:
                hdrs = {kv[0]: kv[1] for kv in m.headers() or [] if isinstance(kv[1], bytes)}
                if m.error() is not None or h.DELIVER_AT not in hdrs:
                    continue  # the warm-up record
                sent = int(json.loads(m.value() or b"{}")["sent_ms"])
                out[hdrs[h.ID].decode()] = (sent, int(hdrs[h.DELIVER_AT]), m.timestamp()[1])
    finally:
        c.close()
    return out


def _buffered(kafka: str) -> dict[str, int]:
    """id -> the LogAppendTime of its schedule record in the buffer topic."""
    meta = AdminClient({"bootstrap.servers": kafka}).list_topics(BUFFER_TOPIC, timeout=10)
    c = Consumer({
        "bootstrap.servers": kafka,
        "group.id": "bench-burst-breakdown-buffer",
        "auto.offset.reset": "earliest",
    })  # fmt: skip
    c.assign([TopicPartition(BUFFER_TOPIC, p, 0) for p in meta.topics[BUFFER_TOPIC].partitions])
    out: dict[str, int] = {}
    idle = 0
    try:
        while idle < 6:
            batch = c.consume(2000, timeout=0.5)
            idle = 0 if batch else idle + 1
            for m in batch:
                if m.error() is not None or m.value() is None:
                    continue
                route = json.loads(dict(m.headers() or []).get(ROUTE_HEADER) or b"{}")
                if route.get("op") == "schedule":
                    out[str(route["i"])] = m.timestamp()[1]
    finally:
        c.close()
    return out


def run(busy: int) -> tuple[list[Message], dict[str, float]]:
    demo.WORK = Path(".kdelay/bench-burst")
    shutil.rmtree(demo.WORK, ignore_errors=True)
    demo.WORK.mkdir(parents=True)
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for p in loops:
        p.start()
    up, state = demo.start_stack()
    try:
        kafka, proxy = str(state["kafka"]), str(state["proxy"])
        demo.create_topics(kafka)
        before = stack_cpu(up.pid)
        started = demo.send(proxy)
        demo.wait_delivered(kafka, started + demo.MAX_DELAY_MS / 1000 + 60)
        after = stack_cpu(up.pid)
        delivered, buffered = _delivered(kafka), _buffered(kafka)
    finally:
        for p in loops:
            p.kill()
        up.signal(signal.SIGTERM)
        wait_until(lambda: not up.alive(), timeout=120, what="kdelay up to stop")
        up.stop()
    msgs = [
        Message(i, sent, due, buffered[i], at)
        for i, (sent, due, at) in delivered.items()
        if i in buffered
    ]
    return msgs, {k: round(after[k] - before.get(k, 0.0), 2) for k in sorted(after)}


def summary(msgs: list[Message]) -> dict[str, object]:
    t0 = min(m.sent_ms for m in msgs)

    def stats(values: list[float]) -> dict[str, float]:
        return {q: percentile(values, p) for q, p in (("p50", 0.5), ("p99", 0.99))} | {
            "max": max(values)
        }

    def stages(sel: list[Message]) -> dict[str, object]:
        return {
            "messages": len(sel),
            "lateness_ms": stats([m.delivered_ms - m.due_ms for m in sel]),
            "proxy_ms": stats([m.buffered_ms - m.sent_ms for m in sel]),
            "service_ms": stats([m.delivered_ms - max(m.due_ms, m.buffered_ms) for m in sel]),
        }

    rows = {
        f"due {lo}-{hi} ms": stages(sel)
        for lo, hi in WINDOWS
        if (sel := [m for m in msgs if lo <= m.due_ms - t0 < hi])
    }
    return {
        "all": stages(msgs),
        "first_buffer_append_ms": min(m.buffered_ms for m in msgs) - t0,
        "last_buffer_append_ms": max(m.buffered_ms for m in msgs) - t0,
        "first_delivery_ms": min(m.delivered_ms for m in msgs) - t0,
        "by_due_time_after_first_send": rows,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=0, help="busy loops running throughout")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    began = time.monotonic()
    msgs, cpu = run(args.busy)
    out = {"busy_loops": args.busy, "delivered": len(msgs), **summary(msgs), "cpu_seconds": cpu}
    out["seconds"] = round(time.monotonic() - began, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
