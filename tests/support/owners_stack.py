"""A stack for the message-owner tests: a secured Kafka (SCRAM users, ACLs;
tests/support/secure_kafka.py), one replica and an in-process proxy whose HTTP API
authenticates against Kafka (``http_auth=kafka``, plain HTTP allowed).

alice, bob and carol may WRITE (and DESCRIBE) a target topic of the stack's own; carol also holds
ALTER on the buffer topic: a kdelay administrator. A test module subclasses :class:`OwnersStack`
with its own helpers."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kdelay import buffer
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import SecureKafka, secured_kafka

USERS = ("alice", "bob", "carol")
ADMIN = "carol"


@dataclass
class OwnersStack:
    secure: SecureKafka
    proxy: Proxy
    replicas: ReplicaSet
    topic: str

    @property
    def kafka(self) -> str:
        """The proxy's Kafka listener."""
        assert self.proxy.addresses is not None
        return self.proxy.addresses.kafka

    @property
    def http(self) -> str:
        """The proxy's HTTP API."""
        assert self.proxy.addresses is not None
        return self.proxy.addresses.http

    def auth(self, user: str) -> dict[str, str]:
        """HTTP Basic credentials of ``user``."""
        pair = f"{user}:{self.secure.password(user)}".encode()
        return {"authorization": "Basic " + base64.b64encode(pair).decode()}


@contextlib.contextmanager
def owners_stack(base: Path, zk_connect: str, name: str) -> Iterator[OwnersStack]:
    """The stack (module docstring), its directories under ``base``, its topic named after
    ``name``; every part stopped on exit."""
    with secured_kafka(base, "SASL_PLAINTEXT") as secure:
        topic = unique_topic(name)
        create_topic(secure.plain, topic, partitions=1)
        for user in USERS:
            secure.grant(user, topic, "WRITE", "DESCRIBE")
        secure.grant(ADMIN, buffer.BUFFER_TOPIC, "ALTER")
        with ReplicaSet(
            base / "replicas", secure.plain, zk_connect, count=1, partitions=3,
            buffer_topic=buffer.BUFFER_TOPIC,
        ) as rs:  # fmt: skip
            config = secure.proxy_config(
                zk_connect=zk_connect,
                zk_root=rs.root,
                http_auth="kafka",
                http_allow_plaintext_auth=True,
            )
            with running_proxy(config) as px:
                rs.start_all()
                rs.wait_master(timeout=90)
                yield OwnersStack(secure, px, rs, topic)
