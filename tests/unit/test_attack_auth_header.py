"""Attack: what is logged, and who you are.

- A hostile ``Authorization`` header (an unknown scheme, garbage, a JWT whose header names an
  invented key or algorithm) carries a marker; neither the proxy's log nor any response holds
  it afterwards (a header is an attacker's text: a log injection, or a password typed in the
  wrong field, must not be written out).
- ``alice`` and ``alice\\u00ad`` (a soft hyphen, which SASLprep maps to nothing) are one HTTP
  principal: the SCRAM library kdelay logs in with prepares the name, Kafka authenticates the
  prepared ``alice``, and the proxy's principal and ACL cache key must be that name, not the one
  the header spelled (otherwise Kafka's answers for alice are cached, and messages owned, under
  a name Kafka never authenticated, which another Kafka user may hold).
- On the Kafka listener the principal stays what the client's token names, unprepared: Kafka's
  SCRAM server does not SASLprep (kafka-clients' ScramFormatter), so ``alice\\u00ad`` there is
  another Kafka user, and must stay another principal.

In process: the real FastAPI application and authenticator on an in-process broker link whose
SCRAM is scramp's server (tests/support/fake_broker_link.py's FakeLink otherwise)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from scramp import ScramException, ScramMechanism
from structlog.testing import capture_logs

from kdelay import buffer
from kdelay.headers import DelayPolicy
from kdelay.proxy import sasl
from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import Link, LinkSettings
from kdelay.proxy.auth.jwks import JwksFile
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.auth.saslprep import InvalidNameError, saslprep
from kdelay.proxy.http.app import create_app
from kdelay.proxy.http.login import HttpAuthenticator, HttpAuthSettings
from kdelay.proxy.kafka.auth_session import AuthSession
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.producer import Upstream
from kdelay.proxy.wire import protocol as p
from tests.support.fake_broker_link import WRITE, FakeKafka, FakeLink, _auth, _failed
from tests.support.fakes import FakeUpstream
from tests.support.jwt_keys import SigningKey, write_jwks

PEER = "127.0.0.1"
MARK = "Zq7MARKx"
SOFT_HYPHEN = "\u00ad"


def _basic(user: str | bytes, secret: str = "") -> str:
    raw = user if isinstance(user, bytes) else f"{user}:{secret}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class ScramLink(FakeLink):
    """A link whose SCRAM is real (scramp's server) and reads the user name as Kafka does:
    ``=2C``/``=3D`` unescaped, nothing prepared (kafka-clients' ScramFormatter.username)."""

    def __init__(self, kafka: FakeKafka) -> None:
        super().__init__(kafka)
        self._server: Any = None

    def authenticate(self, req: Any) -> Any:
        mech = self.mechanism
        if mech not in sasl.SCRAM:
            return super().authenticate(req)
        token = bytes(req.auth_bytes).decode()
        if self._server is None:
            name = sasl.claim(mech, token.encode()).principal.name
            password = self.kafka.users.get(name)
            if password is None:
                return _failed(req, mech)
            info = ScramMechanism(mech).make_auth_info(password, iteration_count=4096)
            self._server = ScramMechanism(mech).make_server(lambda _name: info)
            self._server.set_client_first(token)
            self.user = name
            return _auth(req, auth_bytes=self._server.get_server_first().encode())
        try:
            self._server.set_client_final(token)
        except ScramException:
            return _failed(req, mech)
        assert self.user is not None
        self.authenticated = self.user
        return _auth(req, auth_bytes=self._server.get_server_final().encode())


class Api:
    """The HTTP API authenticating with ``mechanism`` against a fake Kafka, on its own loop."""

    def __init__(self, tmp: Path, mechanism: str) -> None:
        self.kafka = FakeKafka(
            users={"alice": "pw-a"},
            acls={("alice", "orders"): {WRITE}},
            topics={"orders": 1, buffer.BUFFER_TOPIC: 1},
        )
        self.key = SigningKey()
        self.cache = AclCache(60.0)
        upstream = FakeUpstream(topics={"orders": 1, buffer.BUFFER_TOPIC: 1})
        self.metrics = upstream.metrics
        self.auth = HttpAuthenticator(
            HttpAuthSettings(
                mechanism=mechanism,
                link=LinkSettings((("127.0.0.1", 1),)),
                cache=self.cache,
                backoff=LoginBackoff(0.0, 0.0),
                metrics=self.metrics,
                login_ttl_s=60.0,
                jwks=JwksFile(write_jwks(tmp / "jwks.json", self.key)),
                link_factory=self._link,
            )
        )
        self.app = create_app(
            Topics(upstream),
            cast(Upstream, upstream),
            self.metrics,
            DelayPolicy(),
            availability=upstream.availability,
            auth=self.auth,
        )
        self.loop = asyncio.new_event_loop()
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://proxy")

    def _link(self, _settings: LinkSettings) -> Link:
        link = ScramLink(self.kafka)
        self.kafka.links.append(link)
        return link

    def post(self, auth: str) -> httpx.Response:
        body = {"topic": "orders", "value": "v", "delay_ms": 60_000}
        request = self.client.post("/v1/messages", json=body, headers={"authorization": auth})
        return self.loop.run_until_complete(request)

    def principal(self, auth: str) -> str | None:
        async def ask() -> str | None:
            caller = await self.auth.caller(auth, PEER)
            await self.auth.done(caller)
            return caller.principal

        return self.loop.run_until_complete(ask())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.auth.close())
        self.loop.close()


@pytest.fixture(params=["SCRAM-SHA-512", "PLAIN"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    harness = Api(tmp_path, request.param)
    try:
        yield harness
    finally:
        harness.close()


# -- nothing of a hostile header is written out ----------------------------------------------


def _forged_jwt(key: SigningKey, **header: str) -> str:
    """A JWT signed by ``key`` whose header carries ``header`` (kid, alg) as given."""
    token = key.token("alice")
    _, body, signature = token.split(".")
    head = {"typ": "JWT", "alg": "RS256", **header}
    encoded = base64.urlsafe_b64encode(json.dumps(head).encode()).rstrip(b"=").decode()
    return f"{encoded}.{body}.{signature}"


def _hostile_headers(api: Api) -> list[str]:
    return [
        f"{MARK} credentials",
        f"Digest{MARK} username=x",
        f"Basic {MARK}",
        _basic(MARK.encode()),  # no colon
        _basic(b"\xff" + MARK.encode() + b":pw"),  # not UTF-8
        _basic(f"{MARK}\x07", "pw"),  # a control character: SASLprep prohibits it
        _basic(f"\u0627{MARK}", "pw"),  # a malformed bidirectional string
        _basic(MARK, MARK),  # an unknown user: Kafka refuses
        f"Bearer {MARK} x",
        f"Bearer {MARK}",
        "Bearer " + _forged_jwt(api.key, kid=MARK),
        "Bearer " + _forged_jwt(api.key, alg=MARK),
        "Bearer " + _forged_jwt(api.key, alg=MARK[:4]),
    ]


def test_a_hostile_authorization_header_is_never_echoed(api: Api) -> None:
    with capture_logs() as logs:
        responses = [api.post(header) for header in _hostile_headers(api)]
    for header, resp in zip(_hostile_headers(api), responses, strict=True):
        assert resp.status_code == 401, (header, resp.text)
        assert MARK not in resp.text, (header, resp.text)
        assert MARK not in str(resp.headers), header
    assert logs, "the failed logins are logged"
    assert MARK not in repr(logs), [e for e in logs if MARK in repr(e)][:2]
    assert MARK not in api.metrics.exposition().decode()


# -- one principal, the one Kafka authenticated ---------------------------------------------


def test_the_http_principal_is_the_name_kafka_authenticated(api: Api) -> None:
    principal = api.principal(_basic("alice" + SOFT_HYPHEN, "pw-a"))
    authenticated = api.kafka.links[-1].authenticated
    assert authenticated == "alice"  # what the login sent, prepared, and Kafka authenticated
    assert principal == f"User:{authenticated}"


def test_alice_and_alice_with_a_soft_hyphen_are_one_principal_and_one_cache_key(
    api: Api,
) -> None:
    assert api.post(_basic("alice" + SOFT_HYPHEN, "pw-a")).status_code == 202
    # Kafka's answer for alice is cached under alice, never under the spelling of the header.
    assert api.cache.get(sasl.Principal("alice"), "orders") is not None
    assert api.cache.get(sasl.Principal("alice" + SOFT_HYPHEN), "orders") is None
    assert len(api.cache) == 1
    assert api.post(_basic("alice", "pw-a")).status_code == 202
    assert len(api.cache) == 1
    assert api.principal(_basic("alice", "pw-a")) == api.principal(
        _basic("alice" + SOFT_HYPHEN, "pw-a")
    )


def test_on_the_kafka_listener_the_principal_is_the_unprepared_name_kafka_reads() -> None:
    """Kafka does not SASLprep SCRAM names: a client sending ``alice\\u00ad`` (as Kafka's Java
    client and librdkafka do, unprepared) is that Kafka user, another than alice, and the
    proxy's principal must be it too (the fake link's toy SCRAM reads the name as Kafka does)."""
    odd = "alice" + SOFT_HYPHEN
    kafka = FakeKafka(users={odd: "pw-odd", "alice": "pw-a"})

    async def run() -> sasl.Principal | None:
        settings = AuthSettings(
            mechanisms=("SCRAM-SHA-512",),
            link=LinkSettings((("127.0.0.1", 1),)),
            cache=AclCache(5.0),
            backoff=LoginBackoff(0.0, 0.0),
            metrics=FakeUpstream().metrics,
            link_factory=kafka.factory,
        )
        session = AuthSession(settings, PEER)
        first, final = f"n,,n={odd},r=abc".encode(), b"c=biws,r=nonce,p=pw-odd"
        rounds: list[tuple[int, Any]] = [
            (p.SASL_HANDSHAKE, SaslHandshakeRequest(mechanism="SCRAM-SHA-512", version=1)),
            (p.SASL_AUTHENTICATE, SaslAuthenticateRequest(auth_bytes=first, version=2)),
            (p.SASL_AUTHENTICATE, SaslAuthenticateRequest(auth_bytes=final, version=2)),
        ]
        for cid, (key, body) in enumerate(rounds):
            screened = await session.screen(p.Request(key, body.API_VERSION, cid, "t", body))
            assert screened is not None
            assert screened.close is None
        await session.close()
        return session.principal

    principal = asyncio.run(run())
    assert kafka.links[-1].authenticated == odd
    assert principal == sasl.Principal(odd)
    assert str(principal) != "User:alice"


# -- SASLprep itself (RFC 4013 section 3's examples) -----------------------------------------


@pytest.mark.parametrize(
    ("raw", "prepared"),
    [
        ("I\u00adX", "IX"),  # soft hyphen mapped to nothing
        ("user", "user"),
        ("USER", "USER"),  # case preserved
        ("\u00aa", "a"),  # NFKC
        ("\u2168", "IX"),  # NFKC
        ("a\u00a0b", "a b"),  # a non-ASCII space mapped to SPACE
        ("a\u200bb", "ab"),  # zero width space: mapped to nothing
    ],
)
def test_saslprep_maps_and_normalises(raw: str, prepared: str) -> None:
    assert saslprep(raw) == prepared


@pytest.mark.parametrize(
    "raw",
    ["\u0007", "a\x00b", "\u0627\u0031", "\ue000", "\u00ad", "", "a\U000e0001"],
)
def test_saslprep_refuses_prohibited_names_without_quoting_them(raw: str) -> None:
    with pytest.raises(InvalidNameError) as refused:
        saslprep(raw)
    assert raw not in str(refused.value) or not raw
