"""Delay-service replicas for the benchmarks: subprocesses of one replica set, and their figures."""

from __future__ import annotations

import os
import urllib.request
import uuid
from pathlib import Path

from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from dev.stack import KDELAY, KafkaSettings, ManagedProcess, wait_until
from dev.stack.replica import ReplicaSpec
from kdelay.zk import Paths, cluster_status

PARTITIONS = 4


def kafka_settings() -> KafkaSettings:
    """The broker of the steady-rate benchmarks: 1 GiB of heap and the full JIT a long-running
    broker has (not ``kdelay up``'s C1 only), so figures compare with earlier passes'."""
    return KafkaSettings(heap_mb=1024, quick_jit=False)


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def stat_cpu_seconds(stat: str) -> float:
    """User + system CPU time in a /proc ``stat`` line, a process's or one thread's."""
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and of its descendants alive now (a proxy's
    worker processes), from /proc."""
    stats: dict[int, str] = {}
    children: dict[int, list[int]] = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = path.read_text()
        except OSError:  # gone meanwhile
            continue
        member = int(path.parent.name)
        stats[member] = text
        children.setdefault(int(text.rsplit(")", 1)[1].split()[1]), []).append(member)
    total, todo = 0.0, [pid]
    while todo:
        member = todo.pop()
        total += stat_cpu_seconds(stats[member]) if member in stats else 0.0
        todo += children.get(member, [])
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (0 when it is gone), from /proc."""
    try:
        return stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    except FileNotFoundError:
        return 0.0


class Replicas:
    """N replicas of one replica set (own ZooKeeper root and buffer topic)."""

    def __init__(
        self,
        base: Path,
        bootstrap: str,
        zk: str,
        n: int,
        extra_args: tuple[str, ...] = (),
        *,
        shard: tuple[int, int] = (0, 1),
        root: str | None = None,
        buffer: str | None = None,
    ) -> None:
        self.base, self.bootstrap, self.zk = base, bootstrap, zk
        self.shard, self.shards = shard
        if self.shards > 1:
            extra_args = ("--shards", str(self.shards), "--shard", str(self.shard), *extra_args)
        self.extra_args = extra_args
        self.set_root = root or f"/kdelay-bench/{uuid.uuid4().hex[:8]}"
        self.root = Paths(self.set_root).shard(self.shard, self.shards).root
        self.buffer = buffer or f"bench-buffer-{uuid.uuid4().hex[:8]}"
        prefix = f"s{self.shard}" if self.shards > 1 else ""
        self.names = [f"{prefix}r{i}" for i in range(1, n + 1)]
        self.procs: dict[str, ManagedProcess] = {}
        self.client = KazooClient(hosts=zk)
        self.client.start(15)

    def start(self, name: str) -> ManagedProcess:
        spec = ReplicaSpec(
            name,
            self.bootstrap,
            self.zk,
            self.base / name,
            zk_root=self.set_root,
            zk_session_timeout=4,
            buffer_topic=self.buffer,
            buffer_partitions=PARTITIONS,
            status_interval_ms=200,
            log_level="WARNING",
            extra_args=self.extra_args,
        )
        proc = ManagedProcess(f"bench {name}", [KDELAY, *spec.args()], self.base / f"{name}.log")
        proc.start()
        self.procs[name] = proc
        return proc

    def start_all(self) -> None:
        for n in self.names:
            self.start(n)

    def status(self) -> dict[str, dict[str, object]]:
        return {r["name"]: r for r in cluster_status(self.client, Paths(self.root))["replicas"]}

    def wait_master(self, timeout: float = 120) -> str:
        found: list[str] = []

        def ok() -> bool:
            for name, r in self.status().items():
                if r["role"] == "master":
                    found.append(name)
                    return True
            return False

        wait_until(ok, timeout=timeout, what="a master", interval=0.05)
        return found[-1]

    def metric(self, name: str, metric: str) -> float:
        """The value of unlabelled ``metric`` (nan when absent); raises before it answers."""
        for line in self._fetch(name).splitlines():
            if line.startswith(metric + " "):
                return float(line.split()[1])
        return float("nan")

    def _fetch(self, name: str) -> str:
        """Replica ``name``'s /metrics text (KeyError or OSError before it answers)."""
        url = str(self.status()[name]["metrics"])
        text: str = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback
        return text

    def _scrape(self, name: str) -> str | None:
        """:meth:`_fetch`, None before it answers."""
        try:
            return self._fetch(name)
        except (KeyError, OSError):
            return None

    def metric_sum(self, name: str, metric: str) -> float:
        """The sum of every series of ``metric`` (all label values); nan before it answers."""
        text = self._scrape(name)
        if text is None:
            return float("nan")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((metric + "{", metric + " "))
        )

    def round_phases(self, name: str) -> dict[str, tuple[float, float]]:
        """Replica ``name``'s exactly-once round phases so far: phase -> (rounds, seconds), from
        ``kdelay_replica_round_phase_seconds``; empty before it answers."""
        text = self._scrape(name)
        if text is None:
            return {}
        found: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(text):
            if family.name != "kdelay_replica_round_phase_seconds":
                continue
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[1]
                if kind in ("count", "sum"):
                    pair = found.setdefault(sample.labels["phase"], [0.0, 0.0])
                    pair[kind == "sum"] = sample.value
        return {phase: (count, total) for phase, (count, total) in found.items()}

    def cpu_seconds(self, name: str) -> float:
        """User + system CPU time of replica ``name`` so far (0 when it is gone)."""
        pid = self.procs[name].pid
        return 0.0 if pid is None else cpu_seconds(pid)

    def rss_bytes(self, name: str) -> int:
        pid = self.procs[name].pid
        return 0 if pid is None else rss_bytes(pid)

    def close(self) -> None:
        for p in self.procs.values():
            p.stop(grace=20)
        self.client.stop()
        self.client.close()
