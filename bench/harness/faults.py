"""The system under test of ``bench.reliability`` and the faults it injects, one per case.

:class:`Cluster` starts ZooKeeper, Kafka (1 or 3 KRaft nodes), the proxy and three replicas as
real processes on loopback, through :mod:`dev.stack` and :class:`bench.harness.replicas.Replicas`;
a process may run with its wall clock off (:mod:`bench.harness.clock_skew`).
Each :class:`Case` injects its fault from the bench's main thread while the stream runs, and
records an :class:`Event` per fault with the bench's wall clock, which is the brokers' clock
(same machine), so it compares directly with LogAppendTime timestamps.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.exceptions import KazooException

from bench.harness.clock_skew import Skew
from bench.harness.replicas import PARTITIONS, Replicas
from dev.kafka_tools import HeaderList, consume_until, produce_all
from dev.stack import KafkaSettings, LocalKafka, LocalZooKeeper, ManagedProcess, wait_until
from dev.stack.process import free_port, python_argv
from dev.stack.replica import ReplicaSpec
from kdelay.buffer import BUFFER_TOPIC, ROUTE_HEADER
from kdelay.topics import ensure_internal_topics
from kdelay.zk import CoordinationError, Paths, cluster_status

HOST = "127.0.0.1"
SESSION_S = 6  # replicas' ZooKeeper session timeout; master-stop stops for longer
SKEWED = "r1"  # the replica whose clock is off, when a case skews one


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Event:
    """One injected fault: ``at_ms`` when it was injected, ``end_ms`` when it was undone (the
    process restarted, continued or the server back), both on the bench's (= broker) clock."""

    what: str
    at_ms: int
    end_ms: int | None = None


def _argv(args: list[str], skew: Skew | None) -> tuple[list[str], dict[str, str] | None]:
    return (python_argv(*args), None) if skew is None else skew.argv(args)


class BenchReplicas(Replicas):
    """The replica set of :class:`Replicas` on the default buffer topic (the one the proxy writes),
    with a 6 s session, INFO logs, the internal topics' replication and, for one, a shifted
    clock."""

    def __init__(
        self, base: Path, bootstrap: str, zk: str, replication: int, skew: Skew | None
    ) -> None:
        super().__init__(base, bootstrap, zk, 3)
        self.buffer = BUFFER_TOPIC
        self.replication = replication
        self.skew = skew
        #: Clocks set per replica after the start (bench/harness/restarts.py), over ``skew``.
        self.skews: dict[str, Skew | None] = {}
        #: The shard count the replicas start with; replica ``r<i>`` is shard ``(i - 1) % N``.
        self.layout = 1

    def shard_of(self, name: str) -> int:
        return self.names.index(name) % self.layout

    def start(self, name: str) -> ManagedProcess:
        shards: tuple[str, ...] = ()
        if self.layout > 1:
            shards = ("--shards", str(self.layout), "--shard", str(self.shard_of(name)))
        spec = ReplicaSpec(
            name,
            self.bootstrap,
            self.zk,
            self.base / name,
            zk_root=self.set_root,
            zk_session_timeout=SESSION_S,
            buffer_topic=self.buffer,
            buffer_partitions=PARTITIONS,
            status_interval_ms=200,
            log_level="INFO",
            extra_args=("--buffer-replication", str(self.replication), *shards),
        )
        skew = self.skews.get(name, self.skew if name == SKEWED else None)
        argv, env = _argv(spec.args(), skew)
        proc = ManagedProcess(f"bench {name}", argv, self.base / f"{name}.log", env=env)
        proc.start()
        self.procs[name] = proc
        return proc


