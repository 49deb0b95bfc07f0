"""Local Apache Kafka in KRaft mode: one combined broker+controller, or a 3-node cluster.

Storage is formatted on first start (``kafka.tools.StorageTool``); readiness is an admin
request that sees every broker, never a sleep. Used by ``kdelay up`` and the test fixtures.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

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


def _cluster_id() -> str:
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

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


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
        self.nodes = [
            KafkaNode(i + 1, data_dir / f"node-{i + 1}", p or free_port(), free_port())
            for i, p in enumerate(ports)
        ]
        self._cluster_id_file = data_dir / "cluster-id"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

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
            **self.settings.extra,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _prepare(self, node: KafkaNode) -> Path:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        config = node.data_dir / "server.properties"
        config.write_text(self._properties(node))
        (node.data_dir / "log4j2.properties").write_text(
            _LOG4J2.format(level=self.settings.log_level)
        )
        if not (node.data_dir / "logs" / "meta.properties").exists():
            if not self._cluster_id_file.exists():
                self._cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
                self._cluster_id_file.write_text(_cluster_id())
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
        config = self._prepare(node)
        argv = java_argv(
            jars.classpath("kafka"),
            "kafka.Kafka",
            self.settings.heap_mb,
            str(config),
            quick_jit=self.settings.quick_jit,
        )
        argv.insert(1, f"-Dlog4j2.configurationFile={node.data_dir / 'log4j2.properties'}")
        argv.insert(1, f"-Dkafka.logs.dir={node.data_dir}")
        node.process = ManagedProcess(f"kafka-{node.node_id}", argv, node.data_dir / "kafka.log")
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
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
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
