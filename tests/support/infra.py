"""Where the tests' Kafka and ZooKeeper come from.

``KDELAY_TEST_INFRA`` picks the backend:
- ``local`` (the default): the project's own launchers run the pinned jars;
- ``testcontainers``: containers on a container engine (``make test-containers``): Debian's
  podman as ``make containers`` set it up (its Docker API is started for the session when not
  running), or a Docker Engine that answers; images from ``make containers``, each replaceable
  by its variable (``KDELAY_KAFKA_IMAGE=apache/kafka:4.3.1``, ``KDELAY_ZOOKEEPER_IMAGE``);
- ``auto``: ``testcontainers`` when an engine is there, else ``local``;
- ``external``: existing servers named by ``KDELAY_TEST_BOOTSTRAP`` and ``KDELAY_TEST_ZK``
  (and ``KDELAY_TEST_CLUSTER_BOOTSTRAP`` for the 3-broker cluster).
A backend that cannot serve a fixture skips it with the reason; it never passes silently.

In containers, every fixture of the session shares one network (:func:`containers`): Kafka
(1 node, alias ``kafka``, or 3 KRaft nodes ``kafka-1..3``, each broker and controller, quorum
voters by alias) listens for the host on ``127.0.0.1:<mapped port>`` and for containers on
``<alias>:19092`` (:attr:`KafkaInfra.container_bootstrap`); ZooKeeper on ``127.0.0.1:<port>``
and ``zookeeper:2181``. Brokers and ZooKeeper can be stopped, killed and started again
(:class:`ContainerKafka`, :class:`ContainerZooKeeper`), as the local launchers can. Every
container and the network carry the label ``kdelay.managed=<pid of this run>``; JVMs carry it
in their command line too, so ``make check-leftovers`` sees one that outlives the run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from confluent_kafka.admin import AdminClient

from dev.stack import KafkaSettings, LocalKafka, LocalZooKeeper, free_port, wait_until
from dev.stack.kafka import new_cluster_id
from dev.stack.process import MARKER
from dev.stack.zookeeper import session_ok
from kdelay.errors import InfrastructureError

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

    from dev.containers import Engine

BACKENDS = ("local", "testcontainers", "external")
#: The Kafka listener containers on the session's network use, at ``<alias>:19092``.
INTERNAL_PORT = 19092
START_TIMEOUT = 180.0


@dataclass
class KafkaInfra:
    """A running Kafka: where to connect, and its controller when the tests own it."""

    bootstrap_servers: str
    local: LocalKafka | ContainerKafka | None = None
    #: Where containers on the session's network connect (testcontainers backend only).
    container_bootstrap: str | None = None

    def require_local(self, what: str) -> LocalKafka | ContainerKafka:
        """The brokers' controller (local processes or containers), or a skip naming why."""
        if self.local is None:
            pytest.skip(f"{what} needs a Kafka the tests control (KDELAY_TEST_INFRA=local)")
        return self.local


@dataclass
class ZooKeeperInfra:
    """A running ZooKeeper."""

    connect: str
    local: LocalZooKeeper | ContainerZooKeeper | None = None
    #: Where containers on the session's network connect (testcontainers backend only).
    container_connect: str | None = None


def engine_problem() -> str | None:
    """Why no container engine can serve the tests here, or None when one can."""
    try:
        from dev.containers import engine, podman_setup

        found = engine.detect()
        if found.kind == "podman":
            podman_setup.check_podman()
    except InfrastructureError as exc:
        return str(exc)
    return None


def docker_available() -> bool:
    """Whether a Docker API answers or can be started: a Docker Engine, or kdelay's podman."""
    return engine_problem() is None


def backend() -> str:
    chosen = os.environ.get("KDELAY_TEST_INFRA", "local")
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
        with _testcontainers_kafka(nodes) as running:
            yield running
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
        with _testcontainers_zookeeper() as running:
            yield running
        return
    launcher = LocalZooKeeper(base / "zookeeper")
    try:
        launcher.start()
        yield ZooKeeperInfra(launcher.connect_string, launcher)
    finally:
        launcher.stop()