@dataclass
class Cluster:
    """ZooKeeper, Kafka, the proxy and replicas r1..r3 under ``base``; :meth:`stop` always."""

    base: Path
    brokers: int = 1
    replica_skew: Skew | None = None
    proxy_skew: Skew | None = None
    zk: LocalZooKeeper | None = None
    kafka: LocalKafka | None = None
    proxy: ManagedProcess | None = None
    replicas: BenchReplicas | None = None
    http_port: int = 0
    proxy_port: int = 0
    #: ``kdelay proxy``'s arguments (:meth:`proxy_clock` runs them under another clock).
    proxy_args: list[str] = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def bootstrap(self) -> str:
        assert self.kafka is not None
        return self.kafka.bootstrap_servers

    @property
    def proxy_address(self) -> str:
        return f"{HOST}:{self.proxy_port}"

    @property
    def rs(self) -> BenchReplicas:
        assert self.replicas is not None
        return self.replicas

    def start(self) -> None:
        rf = min(3, self.brokers)
        self.zk = LocalZooKeeper(self.base / "zk")
        self._stack.callback(self.zk.stop)
        self.zk.start()
        settings = KafkaSettings(num_partitions=PARTITIONS, auto_create_topics=False)
        self.kafka = LocalKafka(self.base / "kafka", nodes=self.brokers, settings=settings)
        self._stack.callback(self.kafka.stop)
        self.kafka.start()
        ensure_internal_topics(
            self.bootstrap, partitions=PARTITIONS, replication=rf, min_insync=min(2, rf)
        )
        self.proxy_port, self.http_port = free_port(), free_port()
        self.proxy_args = [
            "proxy",
            *("--listen", self.proxy_address, "--http-listen", f"{HOST}:{self.http_port}"),
            *("--bootstrap-servers", self.bootstrap, "--buffer-partitions", str(PARTITIONS)),
            *("--buffer-replication", str(rf)),
        ]
        self.proxy = ManagedProcess("bench proxy", [], self.base / "proxy.log")
        self.proxy_clock(self.proxy_skew)
        self._stack.callback(self.proxy.stop)
        self.proxy.start()
        self.replicas = BenchReplicas(
            self.base / "set", self.bootstrap, self.zk.connect_string, rf, self.replica_skew
        )
        self._stack.callback(self.replicas.close)
        # SIGCONT first: a stopped replica would only die after stop()'s grace period.
        self._stack.callback(self._continue_all)
        if self.replica_skew is not None:  # the skewed replica starts first and leads
            self.rs.start(SKEWED)
            self.wait_master()
        for name in self.rs.names:
            if name not in self.rs.procs:
                self.rs.start(name)
        self.wait_proxy()
        wait_until(
            lambda: sorted(self.roles().values()) == ["follower", "follower", "master"],
            timeout=180,
            what="a master and two caught-up followers",
            interval=0.2,
        )

    def proxy_clock(self, skew: Skew | None) -> None:
        """The proxy's next (re)start runs :attr:`proxy_args` with ``skew``'s clock."""
        assert self.proxy is not None
        self.proxy.argv, self.proxy.env = _argv(self.proxy_args, skew)

    def _continue_all(self) -> None:
        for proc in [*self.rs.procs.values(), *([self.proxy] if self.proxy else [])]:
            proc.signal(signal.SIGCONT)

    def stop(self) -> None:
        self._stack.close()

    def wait_proxy(self, timeout: float = 60) -> None:
        def ready() -> bool:
            url = f"http://{HOST}:{self.http_port}/readyz"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_until(
            ready, timeout=timeout, what="the proxy's /readyz", interval=0.1, proc=self.proxy
        )

    def status(self) -> dict[str, object]:
        """What ``kdelay status --json`` prints for this replica set ({} while ZK is away)."""
        try:
            return cluster_status(self.rs.client, Paths(self.rs.root))
        except (KazooException, CoordinationError):
            return {}

    def roles(self) -> dict[str, str]:
        replicas = self.status().get("replicas") or []
        assert isinstance(replicas, list)
        return {str(r["name"]): str(r["role"]) for r in replicas}

    def master(self, exclude: Collection[str] = ()) -> str | None:
        """The elected replica, when it says it is master, runs and is not in ``exclude``."""
        leader = self.status().get("master")
        if leader is None or leader in exclude or self.roles().get(str(leader)) != "master":
            return None
        proc = self.rs.procs.get(str(leader))
        return str(leader) if proc is not None and proc.alive() else None

    def wait_master(self, exclude: Collection[str] = (), timeout: float = 120) -> str:
        found: list[str] = []

        def ok() -> bool:
            found.extend(m for m in [self.master(exclude)] if m)
            return bool(found)

        wait_until(ok, timeout=timeout, what=f"a master other than {list(exclude)}", interval=0.05)
        return found[0]

    def kraft_leader(self) -> int:
        """The active KRaft controller: the leader of the highest epoch in the nodes'
        ``__cluster_metadata-0/quorum-state`` files (what ``kafka-metadata-quorum`` reports)."""
        assert self.kafka is not None
        states = [
            json.loads(path.read_text())
            for node in self.kafka.nodes
            if (path := node.data_dir / "logs/__cluster_metadata-0/quorum-state").exists()
        ]
        return int(max(states, key=lambda q: int(q["leaderEpoch"]))["leaderId"])


#: ``at(s)`` sleeps until ``s`` seconds after the stream started; events are appended as made.
At = Callable[[float], None]
Inject = Callable[[Cluster, At, list[Event]], None]


def _kill_master(c: Cluster, events: list[Event], exclude: Collection[str] = ()) -> str:
    victim = c.wait_master(exclude)
    proc = c.rs.procs[victim]
    proc.kill()
    event = Event(f"SIGKILL master {victim}", now_ms())
    events.append(event)
    time.sleep(1)  # kdelay up's first restart backoff
    proc.restart()
    event.end_ms = now_ms()
    return victim


def master_kill(c: Cluster, at: At, events: list[Event]) -> None:
    at(10)
    first = _kill_master(c, events)
    c.wait_master(exclude={first})
    at(25)
    _kill_master(c, events)


