"""Failover gap: how long delivery stops when the master dies, or ZooKeeper goes away and back.

    .venv/bin/python -m bench.failover_gap [--case all|master-kill|zk-stop] [--kills 3]
        [--zk-outage 20] [--rate 100] [--zk-session-timeout S] [--out DIR]

Starts the stack ``kdelay up`` starts (:class:`dev.stack.stack.LocalStack`: ZooKeeper, one
Kafka broker, the proxy, three replicas, with ``kdelay up``'s defaults unless
``--zk-session-timeout`` overrides the replicas'), supervised the way ``kdelay up`` supervises
it (a killed replica is restarted after 1 s). A steady stream of delayed messages (``--rate``
a second, each due 1 s after it was sent) flows through the proxy to a ``LogAppendTime`` topic
that a consumer reads the whole time; a delivery's time is its LogAppendTime, on the broker's
clock, which is this machine's.

- ``master-kill`` (``--kills`` times): the master named by ``kdelay status --json`` is SIGKILLed.
  Reported: the *gap* (the longest interval without a delivered record from 2 s before the
  kill on), the time from the kill to the first delivery after it, how long ``kdelay status``
  (the same ``cluster_status`` in-process, polled every 100 ms) still named the dead replica
  master, how long the dead replica's election node still led (its session's expiry), and
  when a live new master was named.
- ``zk-stop``: ZooKeeper is stopped for ``--zk-outage`` seconds and started again. Reported:
  the time from ZooKeeper's start to the first delivery, from the outage's begin to it, and
  whether any replica's session was lost (a restored session keeps its master).
Each case also reports its *baseline*: the longest gap in the 10 s of steady flow before it.
Results go to ``--out``/failover_gap.json; the processes' logs stay in ``--out``/data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from dev.kafka_tools import create_topic, unique_topic
from dev.stack import wait_until
from dev.stack.process import python_argv
from dev.stack.restarts import SupervisedProcesses
from dev.stack.stack import LocalStack, StackOptions
from kdelay import headers as h
from kdelay.zk import Paths, Session, cluster_status, current_leader

PARTITIONS = 4
DELAY_MS = 1_000
BASELINE_MS = 10_000
BEFORE_MS = 2_000


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Deliveries:
    """LogAppendTime of every delivered record, appended by the reader thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    stamps: list[int] = field(default_factory=list)

    def sorted(self) -> list[int]:
        with self.lock:
            return sorted(self.stamps)

    def latest(self) -> int:
        with self.lock:
            return max(self.stamps, default=0)