# ---- the testcontainers backend ------------------------------------------------------------


def _require_engine() -> None:
    if not docker_available():
        why = engine_problem()
        pytest.skip(
            "KDELAY_TEST_INFRA=testcontainers but no Docker engine answers"
            + (f": {why}" if why else "")
        )


class ContainerSession:
    """The engine, the session's network and the owner label, shared by every fixture."""

    def __init__(self, engine: Engine, network: Network) -> None:
        self.engine = engine
        self.network = network
        self.labels = {MARKER: str(os.getpid())}

    def image(self, key: str) -> str:
        """The image for ``key`` (dev/containers/images.py), or a skip when it is absent."""
        from dev.containers import catalogue

        image = catalogue()[key]
        if not self.engine.image_exists(image.name):
            how = "run `make containers`" if image.local else "the engine cannot find it"
            pytest.skip(f"image {image.name} (${image.variable}) is not there: {how}")
        return image.name

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``<engine> run --rm`` with this session's label, to its end: a one-off command."""
        labels = [f"--label={k}={v}" for k, v in self.labels.items()]
        return self.engine.run("run", "--rm", *labels, *args, check=check)

    def container(
        self,
        image: str,
        alias: str,
        *,
        env: dict[str, str] | None = None,
        ports: dict[int, int] | None = None,
        command: list[str] | None = None,
        volumes: dict[str, tuple[str, str]] | None = None,
        tmpfs: tuple[str, ...] = (),
        **options: Any,
    ) -> DockerContainer:
        """A container on the session's network as ``alias`` (also its host name), its
        ``ports`` (container -> host) published on 127.0.0.1 only, ``volumes`` (host path or
        volume name -> (container path, mode)) and ``tmpfs`` mounts. ``options`` are
        docker-py's (``user``, ``read_only``, ``cap_drop``, ``security_opt``, ...)."""
        from testcontainers.core.container import DockerContainer

        container = (
            DockerContainer(image, command=cast(Any, command), env=env)
            .with_name(f"kdelay-{os.getpid()}-{alias}")
            .with_network(self.network)
            .with_network_aliases(alias)
            .with_kwargs(labels=self.labels, hostname=alias, **options)
        )
        published = cast(dict[str, Any], container.ports)  # docker-py takes (host ip, port)
        for inside, outside in (ports or {}).items():
            published[f"{inside}/tcp"] = ("127.0.0.1", outside)
        for source, (target, mode) in (volumes or {}).items():
            container.with_volume_mapping(source, target, mode)
        for path in tmpfs:
            container.with_tmpfs_mount(path)
        return container


def logs(container: DockerContainer, lines: int = 60) -> str:
    """The last ``lines`` of a container's output."""
    try:
        raw = container.get_wrapped_container().logs(tail=lines)
    except Exception as exc:  # noqa: BLE001 - a report must not fail because the logs did
        return f"(no logs: {exc})"
    return bytes(raw).decode(errors="replace")


class _Shared:
    """The open :class:`ContainerSession` and how many fixtures use it."""

    def __init__(self) -> None:
        self.session: ContainerSession | None = None
        self.users = 0
        self.stack = ExitStack()


_SHARED = _Shared()


def _client_environment(engine: Engine, stack: ExitStack) -> None:
    """Point testcontainers (and docker-py) at ``engine`` until ``stack`` closes."""
    saved = {k: os.environ.get(k) for k in engine.client_env()}

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    stack.callback(restore)
    os.environ.update(engine.client_env())
    # testcontainers reads these at import; it may have been imported before this session.
    from testcontainers.core.config import ConnectionMode, testcontainers_config

    env = engine.client_env()
    if env.get("TESTCONTAINERS_RYUK_DISABLED") == "true":
        testcontainers_config.ryuk_disabled = True
    if env.get("TESTCONTAINERS_CONNECTION_MODE") == "docker_host":
        testcontainers_config.connection_mode_override = ConnectionMode.docker_host