def all_replicas_kill(c: Cluster, at: At, events: list[Event]) -> None:
    at(10)
    for proc in c.rs.procs.values():
        proc.kill()
    event = Event("SIGKILL r1, r2, r3; restart after 5 s", now_ms())
    events.append(event)
    time.sleep(5)
    for proc in c.rs.procs.values():
        proc.restart()
    event.end_ms = now_ms()


def master_stop(c: Cluster, at: At, events: list[Event]) -> None:
    at(10)
    victim = c.wait_master()
    proc = c.rs.procs[victim]
    proc.signal(signal.SIGSTOP)
    event = Event(f"SIGSTOP master {victim} for 15 s (session {SESSION_S} s)", now_ms())
    events.append(event)
    time.sleep(15)
    proc.signal(signal.SIGCONT)
    event.end_ms = now_ms()


def zk_stop(c: Cluster, at: At, events: list[Event]) -> None:
    assert c.zk is not None
    at(10)
    c.zk.kill()
    event = Event("SIGKILL ZooKeeper; same port and data dir after 20 s", now_ms())
    events.append(event)
    time.sleep(20)
    c.zk.start()  # returns once a session works
    event.end_ms = now_ms()


def broker_kill(c: Cluster, at: At, events: list[Event]) -> None:
    assert c.kafka is not None
    at(10)
    leader = c.kraft_leader()
    victim = max(n.node_id for n in c.kafka.nodes if n.node_id != leader)
    index = [n.node_id for n in c.kafka.nodes].index(victim)
    c.kafka.kill_node(index)
    event = Event(f"SIGKILL broker {victim} (KRaft leader: {leader}); restart after 15 s", now_ms())
    events.append(event)
    time.sleep(15)
    c.kafka.start_node(index)
    event.end_ms = now_ms()


def proxy_kill(c: Cluster, at: At, events: list[Event]) -> None:
    assert c.proxy is not None
    for i in range(5):
        at(10 + 5 * i)
        if i:  # each restarted proxy serves the stream for 3 s at least before the next kill
            c.wait_proxy()
            time.sleep(3)
        c.proxy.kill()
        event = Event(f"SIGKILL proxy ({i + 1} of 5); restart after 1 s", now_ms())
        events.append(event)
        time.sleep(1)
        c.proxy.restart()
        event.end_ms = now_ms()


def clock_skew(what: str) -> Inject:
    """A fault present from the start: record it as an event at the stream's start."""

    def inject(_c: Cluster, at: At, events: list[Event]) -> None:
        at(0)
        events.append(Event(what, now_ms()))

    return inject


def poison_records(
    bootstrap: str, batch: int
) -> list[tuple[bytes | None, bytes | None, HeaderList]]:
    """Ten of each of 8 kinds of garbage; one is a real buffer record cut in half."""
    [real] = consume_until(bootstrap, [BUFFER_TOPIC], lambda r: len(r) >= 1, timeout=30)[:1]
    route = real.header(ROUTE_HEADER) or b"{}"
    half: HeaderList = [(n, v) for n, v in real.headers if n != ROUTE_HEADER]
    kinds: dict[str, tuple[bytes | None, HeaderList]] = {
        "route-truncated-json": (b"v", [(ROUTE_HEADER, b'{"v":1,"op":"schedule","t":"x')]),
        "route-unknown-version": (b"v", [(ROUTE_HEADER, b'{"v":99,"op":"schedule"}')]),
        "route-unknown-op": (b"v", [(ROUTE_HEADER, b'{"v":1,"op":"explode"}')]),
        "route-missing-fields": (b"v", [(ROUTE_HEADER, b'{"v":1,"op":"schedule"}')]),
        "route-not-utf8": (b"v", [(ROUTE_HEADER, b"\xff\xfe\x00")]),
        "no-route-header": (b"\x00\x01garbage", []),
        "truncated-copy": (
            (real.value or b"")[: len(real.value or b"") // 2],
            [*half, (ROUTE_HEADER, route[: len(route) // 2])],
        ),
    }
    out: list[tuple[bytes | None, bytes | None, HeaderList]] = []
    for i in range(10):
        out += [(f"poison-{k}-{batch}-{i}".encode(), v, hs) for k, (v, hs) in kinds.items()]
        # No key at all would be refused by the compacted topic itself (and its whole batch).
        out.append(
            (b"\xff\xfe-%d-%d" % (batch, i), b"v", [(ROUTE_HEADER, b'{"v":1,"op":"cancel"}')])
        )
    return out


def poison(c: Cluster, at: At, events: list[Event]) -> None:
    at(2)  # a real buffer record exists by now: one of the two batches' kinds copies it
    batches = [poison_records(c.bootstrap, batch) for batch in range(2)]
    for second, records in zip((10, 25), batches, strict=True):
        at(second)
        event = Event(f"{len(records)} garbage records into {BUFFER_TOPIC}", now_ms())
        produce_all(c.bootstrap, BUFFER_TOPIC, records)
        events.append(event)
