"""The whole stack in containers, and a master's container killed mid-stream.

Kafka and ZooKeeper are the session's containers (tests/support/infra.py); the proxy and three
delay-service replicas run from kdelay's own image on the same network, configured by
``KDELAY_*`` variables as deploy/docker/compose.yaml does. Delayed messages stream through the
proxy's published port; the master that ``kdelay status`` reports has its container killed
(``podman kill``: SIGKILL, no goodbye); a new master takes over; the container is started again,
as Kubernetes restarts a pod, and its replica rejoins as a follower. Every acknowledged message
is delivered, none before its due time by the broker's clock (LogAppendTime).

This is the e2e subset CI can afford through containers: one test, about a minute warm.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from dev.stack import free_port, wait_until
from kdelay import headers as h
from tests.support.infra import ContainerSession, KafkaInfra, ZooKeeperInfra, containers, logs
from tests.support.kafka_helpers import Record, create_topic, unique_topic
from tests.support.stream import DelayedStream, read_deliveries
from tests.support.up import cluster_status, confirmed_master, roles

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

PARTITIONS = 4
REPLICAS = 3
TIMEOUT = 180.0
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


@dataclass
class Stack:
    session: ContainerSession
    zk_root: str
    zk_connect: str
    kafka: str
    proxy: str
    replicas: dict[str, DockerContainer]

    def status(self) -> dict[str, Any]:
        """``kdelay status --json`` from the host, as a user runs it."""
        return cluster_status(self.zk_connect, self.zk_root)

    def roles(self) -> dict[str, str]:
        return roles(self.status())

    def master(self) -> str | None:
        return confirmed_master(self.status())

    def log_tails(self) -> str:
        return "\n".join(f"--- {name}\n{logs(c)}" for name, c in self.replicas.items())


@pytest.fixture(scope="module")
def stack(kafka: KafkaInfra, zookeeper: ZooKeeperInfra) -> Iterator[Stack]:
    assert kafka.container_bootstrap
    assert zookeeper.container_connect
    with containers() as session, ExitStack() as started:
        image = session.image("kdelay")
        zk_root = f"/kdelay/e2e-{uuid.uuid4().hex[:8]}"
        hardening: dict[str, Any] = {
            "init": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
        }
        proxy_port, http_port = free_port(), free_port()
        proxy = session.container(
            image,
            "proxy-e2e",
            command=["proxy"],
            env={
                "KDELAY_PROXY_LISTEN": "0.0.0.0:9092",
                "KDELAY_PROXY_ADVERTISED_HOST": "127.0.0.1",
                "KDELAY_PROXY_ADVERTISED_PORT": str(proxy_port),
                "KDELAY_PROXY_HTTP_LISTEN": "0.0.0.0:8080",
                "KDELAY_PROXY_BOOTSTRAP_SERVERS": kafka.container_bootstrap,
                "KDELAY_PROXY_BUFFER_PARTITIONS": "4",
                "KDELAY_PROXY_BUFFER_REPLICATION": "1",
            },
            ports={9092: proxy_port, 8080: http_port},
            read_only=True,
            tmpfs=("/tmp",),
            **hardening,
        )
        started.enter_context(proxy)
        replicas: dict[str, DockerContainer] = {}
        for i in range(1, REPLICAS + 1):
            name = f"replica-{i}"
            # Not read-only: the replica's RocksDB lives in the container's own layer, which a
            # kill and a start keep, as a StatefulSet's volume would.
            replicas[name] = session.container(
                image,
                f"e2e-{name}",
                command=["delay-service"],
                env={
                    "KDELAY_REPLICA_NAME": name,
                    "KDELAY_REPLICA_BOOTSTRAP_SERVERS": kafka.container_bootstrap,
                    "KDELAY_REPLICA_ZK_CONNECT": zookeeper.container_connect,
                    "KDELAY_REPLICA_ZK_ROOT": zk_root,
                    "KDELAY_REPLICA_DATA_DIR": "/var/lib/kdelay/data",
                    "KDELAY_REPLICA_METRICS_HOST": "0.0.0.0",
                    "KDELAY_REPLICA_METRICS_PORT": "9400",
                    "KDELAY_REPLICA_BUFFER_PARTITIONS": "4",
                    "KDELAY_REPLICA_BUFFER_REPLICATION": "1",
                    "KDELAY_REPLICA_CHECKPOINT_INTERVAL_MS": "100",
                },
                **hardening,
            )
            started.enter_context(replicas[name])
        running = Stack(
            session,
            zk_root,
            zookeeper.connect,
            kafka.bootstrap_servers,
            f"127.0.0.1:{proxy_port}",
            replicas,
        )
        try:
            wait_until(
                lambda: running.master() is not None and len(running.roles()) == REPLICAS,
                timeout=TIMEOUT,
                what=f"a master among {REPLICAS} replica containers in `kdelay status`",
                interval=1.0,
            )
        except Exception:
            print(running.log_tails() + f"\n--- proxy\n{logs(proxy)}")
            raise
        yield running


def test_killing_the_masters_container_loses_nothing_and_it_rejoins(stack: Stack) -> None:
    topic = unique_topic("containers-failover")
    create_topic(stack.kafka, topic, PARTITIONS, config=LOG_APPEND_TIME)
    stream = DelayedStream(stack.proxy, topic, prefix="ct", partitions=PARTITIONS)
    stream.start()
    try:
        wait_until(lambda: stream.acked_count() >= 100, timeout=TIMEOUT, what="the stream to flow")
        victim = stack.master()
        assert victim is not None
        container = stack.replicas[victim]
        stack.session.engine.kill(container.get_container_id())  # podman kill: SIGKILL
        wait_until(
            lambda: stack.master() not in (None, victim),
            timeout=TIMEOUT,
            what=f"a new master after {victim}'s container was killed",
            interval=0.5,
        )
        stack.session.engine.run("start", container.get_container_id())
        wait_until(
            lambda: stack.roles().get(victim) == "follower",
            timeout=TIMEOUT,
            what=f"{victim}'s container to start again and rejoin as a follower",
            interval=0.5,
        )
        after = stream.acked_count() + 100
        wait_until(
            lambda: stream.acked_count() >= after,
            timeout=TIMEOUT,
            what="100 more acknowledgements after the failover",
        )
    finally:
        stream.finish()
    assert stream.failed == [], stream.failed[:5]

    records = read_deliveries(stack.kafka, topic, stream.acked, partitions=PARTITIONS)
    early = [r for r in records if r.timestamp_ms < int(r.header(h.DELIVER_AT) or b"0")]
    assert early == [], f"{len(early)} delivered before their due time, e.g. {early[:3]}"
    distinct = {r.header(h.ID) for r in records}
    late = sorted(r.timestamp_ms - int(r.header(h.DELIVER_AT) or b"0") for r in records)
    print(
        f"containers failover: killed {victim}; {stream.sent} sent, {len(stream.acked)} "
        f"acknowledged, {len(distinct)} delivered, {len(stream.acked - distinct_ids(records))} "
        f"lost, 0 early, {len(records) - len(distinct)} duplicates, lateness by LogAppendTime "
        f"p50 {late[len(late) // 2]} ms p99 {late[int(len(late) * 0.99)]} ms max {late[-1]} ms"
    )


def distinct_ids(records: list[Record]) -> set[str]:
    return {(r.header(h.ID) or b"").decode() for r in records}
