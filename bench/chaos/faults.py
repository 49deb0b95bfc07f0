"""The nemesis: the plan's faults, one after the other, on a :class:`Cluster`.

Each fault is injected at its planned second (or as soon as the previous one was undone) and
undone before the next: a killed process is restarted, a stopped one continued, ZooKeeper and a
broker started again, a clock set right again by a restart, a reshard (one shard to two)
resharded back. The victims of a kind are chosen when it runs (the master is whoever leads
then); the seed fixes kind, time, duration and a clock's offset. A fault that cannot find its
victim (no master elected within a minute) is recorded with the error and skipped.
"""

from __future__ import annotations

import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass

from bench.chaos.plan import Fault
from bench.harness import restarts
from bench.harness.clock_skew import Skew
from bench.harness.faults import Cluster, now_ms
from dev.stack import ManagedProcess
from kdelay import logs

log = logs.get(__name__)
FIND_MASTER_S = 60.0
#: A reshard goes from one shard to this many and back (4 buffer partitions: 2 shards of 2).
RESHARD_TO = 2


@dataclass
class Injected:
    """What happened to one planned fault (times in seconds from the run's start)."""

    kind: str
    at: float
    duration: float
    started: float | None = None
    ended: float | None = None
    target: str = ""
    error: str = ""
    #: When it was injected and undone (epoch ms, the brokers' clock: same machine).
    span_ms: tuple[int, int] | None = None
    #: A reshard: from before its replicas started in several shards to after they stopped
    #: (epoch ms): releases meanwhile came from several masters, in no common order.
    shards_ms: tuple[int, int] | None = None


def _master(c: Cluster) -> str:
    return c.wait_master(timeout=FIND_MASTER_S)


def _follower(c: Cluster, rng: random.Random) -> str:
    master = c.master()
    names = [n for n in c.rs.names if n != master]
    return rng.choice(sorted(names))


def _kill_restart(c: Cluster, name: str, pause: float, *, wipe: bool = False) -> None:
    proc = c.rs.procs[name]
    proc.kill()
    if wipe:  # the replica's whole data directory (BenchReplicas: base/<name>)
        shutil.rmtree(c.rs.base / name, ignore_errors=True)
    time.sleep(pause)
    proc.restart()


def heal(c: Cluster) -> list[str]:
    """Restart what exited on its own (no fault of ours was under way): a crash, worth
    reporting; the names restarted."""
    crashed = [name for name, proc in c.rs.procs.items() if not proc.alive()]
    for name in crashed:
        c.rs.procs[name].restart()
    if c.proxy is not None and not c.proxy.alive():
        crashed.append("proxy")
        c.proxy.restart()
    return crashed


def _stop(proc: ManagedProcess, seconds: float) -> None:
    proc.signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        proc.signal(signal.SIGCONT)


def _clock(c: Cluster, fault: Fault, rng: random.Random) -> str:
    """A replica (master or follower) or the proxy restarted with its clock off, then right."""
    skew = Skew(fault.offset_ms / 1000)
    victim = rng.choice(("master", "follower", "proxy"))
    if victim == "proxy":
        try:
            restarts.restart_proxy(c, skew)
            time.sleep(fault.duration_s)
        finally:
            restarts.restart_proxy(c, None)
    else:
        victim = _master(c) if victim == "master" else _follower(c, rng)
        try:
            restarts.restart_replica(c, victim, skew)
            time.sleep(fault.duration_s)
        finally:
            restarts.restart_replica(c, victim, None)
    return f"{victim} {fault.offset_ms:+d} ms"


def _broker_clock(c: Cluster, fault: Fault, rng: random.Random) -> str:
    """A broker restarted with its clock off, then right."""
    assert c.kafka is not None
    index = rng.randrange(len(c.kafka.nodes))
    try:
        restarts.restart_broker(c.kafka, index, fault.offset_ms / 1000)
        time.sleep(fault.duration_s)
    finally:
        restarts.restart_broker(c.kafka, index, None)
    return f"broker {c.kafka.nodes[index].node_id} {fault.offset_ms:+d} ms"


