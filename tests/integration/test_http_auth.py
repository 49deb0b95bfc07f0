"""The HTTP API on HTTPS, authenticated with Kafka's principals.

A real Kafka 4.x with a SASL_SSL listener, SCRAM users and KRaft's StandardAuthorizer
(tests/support/secure_kafka.py), whose OAUTHBEARER accepts only JWTs signed by a key of a JWKS
file (Kafka's own validator); ``kdelay proxy`` (a process, at DEBUG) with ``http_auth=kafka``,
the same JWKS file, and HTTPS with a certificate of the local CA. What a user sees: plain HTTP to
the port fails; no, wrong or invalid credentials are 401 naming both schemes, failed logins
slowed down by the backoff; alice, allowed WRITE on a topic, schedules a message a replica
delivers; carol, not allowed, gets 403; a JWT signed by a key of the JWKS file is accepted (by
the proxy and by Kafka), an expired one or one of another key is 401; the probes and /metrics
answer without credentials; no password or token reaches the proxy's log or /metrics.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dev.stack import KDELAY, ManagedProcess, free_port, wait_until
from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from tests.support.infra import ZooKeeperInfra
from tests.support.jwt_keys import SigningKey, write_jwks
from tests.support.kafka_helpers import consume_until, create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import SecureKafka, secured_kafka

REFUSED_LOGIN = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512"
)
CHALLENGE = 'Basic realm="kdelay", charset="UTF-8", Bearer realm="kdelay"'


@dataclass
class Keys:
    signer: SigningKey
    jwks: Path


@dataclass
class HttpProxy:
    """``kdelay proxy`` serving its HTTP API on HTTPS with authentication."""

    url: str
    log: Path
    client: httpx.Client
    proc: ManagedProcess

    def post(self, auth: str | None, **body: Any) -> httpx.Response:
        headers = {"authorization": auth} if auth is not None else {}
        return self.client.post(f"{self.url}/v1/messages", json=body, headers=headers)

    def metrics(self) -> str:
        return self.client.get(f"{self.url}/metrics").text


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    signer = SigningKey()
    return Keys(signer, write_jwks(tmp_path_factory.mktemp("jwks") / "jwks.json", signer))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> Iterator[SecureKafka]:
    base = tmp_path_factory.mktemp("http-auth")
    with secured_kafka(base, "SASL_SSL", jwks_file=keys.jwks) as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(
    secure: SecureKafka, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpProxy]:
    ca = secure.local.ca
    assert ca is not None
    port, http = free_port(), free_port()
    upstream = {k: str(v) for k, v in secure.client("kdelay").items()}
    env = {
        **os.environ,
        "KDELAY_PROXY_UPSTREAM_CONFIG": json.dumps(upstream),
        "KDELAY_PROXY_LOG_LEVEL": "DEBUG",
    }
    log = tmp_path_factory.mktemp("http-auth-proxy") / "proxy.log"
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
        "--bootstrap-servers", secure.secure, "--buffer-partitions", "3",
        "--http-auth", "kafka", "--http-tls-cert", str(ca.server_cert),
        "--http-tls-key", str(ca.server_key), "--http-jwks-file", str(keys.jwks),
        "--listener-allow-unauthenticated",  # the HTTP API is under test, not the listener
    ]  # fmt: skip
    proc = ManagedProcess("proxy", argv, log, env=env)
    client = httpx.Client(verify=ssl.create_default_context(cafile=str(ca.ca_cert)), timeout=30)
    url = f"https://127.0.0.1:{http}"

    def healthy() -> bool:
        try:
            return client.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    proc.start()
    try:
        wait_until(healthy, timeout=90, what="the proxy's HTTPS API", interval=0.25, proc=proc)
        yield HttpProxy(url, log, client, proc)
    finally:
        client.close()
        proc.stop()


def _events(log: Path) -> list[dict[str, Any]]:
    """The proxy's structured log events (one JSON object a line)."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def _topic(secure: SecureKafka, *writers: str) -> str:
    topic = unique_topic("http-auth")
    create_topic(secure.plain, topic, partitions=1)
    for user in writers:
        secure.grant(user, topic)
    return topic


