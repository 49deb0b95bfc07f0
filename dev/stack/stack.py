"""The whole kdelay stack on one machine: ZooKeeper, Kafka, the proxy and N replicas per shard.

``kdelay up`` runs it in the foreground; ``make demo`` and the end-to-end tests drive
``kdelay up`` as a subprocess. Kafka and ZooKeeper are local unless ``bootstrap_servers`` /
``zk_connect`` name existing ones. Components talk to each other only through their public
interfaces: command lines, the proxy's ``/readyz`` and the replicas' ``/metrics``.
:meth:`LocalStack.components` hands what it started to :mod:`dev.stack.restarts`, which
restarts each with its own command line, so ports and the state file's addresses stay valid.
Whether it is up (the proxy's ``/readyz``, the replicas' ``/metrics``, a master per shard) is
:mod:`dev.stack.readiness`'s question.

Before it starts anything, :meth:`LocalStack.start` takes the stack's lock
(:mod:`dev.stack.lock`: one stack per data directory and state file) and looks for
leftovers (:mod:`dev.stack.leftovers`): processes of an earlier run whose owner is gone. Those
using this data directory would fight the new stack for its files, so they stop the start with
their pids; others are reported. The state file is removed by :meth:`LocalStack.stop` only
when this stack holds the lock, so a second ``kdelay up`` that fails leaves the first's alone.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dev.stack import leftovers
from dev.stack.kafka import KafkaSettings, LocalKafka
from dev.stack.lock import StackLock
from dev.stack.process import ManagedProcess, free_port, python_argv
from dev.stack.readiness import HOST, Replica, masters, wait_ready
from dev.stack.replica import ReplicaSpec
from dev.stack.restarts import Component
from dev.stack.secure import PROXY, REPLICA, SecureStack
from dev.stack.zookeeper import LocalZooKeeper
from kdelay import jars
from kdelay.errors import InfrastructureError


@dataclass(frozen=True)
class StackOptions:
    """What ``kdelay up`` was asked for (CONTRACT.md flags)."""

    replicas: int = 3
    shards: int = 1
    proxy_port: int = 0
    proxy_workers: int = 1
    http_port: int = 0
    kafka_port: int = 0
    zk_port: int = 0
    bootstrap_servers: str | None = None
    zk_connect: str | None = None
    data_dir: Path = Path(".kdelay/data")
    state_file: Path = Path(".kdelay/up.json")
    buffer_partitions: int = 6
    start_timeout: float = 180.0
    #: The replicas' ZooKeeper session timeout; None: the replica's default (2 s, which bounds
    #: a failover; the local ZooKeeper's tickTime of 500 ms lets it be that short).
    zk_session_timeout: float | None = None
    #: Kafka on SASL_SSL with ACLs, ZooKeeper with ACLs, the proxy on SASL_SSL and HTTPS with
    #: authentication, each component on its own least-privilege user (dev/stack/secure.py).
    secure: bool = False


@dataclass
class LocalStack:
    """Start with :meth:`start`, stop with :meth:`stop`; ``progress`` receives one line a step."""

    options: StackOptions
    progress: Callable[[str], None] = print
    zookeeper: LocalZooKeeper | None = None
    kafka: LocalKafka | None = None
    proxy: ManagedProcess | None = None
    replicas: list[Replica] = field(default_factory=list)
    bootstrap: str = ""
    zk_connect: str = ""
    proxy_port: int = 0
    http_port: int = 0
    lock: StackLock | None = None
    secure: SecureStack | None = None

    def start(self) -> None:
        opts = self.options
        data = opts.data_dir.resolve()
        lock = StackLock(data, opts.state_file)
        lock.acquire()  # before anything touches the data directory or the state file
        self.lock = lock
        self._check_leftovers(data)
        if not (opts.bootstrap_servers and opts.zk_connect):
            self.progress("==> checking the pinned Kafka and ZooKeeper jars (first run: Maven)")
            jars.jar_dir("kafka", progress=True)
            jars.jar_dir("zookeeper", progress=True)
        if opts.secure:
            if opts.bootstrap_servers or opts.zk_connect:
                raise InfrastructureError(
                    "--secure runs its own secured Kafka and ZooKeeper: it cannot be combined "
                    "with --bootstrap-servers or --zk-connect"
                )
            self.secure = SecureStack.load_or_create(data / "secrets")
        if opts.zk_connect:
            self.zk_connect = opts.zk_connect
        else:
            self.progress("==> starting ZooKeeper")
            self.zookeeper = LocalZooKeeper(data / "zookeeper", port=opts.zk_port).start()
            self.zk_connect = self.zookeeper.connect_string
        if opts.bootstrap_servers:
            self.bootstrap = opts.bootstrap_servers
        else:
            self.progress("==> starting Kafka (KRaft)" + (" on SASL_SSL" if self.secure else ""))
            self.kafka = LocalKafka(
                data / "kafka",
                ports=[opts.kafka_port],
                settings=KafkaSettings(
                    num_partitions=4,
                    auto_create_topics=True,
                    security=self.secure.kafka_security() if self.secure else None,
                ),
            ).start()
            self.bootstrap = self.kafka.bootstrap_servers
            if self.secure is not None:
                self.progress("==> granting each kdelay component's Kafka user its ACLs")
                self.secure.grant_components(self.bootstrap, self.kafka.admin_config())
        self._start_proxy(data)
        self._reshard()
        self._start_replicas(data)
        self.progress("==> waiting for the proxy and for a master to be elected")
        self._wait_ready()
        self.write_state()

    def _check_leftovers(self, data: Path) -> None:
        """Fail naming the leftovers that use ``data``; report the others."""
        found = leftovers.orphans()
        mine = leftovers.using(data, found)
        if mine:
            pids = " ".join(str(m.pid) for m in mine)
            raise InfrastructureError(
                f"{len(mine)} process(es) of an earlier kdelay run on {data} outlived it and "
                f"still use its files:\n{leftovers.describe(mine)}\nstop them (kill {pids}) "
                "and run kdelay up again"
            )
        if found:
            self.progress(
                f"kdelay: warning: {len(found)} process(es) started by an earlier kdelay run "
                f"outlived it (python -m dev.stack.leftovers lists them):\n"
                f"{leftovers.describe(found)}"
            )

    def _start_proxy(self, data: Path) -> None:
        self.progress("==> starting the proxy")
        self.proxy_port = self.options.proxy_port or free_port()
        self.http_port = self.options.http_port or free_port()
        self.proxy = ManagedProcess(
            "proxy",
            python_argv(
                "proxy",
                "--listen",
                f"{HOST}:{self.proxy_port}",
                "--http-listen",
                f"{HOST}:{self.http_port}",
                "--bootstrap-servers",
                self.bootstrap,
                "--buffer-partitions",
                str(self.options.buffer_partitions),
                # Where the replicas are: GET /v1/messages/{id} and /v1/pending ask them.
                "--zk-connect",
                self.zk_connect,
                "--workers",
                str(self.options.proxy_workers),
                *self._proxy_security_args(),
            ),
            data / "proxy.log",
        )
        self.proxy.start()

    def _reshard(self) -> None:
        """Bring the delay set to ``--shards`` before any replica starts: ``kdelay reshard``
        (a no-op when it has that many already; refused while other replicas run on it)."""
        self.progress(f"==> checking the shard layout ({self.options.shards} shard(s))")
        argv = python_argv(
            "reshard",
            "--zk-connect",
            self.zk_connect,
            "--shards",
            str(self.options.shards),
            *(self.secure.zk_args() if self.secure else ()),
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise InfrastructureError(
                f"kdelay reshard --shards {self.options.shards} failed: "
                f"{(done.stderr or done.stdout).strip()}"
            )
        for line in done.stdout.splitlines():
            self.progress(f"    {line}")

    def _start_replicas(self, data: Path) -> None:
        shards = self.options.shards
        for shard in range(shards):
            for i in range(1, self.options.replicas + 1):
                name = f"replica-{i}" if shards == 1 else f"shard{shard}-replica-{i}"
                self.progress(f"==> starting {name}")
                port = free_port()
                spec = ReplicaSpec(
                    name,
                    self.bootstrap,
                    self.zk_connect,
                    data / name,
                    shards=shards if shards > 1 else None,
                    shard=shard if shards > 1 else None,
                    metrics_port=port,
                    buffer_partitions=self.options.buffer_partitions,
                    zk_session_timeout=self.options.zk_session_timeout,
                    extra_args=tuple(self._replica_security_args()),
                )
                proc = ManagedProcess(name, python_argv(*spec.args()), data / f"{name}.log")
                proc.start()
                self.replicas.append(Replica(name, port, proc, shard))

    def _wait_ready(self) -> None:
        assert self.proxy is not None
        wait_ready(
            self.proxy,
            self.http_url,
            self.ca_file,
            self.replicas,
            shards=self.options.shards,
            timeout=self.options.start_timeout,
        )

    @property
    def ca_file(self) -> Path | None:
        """The local CA's certificate (``--secure``): it signed Kafka's and the proxy's."""
        if self.kafka is None or self.kafka.ca is None:
            return None
        return self.kafka.ca.ca_cert

    @property
    def http_url(self) -> str:
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{HOST}:{self.http_port}"

    def _proxy_security_args(self) -> list[str]:
        """``--secure``: SASL_SSL listener, HTTPS with authentication, its own Kafka user."""
        if self.secure is None:
            return []
        assert self.kafka is not None
        assert self.kafka.ca is not None
        ca = self.kafka.ca
        return [
            "--listener-security-protocol", "SASL_SSL",
            "--tls-cert", str(ca.server_cert),
            "--tls-key", str(ca.server_key),
            "--http-tls-cert", str(ca.server_cert),
            "--http-tls-key", str(ca.server_key),
            "--http-auth", "kafka",
            *self.secure.kafka_args(PROXY, ca.ca_cert),
            *self.secure.zk_args(),
        ]  # fmt: skip

    def _replica_security_args(self) -> list[str]:
        if self.secure is None:
            return []
        assert self.ca_file is not None
        # The proxy's user is the one principal besides the replicas' that may WRITE the buffer.
        writers = ["--buffer-writers", f"User:{PROXY}"]
        return [*self.secure.kafka_args(REPLICA, self.ca_file), *self.secure.zk_args(), *writers]

    def master(self) -> str | None:
        """The replica whose metrics say it is master (of shard 0), if any."""
        return self.masters().get(0)

    def masters(self) -> dict[int, str]:
        """Per shard, the replica whose metrics say it is master (shards without one left
        out)."""
        return masters(self.replicas)

    def state(self) -> dict[str, object]:
        """The state-file document of CONTRACT.md."""
        state: dict[str, object] = {
            "proxy": f"{HOST}:{self.proxy_port}",
            "http": self.http_url,
            "kafka": self.bootstrap,
            "zookeeper": self.zk_connect,
            "replicas": [
                {"name": r.name, "shard": r.shard, "pid": r.process.pid, "metrics": r.metrics_url}
                for r in self.replicas
            ],
        }
        if self.secure is not None and self.ca_file is not None:
            state["security"] = self.secure.state(self.ca_file)
        return state

    def write_state(self) -> None:
        """Write :meth:`state` to the state file atomically (readers never see half of it)."""
        if self.lock is None or not self.lock.held:
            raise InfrastructureError("the stack's lock is not held: not writing the state file")
        path = self.options.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)  # --secure: it holds the admin's password
        tmp.write_text(json.dumps(self.state(), indent=2) + "\n")
        tmp.replace(path)

    def components(self) -> list[Component]:
        """What ``kdelay up`` supervises: the local ZooKeeper and Kafka (essential: without them
        nothing works), the proxy and the replicas. Servers it did not start are not its own."""
        out = []
        if self.zookeeper is not None and self.zookeeper.process is not None:
            out.append(_component("ZooKeeper", self.zookeeper.process, essential=True))
        if self.kafka is not None:
            for node in self.kafka.nodes:
                if node.process is not None:
                    name = "Kafka" if len(self.kafka.nodes) == 1 else f"Kafka node {node.node_id}"
                    out.append(_component(name, node.process, essential=True))
        if self.proxy is not None:
            out.append(_component("proxy", self.proxy))
        out += [_component(r.name, r.process) for r in self.replicas]
        return out

    def stop(self) -> None:
        """Stop everything this stack started, newest first; remove the state file and release
        the lock (if this stack took it)."""
        for replica in reversed(self.replicas):
            self.progress(f"==> stopping {replica.name}")
            replica.process.stop()
        if self.proxy is not None:
            self.progress("==> stopping the proxy")
            self.proxy.stop()
        if self.kafka is not None:
            self.progress("==> stopping Kafka")
            self.kafka.stop()
        if self.zookeeper is not None:
            self.progress("==> stopping ZooKeeper")
            self.zookeeper.stop()
        if self.lock is not None and self.lock.held:
            # Only the stack that holds the lock owns the state file.
            self.options.state_file.unlink(missing_ok=True)
            self.lock.release()


def _component(name: str, proc: ManagedProcess, *, essential: bool = False) -> Component:
    """``proc`` as a supervised component; a restart keeps its command line, ports and log."""
    return Component(
        name=name,
        alive=proc.alive,
        returncode=proc.returncode,
        restart=proc.restart,
        pid=lambda: proc.pid,
        log=str(proc.log_path),
        essential=essential,
    )
