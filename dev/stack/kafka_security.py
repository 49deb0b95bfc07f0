"""Optional security for the local Kafka (:class:`dev.stack.LocalKafka`): a SASL listener with
Kafka's StandardAuthorizer, its users, and a locally made CA and certificate for SASL_SSL.

The secured listener (``SECURE``) speaks ``KafkaSecurity.protocol`` with the enabled mechanisms:
PLAIN (users in the listener's JAAS entry, so they are fixed at start), SCRAM-SHA-256/512 (users
created once the broker runs, with AlterUserScramCredentials from a super user: any Kafka admin
client can add more), and OAUTHBEARER with Kafka's unsecured JWS validator (the default when no
JWKS endpoint is configured: tokens are trusted unsigned, for tests only), or, with
``jwks_file``, Kafka's own validator checking signed JWTs against that JWKS file
(``sasl.oauthbearer.jwks.endpoint.url=file:...``; Kafka 4 reads only URLs and files its JVM
allows: :meth:`KafkaSecurity.jvm_options` gives the ``-Dorg.apache.kafka.sasl.oauthbearer.*``
properties). KRaft's StandardAuthorizer enforces ACLs on every listener; ``super_users`` bypass
them.

``open_listener`` keeps the PLAINTEXT listener beside it, whose anonymous principal is made a
super user: the tests' own helpers, the replicas and anything not under test keep working
unchanged there while clients under test use the secured one (its KRaft controller listener
stays PLAINTEXT too). Without it (``kdelay up --secure``) nothing is open: the brokers talk to
one another over the secured listener, and to the controllers over a SASL_PLAINTEXT controller
listener, both with PLAIN as the first super user, and ``User:ANONYMOUS`` is no super user, so a
local process without credentials cannot reach the controller to create ACLs.

Secrets go to files only (server.properties, mode 0600), never to a command line.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from kdelay.errors import InfrastructureError

#: The secured listener's name in server.properties.
LISTENER = "SECURE"
PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER")
_SCRAM = {
    "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
    "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
}
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}


#: Kafka 4's OAUTHBEARER validator of signed JWTs (a JWKS endpoint, here a file).
_SECURED_VALIDATOR = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
)


@dataclass(frozen=True)
class KafkaSecurity:
    """A secured listener: protocol, mechanisms, users (name -> password, each for PLAIN and
    for every SCRAM mechanism enabled), super users, and KIP-368 session lifetimes."""

    users: dict[str, str]
    protocol: str = "SASL_PLAINTEXT"
    mechanisms: tuple[str, ...] = MECHANISMS
    super_users: tuple[str, ...] = ("admin",)
    open_listener: bool = True
    #: ``connections.max.reauth.ms`` per mechanism (0 or absent: sessions never expire).
    max_reauth_ms: dict[str, int] = field(default_factory=dict)
    #: A JWKS file (absolute path) whose keys sign the OAUTHBEARER tokens Kafka accepts; None:
    #: the unsecured validator (unsigned tokens).
    jwks_file: Path | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown or not self.mechanisms:
            raise ValueError(f"mechanisms must be some of {MECHANISMS}, got {self.mechanisms}")
        missing = set(self.super_users) - set(self.users)
        if missing and not self.open_listener:
            raise ValueError(f"super users without a password: {sorted(missing)}")

    @property
    def tls(self) -> bool:
        return self.protocol == "SASL_SSL"

    @property
    def scram(self) -> tuple[str, ...]:
        return tuple(m for m in self.mechanisms if m in _SCRAM)

    def jvm_options(self) -> list[str]:
        """System properties the broker's JVM needs: Kafka 4 fetches an OAUTHBEARER JWKS only
        from a URL (and a file) these allow."""
        if self.jwks_file is None or "OAUTHBEARER" not in self.mechanisms:
            return []
        return [
            f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.jwks_file.as_uri()}",
            f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.files={self.jwks_file}",
        ]


def _jaas(module: str, options: dict[str, str]) -> str:
    opts = "".join(f' {k}="{v}"' for k, v in options.items())
    return f"{module} required{opts};"


def listener_properties(
    sec: KafkaSecurity, *, host: str, port: int, plain_port: int, controller_port: int,
    keystore: Path | None, truststore: Path | None = None,
) -> dict[str, str]:  # fmt: skip
    """The broker properties of the secured listener (they replace the listener settings)."""
    name = LISTENER.lower()
    listeners = [f"{LISTENER}://{host}:{port}", f"CONTROLLER://{host}:{controller_port}"]
    advertised = [f"{LISTENER}://{host}:{port}"]
    # Closed (no open listener): the controller listener requires SASL PLAIN as well, and only
    # the named super users bypass the ACLs. Open: anyone on the open listener (the tests'
    # helpers) and the brokers on the PLAINTEXT controller listener are ANONYMOUS, a super user.
    controller = "PLAINTEXT" if sec.open_listener else "SASL_PLAINTEXT"
    protocols = [f"{LISTENER}:{sec.protocol}", f"CONTROLLER:{controller}"]
    supers = [f"User:{u}" for u in sec.super_users]
    if sec.open_listener:
        supers.append("User:ANONYMOUS")
        listeners.insert(0, f"PLAINTEXT://{host}:{plain_port}")
        advertised.insert(0, f"PLAINTEXT://{host}:{plain_port}")
        protocols.insert(0, "PLAINTEXT:PLAINTEXT")
    props = {
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised),
        "listener.security.protocol.map": ",".join(protocols),
        "inter.broker.listener.name": "PLAINTEXT" if sec.open_listener else LISTENER,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(supers),
        "allow.everyone.if.no.acl.found": "false",
        "sasl.enabled.mechanisms": ",".join(sec.mechanisms),
        f"listener.name.{name}.sasl.enabled.mechanisms": ",".join(sec.mechanisms),
    }
    for mech in sec.mechanisms:
        options: dict[str, str] = {}
        if mech == "PLAIN":
            options = {f"user_{u}": pw for u, pw in sec.users.items()}
            if not sec.open_listener:
                admin = sec.super_users[0]
                options = {"username": admin, "password": sec.users[admin], **options}
        elif mech == "OAUTHBEARER":
            options = {"unsecuredLoginStringClaim_sub": sec.super_users[0]}
            if sec.jwks_file is not None:
                prefix = f"listener.name.{name}.oauthbearer"
                props[f"{prefix}.sasl.server.callback.handler.class"] = _SECURED_VALIDATOR
                props["sasl.oauthbearer.jwks.endpoint.url"] = sec.jwks_file.as_uri()
        props[f"listener.name.{name}.{mech.lower()}.sasl.jaas.config"] = _jaas(
            _LOGIN_MODULES[mech], options
        )
        lifetime = sec.max_reauth_ms.get(mech)
        if lifetime:
            props[f"listener.name.{name}.{mech.lower()}.connections.max.reauth.ms"] = str(lifetime)
    if not sec.open_listener:
        props["sasl.mechanism.inter.broker.protocol"] = "PLAIN"
        props.update(_controller_sasl(sec))
    if keystore is not None:
        props[f"listener.name.{name}.ssl.keystore.type"] = "PEM"
        props[f"listener.name.{name}.ssl.keystore.location"] = str(keystore)
    if truststore is not None:
        # The brokers' own client side (inter-broker traffic without the open listener).
        props[f"listener.name.{name}.ssl.truststore.type"] = "PEM"
        props[f"listener.name.{name}.ssl.truststore.location"] = str(truststore)
    return props


def _controller_sasl(sec: KafkaSecurity) -> dict[str, str]:
    """SASL PLAIN on the KRaft controller listener: the nodes log in to it as the first super
    user (the JAAS entry's username/password), the only user it knows (``user_<name>``). PLAIN
    needs no credential in the metadata log, which the controller is the one to serve."""
    admin = sec.super_users[0]
    password = sec.users[admin]
    jaas = _jaas(
        _LOGIN_MODULES["PLAIN"],
        {"username": admin, "password": password, f"user_{admin}": password},
    )
    return {
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": jaas,
    }


@dataclass(frozen=True)
class LocalCa:
    """A CA and one server certificate for 127.0.0.1 / localhost, made with openssl."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    #: The key and the certificate chain in one file: Kafka's PEM keystore.
    keystore: Path


def make_ca(directory: Path) -> LocalCa:
    """A new CA and server certificate in ``directory`` (kept when already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "server.ext"
    keystore = directory / "keystore.pem"
    if not keystore.exists():
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        steps = [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=kdelay local CA", "-keyout", str(ca_key), "-out", str(ca_cert)],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", str(key), "-out", str(csr)],
            ["x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert)],
        ]  # fmt: skip
        for argv in steps:
            done = subprocess.run(
                ["openssl", *argv], capture_output=True, text=True, timeout=60, check=False
            )
            if done.returncode != 0:
                raise InfrastructureError(f"openssl {argv[0]} failed: {done.stderr[-2000:]}")
        pkcs8 = subprocess.run(
            ["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", str(key)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        keystore.write_text(pkcs8.stdout + cert.read_text() + ca_cert.read_text())
        for secret in (ca_key, key, keystore):
            secret.chmod(0o600)
    return LocalCa(ca_cert, cert, key, keystore)


def client_config(
    sec: KafkaSecurity, user: str, mechanism: str = "SCRAM-SHA-512", ca: Path | None = None
) -> dict[str, str]:
    """librdkafka settings for ``user`` on the secured listener (OAUTHBEARER: an unsecured
    token whose subject is ``user``)."""
    conf = {"security.protocol": sec.protocol, "sasl.mechanism": mechanism}
    if mechanism == "OAUTHBEARER":
        conf["sasl.oauthbearer.config"] = f"principal={user}"
        conf["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
    else:
        conf["sasl.username"] = user
        conf["sasl.password"] = sec.users[user]
    if sec.tls and ca is not None:
        conf["ssl.ca.location"] = str(ca)
    return conf


def create_scram_users(bootstrap: str, admin_config: dict[str, str], sec: KafkaSecurity,
                       users: dict[str, str] | None = None) -> None:  # fmt: skip
    """SCRAM credentials for ``users`` (default: every user of ``sec``) under every SCRAM
    mechanism ``sec`` enables, through AlterUserScramCredentials as a super user."""
    wanted = users if users is not None else sec.users
    if not sec.scram or not wanted:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_config})
    # One request per mechanism: Kafka refuses to alter one user twice in one request.
    for mech in sec.scram:
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(_SCRAM[mech], 4096), password.encode()
            )
            for user, password in wanted.items()
        ]
        for user, future in admin.alter_user_scram_credentials(upserts).items():
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                raise InfrastructureError(f"creating {mech} user {user} failed: {exc}") from None
