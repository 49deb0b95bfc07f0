"""Where the tests' Kafka and ZooKeeper come from.

``KDELAY_TEST_INFRA`` picks the backend:
- ``local``: the project's own launchers run the pinned jars (the default without Docker);
- ``testcontainers``: containers, when a Docker engine answers (the default with one);
- ``external``: existing servers named by ``KDELAY_TEST_BOOTSTRAP`` and ``KDELAY_TEST_ZK``
  (and ``KDELAY_TEST_CLUSTER_BOOTSTRAP`` for the 3-broker cluster).
A backend that cannot serve a fixture skips it with the reason; it never passes silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdelay.local import KafkaSettings, LocalKafka, LocalZooKeeper

BACKENDS = ("local", "testcontainers", "external")


@dataclass
class KafkaInfra:
    """A running Kafka: where to connect, and the launcher when the tests own it."""

    bootstrap_servers: str
    local: LocalKafka | None = None

    def require_local(self, what: str) -> LocalKafka:
        if self.local is None:
            pytest.skip(f"{what} needs a Kafka the tests control (KDELAY_TEST_INFRA=local)")
        return self.local


@dataclass
class ZooKeeperInfra:
    """A running ZooKeeper."""

    connect: str
    local: LocalZooKeeper | None = None


def docker_available() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def backend() -> str:
    chosen = os.environ.get("KDELAY_TEST_INFRA", "auto")
    if chosen == "auto":
        return "testcontainers" if docker_available() else "local"
    if chosen not in BACKENDS:
        raise pytest.UsageError(f"KDELAY_TEST_INFRA={chosen!r}: use one of {BACKENDS} or auto")
    return chosen


def _external(var: str, what: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.skip(f"KDELAY_TEST_INFRA=external but {var} does not name {what}")
    return value


@contextmanager
def kafka(base: Path, *, nodes: int = 1) -> Iterator[KafkaInfra]:
    """A Kafka for the session: ``nodes`` brokers on loopback (local), or the backend's."""
    kind = backend()
    if kind == "external":
        var = "KDELAY_TEST_BOOTSTRAP" if nodes == 1 else "KDELAY_TEST_CLUSTER_BOOTSTRAP"
        yield KafkaInfra(_external(var, f"a {nodes}-broker Kafka"))
        return
    if kind == "testcontainers":
        with _testcontainers_kafka(nodes) as bootstrap:
            yield KafkaInfra(bootstrap)
        return
    settings = KafkaSettings(num_partitions=1, auto_create_topics=True)
    launcher = LocalKafka(base / f"kafka-{nodes}", nodes=nodes, settings=settings)
    try:
        launcher.start()
    except Exception:
        launcher.stop()
        raise
    try:
        yield KafkaInfra(launcher.bootstrap_servers, launcher)
    finally:
        launcher.stop()


@contextmanager
def zookeeper(base: Path) -> Iterator[ZooKeeperInfra]:
    kind = backend()
    if kind == "external":
        yield ZooKeeperInfra(_external("KDELAY_TEST_ZK", "a ZooKeeper"))
        return
    if kind == "testcontainers":
        with _testcontainers_zookeeper() as connect:
            yield ZooKeeperInfra(connect)
        return
    launcher = LocalZooKeeper(base / "zookeeper")
    try:
        launcher.start()
        yield ZooKeeperInfra(launcher.connect_string, launcher)
    finally:
        launcher.stop()


@contextmanager
def _testcontainers_kafka(nodes: int) -> Iterator[str]:
    if nodes != 1:
        pytest.skip(
            "the testcontainers backend offers a single broker; use KDELAY_TEST_INFRA=local"
        )
    if not docker_available():
        pytest.skip("KDELAY_TEST_INFRA=testcontainers but no Docker engine answers `docker info`")
    from testcontainers.kafka import KafkaContainer

    with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
        yield str(container.get_bootstrap_server())


@contextmanager
def _testcontainers_zookeeper() -> Iterator[str]:
    if not docker_available():
        pytest.skip("KDELAY_TEST_INFRA=testcontainers but no Docker engine answers `docker info`")
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    with DockerContainer("zookeeper:3.9").with_exposed_ports(2181) as container:
        wait_for_logs(container, "binding to port")
        host = container.get_container_host_ip()
        yield f"{host}:{container.get_exposed_port(2181)}"
