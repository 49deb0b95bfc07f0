"""SASL on the Kafka listener against an in-process broker link (tests/support/fake_broker_link.py):
the login relayed and its principal, Kafka's answers to every way of getting it wrong, the limits
before authentication, re-authentication and session expiry (KIP-368), and Kafka's ACLs at
Produce and Metadata, cached per principal and topic. The real thing, with real clients and a
real Kafka, is tests/integration/test_proxy_sasl.py."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as kerr
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import LinkSettings
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.server import KafkaServer, Limits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Outgoing
from kdelay.proxy.routing.topics import Advertised, TopicInfo, Topics
from kdelay.proxy.wire import protocol as p
from tests.support.fake_broker_link import WRITE, FakeKafka
from tests.support.fakes import FakeClock
from tests.support.raw_client import metadata_request, produce_request, record_batch

DEADLINE_S = 10.0
AUTH_FAILED = kerr.SaslAuthenticationFailedError.errno
ILLEGAL = kerr.IllegalSaslStateError.errno
DENIED = kerr.TopicAuthorizationFailedError.errno


class AckingUpstream:
    """Acknowledges every batch at once; every topic exists with one partition."""

    cluster_id: str | None = "fake"

    def __init__(self) -> None:
        self.submitted: list[list[Outgoing]] = []

    async def submit(self, records: list[Outgoing]) -> asyncio.Future[int]:
        self.submitted.append(list(records))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future

    def topic(self, name: str, *, create: bool) -> TopicInfo:
        return TopicInfo(0, 1)

    def all_topics(self) -> dict[str, TopicInfo]:
        return {"t": TopicInfo(0, 1)}


@dataclass
class Harness:
    port: int
    kafka: FakeKafka
    metrics: ProxyMetrics
    clock: FakeClock
    upstream: AckingUpstream
    backoff: LoginBackoff
    clients: list[Client] = field(default_factory=list)

    def failures(self, mechanism: str, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "kdelay_proxy_auth_failures_total", {"mechanism": mechanism, "reason": reason}
        )
        return value or 0.0

    async def client(self) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(Client(reader, writer))
        return self.clients[-1]


@contextlib.asynccontextmanager
async def _listener(
    *,
    timeout_s: float = 30.0,
    real_clock: bool = False,
    max_receive: int = 524_288,
    acl_ttl_s: float = 5.0,
) -> AsyncIterator[Harness]:
    kafka = FakeKafka(
        users={"alice": "alice-pw", "bob": "bob-pw", "a,b=c": "odd-pw"},
        acls={("alice", "t"): {WRITE}},
        topics={"t": 1, "u": 1},
    )
    clock, metrics, upstream = FakeClock(), ProxyMetrics(), AckingUpstream()
    now = asyncio.get_running_loop().time if real_clock else clock.monotonic
    backoff = LoginBackoff(0.0, 0.0, clock=now)
    auth = AuthSettings(
        mechanisms=("SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"),
        link=LinkSettings((("127.0.0.1", 1),)),
        cache=AclCache(acl_ttl_s, clock=now),
        backoff=backoff,
        metrics=metrics,
        timeout_s=timeout_s,
        max_receive_bytes=max_receive,
        clock=now,
        link_factory=kafka.factory,
    )
    server = KafkaServer(metrics, Limits(), auth=auth)
    host, port = await server.bind("127.0.0.1", 0)
    broker = Broker(upstream, Topics(upstream), metrics, Advertised(1, host, port), sasl=True)
    await server.serve(broker)
    try:
        harness = Harness(port, kafka, metrics, clock, upstream, backoff)
        yield harness
    finally:
        for c in harness.clients:
            c.close()
            with contextlib.suppress(ConnectionError):
                await c.writer.wait_closed()
        await server.close()


class Client:
    """A raw client speaking one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.cid = 0

    async def send(self, request: Any) -> None:
        self.cid += 1
        request.with_header(correlation_id=self.cid, client_id="t")
        self.writer.write(bytes(request.encode(header=True, framed=True)))
        await self.writer.drain()

    async def call(self, request: Any) -> Any:
        await self.send(request)
        async with asyncio.timeout(DEADLINE_S):
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            frame = await self.reader.readexactly(size)
        spec = {**p.APIS, **p.SASL_APIS}[request.API_KEY]
        return spec.response.decode(frame, version=request.API_VERSION, header=True)

    async def closed(self) -> bool:
        """Whether the proxy closes the connection (EOF) before the deadline."""
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(DEADLINE_S):
                while await self.reader.read(65536):
                    pass
        self.close()
        return True

    async def handshake(self, mechanism: str) -> Any:
        return await self.call(SaslHandshakeRequest(mechanism=mechanism, version=1))

    async def authenticate(self, token: bytes, version: int = 2) -> Any:
        return await self.call(SaslAuthenticateRequest(auth_bytes=token, version=version))

    async def plain(self, user: str, password: str) -> Any:
        assert (await self.handshake("PLAIN")).error_code == 0
        return await self.authenticate(f"\0{user}\0{password}".encode())

    def close(self) -> None:
        self.writer.close()


