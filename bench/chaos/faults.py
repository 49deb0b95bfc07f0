"""The nemesis: the plan's faults, one after the other, on a :class:`Cluster`.

Each fault is injected at its planned second (or as soon as the previous one was undone) and
undone before the next: a killed process is restarted, a stopped one continued, ZooKeeper and a
broker started again. The victims of a kind are chosen when it runs (the master is whoever
leads then); the seed fixes kind, time and duration. A fault that cannot find its victim (no
master elected within a minute) is recorded with the error and skipped.
"""

from __future__ import annotations

import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass

from bench.chaos.plan import Fault
from bench.harness.faults import Cluster
from kdelay import logs

log = logs.get(__name__)
FIND_MASTER_S = 60.0


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


def inject(c: Cluster, fault: Fault, rng: random.Random) -> str:
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
    elif kind == "master-stop":
        victim = _master(c)
        proc = c.rs.procs[victim]
        proc.signal(signal.SIGSTOP)
        try:
            time.sleep(d)
        finally:
            proc.signal(signal.SIGCONT)
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
        try:
            record.target = inject(c, fault, rng)
        except Exception as err:  # noqa: BLE001 - recorded; the run goes on
            record.error = f"{type(err).__name__}: {err}"[:300]
        record.ended = round(time.monotonic() - t0, 1)
        log.info("chaos.fault", kind=fault.kind, target=record.target, error=record.error)
        print(
            f"[chaos] fault {fault.kind} on {record.target or '?'} at {record.started} s, "
            f"undone at {record.ended} s {record.error}",
            flush=True,
        )
