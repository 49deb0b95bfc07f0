"""Local Apache ZooKeeper, standalone; readiness is a real kazoo session.

Plaintext and open by default. :class:`ZooKeeperSecurity` adds, for the tests of kdelay's ZooKeeper
security and for ``kdelay up --secure``:

- a digest super user (``super``, DigestAuthenticationProvider's superDigest), who passes every
  ACL: tests read and clean kdelay's closed znodes with it;
- TLS on a second port (``secureClientPort``, served by the Netty connection factory, which
  ZooKeeper needs for TLS) with a PEM keystore signed by the local CA that the secured Kafka uses
  too (:func:`dev.stack.kafka_security.make_ca`, one CA code); clients need no certificate of
  their own (``ssl.clientAuth=none``). ``plaintext=False`` drops the plaintext port.

Secrets stay off the command line: ZooKeeper turns every zoo.cfg key it does not know into the
system property ``zookeeper.<key>``, so the super user's digest and the TLS settings go into
zoo.cfg (mode 0600) instead of ``-D`` flags.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from dev.stack.kafka_security import LocalCa, make_ca
from dev.stack.process import ManagedProcess, free_port, java_argv, wait_until
from kdelay import jars
from kdelay.zk.access import digest_credential
from kdelay.zk.access import session_ok as zk_session_ok

HOST = "127.0.0.1"
#: The digest super user's name (ZooKeeper lets it pass every ACL).
SUPER_USER = "super"


@dataclass(frozen=True)
class ZooKeeperSecurity:
    """A digest super user (``super_password``; None: none) and TLS on a second port."""

    super_password: str | None = None
    tls: bool = False
    #: Keep the plaintext client port beside the TLS one.
    plaintext: bool = True

    def __post_init__(self) -> None:
        if not self.plaintext and not self.tls:
            raise ValueError("a ZooKeeper without its plaintext port needs tls=True")


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
        security: ZooKeeperSecurity | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.heap_mb = heap_mb
        self.start_timeout = start_timeout
        self.security = security
        self.process: ManagedProcess | None = None
        tls = security is not None and security.tls
        #: The TLS port (``ZooKeeperSecurity.tls``), else 0.
        self.secure_port = free_port() if tls else 0
        #: The CA that signed ZooKeeper's certificate (``ZooKeeperSecurity.tls``).
        self.ca: LocalCa | None = make_ca(data_dir / "tls") if tls else None

    @property
    def connect_string(self) -> str:
        """The plaintext client port."""
        return f"{HOST}:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        """The TLS client port (``ZooKeeperSecurity.tls``)."""
        if not self.secure_port:
            raise ValueError("this ZooKeeper has no TLS port (ZooKeeperSecurity.tls)")
        return f"{HOST}:{self.secure_port}"

    def super_client_kwargs(self) -> dict[str, Any]:
        """KazooClient arguments that log in as the digest super user (plaintext port)."""
        sec = self.security
        if sec is None or sec.super_password is None:
            raise ValueError("this ZooKeeper has no super user (ZooKeeperSecurity.super_password)")
        return {"auth_data": [("digest", f"{SUPER_USER}:{sec.super_password}")]}

    def _config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        sec = self.security
        lines = [
            "tickTime=500",
            f"dataDir={self.data_dir / 'data'}",
            "maxSessionTimeout=30000",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,stat,mntr",
            "autopurge.purgeInterval=1",
        ]
        if sec is None or sec.plaintext:
            lines += [f"clientPort={self.port}", f"clientPortAddress={HOST}"]
        if sec is not None and sec.super_password is not None:
            digest = digest_credential(SUPER_USER, sec.super_password)
            lines.append(f"DigestAuthenticationProvider.superDigest={digest}")
        if self.ca is not None:
            lines += [
                f"secureClientPort={self.secure_port}",
                f"secureClientPortAddress={HOST}",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                "ssl.keyStore.type=PEM",
                f"ssl.keyStore.location={self.ca.keystore}",
                "ssl.trustStore.type=PEM",
                f"ssl.trustStore.location={self.ca.ca_cert}",
                "ssl.clientAuth=none",
            ]
        cfg.write_text("".join(f"{line}\n" for line in lines))
        cfg.chmod(0o600)
        return cfg

    def _ready_address(self) -> str:
        plaintext = self.security is None or self.security.plaintext
        return self.connect_string if plaintext else self.secure_connect_string

    def _ready(self) -> bool:
        if self.security is None or self.security.plaintext:
            return session_ok(self.connect_string)
        assert self.ca is not None
        return session_ok(
            self.secure_connect_string,
            use_ssl=True,
            ca=str(self.ca.ca_cert),
            check_hostname=True,
        )

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
            self._ready,
            timeout=self.start_timeout,
            what=f"a ZooKeeper session at {self._ready_address()}",
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


def session_ok(connect: str, **kazoo: Any) -> bool:
    """Whether a ZooKeeper session opens at ``connect`` and can list ``/`` (``kazoo``: more
    client arguments, e.g. TLS)."""
    return zk_session_ok(connect, timeout=2.0, logger=_QUIET, **kazoo)
