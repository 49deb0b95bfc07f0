"""``kdelay up --secure``: the embedded stack as a secured deployment would run it.

- Kafka on SASL_SSL only (no open listener): SCRAM-SHA-512 and SCRAM-SHA-256 for clients,
  PLAIN for the brokers among themselves, KRaft's StandardAuthorizer with no ACL meaning no
  access, and a CA and certificate made locally (dev/stack/kafka_security.py).
- One Kafka user per kdelay component (``kdelay-proxy``, ``kdelay-replica``, ``kdelay-verifier``)
  holding only the ACLs the component needs (:data:`ACLS`), and ``admin``, a super user whose
  credentials the state file gives, so a user or a test creates users and ACLs with any Kafka
  admin client.
- ZooKeeper: kdelay's znodes carry a digest ACL of the user ``kdelay``; no one else may read or
  change them.
- The proxy: its Kafka listener on SASL_SSL (each client's login relayed to Kafka), its HTTP API
  on HTTPS with Basic authentication checked against Kafka.

Secrets: the passwords are generated once per data directory and kept in files (mode 0600)
under ``<data>/secrets``; components read them from there (``--kafka-sasl-password-file``,
``--zk-auth-password-file``), never from a command line or their logs.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from dev.stack.kafka_security import KafkaSecurity
from kdelay import acls
from kdelay.errors import InfrastructureError

#: The Kafka super user of the secured stack (the state file's ``security.admin``).
ADMIN = "admin"
PROXY = "kdelay-proxy"
REPLICA = "kdelay-replica"
VERIFIER = "kdelay-verifier"
#: The ZooKeeper digest user of every kdelay component.
ZK_USER = "kdelay"
MECHANISM = "SCRAM-SHA-512"
_USERS = (ADMIN, PROXY, REPLICA, VERIFIER)


@dataclass(frozen=True)
class SecureStack:
    """The secrets and settings of one secured stack; see the module docstring."""

    directory: Path
    passwords: dict[str, str]

    @classmethod
    def load_or_create(cls, directory: Path) -> SecureStack:
        """The stack's secrets in ``directory``: made on first use, reused afterwards (the local
        Kafka keeps its users across restarts of ``kdelay up`` on the same data directory)."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        passwords = {}
        for user in (*_USERS, ZK_USER):
            path = directory / f"{user}.password"
            if not path.exists():
                path.touch(mode=0o600)
                path.write_text(secrets.token_urlsafe(24) + "\n")
            passwords[user] = path.read_text().strip()
        return cls(directory, passwords)

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def kafka_security(self) -> KafkaSecurity:
        """The local Kafka's secured listener: SASL_SSL only, these users, ``admin`` super."""
        users = {u: self.passwords[u] for u in _USERS}
        return KafkaSecurity(
            users=users,
            protocol="SASL_SSL",
            mechanisms=("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"),
            super_users=(ADMIN,),
            open_listener=False,
        )

    def kafka_args(self, user: str, ca_file: Path) -> list[str]:
        """The flags that log a component in to Kafka as ``user`` (the password by file)."""
        return [
            "--kafka-security-protocol", "SASL_SSL",
            "--kafka-sasl-mechanism", MECHANISM,
            "--kafka-sasl-username", user,
            "--kafka-sasl-password-file", str(self.password_file(user)),
            "--kafka-ssl-ca-file", str(ca_file),
        ]  # fmt: skip

    def zk_args(self) -> list[str]:
        """The flags that log a component in to ZooKeeper as ``kdelay``."""
        return [
            "--zk-auth-username", ZK_USER,
            "--zk-auth-password-file", str(self.password_file(ZK_USER)),
        ]  # fmt: skip

    def state(self, ca_file: Path) -> dict[str, object]:
        """The state file's ``security`` object (CONTRACT.md v3)."""
        return {
            "protocol": "SASL_SSL",
            "mechanism": MECHANISM,
            "ca_file": str(ca_file.resolve()),
            "admin": {"username": ADMIN, "password": self.passwords[ADMIN]},
        }

    def grant_components(self, bootstrap: str, admin_config: dict[str, str]) -> None:
        """Give each component's user exactly the ACLs of kdelay/acls.py's table."""
        users = {"proxy": PROXY, "replica": REPLICA, "verifier": VERIFIER}
        bindings = [
            binding(user, acl)
            for component, user in users.items()
            for acl in acls.table()[component]
        ]
        self.grant(bootstrap, admin_config, bindings)

    def grant(
        self, bootstrap: str, admin_config: dict[str, str], bindings: list[AclBinding]
    ) -> None:
        """Create ``bindings`` as the super user; InfrastructureError naming the one refused."""
        admin = AdminClient({"bootstrap.servers": bootstrap, **admin_config})
        for one, future in admin.create_acls(bindings).items():
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                raise InfrastructureError(f"creating the ACL {one} failed: {exc}") from None


def binding(user: str, acl: acls.Acl) -> AclBinding:
    """``acl`` as an ALLOW binding for ``User:<user>`` from any host."""
    return AclBinding(
        ResourceType[acl.resource if acl.resource != "CLUSTER" else "BROKER"],
        acl.name,
        ResourcePatternType[acl.pattern],
        f"User:{user}",
        "*",
        AclOperation[acl.operation],
        AclPermissionType.ALLOW,
    )