def _unauthorized(resp: httpx.Response, says: str) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert says in resp.json()["error"]
    assert resp.headers["www-authenticate"] == CHALLENGE


def test_the_api_speaks_https_only(proxy: HttpProxy) -> None:
    assert proxy.client.get(f"{proxy.url}/healthz").json() == {"status": "ok"}
    with pytest.raises(httpx.TransportError):
        httpx.get(proxy.url.replace("https://", "http://") + "/healthz", timeout=10)


def test_no_credentials_is_401_naming_both_schemes(secure: SecureKafka, proxy: HttpProxy) -> None:
    topic = _topic(secure, "alice")
    _unauthorized(proxy.post(None, topic=topic, value="v", delay_ms=1000), "no credentials")
    resp = proxy.client.get(f"{proxy.url}/v1/messages/some-id")
    _unauthorized(resp, "no credentials")


def test_a_wrong_password_is_401_with_kafkas_message_after_the_backoff(
    secure: SecureKafka, proxy: HttpProxy
) -> None:
    topic = _topic(secure, "alice")
    for _ in range(2):
        wrong = _basic("alice", f"wrong-{uuid.uuid4().hex}")
        _unauthorized(proxy.post(wrong, topic=topic, value="v", delay_ms=1000), REFUSED_LOGIN)
    # The proxy waited before each answer, twice as long the second time (the address's
    # backoff, auth_failure_delay_ms 100 ms doubling), and counted both.
    delays = [
        float(event["delay_s"])
        for event in _events(proxy.log)
        if event.get("event") == "proxy.http_authentication_failed"
        and event.get("reason") == "http_invalid_credentials"
    ]
    assert len(delays) >= 2
    assert delays[-2] >= 0.1
    assert delays[-1] == min(2 * delays[-2], 5.0)
    counted = re.search(
        r'kdelay_proxy_auth_failures_total\{mechanism="SCRAM-SHA-512",'
        r'reason="http_invalid_credentials"\} ([\d.]+)',
        proxy.metrics(),
    )
    assert counted is not None
    assert float(counted.group(1)) >= 2


