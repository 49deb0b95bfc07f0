"""Metric-label and principal attacks against a real secured proxy: a Kafka 4.x on SASL_SSL with
SCRAM users (tests/support/secure_kafka.py), the proxy's Kafka listener on SASL_PLAINTEXT and its
HTTP API authenticating with Kafka (``http_auth=kafka``).

- Point 1: unauthenticated ApiVersions with distinct unsupported versions, unknown API keys and
  made-up HTTP methods leave the same ``/metrics`` series after 50 attempts as after 500.
- Point 8: ``Authorization: Basic`` as ``alice\\u00ad`` with alice's password is the principal
  Kafka authenticated, ``User:alice`` (the SCRAM login SASLprep'd the name), never a principal
  Kafka does not know.
"""

from __future__ import annotations

import base64
import socket
import struct
from collections.abc import Iterator

import httpx
import pytest
from structlog.testing import capture_logs

from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from kdelay.proxy.wire import protocol as p
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.secure_kafka import SecureKafka, secured_kafka

SOFT_HYPHEN = "\u00ad"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("attack-labels"), "SASL_SSL") as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        http_auth="kafka",
        http_allow_plaintext_auth=True,
        http_allow_unauthenticated=False,
        auth_failure_delay_ms=0,
        auth_failure_max_delay_ms=0,
    )
    with running_proxy(cfg) as px:
        yield px


def _header_only(api_key: int, version: int, correlation_id: int) -> bytes:
    body = struct.pack(">hhih", api_key, version, correlation_id, -1)
    return struct.pack(">i", len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _flood(px: Proxy, first: int, count: int) -> None:
    """Unauthenticated: ``count`` ApiVersions of distinct unsupported versions from ``first``
    (each answered), a tenth as many unknown API keys, a fifth as many made-up HTTP methods."""
    assert px.addresses is not None
    host, _, port = px.addresses.kafka.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"".join(_header_only(p.API_VERSIONS, 100 + first + i, i) for i in range(count))
        )
        for _ in range(count):
            (size,) = struct.unpack(">i", _read_exact(sock, 4))
            _read_exact(sock, size)
    for i in range(count // 10):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(_header_only(2000 + first + i, 1, 1))
            while sock.recv(4096):
                pass
    with httpx.Client(base_url=px.addresses.http, timeout=30) as client:
        for i in range(count // 5):
            client.request(f"X{first + i}", f"/v1/messages/{first + i}")


def _series(px: Proxy) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    families = {"kdelay_proxy_requests", "kdelay_proxy_http_requests", "kdelay_proxy_auth_failures"}
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in px.metrics.registry.collect()
        if family.name in families
        for s in family.samples
    }


def test_unauthenticated_input_does_not_grow_the_metrics(proxy: Proxy) -> None:
    _flood(proxy, 0, 50)
    after_50, size_50 = _series(proxy), len(proxy.metrics.exposition())
    _flood(proxy, 50, 450)
    after_500, size_500 = _series(proxy), len(proxy.metrics.exposition())
    assert after_500 == after_50, sorted(after_500 - after_50)[:5]
    assert size_500 - size_50 < 200, (size_50, size_500)


def test_a_soft_hyphen_in_the_user_name_is_the_principal_kafka_authenticated(
    secure: SecureKafka, proxy: Proxy
) -> None:
    assert proxy.addresses is not None
    topic = unique_topic("saslprep")
    create_topic(secure.plain, topic, partitions=1)
    secure.grant("alice", topic)
    raw = f"alice{SOFT_HYPHEN}:{secure.password('alice')}".encode()
    auth = "Basic " + base64.b64encode(raw).decode()
    body = {"topic": topic, "value": "v", "delay_ms": 600_000}
    with capture_logs() as logs, httpx.Client(timeout=60) as client:
        resp = client.post(
            f"{proxy.addresses.http}/v1/messages", json=body, headers={"authorization": auth}
        )
    assert resp.status_code == 202, resp.text
    principals = {e.get("principal") for e in logs if e["event"] == "proxy.http_authenticated"}
    assert principals == {"User:alice"}
