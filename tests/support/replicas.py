"""Run delay-service replicas as real subprocesses (``kdelay delay-service``) for failure tests.

Each :class:`ReplicaSet` gets its own ZooKeeper root and its own buffer topic, so tests sharing
one Kafka never see each other's messages. Replicas are ManagedProcesses: SIGKILL is real.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from dev.kafka_tools import create_topic
from dev.stack import KDELAY, ManagedProcess, wait_until
from dev.stack.replica import ReplicaSpec
from kdelay.checkpoint import CheckpointRecord
from kdelay.topics import BUFFER_TOPIC_CONFIG
from kdelay.zk import Paths, cluster_status, read_checkpoint


@dataclass
class Replica:
    """One replica's name, state directory and (when running) process."""

    name: str
    data_dir: Path
    log_path: Path
    proc: ManagedProcess | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_events(self) -> list[dict[str, Any]]:
        """The replica's JSON log lines, parsed (other lines skipped)."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


@dataclass
class ReplicaSet:
    """N replicas of one replica set; a context manager that stops them all."""

    base: Path
    bootstrap: str
    zk_connect: str
    count: int = 3
    partitions: int = 4
    session_timeout: float = 3.0
    checkpoint_interval_ms: int = 100
    extra_args: list[str] = field(default_factory=list)
    root: str = field(default_factory=lambda: f"/kdelay-test/{uuid.uuid4().hex[:10]}")
    buffer_topic: str = field(default_factory=lambda: f"buffer-{uuid.uuid4().hex[:10]}")
    replicas: dict[str, Replica] = field(default_factory=dict)
    #: Per replica, a command to run it under and its environment (``faketime -f +5s``).
    wrap: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    #: This set is shard ``shard`` of ``shards`` of the delay set under ``root`` (kdelay/shards.py).
    shards: int = 1
    shard: int = 0

    def __post_init__(self) -> None:
        self.paths = Paths(self.root).shard(self.shard, self.shards)
        for i in range(1, self.count + 1):
            name = f"replica-{i}"
            self.replicas[name] = Replica(
                name, self.base / name / "data", self.base / name / "replica.log"
            )
        self._zk = KazooClient(hosts=self.zk_connect, timeout=10.0)
        self._zk.start(timeout=15)

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_buffer_topic(self) -> None:
        """Create this set's buffer topic as a replica would, to fill it before any starts."""
        create_topic(self.bootstrap, self.buffer_topic, self.partitions, config=BUFFER_TOPIC_CONFIG)

    # -- processes ---------------------------------------------------------------------------

    def argv(self, name: str) -> list[str]:
        spec = ReplicaSpec(
            name,
            self.bootstrap,
            self.zk_connect,
            self.replicas[name].data_dir,
            zk_root=self.root,
            shards=self.shards if self.shards > 1 else None,
            shard=self.shard if self.shards > 1 else None,
            zk_session_timeout=self.session_timeout,
            buffer_topic=self.buffer_topic,
            buffer_partitions=self.partitions,
            checkpoint_interval_ms=self.checkpoint_interval_ms,
            status_interval_ms=200,
            extra_args=tuple(self.extra_args),
        )
        return [KDELAY, *spec.args()]

    def start(self, name: str) -> Replica:
        r = self.replicas[name]
        prefix, extra_env = self.wrap.get(name, ([], {}))
        env = {**os.environ, "KDELAY_MANAGED_ROLE": "replica", **extra_env}
        argv = [*prefix, *self.argv(name)]
        r.proc = ManagedProcess(f"replica {name}", argv, r.log_path, env=env)
        r.proc.start()
        return r

    def start_all(self) -> None:
        for name in self.replicas:
            self.start(name)

    def kill(self, name: str) -> None:
        """SIGKILL: a crash."""
        proc = self.replicas[name].proc
        assert proc is not None
        proc.kill()

    def stop(self, name: str, grace: float = 30.0) -> None:
        """SIGTERM, then wait: a graceful shutdown."""
        proc = self.replicas[name].proc
        if proc is not None:
            proc.stop(grace=grace)

    def close(self) -> None:
        for r in self.replicas.values():
            if r.proc is not None:
                r.proc.stop(grace=10)
        self._zk.stop()
        self._zk.close()

    # -- observation -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return cluster_status(self._zk, self.paths)

    def metrics_url(self, name: str) -> str | None:
        """Replica ``name``'s registered /metrics URL; None while it is not registered."""
        urls = [str(r["metrics"]) for r in self.status()["replicas"] if r["name"] == name]
        return urls[0] if urls else None

    def metric(self, name: str, metric: str, url: str | None = None) -> float | None:
        """The value of an unlabelled ``metric`` on replica ``name``'s /metrics (at ``url`` when
        given, which a replica keeps while it re-registers); None while the replica is not
        registered (e.g. rejoining the election) or does not export it."""
        url = url or self.metrics_url(name)
        if url is None:
            return None
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(f"{metric} "):
                return float(line.split()[1])
        return None

    def message(self, name: str, msg_id: str) -> dict[str, Any] | None:
        """Replica ``name``'s own answer about message ``msg_id`` (``GET /v1/messages/<id>``
        on its HTTP port); None when it knows none or is not registered."""
        url = self.metrics_url(name)
        if url is None:
            return None
        base = url.rsplit("/metrics", 1)[0]
        try:
            with urllib.request.urlopen(  # noqa: S310 - loopback
                f"{base}/v1/messages/{urllib.parse.quote(msg_id, safe='')}", timeout=5
            ) as resp:
                doc: dict[str, Any] = json.load(resp)
                return doc
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def roles(self) -> dict[str, str]:
        return {r["name"]: r["role"] for r in self.status()["replicas"]}

    def master(self) -> str | None:
        """The replica whose status says it is forwarding as master."""
        masters = [n for n, role in self.roles().items() if role == "master"]
        return masters[0] if len(masters) == 1 else None

    def wait_master(self, timeout: float = 60.0, exclude: str | None = None) -> str:
        found: list[str] = []

        def ready() -> bool:
            m = self.master()
            if m is not None and m != exclude and self.replicas[m].alive():
                found.append(m)
                return True
            return False

        wait_until(ready, timeout=timeout, what=f"a master in {self.paths.root}", interval=0.05)
        return found[-1]

    def wait_roles(self, names: list[str], roles: set[str], timeout: float = 60.0) -> None:
        def ok() -> bool:
            current = self.roles()
            return all(current.get(n) in roles for n in names)

        wait_until(ok, timeout=timeout, what=f"{names} to be {roles}", interval=0.05)

    def checkpoint(self) -> CheckpointRecord | None:
        """The checkpoint the master last wrote, or None before the first."""
        data = read_checkpoint(self._zk, self.paths)
        return None if data is None else CheckpointRecord.decode(data)

    def session_file(self, name: str) -> tuple[int, bytes]:
        data = json.loads((self.replicas[name].data_dir / "zk-session.json").read_text())
        return int(data["session_id"]), bytes.fromhex(data["password"])

    def expire_session(self, name: str) -> None:
        """Expire ``name``'s ZooKeeper session from outside (join the session, then close it)."""
        sid, password = self.session_file(name)
        intruder = KazooClient(hosts=self.zk_connect, client_id=(sid, password), timeout=10.0)
        intruder.start(timeout=15)
        intruder.stop()
        intruder.close()
