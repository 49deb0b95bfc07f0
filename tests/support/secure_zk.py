"""A ZooKeeper with a digest super user and TLS, and replica sets that log in to it.

:func:`secure_zookeeper` starts :class:`dev.stack.zookeeper.LocalZooKeeper` with
``ZooKeeperSecurity``: the plaintext port and a TLS port (certificate from the local CA), and the
super user ``super`` whose client passes every ACL (the tests inspect kdelay's closed znodes with
it). :class:`SecureReplicaSet` is :class:`tests.support.replicas.ReplicaSet` whose replicas get
kdelay's ZooKeeper settings (flags, the password in the environment only) and whose own
observing client logs in as they do. Passwords are random per run.

Only the ``local`` test backend can start it; other backends skip, naming why.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pydantic import SecretStr

from dev.stack.zookeeper import LocalZooKeeper, ZooKeeperSecurity
from kdelay.zk import Paths
from kdelay.zk.security import ZkSecurity
from tests.support import infra
from tests.support.replicas import Replica, ReplicaSet

#: kdelay's ZooKeeper user in these tests.
USER = "kdelay"


@dataclass
class SecureZooKeeper:
    """A running ZooKeeper with a super user and TLS, and kdelay's credentials for it."""

    local: LocalZooKeeper
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))

    @property
    def plain(self) -> str:
        return self.local.connect_string

    @property
    def tls(self) -> str:
        return self.local.secure_connect_string

    @property
    def ca(self) -> Path:
        assert self.local.ca is not None
        return self.local.ca.ca_cert

    def security(self, *, tls: bool = False) -> ZkSecurity:
        """kdelay's settings for this ZooKeeper (over TLS when ``tls``)."""
        return ZkSecurity(
            zk_auth_username=USER,
            zk_auth_password=SecretStr(self.password),
            zk_tls=tls,
            zk_tls_ca_file=self.ca if tls else None,
        )

    def replica_args(self, *, tls: bool = False) -> list[str]:
        """The replicas' flags (the password goes in :meth:`replica_env`, never a flag)."""
        args = ["--zk-auth-username", USER]
        if tls:
            args += ["--zk-tls", "--zk-tls-ca-file", str(self.ca)]
        return args

    def replica_env(self) -> dict[str, str]:
        return {"KDELAY_REPLICA_ZK_AUTH_PASSWORD": self.password}

    def client(self, *, tls: bool = False, **kazoo: Any) -> KazooClient:
        """A started kazoo client on the plaintext (or TLS) port with ``kazoo`` arguments."""
        hosts = self.tls if tls else self.plain
        client = KazooClient(hosts=hosts, timeout=10.0, **kazoo)
        client.start(timeout=15)
        return client

    def super_client(self) -> KazooClient:
        """A client logged in as ZooKeeper's super user (passes every ACL)."""
        return self.client(**self.local.super_client_kwargs())


@contextmanager
def secure_zookeeper(base: Path) -> Iterator[SecureZooKeeper]:
    """A local ZooKeeper with a super user and a TLS port beside the plaintext one."""
    if infra.backend() != "local":
        pytest.skip("the secured ZooKeeper is started by the local launcher only")
    security = ZooKeeperSecurity(super_password=secrets.token_urlsafe(18), tls=True)
    with LocalZooKeeper(base, security=security) as local:
        yield SecureZooKeeper(local)


@dataclass
class SecureReplicaSet(ReplicaSet):
    """A :class:`ReplicaSet` whose replicas, and whose observing client, log in to ZooKeeper
    with ``zk`` (over TLS when ``tls``; ``zk_connect`` is then ZooKeeper's TLS port)."""

    zk: SecureZooKeeper | None = None
    tls: bool = False

    def __post_init__(self) -> None:
        # ReplicaSet's own, but its observing client logs in (and speaks TLS) as the replicas do.
        assert self.zk is not None
        self.paths = Paths(self.root).shard(self.shard, self.shards)
        for i in range(1, self.count + 1):
            name = f"replica-{i}"
            self.replicas[name] = Replica(
                name, self.base / name / "data", self.base / name / "replica.log"
            )
            self.wrap.setdefault(name, ([], self.zk.replica_env()))
        self.extra_args = [*self.extra_args, *self.zk.replica_args(tls=self.tls)]
        self._zk = self.zk.client(tls=self.tls, **self.zk.security(tls=self.tls).kazoo_kwargs())