def _versions() -> Any:
    return ApiVersionsRequest(client_software_name="t", client_software_version="1", version=3)


def _produce(topic: str = "t", headers: list[tuple[str, bytes]] | None = None) -> Any:
    return produce_request(topic, 0, record_batch([(b"k", b"v", headers or [])]))


def _errors(resp: Any) -> dict[str, int]:
    return {t.name: pr.error_code for t in resp.responses for pr in t.partition_responses}


def test_api_versions_lists_the_sasl_apis_of_a_sasl_listener() -> None:
    async def run() -> None:
        async with _listener() as h:
            c = await h.client()
            resp = await c.call(_versions())
            keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
            assert keys[p.SASL_HANDSHAKE] == (0, 1)  # as Kafka 4.3
            assert keys[p.SASL_AUTHENTICATE] == (0, 2)
            c.close()

    asyncio.run(run())


def test_plain_login_then_writes_only_where_kafka_allows() -> None:
    async def run() -> None:
        async with _listener() as h:
            c = await h.client()
            assert (await c.call(_versions())).error_code == 0
            resp = await c.plain("alice", "alice-pw")
            assert resp.error_code == 0
            assert _errors(await c.call(_produce("t"))) == {"t": 0}
            delayed = [("kdelay-delay-ms", b"60000")]
            assert _errors(await c.call(_produce("t", delayed))) == {"t": 0}
            refused = await c.call(_produce("u", delayed))
            assert _errors(refused) == {"u": DENIED}
            message = refused.responses[0].partition_responses[0].error_message
            assert "User:alice" in message
            assert "WRITE topic u" in message
            assert len(h.upstream.submitted) == 2  # nothing of the refused batch went upstream
            rejected = h.metrics.registry.get_sample_value(
                "kdelay_proxy_records_rejected_total", {"reason": "topic_authorization"}
            )
            assert rejected == 1
            c.close()

    asyncio.run(run())


def test_scram_login_relays_both_rounds_and_names_the_unescaped_user() -> None:
    async def run() -> None:
        async with _listener() as h:
            c = await h.client()
            assert (await c.handshake("SCRAM-SHA-512")).error_code == 0
            first = await c.authenticate(b"n,,n=a=2Cb=3Dc,r=nonce")
            assert (first.error_code, bytes(first.auth_bytes)) == (0, b"r=nonce,s=c2FsdA==,i=4096")
            final = await c.authenticate(b"c=biws,r=nonce,p=odd-pw")
            assert (final.error_code, bytes(final.auth_bytes)) == (0, b"v=signature")
            h.kafka.acls[("a,b=c", "u")] = {WRITE}
            assert _errors(await c.call(_produce("u"))) == {"u": 0}
            c.close()

    asyncio.run(run())


def test_a_wrong_password_gets_kafkas_error_and_the_connection_closes() -> None:
    async def run() -> None:
        async with _listener() as h:
            c = await h.client()
            assert (await c.handshake("SCRAM-SHA-512")).error_code == 0
            assert (await c.authenticate(b"n,,n=alice,r=x")).error_code == 0
            resp = await c.authenticate(b"c=biws,r=x,p=guess")
            assert resp.error_code == AUTH_FAILED
            assert resp.error_message == (
                "Authentication failed during authentication due to invalid credentials "
                "with SASL mechanism SCRAM-SHA-512"
            )
            assert await c.closed()
            assert h.failures("SCRAM-SHA-512", "invalid_credentials") == 1
            assert h.backoff.failures("127.0.0.1") == 1
            # Everyone else is served as before.
            other = await h.client()
            assert (await other.plain("alice", "alice-pw")).error_code == 0
            other.close()

    asyncio.run(run())


def test_an_unknown_mechanism_gets_the_enabled_list_and_the_connection_closes() -> None:
    async def run() -> None:
        async with _listener() as h:
            c = await h.client()
            resp = await c.handshake("GSSAPI")
            assert resp.error_code == kerr.UnsupportedSaslMechanismError.errno
            assert resp.mechanisms == ["SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"]
            assert await c.closed()
            assert h.failures("other", "unsupported_mechanism") == 1
            assert h.kafka.links == []  # refused before asking the broker

    asyncio.run(run())


