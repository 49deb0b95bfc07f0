"""proxy/http/login.py: the HTTP API's Authorization header, checked by logging in to Kafka, on an
in-process broker link (tests/support/fake_broker_link.py, PLAIN and OAUTHBEARER) and the real
FastAPI application: 401 with WWW-Authenticate for no, malformed or wrong credentials (the
failed ones after the address's backoff, counted), 503 when Kafka cannot be asked, the open
probes, a login reused without its password, and what the caller may do asked of Kafka. The
real Kafka and SCRAM are tests/integration/test_http_auth.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, cast

import httpx
import pytest
from fastapi import Depends, FastAPI

from kdelay import buffer
from kdelay.headers import DelayPolicy
from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import Link, LinkSettings
from kdelay.proxy.auth.jwks import JwksFile
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.http import errors as http_errors
from kdelay.proxy.http.app import create_app
from kdelay.proxy.http.auth import Caller, current_caller
from kdelay.proxy.http.authenticate import Authenticate
from kdelay.proxy.http.credentials import (
    Basic,
    Bearer,
    MalformedCredentialsError,
    parse_authorization,
)
from kdelay.proxy.http.login import HttpAuthenticator, HttpAuthSettings, Timer
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.producer import Upstream
from tests.support.fake_broker_link import WRITE, FakeKafka, FakeLink
from tests.support.fakes import FakeClock, FakeUpstream
from tests.support.jwt_keys import SigningKey, write_jwks

PEER = "127.0.0.1"  # httpx's ASGI transport's client address


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- the header ------------------------------------------------------------------------------


def test_basic_and_bearer_credentials_are_read() -> None:
    assert parse_authorization(None) is None
    assert parse_authorization("  ") is None
    assert parse_authorization(_basic("alice", "p:w")) == Basic("alice", "p:w")
    assert parse_authorization(_basic("élodie", "")) == Basic("élodie", "")
    assert parse_authorization("basic " + _basic("a", "b")[6:]) == Basic("a", "b")
    assert parse_authorization("Bearer a.b.c") == Bearer("a.b.c")
    assert parse_authorization("BEARER  a.b.c ") == Bearer("a.b.c")
    assert "p:w" not in repr(Basic("alice", "p:w"))
    assert "a.b.c" not in repr(Bearer("a.b.c"))


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ("Basic !!!", "not base64"),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "not base64 of UTF-8"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "not user:password"),
        ("Basic " + base64.b64encode(b":pw").decode(), "not user:password"),
        ("Bearer", "not one token"),
        ("Bearer a b", "not one token"),
        ("Digest username=x", "scheme 'Digest' is not accepted"),
    ],
)
def test_a_malformed_header_says_why_without_quoting_it(header: str, why: str) -> None:
    with pytest.raises(MalformedCredentialsError, match=why) as refused:
        parse_authorization(header)
    assert header.partition(" ")[2] not in str(refused.value) or not header.partition(" ")[2]


# -- the application -------------------------------------------------------------------------


class Harness:
    """The proxy's HTTP API with an authenticator on a fake Kafka, on a loop of its own."""

    def __init__(
        self, tmp: Path, *, ttl_s: float = 5.0, jwks: bool = True, slow: bool = False
    ) -> None:
        self.kafka = FakeKafka(
            users={"alice": "pw-a", "carol": "pw-c", "dave": ""},  # dave: OAUTHBEARER
            acls={("alice", "orders"): {WRITE}, ("dave", "orders"): {WRITE}},
            topics={"orders": 2, buffer.BUFFER_TOPIC: 2},
        )
        self.key = SigningKey()
        self.upstream = FakeUpstream(topics={"orders": 2, buffer.BUFFER_TOPIC: 2})
        self.metrics = self.upstream.metrics
        self.backoff = LoginBackoff(0.0, 0.0)
        self.acl_clock = FakeClock()
        self.timers = Timers()
        self.settings = HttpAuthSettings(
            mechanism="PLAIN",
            link=LinkSettings((("127.0.0.1", 1),)),
            cache=AclCache(ttl_s, clock=self.acl_clock.monotonic),
            backoff=self.backoff,
            metrics=self.metrics,
            login_ttl_s=ttl_s,
            jwks=JwksFile(write_jwks(tmp / "jwks.json", self.key)) if jwks else None,
            link_factory=self._slow_link if slow else self.kafka.factory,
            timer=self.timers.call_later,
        )
        self.auth = HttpAuthenticator(self.settings)
        self.app = create_app(
            Topics(self.upstream),
            cast(Upstream, self.upstream),
            self.metrics,
            DelayPolicy(),
            availability=self.upstream.availability,
            auth=self.auth,
        )
        self.loop = asyncio.new_event_loop()
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://proxy")

    def _slow_link(self, _settings: LinkSettings) -> Link:
        link = SlowLink(self.kafka)
        self.kafka.links.append(link)
        return link

    def request(self, method: str, url: str, auth: str | None = None, **kw: Any) -> httpx.Response:
        headers = {"authorization": auth} if auth is not None else {}
        return self.loop.run_until_complete(self.client.request(method, url, headers=headers, **kw))

    def post(self, auth: str | None) -> httpx.Response:
        body = {"topic": "orders", "value": "v", "delay_ms": 60_000}
        return self.request("POST", "/v1/messages", auth, json=body)

    def failures(self, mechanism: str, reason: str) -> float:
        labels = {"mechanism": mechanism, "reason": reason}
        return (
            self.metrics.registry.get_sample_value("kdelay_proxy_auth_failures_total", labels)
            or 0.0
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.auth.close())
        self.loop.close()