@contextmanager
def containers() -> Iterator[ContainerSession]:
    """The session's container engine and network: opened by the first fixture that needs
    them, closed (network removed, a Docker API this run started stopped) by the last."""
    shared = _SHARED
    if shared.session is None:
        _require_engine()
        from testcontainers.core.network import Network

        from dev.containers import api, detect, remove_orphans

        stack = ExitStack()
        try:
            engine = stack.enter_context(api(detect()))
            _client_environment(engine, stack)
            remove_orphans(engine)  # what a run that died left behind
            network = Network(docker_network_kw={"labels": {MARKER: str(os.getpid())}})
            stack.enter_context(network)
        except BaseException:
            stack.close()
            raise
        shared.session, shared.stack = ContainerSession(engine, network), stack
    shared.users += 1
    try:
        assert shared.session is not None
        yield shared.session
    finally:
        shared.users -= 1
        if shared.users == 0:
            shared.session = None
            shared.stack.close()


class _Running:
    """``process``-like view of a container: :meth:`alive` while it runs."""

    def __init__(self, container: DockerContainer) -> None:
        self.container = container

    def alive(self) -> bool:
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status) == "running"


@dataclass
class ContainerNode:
    """One KRaft node in a container."""

    node_id: int
    alias: str
    port: int
    container: DockerContainer
    process: _Running = field(init=False)

    def __post_init__(self) -> None:
        self.process = _Running(self.container)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def kafka_environment(
    node_id: int, alias: str, port: int, *, voters: str, nodes: int, cluster_id: str
) -> dict[str, str]:
    """One node's settings as apache/kafka's variables (kdelay's image reads the same), the
    broker settings of :class:`dev.stack.LocalKafka` included."""
    rf = min(3, nodes)
    isr = min(2, rf)
    return {
        "CLUSTER_ID": cluster_id,
        "KAFKA_NODE_ID": str(node_id),
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"INTERNAL://:{INTERNAL_PORT},EXTERNAL://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": (
            f"INTERNAL://{alias}:{INTERNAL_PORT},EXTERNAL://127.0.0.1:{port}"
        ),
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
            "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
        ),
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": voters,
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "true",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": str(rf),
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "4",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": str(rf),
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": str(isr),
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "4",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": str(rf),
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": str(isr),
        "KAFKA_DEFAULT_REPLICATION_FACTOR": str(rf),
        "KAFKA_MIN_INSYNC_REPLICAS": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_NETWORK_THREADS": "2",
        "KAFKA_NUM_IO_THREADS": "4",
        "KAFKA_LOG_CLEANER_DEDUPE_BUFFER_SIZE": str(8 * 1024 * 1024),
        "KAFKA_LOG_CLEANER_BACKOFF_MS": "1000",
        "KAFKA_LOG_SEGMENT_BYTES": str(64 * 1024 * 1024),
        "KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
        "KAFKA_LOG_LEVEL": "WARN",
        "KAFKA_OPTS": f"-D{MARKER}={os.getpid()}",
    }


def _brokers_visible(bootstrap: str, expected: int) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        return len(admin.list_topics(timeout=2).brokers) >= expected
    except Exception:  # noqa: BLE001 - any failure here just means "not ready yet"
        return False