def test_alice_allowed_write_schedules_a_message_that_is_delivered(
    secure: SecureKafka, proxy: HttpProxy, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = _topic(secure, "alice")
    msg_id = uuid.uuid4().hex
    with ReplicaSet(
        tmp_path, secure.plain, zookeeper.connect, count=1, partitions=3,
        buffer_topic=buffer.BUFFER_TOPIC,
    ) as rs:  # fmt: skip
        rs.start_all()
        rs.wait_master(timeout=90)
        resp = proxy.post(
            _basic("alice", secure.password("alice")),
            topic=topic,
            value="released",
            delay_ms=1000,
            id=msg_id,
        )
        assert resp.status_code == 202, resp.text
        records = consume_until(secure.plain, [topic], lambda rs_: len(rs_) >= 1, timeout=90)
    assert [(r.value, r.header(h.ID)) for r in records] == [(b"released", msg_id.encode())]


def test_carol_without_write_is_403(secure: SecureKafka, proxy: HttpProxy) -> None:
    topic = _topic(secure, "alice")
    resp = proxy.post(_basic("carol", secure.password("carol")), topic=topic, value="v", delay_ms=1)
    assert resp.status_code == 403, resp.text
    assert f"do not allow User:carol to WRITE topic {topic}" in resp.json()["error"]


def test_a_jwt_of_the_jwks_file_is_accepted_and_expired_or_foreign_ones_are_401(
    secure: SecureKafka, proxy: HttpProxy, keys: Keys
) -> None:
    topic = _topic(secure, "dave")  # dave exists only as the sub of tokens
    good = keys.signer.token("dave")
    resp = proxy.post(f"Bearer {good}", topic=topic, value="v", delay_ms=600_000)
    assert resp.status_code == 202, resp.text
    expired = keys.signer.token("dave", ttl_s=-60)
    _unauthorized(proxy.post(f"Bearer {expired}", topic=topic, value="v", delay_ms=1), "expired")
    foreign = SigningKey().token("dave")
    _unauthorized(proxy.post(f"Bearer {foreign}", topic=topic, value="v", delay_ms=1), "kid")
    # Signed by another key under the good key's kid: the signature does not verify.
    forged = SigningKey().token("dave", kid=keys.signer.kid)
    _unauthorized(proxy.post(f"Bearer {forged}", topic=topic, value="v", delay_ms=1), "signature")
    other = keys.signer.token("erin")  # a valid token, but Kafka allows erin nothing
    assert proxy.post(f"Bearer {other}", topic=topic, value="v", delay_ms=1).status_code == 403


def test_probes_and_metrics_answer_without_credentials(proxy: HttpProxy) -> None:
    assert proxy.client.get(f"{proxy.url}/healthz").status_code == 200
    assert proxy.client.get(f"{proxy.url}/readyz").status_code in (200, 503)  # never 401
    metrics = proxy.client.get(f"{proxy.url}/metrics")
    assert metrics.status_code == 200
    assert "kdelay_proxy_auth_failures_total" in metrics.text
    _unauthorized(proxy.client.get(f"{proxy.url}/docs"), "no credentials")


def test_no_password_or_token_reaches_the_log_or_metrics(
    secure: SecureKafka, proxy: HttpProxy, keys: Keys
) -> None:
    topic = _topic(secure, "alice", "dave")
    wrong = f"wrong-{uuid.uuid4().hex}"
    token = keys.signer.token("dave")
    expired = keys.signer.token("dave", ttl_s=-60)
    sent = {
        _basic("alice", secure.password("alice")): 202,
        _basic("alice", wrong): 401,
        f"Bearer {token}": 202,
        f"Bearer {expired}": 401,
    }
    for auth, status in sent.items():
        assert proxy.post(auth, topic=topic, value="v", delay_ms=600_000).status_code == status
    text, metrics = proxy.log.read_text(errors="replace"), proxy.metrics()
    assert "proxy.http_authenticated" in text  # the log does speak of logins
    secrets = [secure.password("alice"), secure.password("kdelay"), wrong, token, expired]
    secrets += [auth.split(" ", 1)[1] for auth in sent]
    for secret in secrets:
        assert secret not in text
        assert secret not in metrics


def test_an_embedded_proxy_serves_https_and_closes_its_callers_connections_when_it_stops(
    secure: SecureKafka, keys: Keys
) -> None:
    ca = secure.local.ca
    assert ca is not None
    cfg = secure.proxy_config(
        http_auth="kafka",
        http_tls_cert=ca.server_cert,
        http_tls_key=ca.server_key,
        http_jwks_file=keys.jwks,
    )
    topic = _topic(secure, "alice")
    with running_proxy(cfg) as px:
        assert px.addresses is not None
        assert px.addresses.http.startswith("https://127.0.0.1:")
        verify = ssl.create_default_context(cafile=str(ca.ca_cert))
        with httpx.Client(verify=verify, timeout=30) as client:
            resp = client.post(
                f"{px.addresses.http}/v1/messages",
                json={"topic": topic, "value": "v", "delay_ms": 600_000},
                headers={"authorization": _basic("alice", secure.password("alice"))},
            )
        assert resp.status_code == 202, resp.text
        auth = px.http_auth
        assert auth is not None
        assert len(auth) == 1  # alice's login, kept for acl_cache_ms
        [login] = auth.logins().values()
    assert login.closed
    assert not login.link.open