class Timers:
    """The logins' expiry timers, fired by the test (:meth:`expire`), never by the loop."""

    def __init__(self) -> None:
        self.pending: list[_Timer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        timer = _Timer(callback)
        self.pending.append(timer)
        return timer

    def expire(self) -> None:
        """Every login's time runs out now."""
        due, self.pending = self.pending, []
        for timer in due:
            if not timer.cancelled:
                timer.callback()


class _Timer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SlowLink(FakeLink):
    """A link whose connection takes a while (other requests arrive meanwhile)."""

    async def connect(self) -> None:
        await asyncio.sleep(0.05)
        await super().connect()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def _unauthorized(resp: httpx.Response, says: str) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert says in resp.json()["error"]
    assert (
        resp.headers["www-authenticate"]
        == 'Basic realm="kdelay", charset="UTF-8", Bearer realm="kdelay"'
    )


def test_probes_and_metrics_stay_open_and_everything_else_needs_credentials(api: Harness) -> None:
    assert api.request("GET", "/healthz").status_code == 200
    assert api.request("GET", "/metrics").status_code == 200
    for method, path in [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/ui/"),
                         ("GET", "/v1/messages/x"), ("DELETE", "/v1/messages/x")]:  # fmt: skip
        _unauthorized(api.request(method, path), "carries no credentials")
    _unauthorized(api.post(None), "carries no credentials")
    assert api.upstream.written == []
    # No credentials is not a failed login: no wait.
    assert api.backoff.failures(PEER) == 0
    assert api.failures("none", "http_missing_credentials") == 6


def test_a_wrong_password_is_401_after_the_backoff_and_counted(api: Harness) -> None:
    _unauthorized(api.post(_basic("alice", "wrong")), "Authentication failed")
    _unauthorized(api.post(_basic("nobody", "pw-a")), "Authentication failed")
    _unauthorized(api.post("Basic %%%"), "not base64")
    assert api.backoff.failures(PEER) == 3
    assert api.failures("PLAIN", "http_invalid_credentials") == 2
    assert api.failures("none", "http_malformed") == 1
    assert all(not link.open for link in api.kafka.links)
    assert api.upstream.written == []


def test_a_right_password_is_accepted_and_its_login_reused_without_the_password(
    api: Harness,
) -> None:
    assert api.post(_basic("alice", "pw-a")).status_code == 202
    assert api.post(_basic("alice", "pw-a")).status_code == 202
    assert len(api.kafka.links) == 1  # one login, reused
    assert len(api.auth) == 1
    assert all(b"pw-a" not in key for key in api.auth.logins())
    _unauthorized(api.post(_basic("alice", "pw-b")), "Authentication failed")  # not the cache
    assert len(api.upstream.written) == 2
    logins = api.metrics.registry.get_sample_value(
        "kdelay_proxy_authentications_total", {"mechanism": "PLAIN", "kind": "http"}
    )
    assert logins == 1


def test_kafka_unreachable_is_503(api: Harness) -> None:
    api.kafka.unreachable = True
    resp = api.post(_basic("alice", "pw-a"))
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"] == "1"
    assert "cannot check the credentials" in resp.json()["error"]
    assert api.failures("PLAIN", "http_upstream_unavailable") == 1


def test_a_bearer_token_of_the_jwks_file_is_accepted_and_a_bad_one_is_401(api: Harness) -> None:
    assert api.post("Bearer " + api.key.token("dave")).status_code == 202
    assert api.kafka.links[-1].authenticated == "dave"  # logged in with OAUTHBEARER
    _unauthorized(api.post("Bearer " + api.key.token("dave", ttl_s=-5)), "has expired")
    _unauthorized(api.post("Bearer " + SigningKey().token("dave")), "no key of http_jwks_file")
    assert api.failures("OAUTHBEARER", "http_invalid_token") == 2


def test_without_a_jwks_file_bearer_tokens_are_refused(tmp_path: Path) -> None:
    api = Harness(tmp_path, jwks=False)
    try:
        resp = api.post("Bearer " + api.key.token("dave"))
        assert resp.status_code == 401
        assert "http_jwks_file is not set" in resp.json()["error"]
        assert resp.headers["www-authenticate"] == 'Basic realm="kdelay", charset="UTF-8"'
    finally:
        api.close()


# -- the caller ------------------------------------------------------------------------------


def _who_app(auth: HttpAuthenticator) -> FastAPI:
    app = FastAPI()
    http_errors.install(app, ProxyMetrics())
    app.add_middleware(Authenticate, authenticator=auth)

    @app.get("/who")
    async def who(caller: Annotated[Caller, Depends(current_caller)]) -> dict[str, object]:
        return {
            "principal": caller.principal,
            "writable": await caller.writable("orders"),
            "admin": await caller.admin(),
        }

    return app


def test_what_a_caller_may_do_is_asked_of_kafka_and_a_lost_link_is_503(api: Harness) -> None:
    api.client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_who_app(api.auth), raise_app_exceptions=False),
        base_url="http://proxy",
    )
    alice = api.request("GET", "/who", _basic("alice", "pw-a"))
    assert alice.json() == {"principal": "User:alice", "writable": True, "admin": False}
    carol = api.request("GET", "/who", _basic("carol", "pw-c"))
    assert carol.json() == {"principal": "User:carol", "writable": False, "admin": False}
    api.acl_clock.advance(api.settings.cache.ttl_s)  # the cached answers expire
    api.kafka.links[0].fail_next = True
    lost = api.request("GET", "/who", _basic("alice", "pw-a"))
    assert lost.status_code == 503
    assert "cannot be asked what User:alice may do" in lost.json()["error"]
    assert len(api.auth) == 1  # alice's login is forgotten: the next request logs in again
    assert api.request("GET", "/who", _basic("alice", "pw-a")).json()["writable"] is True
    assert len(api.kafka.links) == 3