def _reshard(c: Cluster, fault: Fault, record: Injected) -> str:
    start = now_ms()
    try:
        restarts.reshard(c, RESHARD_TO)
        time.sleep(fault.duration_s)
    finally:
        restarts.reshard(c, 1)
        record.shards_ms = (start, now_ms())
    return f"replicas: 1 -> {RESHARD_TO} -> 1 shards"


def inject(c: Cluster, fault: Fault, rng: random.Random, record: Injected) -> str:
    """Inject ``fault`` and undo it; returns the victim's name."""
    kind, d = fault.kind, fault.duration_s
    if kind == "master-kill":
        victim = _master(c)
        _kill_restart(c, victim, 1.0)
    elif kind == "follower-kill":
        victim = _follower(c, rng)
        _kill_restart(c, victim, min(d, 5.0))
    elif kind == "store-wipe":
        victim = rng.choice(sorted(c.rs.names))
        _kill_restart(c, victim, 1.0, wipe=True)
    elif kind in ("master-stop", "follower-stop"):
        victim = _master(c) if kind == "master-stop" else _follower(c, rng)
        _stop(c.rs.procs[victim], d)
    elif kind == "proxy-stop":
        assert c.proxy is not None
        victim = "proxy"
        _stop(c.proxy, d)
    elif kind == "clock-offset":
        victim = _clock(c, fault, rng)
    elif kind == "reshard":
        victim = _reshard(c, fault, record)
    elif kind == "proxy-kill":
        assert c.proxy is not None
        victim = "proxy"
        c.proxy.kill()
        time.sleep(1.0)
        c.proxy.restart()
        c.wait_proxy()
    elif kind == "zk-restart":
        assert c.zk is not None
        victim = "zookeeper"
        c.zk.kill()
        time.sleep(d)
        c.zk.start()
    elif kind == "broker-kill":
        assert c.kafka is not None
        index = rng.randrange(len(c.kafka.nodes))
        victim = f"broker {c.kafka.nodes[index].node_id}"
        c.kafka.kill_node(index)
        time.sleep(d)
        c.kafka.start_node(index)
    elif kind == "broker-clock-offset":
        victim = _broker_clock(c, fault, rng)
    else:
        raise ValueError(f"fault kind {kind!r} is not one of bench.chaos.plan.FAULT_KINDS")
    return victim


def nemesis(
    c: Cluster,
    faults: tuple[Fault, ...],
    *,
    seed: int,
    t0: float,
    stop: threading.Event,
    out: list[Injected],
    crashes: list[str],
) -> None:
    """Run ``faults`` from ``t0`` (time.monotonic) until done or ``stop``; append to ``out``,
    and the processes found dead before a fault to ``crashes``."""
    rng = random.Random(seed ^ 0x5EED)  # victims among equals; kinds and times are the plan's
    for fault in faults:
        wait = t0 + fault.at_s - time.monotonic()
        if stop.wait(max(0.0, wait)):
            return
        crashes += heal(c)
        record = Injected(fault.kind, fault.at_s, fault.duration_s)
        out.append(record)
        record.started = round(time.monotonic() - t0, 1)
        start_ms = now_ms()
        try:
            record.target = inject(c, fault, rng, record)
        except Exception as err:  # noqa: BLE001 - recorded; the run goes on
            record.error = f"{type(err).__name__}: {err}"[:300]
        record.ended = round(time.monotonic() - t0, 1)
        record.span_ms = (start_ms, now_ms())
        log.info("chaos.fault", kind=fault.kind, target=record.target, error=record.error)
        print(
            f"[chaos] fault {fault.kind} on {record.target or '?'} at {record.started} s, "
            f"undone at {record.ended} s {record.error}",
            flush=True,
        )
