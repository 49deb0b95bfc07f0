"""Local Apache Kafka in KRaft mode: one combined broker+controller, or a 3-node cluster.

Storage is formatted on first start (``kafka.tools.StorageTool``); readiness is an admin
request that sees every broker, never a sleep. Used by ``kdelay up`` and the test fixtures.
``KafkaSettings.security`` adds a SASL listener, users and the StandardAuthorizer
(dev/stack/kafka_security.py). ``KafkaSettings.clock_offsets`` runs a node under libfaketime
(its wall and monotonic clocks shifted alike: with the monotonic clock true, libfaketime 0.9.10
ends the JVM's timed waits at once and every waiting broker thread spins; a constant offset on
the monotonic clock changes no interval the JVM measures).
"""

from __future__ import annotations

import base64
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from dev.stack.kafka_security import (
    KafkaSecurity,
    LocalCa,
    client_config,
    create_scram_users,
    listener_properties,
    make_ca,
)
from dev.stack.process import ManagedProcess, free_port, java_argv, log_tails, wait_until
from kdelay import jars
from kdelay.errors import InfrastructureError

HOST = "127.0.0.1"

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


def new_cluster_id() -> str:
    """A random cluster id that does not start with '-' (Kafka's own ``Uuid.randomUuid`` avoids
    it, for other tools' sake); :func:`format_argv` copes with one that does anyway."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def format_argv(cluster_id: str, config: Path) -> list[str]:
    """``kafka-storage format`` arguments. The id is attached with ``=``: a base64 id may begin
    with '-' (1 in 64 random ids), which as a separate argument the tool's parser takes for an
    option (``argument --cluster-id/-t: expected one argument``)."""
    return ["format", "--ignore-formatted", f"--cluster-id={cluster_id}", "--config", str(config)]


@dataclass
class KafkaNode:
    """One KRaft node (broker and controller in one process)."""

    node_id: int
    data_dir: Path
    port: int
    controller_port: int
    process: ManagedProcess | None = None
    #: The secured listener's port (``KafkaSettings.security``), else 0.
    secure_port: int = 0

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def secure_bootstrap(self) -> str:
        return f"{HOST}:{self.secure_port}"


@dataclass
class KafkaSettings:
    """Broker settings a test or ``kdelay up`` may want to change."""

    num_partitions: int = 1
    auto_create_topics: bool = True
    heap_mb: int = 512
    log_level: str = "WARN"
    extra: dict[str, str] = field(default_factory=dict)
    #: C1-only JIT (dev.stack.process.QUICK_JIT): cheaper for a broker that lives minutes
    #: (``kdelay up``, the tests); the benchmarks set False (the full JIT of a lasting broker).
    quick_jit: bool = True
    #: A SASL listener with users and ACLs (dev/stack/kafka_security.py); None: PLAINTEXT only.
    security: KafkaSecurity | None = None
    #: Seconds each node's clock runs off, by node id (libfaketime; nodes not named run true):
    #: brokers that disagree on the time, as LogAppendTime shows it.
    clock_offsets: dict[int, float] = field(default_factory=dict)


def faketime_env(offset_s: float) -> dict[str, str]:
    """The environment that runs a process (and nothing it does not start) with its wall and
    monotonic clocks ``offset_s`` seconds off: Debian's libfaketime preloaded."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise InfrastructureError("libfaketime is missing: apt-get install faketime")
    env = {k: v for k, v in os.environ.items() if k != "FAKETIME_DONT_FAKE_MONOTONIC"}
    preload = " ".join(filter(None, [str(found[0]), env.get("LD_PRELOAD", "")]))
    return {**env, "LD_PRELOAD": preload, "FAKETIME": f"{offset_s:+g}"}