def test_with_no_cache_each_request_logs_in_and_closes_its_connection(tmp_path: Path) -> None:
    api = Harness(tmp_path, ttl_s=0.0)
    try:
        assert api.post(_basic("alice", "pw-a")).status_code == 202
        assert api.post(_basic("alice", "pw-a")).status_code == 202
        assert len(api.kafka.links) == 2
        assert not any(link.open for link in api.kafka.links)
        assert len(api.auth) == 0
    finally:
        api.close()


def test_requests_with_the_same_new_credentials_share_one_login(tmp_path: Path) -> None:
    api = Harness(tmp_path, slow=True)

    async def burst(auth: str, n: int) -> list[int]:
        body = {"topic": "orders", "value": "v", "delay_ms": 60_000}
        answers = await asyncio.gather(
            *(
                api.client.post("/v1/messages", json=body, headers={"authorization": auth})
                for _ in range(n)
            )
        )
        return [a.status_code for a in answers]

    try:
        assert api.loop.run_until_complete(burst(_basic("alice", "pw-a"), 5)) == [202] * 5
        assert len(api.kafka.links) == 1
        assert api.loop.run_until_complete(burst(_basic("carol", "bad"), 4)) == [401] * 4
        assert len(api.kafka.links) == 2
        assert api.backoff.failures(PEER) == 1  # one failed login, answered four times
    finally:
        api.close()


def test_close_closes_every_kept_login(api: Harness) -> None:
    assert api.post(_basic("alice", "pw-a")).status_code == 202
    assert api.post("Bearer " + api.key.token("dave")).status_code == 202
    assert [link.open for link in api.kafka.links] == [True, True]
    api.loop.run_until_complete(api.auth.close())
    assert [link.open for link in api.kafka.links] == [False, False]
    assert len(api.auth) == 0


def test_a_login_that_expires_while_a_request_uses_it_closes_after_that_request(
    tmp_path: Path,
) -> None:
    api = Harness(tmp_path)

    async def request_outliving_its_login() -> tuple[bool, bool, bool]:
        caller = await api.auth.caller(_basic("alice", "pw-a"), PEER)
        api.timers.expire()  # the login's time runs out
        retired_but_open = len(api.auth) == 0 and api.kafka.links[0].open
        writable = await caller.writable("orders")
        await api.auth.done(caller)
        return retired_but_open, writable, api.kafka.links[0].open

    try:
        assert api.loop.run_until_complete(request_outliving_its_login()) == (True, True, False)
    finally:
        api.close()
