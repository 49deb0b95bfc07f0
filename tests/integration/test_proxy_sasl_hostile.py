"""Hostile input on the proxy's SASL listener, against a real secured Kafka.

Malformed SASL frames, an unknown mechanism, SASL out of order, a client that never logs in and a
flood of failed logins each get Kafka's answer (or the close Kafka would do), are counted in
``kdelay_proxy_auth_failures_total{mechanism,reason}``, and cost nobody else anything: a producer
logged in beside them keeps producing. No password or token reaches the proxy's log or /metrics.
The proxy's listener speaks SASL_PLAINTEXT here so the raw client (tests/support/raw_client.py)
can send exactly the bytes each case needs; upstream is SASL_SSL.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import KDELAY, ManagedProcess, free_port, wait_until
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.proxies import wait_accepting
from tests.support.raw_client import (
    RawClient,
    metadata_request,
    plain_token,
    produce_request,
    record_batch,
    sasl_authenticate_request,
    sasl_handshake_request,
)
from tests.support.secure_kafka import SecureKafka, secured_kafka

AUTH_FAILED = kerr.SaslAuthenticationFailedError.errno
ILLEGAL = kerr.IllegalSaslStateError.errno
UNSUPPORTED = kerr.UnsupportedSaslMechanismError.errno
WRONG_PLAIN = (
    "Authentication failed: Invalid username or password"  # Kafka's PlainServerCallbackHandler
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("sasl-hostile"), "SASL_SSL") as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    cfg = secure.proxy_config(
        "SASL_PLAINTEXT",
        # Short, for the client that never logs in; long enough for a login relayed to Kafka
        # while 8 others flood it on a loaded 2-core machine (1 s timed some of them out).
        sasl_authentication_timeout_ms=3_000,
        auth_failure_delay_ms=20,
        auth_failure_max_delay_ms=300,
    )
    with running_proxy(cfg) as px:
        yield px


def _addr(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _failures(px: Proxy, mechanism: str, reason: str) -> float:
    labels = {"mechanism": mechanism, "reason": reason}
    return px.metrics.registry.get_sample_value("kdelay_proxy_auth_failures_total", labels) or 0.0


class Bystander:
    """A producer logged in with SCRAM that keeps producing while a test misbehaves."""

    def __init__(self, secure: SecureKafka, px: Proxy) -> None:
        self.topic = unique_topic("bystander")
        create_topic(secure.plain, self.topic)
        secure.grant("alice", self.topic)
        conf = secure.client("alice", "SCRAM-SHA-512", **{"security.protocol": "SASL_PLAINTEXT"})
        conf.pop("ssl.ca.location", None)
        self.producer = Producer({"bootstrap.servers": _addr(px), **conf, "linger.ms": 0})
        self.acked = 0
        self.failed: list[KafkaError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(err)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.produce(self.topic, b"still here", on_delivery=self._report)
            self.producer.poll(0.05)

    def __enter__(self) -> Bystander:
        self._thread.start()
        wait_until(lambda: self.acked > 0, timeout=60, what="the bystander's first ack")
        return self

    def __exit__(self, *exc: object) -> None:
        before = self.acked
        wait_until(lambda: self.acked > before, timeout=60, what="the bystander to go on")
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(60) == 0
        assert self.failed == []


def _login(address: str, mechanism: str, token: bytes) -> tuple[RawClient, Any]:
    client = RawClient(address)
    try:
        assert client.request(sasl_handshake_request(mechanism)).error_code == 0
        return client, client.request(sasl_authenticate_request(token))
    except BaseException:
        client.close()  # no socket left for the garbage collector (a ResourceWarning later)
        raise


def test_malformed_sasl_frames_get_kafkas_answer_and_cost_nobody_else(
    secure: SecureKafka, proxy: Proxy
) -> None:
    addr = _addr(proxy)
    with Bystander(secure, proxy):
        # A username's bytes where a request header belongs (a SASL client of the 0.9 era).
        with RawClient(addr) as raw:
            raw.send_bytes(struct.pack(">i", 12) + b"alice\0secret")
            assert raw.closed_by_peer()
        # A SaslAuthenticate cut short inside its body.
        with RawClient(addr) as raw:
            assert raw.request(sasl_handshake_request("PLAIN")).error_code == 0
            frame = struct.pack(">hhih", 36, 2, 7, 1) + b"t\x00\x09\x00"
            raw.send_bytes(struct.pack(">i", len(frame)) + frame)
            assert raw.closed_by_peer()
        # SaslHandshake v0, then a bare token (no SaslAuthenticate framing) that is not
        # PLAIN's: as on Kafka, the failed v0 login is closed unanswered.
        with RawClient(addr) as raw:
            assert raw.request(sasl_handshake_request("PLAIN", version=0)).error_code == 0
            raw.send_bytes(struct.pack(">i", 4) + b"nope")
            assert raw.closed_by_peer()
        # A frame far larger than a login needs, announced before authentication.
        with RawClient(addr) as raw:
            raw.send_bytes(struct.pack(">i", 50 * 1024 * 1024) + b"\0" * 1024)
            assert raw.closed_by_peer()
        # Well framed, but not a PLAIN token: the broker's verdict, relayed.
        client, resp = _login(addr, "PLAIN", b"no separators at all")
        assert resp.error_code == AUTH_FAILED
        assert "Invalid SASL/PLAIN response" in resp.error_message
        assert client.closed_by_peer()
        client.close()
    assert _failures(proxy, "none", "malformed") >= 2
    assert _failures(proxy, "PLAIN", "malformed") >= 1


def test_an_unknown_mechanism_gets_the_enabled_list(secure: SecureKafka, proxy: Proxy) -> None:
    with RawClient(_addr(proxy)) as raw:
        resp = raw.request(sasl_handshake_request("GSSAPI"))
        assert resp.error_code == UNSUPPORTED
        assert resp.mechanisms == ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"]
        assert raw.closed_by_peer()
    assert _failures(proxy, "other", "unsupported_mechanism") >= 1


def test_sasl_out_of_order_gets_illegal_sasl_state(secure: SecureKafka, proxy: Proxy) -> None:
    addr = _addr(proxy)
    topic = unique_topic("ooo")
    create_topic(secure.plain, topic)
    secure.grant("alice", topic)
    with Bystander(secure, proxy):
        # Produce before any login: closed unanswered (as Kafka does); nothing written.
        with RawClient(addr) as raw:
            raw.send_bytes(raw.encode(produce_request(topic, 0, record_batch([(b"k", b"v", [])]))))
            assert raw.closed_by_peer()
        # SaslAuthenticate before SaslHandshake.
        with RawClient(addr) as raw:
            resp = raw.request(sasl_authenticate_request(plain_token("alice", "x")))
            assert resp.error_code == ILLEGAL
            assert raw.closed_by_peer()
        # Metadata in the middle of the exchange.
        with RawClient(addr) as raw:
            assert raw.request(sasl_handshake_request("SCRAM-SHA-512")).error_code == 0
            raw.send_bytes(raw.encode(metadata_request([topic])))
            assert raw.closed_by_peer()
        # SaslAuthenticate once logged in: answered, and the connection stays.
        token = plain_token("alice", secure.password("alice"))
        client, resp = _login(addr, "PLAIN", token)
        assert resp.error_code == 0
        assert client.request(sasl_authenticate_request(token)).error_code == ILLEGAL
        meta = client.request(metadata_request([topic]))
        assert [(t.name, t.error_code) for t in meta.topics] == [(topic, 0)]
        client.close()
    assert _failures(proxy, "none", "illegal_state") >= 2


def test_a_client_that_never_logs_in_is_closed(secure: SecureKafka, proxy: Proxy) -> None:
    before = _failures(proxy, "none", "timeout")
    with RawClient(_addr(proxy), timeout=30) as raw:
        assert raw.closed_by_peer()  # sasl_authentication_timeout_ms=3000 here
    assert _failures(proxy, "none", "timeout") == before + 1


def test_a_flood_of_failed_logins_is_slowed_and_everyone_else_served(
    secure: SecureKafka, proxy: Proxy
) -> None:
    addr = _addr(proxy)
    flood = 40
    before = _failures(proxy, "PLAIN", "invalid_credentials")

    def attempt(i: int) -> tuple[int, str]:
        client, resp = _login(addr, "PLAIN", plain_token("alice", f"guess-{i}"))
        closed = client.closed_by_peer()
        client.close()
        assert closed
        return int(resp.error_code), str(resp.error_message)

    with Bystander(secure, proxy), ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(attempt, range(flood)))
    assert set(answers) == {(AUTH_FAILED, WRONG_PLAIN)}
    assert _failures(proxy, "PLAIN", "invalid_credentials") == before + flood
    assert proxy.kafka is not None
    assert proxy.kafka.auth is not None
    assert proxy.kafka.auth.backoff.failures("127.0.0.1") >= flood


def test_no_secret_reaches_the_log_or_metrics(secure: SecureKafka, tmp_path: Path) -> None:
    """``kdelay proxy`` with its upstream password in the environment, at DEBUG: logins that
    succeed and fail with each mechanism; then its log and /metrics are searched for every
    password and token it saw."""
    port, http = free_port(), free_port()
    upstream = {k: str(v) for k, v in secure.client("kdelay").items()}
    env = {
        **os.environ,
        "KDELAY_PROXY_UPSTREAM_CONFIG": json.dumps(upstream),
        "KDELAY_PROXY_LISTENER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KDELAY_PROXY_HTTP_ALLOW_UNAUTHENTICATED": "true",
        "KDELAY_PROXY_LOG_LEVEL": "DEBUG",
    }
    log_path = tmp_path / "proxy.log"
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
        "--bootstrap-servers", secure.secure, "--buffer-partitions", "3",
    ]  # fmt: skip
    topic = unique_topic("secrets")
    create_topic(secure.plain, topic)
    secure.grant("carol", topic)
    wrong = f"wrong-{uuid.uuid4().hex}"
    proc = ManagedProcess("proxy", argv, log_path, env=env)
    proc.start()
    try:
        wait_accepting(port)
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
            conf = secure.client("carol", mechanism, **{"security.protocol": "SASL_PLAINTEXT"})
            conf.pop("ssl.ca.location", None)
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", **conf})
            producer.produce(topic, b"v")
            assert producer.flush(60) == 0
        for mechanism in ("SCRAM-SHA-512", "PLAIN"):
            client = RawClient(f"127.0.0.1:{port}")
            assert client.request(sasl_handshake_request(mechanism)).error_code == 0
            token = (
                plain_token("carol", wrong)
                if mechanism == "PLAIN"
                else b"n,,n=carol,r=" + wrong.encode()
            )
            client.request(sasl_authenticate_request(token))
            client.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
    finally:
        proc.stop()
    text = log_path.read_text(errors="replace")
    assert "proxy.sasl_authenticated" in text  # the log does speak of logins
    assert "kdelay_proxy_auth_failures_total" in metrics
    for secret in (secure.password("carol"), secure.password("kdelay"), wrong):
        assert secret not in text
        assert secret not in metrics
