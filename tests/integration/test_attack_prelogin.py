"""Attacks without credentials on a SASL proxy, against a real secured
Kafka: none of them may cost an authenticated client its service.

- (a) Hundreds of connections announce a frame and send nothing more. Before: each reserved its
  announced size of ``max_buffered_request_bytes`` up front, so they held the whole budget and an
  authenticated producer's record waited for it (the reported 15 s timeout).
- (b) One address opens more connections than ``prelogin_max_connections_per_address``: the
  rest are closed at once. Before: all were kept.
- (c) A TCP connection to a SASL_SSL listener that never starts TLS is closed at the login
  deadline (``sasl_authentication_timeout_ms``). Before: asyncio's 60 s TLS handshake timeout.
- (d) An HTTP body announcing 100 MB and sent slowly is answered 408 after
  ``http_body_timeout_ms`` and reserves only what arrived. Before: 100 MB reserved, no deadline.
- (e) ``X-Forwarded-For`` is ignored unless its sender is in ``http_trusted_proxies``: failed
  logins count against the socket's address. Before: uvicorn believed it from 127.0.0.1.

Waits are failure detection only (no speed is asserted).
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from confluent_kafka import Producer

from dev.stack import wait_until
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.raw_client import RawClient, sasl_handshake_request
from tests.support.secure_kafka import SecureKafka, secured_kafka

#: Attackers in (a).
FLOOD = 300
#: The budget in (a): far below FLOOD frames of either announced size.
BUDGET = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("attack-prelogin"), "SASL_SSL") as sk:
        yield sk


def _kafka(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _http(px: Proxy) -> tuple[str, int]:
    assert px.addresses is not None
    host, _, port = px.addresses.http.removeprefix("http://").rpartition(":")
    return host, int(port)


def _produce_as_alice(secure: SecureKafka, px: Proxy) -> None:
    """One record through the proxy as an authenticated producer; fails if it is not
    acknowledged within a generous wait."""
    topic = unique_topic("prelogin")
    create_topic(secure.plain, topic)
    secure.grant("alice", topic)
    conf = secure.client("alice", "SCRAM-SHA-512", **{"security.protocol": "SASL_PLAINTEXT"})
    conf.pop("ssl.ca.location", None)
    producer = Producer({"bootstrap.servers": _kafka(px), **conf, "linger.ms": 0})
    producer.produce(topic, b"still served")
    assert producer.flush(60) == 0, "the authenticated producer's record was not acknowledged"


# 512 KiB: Kafka's own cap, over the proxy's; 64 KiB: the proxy's cap, 256 of them the budget.
@pytest.mark.parametrize("announced", [512 * 1024, 64 * 1024], ids=["512KiB", "64KiB"])
def test_half_open_frames_do_not_starve_an_authenticated_producer(
    secure: SecureKafka, announced: int
) -> None:
    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        max_request_bytes=1024 * 1024,
        max_buffered_request_bytes=BUDGET,
        # Beyond the test's patience: served only while they are still connected counts.
        sasl_authentication_timeout_ms=600_000,
        prelogin_max_connections=2 * FLOOD,
        prelogin_max_connections_per_address=2 * FLOOD,
    )
    with running_proxy(cfg) as px, ExitStack() as stack:
        assert px.kafka is not None
        attackers = [stack.enter_context(RawClient(_kafka(px), timeout=60)) for _ in range(FLOOD)]
        for raw in attackers:
            raw.send_bytes(struct.pack(">i", announced))  # and nothing more
        _produce_as_alice(secure, px)
        if announced > cfg.sasl_max_receive_bytes:  # closed at once, the setting named
            assert all(raw.closed_by_peer() for raw in attackers)
        else:  # still connected, counted before login, holding nothing of the budget
            assert _prelogin_open(px) == FLOOD
        # Only the producer's own requests, if any are in flight: less than one attacker's.
        assert px.kafka.budget.used < announced


@pytest.fixture(scope="module")
def capped(secure: SecureKafka) -> Iterator[Proxy]:
    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        prelogin_max_connections_per_address=4,
        sasl_authentication_timeout_ms=30_000,
    )
    with running_proxy(cfg) as px:
        yield px


def test_connections_over_the_per_address_cap_are_closed_at_once(
    secure: SecureKafka, capped: Proxy
) -> None:
    with ExitStack() as stack:
        held = [stack.enter_context(RawClient(_kafka(capped), timeout=20)) for _ in range(4)]
        for raw in held:  # admitted: each is served before login
            assert raw.request(sasl_handshake_request("PLAIN")).error_code == 0
        extra = stack.enter_context(RawClient(_kafka(capped), timeout=20))
        # Closed long before the 30 s login deadline (the recv timeout is 20 s).
        assert extra.closed_by_peer()
    # Those four gone, the address may connect again, and log in.
    wait_until(lambda: _prelogin_open(capped) == 0, timeout=30, what="the four to be let go")
    _produce_as_alice(secure, capped)


def _prelogin_open(px: Proxy) -> int:
    assert px.kafka is not None
    assert px.kafka.prelogin is not None
    return px.kafka.prelogin.open


def test_a_tcp_connection_that_never_starts_tls_is_closed_at_the_login_deadline(
    secure: SecureKafka,
) -> None:
    cfg = secure.proxy_config("SASL_SSL", sasl_authentication_timeout_ms=2_000)
    with running_proxy(cfg) as px:
        host, _, port = _kafka(px).rpartition(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            # The proxy hangs up well before asyncio's 60 s TLS handshake timeout.
            assert sock.recv(1) == b""


@pytest.fixture(scope="module")
def http_proxy(secure: SecureKafka) -> Iterator[Proxy]:
    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        http_auth="kafka",
        http_allow_plaintext_auth=True,
        http_body_timeout_ms=2_000,
        auth_failure_delay_ms=1,
        auth_failure_max_delay_ms=2,
    )
    with running_proxy(cfg) as px:
        yield px


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:])}
    length = int(fields["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def test_a_slow_body_is_answered_408_and_reserves_only_what_arrived(
    secure: SecureKafka, http_proxy: Proxy
) -> None:
    assert http_proxy.kafka is not None
    budget = http_proxy.kafka.budget
    announced = 100_000_000
    request = (
        "POST /v1/messages HTTP/1.1\r\nHost: kdelay\r\nContent-Type: application/json\r\n"
        f"Authorization: {_basic('alice', secure.password('alice'))}\r\n"
        f"Content-Length: {announced}\r\n\r\n"
    ).encode() + b'{"topic": '
    answer: list[tuple[int, dict[str, object]]] = []
    most = 0
    with socket.create_connection(_http(http_proxy), timeout=60) as sock:
        sock.sendall(request)
        reader = threading.Thread(target=lambda: answer.append(_read_response(sock)))
        reader.start()

        def answered() -> bool:
            nonlocal most
            most = max(most, budget.used)
            return not reader.is_alive()

        wait_until(answered, timeout=60, what="an answer to the stalled body")
        reader.join()
    status, body = answer[0]
    assert status == 408
    assert "http_body_timeout_ms" in str(body["error"])
    assert most < 1024 * 1024, f"{most:,} bytes reserved for a body that sent 10"
    assert budget.used == 0


def _failed_login_with_xff(px: Proxy, forwarded: str) -> None:
    with socket.create_connection(_http(px), timeout=30) as sock:
        sock.sendall(
            (
                "GET /v1/pending HTTP/1.1\r\nHost: kdelay\r\n"
                f"Authorization: {_basic('alice', 'wrong')}\r\n"
                f"X-Forwarded-For: {forwarded}\r\n\r\n"
            ).encode()
        )
        status, _ = _read_response(sock)
        assert status == 401


def _failures(px: Proxy, address: str) -> int:
    assert px.kafka is not None
    assert px.kafka.auth is not None
    return px.kafka.auth.backoff.failures(address)


def test_x_forwarded_for_is_ignored_unless_the_sender_is_trusted(
    secure: SecureKafka, http_proxy: Proxy
) -> None:
    before = _failures(http_proxy, "127.0.0.1")
    for i in range(5):
        _failed_login_with_xff(http_proxy, f"203.0.113.{i}")
    assert _failures(http_proxy, "127.0.0.1") == before + 5
    assert all(_failures(http_proxy, f"203.0.113.{i}") == 0 for i in range(5))

    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        http_auth="kafka",
        http_allow_plaintext_auth=True,
        http_trusted_proxies=["127.0.0.0/8"],
        auth_failure_delay_ms=1,
        auth_failure_max_delay_ms=2,
    )
    with running_proxy(cfg) as trusting:
        _failed_login_with_xff(trusting, "198.51.100.7")
        assert _failures(trusting, "198.51.100.7") == 1
        assert _failures(trusting, "127.0.0.1") == 0