class LocalKafka:
    """A KRaft Kafka of ``nodes`` combined nodes on loopback; a context manager.

    ``stop_node``/``start_node``/``kill_node`` serve broker-failure tests.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        nodes: int = 1,
        ports: list[int] | None = None,
        settings: KafkaSettings | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.data_dir = data_dir
        self.settings = settings or KafkaSettings()
        self.start_timeout = start_timeout
        ports = ports or [0] * nodes
        sec = self.settings.security
        # ``ports`` are the clients' listener: the secured one when it is the only one
        # (``kdelay up --secure --kafka-port``), else the PLAINTEXT one.
        secured_only = sec is not None and not sec.open_listener
        self.nodes: list[KafkaNode] = []
        for i, asked in enumerate(ports):
            port, secure_port = (free_port(), asked) if secured_only else (asked, 0)
            self.nodes.append(
                KafkaNode(
                    i + 1,
                    data_dir / f"node-{i + 1}",
                    port or free_port(),
                    free_port(),
                    secure_port=(secure_port or free_port()) if sec is not None else 0,
                )
            )
        self._cluster_id_file = data_dir / "cluster-id"
        #: The CA and the brokers' certificate of a SASL_SSL listener.
        self.ca: LocalCa | None = make_ca(data_dir / "tls") if sec and sec.tls else None

    @property
    def bootstrap_servers(self) -> str:
        """The PLAINTEXT listener's addresses; the secured one's when there is no other."""
        sec = self.settings.security
        if sec is not None and not sec.open_listener:
            return self.secure_bootstrap_servers
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def secure_bootstrap_servers(self) -> str:
        """The secured listener's addresses (``KafkaSettings.security``)."""
        return ",".join(n.secure_bootstrap for n in self.nodes)

    def client_config(self, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """librdkafka settings for ``user`` on the secured listener (with its CA for TLS)."""
        sec = self.settings.security
        assert sec is not None, "KafkaSettings.security is not set"
        return client_config(sec, user, mechanism, self.ca.ca_cert if self.ca else None)

    def admin_config(self) -> dict[str, str]:
        """Settings an admin client adds to ``bootstrap_servers``: none on the PLAINTEXT
        listener, else the first super user with PLAIN."""
        sec = self.settings.security
        if sec is None or sec.open_listener:
            return {}
        return self.client_config(sec.super_users[0], "PLAIN")

    def _properties(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in self.nodes)
        rf = min(3, len(self.nodes))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.data_dir / "logs"),
            "num.partitions": str(self.settings.num_partitions),
            "auto.create.topics.enable": str(self.settings.auto_create_topics).lower(),
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(min(2, rf)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": str(min(2, rf)),
            "default.replication.factor": str(rf),
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            # Look for compactable logs every second (Kafka's default is 15 s): tombstones of
            # the buffer topic take effect while a local test or demo still watches.
            "log.cleaner.backoff.ms": "1000",
            "log.segment.bytes": str(64 * 1024 * 1024),
        }
        sec = self.settings.security
        if sec is not None:
            props.update(
                listener_properties(
                    sec,
                    host=HOST,
                    port=node.secure_port,
                    plain_port=node.port,
                    controller_port=node.controller_port,
                    keystore=self.ca.keystore if self.ca else None,
                    truststore=self.ca.ca_cert if self.ca else None,
                )
            )
        props.update(self.settings.extra)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def prepare(self, node: KafkaNode) -> Path:
        """Write ``node``'s settings and format its storage if it is new (the cluster id
        shared by every node); starts no broker. Returns its ``server.properties``."""
        node.data_dir.mkdir(parents=True, exist_ok=True)
        config = node.data_dir / "server.properties"
        config.touch(mode=0o600)  # it may hold the JAAS passwords of PLAIN users
        config.write_text(self._properties(node))
        (node.data_dir / "log4j2.properties").write_text(
            _LOG4J2.format(level=self.settings.log_level)
        )
        if not (node.data_dir / "logs" / "meta.properties").exists():
            if not self._cluster_id_file.exists():
                self._cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
                self._cluster_id_file.write_text(new_cluster_id())
            fmt = ManagedProcess(
                f"kafka-format-{node.node_id}",
                java_argv(
                    jars.classpath("kafka"),
                    "kafka.tools.StorageTool",
                    256,
                    *format_argv(self._cluster_id_file.read_text().strip(), config),
                ),
                node.data_dir / "format.log",
            )
            fmt.start()
            wait_until(lambda: not fmt.alive(), timeout=120, what="kafka storage format")
            if fmt.returncode() != 0:
                raise InfrastructureError(
                    f"formatting Kafka storage in {node.data_dir} failed:\n{fmt.log_tail()}"
                )
            fmt.stop()
        return config

    def start_node(self, index: int) -> None:
        node = self.nodes[index]
        config = self.prepare(node)
        argv = java_argv(
            jars.classpath("kafka"),
            "kafka.Kafka",
            self.settings.heap_mb,
            str(config),
            quick_jit=self.settings.quick_jit,
        )
        argv.insert(1, f"-Dlog4j2.configurationFile={node.data_dir / 'log4j2.properties'}")
        argv.insert(1, f"-Dkafka.logs.dir={node.data_dir}")
        if self.settings.security is not None:
            argv[1:1] = self.settings.security.jvm_options()
        offset = self.settings.clock_offsets.get(node.node_id)
        env = faketime_env(offset) if offset else None
        log = node.data_dir / "kafka.log"
        node.process = ManagedProcess(f"kafka-{node.node_id}", argv, log, env=env)
        node.process.start()

    def stop_node(self, index: int) -> None:
        proc = self.nodes[index].process
        if proc is not None:
            proc.stop()

    def kill_node(self, index: int) -> None:
        proc = self.nodes[index].process
        if proc is not None:
            proc.kill()

    def _brokers_visible(self, expected: int) -> bool:
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap_servers, "log_level": 0, **self.admin_config()}
        )
        try:
            return len(admin.list_topics(timeout=2).brokers) >= expected
        except Exception:  # noqa: BLE001 - any failure here just means "not ready yet"
            return False

    def wait_ready(self, expected: int | None = None, timeout: float | None = None) -> None:
        """Block until ``expected`` brokers (default: every running node) answer metadata."""
        running = [n for n in self.nodes if n.process is not None and n.process.alive()]
        want = expected if expected is not None else len(running)
        for node in running:
            assert node.process is not None
            wait_until(
                lambda: self._brokers_visible(want),
                timeout=timeout or self.start_timeout,
                what=f"Kafka at {self.bootstrap_servers} to report {want} broker(s)",
                interval=0.25,
                proc=node.process,
            )

    def start(self) -> LocalKafka:
        for i in range(len(self.nodes)):
            self.start_node(i)
        self.wait_ready()
        if self.settings.security is not None:
            create_scram_users(self.bootstrap_servers, self.admin_config(), self.settings.security)
        return self

    def stop(self) -> None:
        for i in reversed(range(len(self.nodes))):
            self.stop_node(i)

    def log_tails(self) -> str:
        return log_tails(n.process for n in self.nodes if n.process is not None)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
