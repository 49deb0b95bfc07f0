"""A secured Kafka for the SASL tests: the local launcher with a SASL listener, users and ACLs.

:func:`secured_kafka` starts :class:`dev.stack.LocalKafka` with ``KafkaSettings.security``
(dev/stack/kafka_security.py): a SASL_SSL (or SASL_PLAINTEXT) listener offering SCRAM-SHA-512,
SCRAM-SHA-256, PLAIN and OAUTHBEARER (unsecured JWTs), KRaft's StandardAuthorizer, the super
users ``admin`` and ``kdelay`` (the proxy's own identity), the users ``alice``, ``bob`` and
``carol`` with no ACL until a test grants one, and the PLAIN sessions of ``PLAIN_REAUTH_MS``
(KIP-368, so re-authentication happens in every PLAIN test). The PLAINTEXT listener stays open
with ANONYMOUS a super user: the tests' helpers (topic creation, read-back) and the replicas use
it, so only what is under test goes through SASL. Passwords are random per session.

Only the ``local`` test backend can start it; other backends skip, naming why.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from dev.stack import KafkaSecurity, KafkaSettings, LocalKafka, free_port
from dev.stack.kafka_security import create_scram_users
from kdelay.proxy import ProxyConfig
from tests.support import infra

USERS = ("admin", "kdelay", "alice", "bob", "carol")
SCRAM = ("SCRAM-SHA-512", "SCRAM-SHA-256")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER")
#: connections.max.reauth.ms for PLAIN on the secured listener.
PLAIN_REAUTH_MS = 4_000


@dataclass
class SecureKafka:
    """A running secured Kafka and what tests need to use it."""

    local: LocalKafka
    security: KafkaSecurity

    @property
    def plain(self) -> str:
        """The open PLAINTEXT listener (ANONYMOUS is a super user there)."""
        return ",".join(n.bootstrap for n in self.local.nodes)

    @property
    def secure(self) -> str:
        """The secured listener."""
        return self.local.secure_bootstrap_servers

    @property
    def protocol(self) -> str:
        return self.security.protocol

    @property
    def ca(self) -> Path | None:
        return self.local.ca.ca_cert if self.local.ca else None

    def password(self, user: str) -> str:
        return self.security.users[user]

    def client(self, user: str, mechanism: str = "SCRAM-SHA-512", **extra: Any) -> dict[str, Any]:
        """librdkafka settings for ``user`` on a SASL listener of this cluster's protocol."""
        return {**self.local.client_config(user, mechanism), **extra}

    def add_user(self, user: str) -> str:
        """A new SCRAM user (both SCRAM mechanisms); its password."""
        password = secrets.token_urlsafe(18)
        self.security.users[user] = password
        create_scram_users(self.plain, {}, self.security, {user: password})
        return password

    def proxy_config(self, listener: str | None = None, **overrides: Any) -> ProxyConfig:
        """A proxy on free loopback ports whose upstream is the secured listener as ``kdelay``
        (a super user) and whose Kafka listener speaks ``listener`` (default: the cluster's
        protocol; SASL_SSL gets the cluster's certificate)."""
        listener = listener or self.protocol
        upstream = {k: str(v) for k, v in self.client("kdelay", "SCRAM-SHA-512").items()}
        settings: dict[str, Any] = {
            "listen": f"127.0.0.1:{free_port()}",
            "http_listen": f"127.0.0.1:{free_port()}",
            "bootstrap_servers": self.secure,
            "buffer_partitions": 3,
            "upstream_config": upstream,
            "listener_security_protocol": listener,
            # Tests on loopback: an open HTTP API or a listener without SASL is opted in
            # (proxy/secure_defaults.py); a test that authenticates them overrides these.
            "http_allow_unauthenticated": True,
            "listener_allow_unauthenticated": True,
        }
        if listener in ("SSL", "SASL_SSL"):
            assert self.local.ca is not None, "a TLS listener needs the cluster's certificate"
            settings["tls_cert"] = self.local.ca.server_cert
            settings["tls_key"] = self.local.ca.server_key
        return ProxyConfig(**{**settings, **overrides})

    # -- ACLs -------------------------------------------------------------------------------

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.plain})

    def grant(self, user: str, topic: str, *operations: str) -> None:
        """ALLOW ``operations`` (default WRITE) on ``topic`` to ``user``."""
        bindings = [_binding(user, topic, op) for op in operations or ("WRITE",)]
        admin = self._admin()  # referenced until the futures are done (its handle serves them)
        for future in admin.create_acls(bindings).values():
            future.result(timeout=30)

    def revoke(self, user: str, topic: str, *operations: str) -> None:
        """Delete ``user``'s ALLOW ``operations`` (default WRITE) on ``topic``."""
        filters = [
            AclBindingFilter(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                f"User:{user}",
                "*",
                AclOperation[op],
                AclPermissionType.ALLOW,
            )
            for op in operations or ("WRITE",)
        ]
        admin = self._admin()
        for future in admin.delete_acls(filters).values():
            future.result(timeout=30)


def _binding(user: str, topic: str, operation: str) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        AclOperation[operation],
        AclPermissionType.ALLOW,
    )


@contextmanager
def secured_kafka(
    base: Path, protocol: str = "SASL_SSL", *, jwks_file: Path | None = None
) -> Iterator[SecureKafka]:
    """A secured single-broker Kafka in ``base`` (see the module docstring); with ``jwks_file``
    its OAUTHBEARER accepts only JWTs signed by a key of that JWKS file (Kafka's own validator)
    instead of unsecured ones."""
    if infra.backend() != "local":
        pytest.skip("the secured Kafka is started from the pinned jars (KDELAY_TEST_INFRA=local)")
    users = {u: secrets.token_urlsafe(18) for u in USERS}
    security = KafkaSecurity(
        users=users,
        protocol=protocol,
        mechanisms=MECHANISMS,
        super_users=("admin", "kdelay"),
        max_reauth_ms={"PLAIN": PLAIN_REAUTH_MS},
        jwks_file=jwks_file,
    )
    settings = KafkaSettings(num_partitions=1, auto_create_topics=True, security=security)
    launcher = LocalKafka(base / f"kafka-{protocol.lower()}", settings=settings)
    try:
        launcher.start()
    except Exception:
        launcher.stop()
        raise
    try:
        yield SecureKafka(launcher, security)
    finally:
        launcher.stop()
