"""An in-process stand-in for a broker link (proxy/auth/broker_link.py's ``Link``), for unit tests.

It plays a SASL broker with users, ACLs and topics the test sets: SaslHandshake for the enabled
mechanisms; SaslAuthenticate for PLAIN (``authzid NUL user NUL password``), for a toy SCRAM
(client-first names the user, client-final carries ``p=<password>``: the proxy only relays, so
the cryptography is not what is under test) and for OAUTHBEARER (any token: the claim decides);
and Metadata with authorized operations from its ACL table. ``fail_next`` makes the next request
raise LinkError, as a broken connection does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kafka.errors as kerr
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kdelay.proxy import sasl
from kdelay.proxy.auth.broker_link import LinkError, LinkSettings

WRITE, DESCRIBE = 4, 8
_Topic = MetadataResponse.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition


@dataclass
class FakeKafka:
    """What every fake link of a test answers from."""

    users: dict[str, str] = field(default_factory=dict)
    mechanisms: tuple[str, ...] = sasl.MECHANISMS
    #: (user, topic) -> AclOperation codes allowed.
    acls: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)
    session_lifetime_ms: int = 0
    links: list[FakeLink] = field(default_factory=list)
    metadata_requests: int = 0
    unreachable: bool = False

    def factory(self, _settings: LinkSettings) -> FakeLink:
        link = FakeLink(self)
        self.links.append(link)
        return link


class FakeLink:
    """One link: its own SASL state, like a broker connection."""

    def __init__(self, kafka: FakeKafka) -> None:
        self.kafka = kafka
        self._open = False
        self.mechanism: str | None = None
        self.user: str | None = None
        self.authenticated: str | None = None
        self.fail_next = False
        self.requests: list[Any] = []

    @property
    def open(self) -> bool:
        return self._open

    async def connect(self) -> None:
        if self.kafka.unreachable:
            raise LinkError("no upstream broker accepted a connection: refused")
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def request(self, request: Any) -> Any:
        if not self._open:
            raise LinkError("the link to the broker is closed")
        if self.fail_next:
            self._open = False
            raise LinkError("request to broker fake failed: reset")
        self.requests.append(request)
        if isinstance(request, SaslHandshakeRequest):
            return self._handshake(request)
        if isinstance(request, SaslAuthenticateRequest):
            return self.authenticate(request)
        if isinstance(request, MetadataRequest):
            return self._metadata(request)
        raise AssertionError(f"unexpected request {request!r}")

    def _handshake(self, req: Any) -> Any:
        ok = req.mechanism in self.kafka.mechanisms
        self.mechanism = req.mechanism if ok else None
        self.user = None
        code = 0 if ok else kerr.UnsupportedSaslMechanismError.errno
        return SaslHandshakeResponse(
            error_code=code, mechanisms=list(self.kafka.mechanisms), version=req.API_VERSION
        )

    def authenticate(self, req: Any) -> Any:
        """The answer to a SaslAuthenticateRequest (a subclass may answer a mechanism its own
        way)."""
        token = bytes(req.auth_bytes)
        mech = self.mechanism
        try:
            if mech == sasl.PLAIN:
                _, user, secret = token.split(b"\0")
                return self._verdict(req, user.decode(), secret.decode(), b"")
            if mech in sasl.SCRAM and self.user is None:
                self.user = sasl.claim(mech, token).principal.name
                return _auth(req, auth_bytes=b"r=nonce,s=c2FsdA==,i=4096")
            if mech in sasl.SCRAM:
                assert self.user is not None
                password = dict(f.split("=", 1) for f in token.decode().split(","))["p"]
                return self._verdict(req, self.user, password, b"v=signature")
            if mech == sasl.OAUTHBEARER:
                name = sasl.claim(mech, token).principal.name
                return self._verdict(req, name, self.kafka.users.get(name, ""), b"")
        except (ValueError, KeyError, sasl.SaslTokenError):
            pass
        return _failed(req, mech)

    def _verdict(self, req: Any, user: str, password: str, final: bytes) -> Any:
        if self.kafka.users.get(user) != password:
            return _failed(req, self.mechanism)
        if self.authenticated is not None and self.authenticated != user:
            return _auth(
                req,
                code=kerr.SaslAuthenticationFailedError.errno,
                message=f"Cannot change principals during re-authentication from User:"
                f"{self.authenticated}: User:{user}",
            )
        self.authenticated = user
        return _auth(req, auth_bytes=final, lifetime=self.kafka.session_lifetime_ms)

    def _metadata(self, req: Any) -> Any:
        self.kafka.metadata_requests += 1
        user = self.authenticated
        names = list(self.kafka.topics) if req.topics is None else [t.name for t in req.topics]
        topics = []
        for name in names:
            ops = self.kafka.acls.get((user or "", name), set())
            if WRITE in ops:
                ops = ops | {DESCRIBE}
            if DESCRIBE not in ops:
                if req.topics is not None:
                    topics.append(_Topic(error_code=29, name=name, partitions=[]))
                continue
            if name not in self.kafka.topics:
                topics.append(_Topic(error_code=3, name=name, partitions=[]))
                continue
            parts = [
                _Partition(error_code=0, partition_index=i, leader_id=1, replica_nodes=[1],
                           isr_nodes=[1], offline_replicas=[])
                for i in range(self.kafka.topics[name])
            ]  # fmt: skip
            topics.append(
                _Topic(error_code=0, name=name, partitions=parts, authorized_operations=ops)
            )
        return MetadataResponse(
            throttle_time_ms=0, brokers=[], cluster_id="fake", controller_id=1, topics=topics,
            version=req.API_VERSION,
        )  # fmt: skip


def _auth(req: Any, *, code: int = 0, message: str | None = None, auth_bytes: bytes = b"",
          lifetime: int = 0) -> Any:  # fmt: skip
    return SaslAuthenticateResponse(
        error_code=code, error_message=message, auth_bytes=auth_bytes,
        session_lifetime_ms=lifetime, version=req.API_VERSION,
    )  # fmt: skip


def _failed(req: Any, mechanism: str | None) -> Any:
    return _auth(
        req,
        code=kerr.SaslAuthenticationFailedError.errno,
        message="Authentication failed during authentication due to invalid credentials with "
        f"SASL mechanism {mechanism}",
    )
