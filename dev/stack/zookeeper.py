"""Local Apache ZooKeeper, standalone; readiness is a real kazoo session."""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType

from kazoo.client import KazooClient

from dev.stack.process import ManagedProcess, free_port, java_argv, wait_until
from kdelay import jars

HOST = "127.0.0.1"


class LocalZooKeeper:
    """ZooKeeper standalone on loopback; a context manager.

    tickTime is 500 ms so tests can use session timeouts from 1 s (2 ticks) to 30 s.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        heap_mb: int = 256,
        start_timeout: float = 60.0,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.heap_mb = heap_mb
        self.start_timeout = start_timeout
        self.process: ManagedProcess | None = None

    @property
    def connect_string(self) -> str:
        return f"{HOST}:{self.port}"

    def _config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            f"tickTime=500\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={HOST}\n"
            f"maxSessionTimeout=30000\n"
            f"maxClientCnxns=0\n"
            f"admin.enableServer=false\n"
            f"4lw.commands.whitelist=ruok,stat,mntr\n"
            f"autopurge.purgeInterval=1\n"
        )
        return cfg

    def start(self) -> LocalZooKeeper:
        cfg = self._config()
        argv = java_argv(
            jars.classpath("zookeeper"),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            self.heap_mb,
            str(cfg),
        )
        argv.insert(1, "-Dzookeeper.jmx.log4j.disable=true")
        self.process = ManagedProcess("zookeeper", argv, self.data_dir / "zookeeper.log")
        self.process.start()
        wait_until(
            lambda: session_ok(self.connect_string),
            timeout=self.start_timeout,
            what=f"a ZooKeeper session at {self.connect_string}",
            interval=0.25,
            proc=self.process,
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_QUIET = logging.getLogger("dev.stack.zookeeper.kazoo")
_QUIET.setLevel(logging.CRITICAL)
_QUIET.propagate = False


def session_ok(connect: str) -> bool:
    """Whether a ZooKeeper session opens at ``connect`` and can list ``/``."""
    client = KazooClient(hosts=connect, timeout=2.0, logger=_QUIET)
    try:
        client.start(timeout=2.0)
        client.get_children("/")
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        client.stop()
        client.close()
    return True