def _read(bootstrap: str, topic: str, out: Deliveries, stop: threading.Event) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("gap-reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            stamps = [m.timestamp()[1] for m in consumer.consume(1000, 0.2) if m.error() is None]
            with out.lock:
                out.stamps += stamps
    finally:
        consumer.close()


def _send(proxy: str, topic: str, rate: int, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": proxy, "enable.idempotence": True, "linger.ms": 5})
    start, n = time.monotonic(), 0
    while not stop.is_set():
        while n < int((time.monotonic() - start) * rate):
            producer.produce(
                topic, b"x", f"gap-{n}".encode(), partition=n % PARTITIONS,
                headers=[(h.DELAY_MS, str(DELAY_MS).encode())],
            )  # fmt: skip
            n += 1
        producer.poll(0.005)
    producer.flush(60)


def longest_gap(stamps: list[int], start: int, end: int) -> tuple[int, int, int]:
    """(gap ms, from, to): the longest interval between consecutive deliveries in
    [start, end], ``stamps`` sorted."""
    window = stamps[bisect_left(stamps, start) : bisect_right(stamps, end)]
    best = (0, start, start)
    for a, b in itertools.pairwise(window):
        if b - a > best[0]:
            best = (b - a, a, b)
    return best


def _first_after(stamps: list[int], t: int) -> int | None:
    i = bisect_right(stamps, t)
    return stamps[i] if i < len(stamps) else None


@dataclass
class Bench:
    """The running stack, its supervisor, the reader's deliveries and a ZooKeeper viewer."""

    stack: LocalStack
    supervisor: SupervisedProcesses
    deliveries: Deliveries
    viewer: Session
    paths: Paths = field(default_factory=Paths)
    _next_tick: float = 0.0

    def tick(self) -> None:
        """What ``kdelay up``'s loop does once a second: restart what exited."""
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + 1.0
            self.supervisor.tick()

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        def ticking() -> bool:
            self.tick()
            return condition()

        wait_until(ticking, timeout=timeout, what=what, interval=0.1)

    def status_json(self) -> dict[str, Any]:
        """``kdelay status --json``, run as a user runs it."""
        result = subprocess.run(
            python_argv("status", "--zk-connect", self.stack.zk_connect, "--json"),
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        doc: dict[str, Any] = json.loads(result.stdout)
        return doc

    def steady(self, seconds: float = BASELINE_MS / 1000 + 2) -> None:
        """Wait for ``seconds`` of deliveries from now on."""
        t = now_ms()
        self.wait(
            lambda: self.deliveries.latest() >= t + seconds * 1000,
            timeout=seconds + 120,
            what=f"{seconds:g} s of steady deliveries",
        )


def master_kill(b: Bench) -> dict[str, Any]:
    found: list[str] = []

    def named() -> bool:
        status = b.status_json()
        roles = {r["name"]: r["role"] for r in status["replicas"]}
        if status["master"] is not None and roles.get(status["master"]) == "master":
            found.append(str(status["master"]))
        return bool(found)

    b.wait(named, timeout=120, what="a master in `kdelay status --json`")
    victim = found[-1]
    [replica] = [r for r in b.stack.replicas if r.name == victim]
    t_kill = now_ms()
    os.kill(replica.process.pid, signal.SIGKILL)
    marks: dict[str, int] = {}
    new_master = None
    while len(marks) < 3 and now_ms() < t_kill + 120_000:
        b.tick()
        status = cluster_status(b.viewer.client, b.paths)
        t = now_ms()
        if status["master"] != victim:
            marks.setdefault("status_names_dead_master_ms", t - t_kill)
        if current_leader(b.viewer.client, b.paths) != victim:
            marks.setdefault("dead_election_node_leads_ms", t - t_kill)
        if status["master"] not in (None, victim):
            marks.setdefault("new_master_named_ms", t - t_kill)
            new_master = status["master"]
        time.sleep(0.1)
    b.steady()
    stamps = b.deliveries.sorted()
    gap, start, end = longest_gap(stamps, t_kill - BEFORE_MS, b.deliveries.latest())
    first = _first_after(stamps, t_kill)
    base, _, _ = longest_gap(stamps, t_kill - BEFORE_MS - BASELINE_MS, t_kill - BEFORE_MS)
    b.wait(
        lambda: any(
            r["name"] == victim and r["role"] == "follower"
            for r in cluster_status(b.viewer.client, b.paths)["replicas"]
        ),
        timeout=180,
        what=f"{victim} to be restarted and follow",
    )
    return {
        "case": "master-kill",
        "victim": victim,
        "new_master": new_master,
        "gap_ms": gap,
        "gap_from_kill_ms": [start - t_kill, end - t_kill],
        "kill_to_first_delivery_ms": None if first is None else first - t_kill,
        **marks,
        "baseline_gap_ms": base,
    }


def zk_stop(b: Bench, outage_s: float) -> dict[str, Any]:
    zookeeper = b.stack.zookeeper
    assert zookeeper is not None
    master_before = b.stack.master()
    lost_before = _lost_sessions(b.stack)
    t_stop = now_ms()
    zookeeper.stop()
    deadline = time.monotonic() + outage_s
    while time.monotonic() < deadline:  # the fault's duration; the supervisor keeps ticking
        b.tick()
        time.sleep(0.1)
    t_start = now_ms()
    zookeeper.start()
    t_serving = now_ms()
    b.steady()
    stamps = b.deliveries.sorted()
    gap, _, _ = longest_gap(stamps, t_stop - BEFORE_MS, b.deliveries.latest())
    first = _first_after(stamps, t_start)
    base, _, _ = longest_gap(stamps, t_stop - BEFORE_MS - BASELINE_MS, t_stop - BEFORE_MS)
    lost = _lost_sessions(b.stack)
    return {
        "case": "zk-stop",
        "outage_s": outage_s,
        "zk_start_to_serving_ms": t_serving - t_start,
        "zk_start_to_first_delivery_ms": None if first is None else first - t_start,
        "outage_begin_to_first_delivery_ms": None if first is None else first - t_stop,
        "gap_ms": gap,
        "sessions_lost": {n: lost[n] - lost_before.get(n, 0) for n in lost},
        "master_before": master_before,
        "master_after": b.stack.master(),
        "baseline_gap_ms": base,
    }


def _lost_sessions(stack: LocalStack) -> dict[str, int]:
    """How often each replica logged a lost ZooKeeper session so far."""
    return {
        r.name: r.process.log_path.read_text(errors="replace").count('"state": "lost"')
        for r in stack.replicas
    }


def _prune(data: Path) -> None:
    """Delete the stack's data, keep its logs."""
    for pattern in ("kafka/node-*/logs", "replica-*/store", "zookeeper/data"):
        for path in data.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--case", choices=("all", "master-kill", "zk-stop"), default="all")
    ap.add_argument("--kills", type=int, default=3, help="master kills, one after another")
    ap.add_argument("--zk-outage", type=float, default=20.0, help="seconds ZooKeeper is down")
    ap.add_argument("--rate", type=int, default=100, help="delayed messages per second")
    ap.add_argument("--zk-session-timeout", type=float, default=None, help="[replica default]")
    ap.add_argument("--out", type=Path, default=Path("reports/failover-gap"))
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    options = StackOptions(
        data_dir=out / "data",
        state_file=out / "up.json",
        zk_session_timeout=args.zk_session_timeout,
    )
    stack = LocalStack(options)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    viewer: Session | None = None
    results: list[dict[str, Any]] = []
    try:
        stack.start()
        topic = unique_topic("gap")
        create_topic(
            stack.bootstrap, topic, PARTITIONS, config={"message.timestamp.type": "LogAppendTime"}
        )
        deliveries = Deliveries()
        proxy = f"127.0.0.1:{stack.proxy_port}"
        threads = [
            threading.Thread(target=_read, args=(stack.bootstrap, topic, deliveries, stop)),
            threading.Thread(target=_send, args=(proxy, topic, args.rate, stop)),
        ]
        for t in threads:
            t.start()
        viewer = Session(stack.zk_connect, 10.0)
        viewer.start(timeout=30)
        # Like `kdelay up`, minus the servers: the zk-stop case stops ZooKeeper on purpose.
        parts = [c for c in stack.components() if not c.essential]
        b = Bench(stack, SupervisedProcesses(parts, log=print), deliveries, viewer)
        b.steady()
        if args.case in ("all", "master-kill"):
            for _ in range(args.kills):
                results.append(master_kill(b))
                print(json.dumps(results[-1]), flush=True)
                b.steady()
        if args.case in ("all", "zk-stop"):
            results.append(zk_stop(b, args.zk_outage))
            print(json.dumps(results[-1]), flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
        if viewer is not None:
            viewer.stop()
        stack.stop()
        _prune(out / "data")
    report = {
        "rate": args.rate,
        "delay_ms": DELAY_MS,
        "zk_session_timeout_s": args.zk_session_timeout or "replica default",
        "results": results,
    }
    (out / "failover_gap.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
