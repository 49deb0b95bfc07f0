"""A process of a :class:`bench.harness.faults.Cluster` restarted otherwise: with its wall clock
off, or every replica under another shard count (``kdelay reshard``), for ``bench.chaos``.

Clocks: a replica or the proxy runs under :class:`bench.harness.clock_skew.Skew` (faketime with
the monotonic clock true, and the shim for time.sleep). A broker runs under faketime with its
monotonic clock shifted by the same offset: with ``FAKETIME_DONT_FAKE_MONOTONIC`` libfaketime
0.9.10 ends the JVM's timed waits on its monotonic condition variables at once (``Object.wait``
and ``LockSupport.parkNanos`` of 50 ms returned after 0 ms here), so every waiting thread of the
broker would spin; a constant offset on the monotonic clock changes no interval the JVM measures.

Stops are graceful (SIGTERM to the process group, then what is left killed): faketime's own
process exits at the signal, before the process it runs has finished its shutdown, so the
group is waited for, not the process the harness started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from bench.harness.clock_skew import FAKETIME, Skew
from bench.harness.faults import Cluster
from dev.stack import KDELAY, LocalKafka, ManagedProcess, wait_until
from kdelay.zk import Paths, cluster_status

STOP_GRACE_S = 20.0
#: ``kdelay reshard`` refuses while a replica is registered: a killed one's session lasts 6 s.
RESHARD_TRIES_S = 60.0


def _group_gone(proc: ManagedProcess) -> bool:
    """No member of ``proc``'s process group runs (zombies do not count: nothing here reaps
    what faketime leaves behind)."""
    if proc.alive():
        return False
    for path in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            state, _ppid, group = path.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == proc.pid and state != "Z":
                return False
    return True


def stop_group(proc: ManagedProcess, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM ``proc``'s process group and wait until every member exited (faketime's process
    exits first), killing what is left after ``grace`` seconds."""
    if not proc.alive():
        proc.stop(grace=0)
        return
    proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not _group_gone(proc):
        time.sleep(0.2)
    proc.stop(grace=0)  # kills what is left of the group, reaps the leader


def restart_replica(c: Cluster, name: str, skew: Skew | None) -> None:
    """Stop replica ``name`` and start it again with ``skew``'s clock (None: the true one)."""
    stop_group(c.rs.procs[name])
    c.rs.skews[name] = skew
    c.rs.start(name)


def restart_proxy(c: Cluster, skew: Skew | None) -> None:
    """Stop the proxy and start it again with ``skew``'s clock, ready."""
    assert c.proxy is not None
    stop_group(c.proxy)
    c.proxy_clock(skew)
    c.proxy.start()
    c.wait_proxy()


def restart_broker(kafka: LocalKafka, index: int, offset_s: float | None) -> None:
    """Stop broker ``index`` and start it again, its clocks ``offset_s`` off (None: true), once
    every broker answers metadata."""
    node = kafka.nodes[index]
    assert node.process is not None, "the broker never ran"
    stop_group(node.process)
    if offset_s is None:
        kafka.start_node(index)
    else:
        java = node.process.argv[3:] if node.process.argv[0] == FAKETIME else node.process.argv
        env = {k: v for k, v in os.environ.items() if k != "FAKETIME_DONT_FAKE_MONOTONIC"}
        node.process = ManagedProcess(
            f"kafka-{node.node_id}",
            [FAKETIME, "-f", f"{offset_s:+g}s", *java],
            node.data_dir / "kafka.log",
            env=env,
        )
        node.process.start()
    kafka.wait_ready(timeout=180)


def _masters(c: Cluster, shards: int) -> bool:
    root = Paths(c.rs.set_root)
    with contextlib.suppress(Exception):  # ZooKeeper away or a status node half written
        return all(
            cluster_status(c.rs.client, root.shard(i, shards)).get("master") is not None
            for i in range(shards)
        )
    return False


def reshard(c: Cluster, shards: int, *, timeout: float = 240.0) -> None:
    """Stop every replica, ``kdelay reshard --shards SHARDS``, start them again with it
    (replica ``r<i>`` in shard ``(i - 1) % SHARDS``) and wait for a master in every shard."""
    for proc in c.rs.procs.values():
        stop_group(proc)
    assert c.zk is not None
    argv = [KDELAY, "reshard", "--zk-connect", c.zk.connect_string, "--zk-root", c.rs.set_root]
    argv += ["--shards", str(shards), "--bootstrap-servers", c.bootstrap]
    deadline = time.monotonic() + RESHARD_TRIES_S
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"kdelay reshard --shards {shards}: {done.stderr[-400:]}")
        time.sleep(2)
    c.rs.layout = shards
    for name in c.rs.names:
        c.rs.start(name)
    wait_until(
        lambda: _masters(c, shards),
        timeout=timeout,
        what=f"a master in each of {shards} shards",
        interval=0.5,
    )