def test_requests_out_of_order_get_kafkas_answers() -> None:
    async def run() -> None:
        async with _listener() as h:
            # A Produce before logging in: closed unanswered, as Kafka does.
            c = await h.client()
            await c.send(_produce("t"))
            assert await c.closed()
            assert h.upstream.submitted == []
            # SaslAuthenticate before SaslHandshake: ILLEGAL_SASL_STATE, then closed.
            c = await h.client()
            resp = await c.authenticate(b"\0alice\0alice-pw")
            assert resp.error_code == ILLEGAL
            assert await c.closed()
            # A second handshake in the middle of an exchange.
            c = await h.client()
            assert (await c.handshake("SCRAM-SHA-512")).error_code == 0
            assert (await c.handshake("PLAIN")).error_code == ILLEGAL
            assert await c.closed()
            # SaslAuthenticate after success: ILLEGAL_SASL_STATE, and the connection stays.
            c = await h.client()
            assert (await c.plain("alice", "alice-pw")).error_code == 0
            assert (await c.authenticate(b"again")).error_code == ILLEGAL
            assert _errors(await c.call(_produce("t"))) == {"t": 0}
            c.close()
            assert h.failures("none", "illegal_state") == 2
            assert h.failures("SCRAM-SHA-512", "illegal_state") == 1
            assert h.failures("PLAIN", "illegal_state") == 1

    asyncio.run(run())


def test_malformed_and_oversized_frames_before_login_close_only_their_connection() -> None:
    async def run() -> None:
        async with _listener(max_receive=4096) as h:
            bystander = await h.client()
            assert (await bystander.plain("bob", "bob-pw")).error_code == 0
            # A username's bytes read as a request header (a client sending raw SASL tokens).
            raw = await h.client()
            raw.writer.write(struct.pack(">i", 12) + b"alice\0secret")
            assert await raw.closed()
            # A huge frame announced before authentication.
            big = await h.client()
            big.writer.write(struct.pack(">i", 5_000) + b"\0" * 100)
            assert await big.closed()
            # A SaslAuthenticate whose body is cut short.
            cut = await h.client()
            assert (await cut.handshake("PLAIN")).error_code == 0
            frame = struct.pack(">hhih", p.SASL_AUTHENTICATE, 2, 9, 1) + b"t\x00\x05"
            cut.writer.write(struct.pack(">i", len(frame)) + frame)
            assert await cut.closed()
            assert h.failures("none", "malformed") == 2
            assert h.failures("PLAIN", "malformed") == 1
            # The authenticated bystander may send a frame above the login limit.
            big_batch = record_batch([(b"k", b"x" * 6000, [])])
            resp = await bystander.call(produce_request("t", 0, big_batch))
            assert _errors(resp) == {"t": DENIED}  # bob has no ACL: Kafka's answer, not a close
            bystander.close()

    asyncio.run(run())


def test_a_client_that_never_logs_in_is_closed_after_the_time_limit() -> None:
    async def run() -> None:
        async with _listener(timeout_s=0.3, real_clock=True) as h:
            ok = await h.client()  # logged in in time: it stays, though connected longest
            assert (await ok.plain("alice", "alice-pw")).error_code == 0
            quiet = await h.client()
            chatty = await h.client()
            assert (await chatty.call(_versions())).error_code == 0
            assert await quiet.closed()
            assert await chatty.closed()  # ApiVersions alone is no login
            assert h.failures("none", "timeout") == 2
            assert _errors(await ok.call(_produce("t"))) == {"t": 0}
            ok.close()

    asyncio.run(run())


def test_reauthentication_keeps_the_connection_and_the_principal() -> None:
    async def run() -> None:
        async with _listener() as h:
            h.kafka.session_lifetime_ms = 1_000
            c = await h.client()
            first = await c.plain("alice", "alice-pw")
            assert first.session_lifetime_ms == 1_000
            h.clock.advance(0.9)
            again = await c.plain("alice", "alice-pw")  # KIP-368, within the lifetime
            assert (again.error_code, again.session_lifetime_ms) == (0, 1_000)
            h.clock.advance(0.9)  # 1.8 s after the first login, 0.9 s after the second
            assert _errors(await c.call(_produce("t"))) == {"t": 0}
            assert len(h.kafka.links) == 1  # one link, re-authenticated too
            # Another principal on the same connection is refused, and the connection closed.
            other = await c.plain("bob", "bob-pw")
            assert other.error_code == AUTH_FAILED
            assert "Cannot change principals" in other.error_message
            assert await c.closed()

    asyncio.run(run())