class ContainerKafka:
    """Kafka nodes in containers, controlled as :class:`dev.stack.LocalKafka` is."""

    def __init__(self, nodes: list[ContainerNode]) -> None:
        self.nodes = nodes

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def stop_node(self, index: int) -> None:
        self.nodes[index].container.get_wrapped_container().stop(timeout=15)

    def kill_node(self, index: int) -> None:
        self.nodes[index].container.get_wrapped_container().kill()

    def start_node(self, index: int) -> None:
        self.nodes[index].container.get_wrapped_container().start()

    def wait_ready(self, expected: int | None = None, timeout: float | None = None) -> None:
        """Block until ``expected`` brokers (default: every running node) answer metadata."""
        running = [n for n in self.nodes if n.process.alive()]
        want = expected if expected is not None else len(running)
        bootstrap = ",".join(n.bootstrap for n in running) or self.bootstrap_servers
        try:
            wait_until(
                lambda: _brokers_visible(bootstrap, want),
                timeout=timeout or START_TIMEOUT,
                what=f"Kafka containers at {bootstrap} to report {want} broker(s)",
                interval=0.5,
            )
        except InfrastructureError as exc:
            raise InfrastructureError(f"{exc}\n{self.log_tails()}") from exc

    def log_tails(self) -> str:
        return "\n".join(f"--- {n.alias}\n{logs(n.container)}" for n in self.nodes)


@contextmanager
def _testcontainers_kafka(nodes: int) -> Iterator[KafkaInfra]:
    _require_engine()
    with containers() as session, ExitStack() as stack:
        image = session.image("kafka")
        aliases = ["kafka"] if nodes == 1 else [f"kafka-{i + 1}" for i in range(nodes)]
        voters = ",".join(f"{i + 1}@{a}:9093" for i, a in enumerate(aliases))
        cluster_id = new_cluster_id()
        started: list[ContainerNode] = []
        for i, alias in enumerate(aliases):
            port = free_port()
            env = kafka_environment(
                i + 1, alias, port, voters=voters, nodes=nodes, cluster_id=cluster_id
            )
            container = session.container(image, alias, env=env, ports={port: port})
            stack.enter_context(container)
            started.append(ContainerNode(i + 1, alias, port, container))
        cluster = ContainerKafka(started)
        cluster.wait_ready(nodes)
        internal = ",".join(f"{a}:{INTERNAL_PORT}" for a in aliases)
        yield KafkaInfra(cluster.bootstrap_servers, cluster, internal)


class ContainerZooKeeper:
    """ZooKeeper in a container, controlled as :class:`dev.stack.LocalZooKeeper` is."""

    def __init__(self, container: DockerContainer, port: int) -> None:
        self.container = container
        self.port = port
        self.process = _Running(container)

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        try:
            wait_until(
                lambda: session_ok(self.connect_string),
                timeout=timeout,
                what=f"a ZooKeeper session at {self.connect_string} (container)",
                interval=0.5,
            )
        except InfrastructureError as exc:
            raise InfrastructureError(f"{exc}\n{self.log_tails()}") from exc

    def stop(self) -> None:
        self.container.get_wrapped_container().stop(timeout=15)

    def kill(self) -> None:
        self.container.get_wrapped_container().kill()

    def start(self) -> ContainerZooKeeper:
        self.container.get_wrapped_container().start()
        self.wait_ready()
        return self

    def log_tails(self) -> str:
        return f"--- zookeeper\n{logs(self.container)}"


def zookeeper_environment() -> dict[str, str]:
    """The official zookeeper image's variables (kdelay's image reads the same) for the
    settings of :class:`dev.stack.LocalZooKeeper` (tickTime 500 ms: sessions from 1 s)."""
    return {
        "ZOO_TICK_TIME": "500",
        "ZOO_MAX_CLIENT_CNXNS": "0",
        "ZOO_4LW_COMMANDS_WHITELIST": "ruok,stat,mntr,srvr",
        "ZOO_AUTOPURGE_PURGEINTERVAL": "1",
        "ZOO_CFG_EXTRA": "maxSessionTimeout=30000",
        "JVMFLAGS": f"-D{MARKER}={os.getpid()}",
    }


@contextmanager
def _testcontainers_zookeeper() -> Iterator[ZooKeeperInfra]:
    _require_engine()
    with containers() as session:
        port = free_port()
        container = session.container(
            session.image("zookeeper"), "zookeeper", env=zookeeper_environment(), ports={2181: port}
        )
        with container:
            running = ContainerZooKeeper(container, port)
            running.wait_ready()
            yield ZooKeeperInfra(running.connect_string, running, "zookeeper:2181")