def test_a_session_used_after_its_lifetime_is_closed() -> None:
    async def run() -> None:
        async with _listener() as h:
            h.kafka.session_lifetime_ms = 1_000
            c = await h.client()
            assert (await c.plain("alice", "alice-pw")).error_code == 0
            h.clock.advance(1.0)
            await c.send(_produce("t"))
            assert await c.closed()
            assert h.failures("PLAIN", "session_expired") == 1
            assert h.upstream.submitted == []

    asyncio.run(run())


def test_acl_answers_are_cached_per_principal_and_a_revocation_applies_after_the_ttl() -> None:
    async def run() -> None:
        async with _listener(acl_ttl_s=5.0) as h:
            a1, a2, b = await h.client(), await h.client(), await h.client()
            for c, user in ((a1, "alice"), (a2, "alice"), (b, "bob")):
                assert (await c.plain(user, f"{user}-pw")).error_code == 0
            assert _errors(await a1.call(_produce("t"))) == {"t": 0}
            assert _errors(await a2.call(_produce("t"))) == {"t": 0}
            assert _errors(await b.call(_produce("t"))) == {"t": DENIED}
            assert h.kafka.metadata_requests == 2  # alice's answer served both her connections
            del h.kafka.acls[("alice", "t")]  # revoked in Kafka
            assert _errors(await a1.call(_produce("t"))) == {"t": 0}  # cached
            h.clock.advance(5.0)
            assert _errors(await a1.call(_produce("t"))) == {"t": DENIED}
            assert _errors(await a2.call(_produce("t"))) == {"t": DENIED}
            for c in (a1, a2, b):
                c.close()

    asyncio.run(run())


def test_metadata_shows_only_what_kafka_shows_the_principal() -> None:
    async def run() -> None:
        async with _listener() as h:
            h.kafka.topics["__kdelay_checkpoint"] = 3
            h.kafka.acls[("alice", "__kdelay_checkpoint")] = {WRITE}
            c = await h.client()
            assert (await c.plain("alice", "alice-pw")).error_code == 0
            listing = await c.call(metadata_request(None))
            assert [t.name for t in listing.topics] == ["t"]  # not u, nor the internal topic
            named = await c.call(metadata_request(["t", "u", "__kdelay_checkpoint"]))
            assert {t.name: t.error_code for t in named.topics} == {
                "t": 0,
                "u": DENIED,
                "__kdelay_checkpoint": DENIED,
            }
            assert isinstance(named, MetadataResponse)
            assert [(b.host, b.port) for b in named.brokers] == [("127.0.0.1", h.port)]
            c.close()

    asyncio.run(run())


def test_a_lost_link_closes_the_connection_and_the_client_logs_in_again() -> None:
    async def run() -> None:
        async with _listener(acl_ttl_s=0) as h:
            c = await h.client()
            assert (await c.plain("alice", "alice-pw")).error_code == 0
            h.kafka.links[0].fail_next = True
            await c.send(_produce("t"))
            assert await c.closed()
            assert h.upstream.submitted == []
            again = await h.client()
            assert (await again.plain("alice", "alice-pw")).error_code == 0
            assert _errors(await again.call(_produce("t"))) == {"t": 0}
            again.close()
            # Kafka unreachable at login: the handshake is answered without upstream (issue
            # 45); the first round finds no link and is closed unanswered, so the client retries.
            h.kafka.unreachable = True
            c = await h.client()
            links = len(h.kafka.links)
            handshake = await c.call(SaslHandshakeRequest(mechanism="PLAIN", version=1))
            assert handshake.error_code == 0
            assert len(h.kafka.links) == links  # nothing opened upstream for a handshake
            await c.send(SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-pw", version=2))
            assert await c.closed()
            assert h.failures("PLAIN", "upstream_unavailable") == 1

    asyncio.run(run())


def test_a_listener_without_sasl_answers_sasl_requests_illegal_state() -> None:
    async def run() -> None:
        upstream, metrics = AckingUpstream(), ProxyMetrics()
        server = KafkaServer(metrics, Limits())
        host, port = await server.bind("127.0.0.1", 0)
        await server.serve(Broker(upstream, Topics(upstream), metrics, Advertised(1, host, port)))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            c = Client(reader, writer)
            versions = await c.call(_versions())
            assert isinstance(versions, ApiVersionsResponse)
            assert p.SASL_HANDSHAKE not in {k.api_key for k in versions.api_keys}
            hs = await c.handshake("PLAIN")
            assert isinstance(hs, SaslHandshakeResponse)
            assert hs.error_code == ILLEGAL
            auth = await c.authenticate(b"x")
            assert isinstance(auth, SaslAuthenticateResponse)
            assert auth.error_code == ILLEGAL
            assert "does not speak SASL" in auth.error_message
            assert _errors(await c.call(_produce("t"))) == {"t": 0}  # still open
            c.close()
        finally:
            await server.close()

    asyncio.run(run())
