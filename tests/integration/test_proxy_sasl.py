"""SASL through the proxy in front of a secured Kafka.

A real Kafka 4.x with a SASL_SSL listener, SCRAM-SHA-512/256, PLAIN and OAUTHBEARER users and
KRaft's StandardAuthorizer (tests/support/secure_kafka.py); the proxy's Kafka listener on SASL_SSL
too, its upstream the secured listener as its own super user ``kdelay``. Unchanged producers
configured for the secured cluster work by changing only ``bootstrap.servers``: librdkafka
(confluent-kafka) with each mechanism, kafka-python, and the Java client; Kafka's users and ACLs
decide, immediate and delayed records alike; a wrong password gets Kafka's own error at once; a
revoked ACL takes effect; KIP-368 re-authentication keeps a producer's connection.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from kafka import KafkaProducer

from dev.stack import wait_until
from kdelay import buffer, jars
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import (
    Record,
    consume_until,
    create_topic,
    decode_buffer,
    unique_topic,
)
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import MECHANISMS, PLAIN_REAUTH_MS, SecureKafka, secured_kafka

Headers = list[tuple[str, str | bytes | None]]
JAVA_PRODUCER = Path(__file__).parents[1] / "support" / "java" / "ProxyProducer.java"
WRONG = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512"
)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("sasl"), "SASL_SSL") as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    with running_proxy(secure.proxy_config()) as px:
        yield px


def _addr(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _metric(px: Proxy, name: str, labels: dict[str, str]) -> float:
    return px.metrics.registry.get_sample_value(name, labels) or 0.0


class Outcome:
    """Delivery reports and error callbacks of one producer."""

    def __init__(self) -> None:
        self.delivered: list[tuple[bytes, int]] = []
        self.failed: list[KafkaError] = []
        self.errors: list[KafkaError] = []

    def report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed.append(err)
        else:
            offset = msg.offset()
            self.delivered.append((msg.value() or b"", -1 if offset is None else offset))

    def error(self, err: KafkaError) -> None:
        self.errors.append(err)


def _producer(bootstrap: str, conf: dict[str, Any], outcome: Outcome, **extra: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "error_cb": outcome.error,
            "message.timeout.ms": 30_000,
            **conf,
            **extra,
        }
    )


def _scheduled(secure: SecureKafka, ids: set[str]) -> dict[str, buffer.Scheduled]:
    found: dict[str, buffer.Scheduled] = {}

    def done(records: list[Record]) -> bool:
        for r in records:
            decoded = decode_buffer(r)
            if isinstance(decoded, buffer.Scheduled) and decoded.id in ids:
                found.setdefault(decoded.id, decoded)
        return set(found) == ids

    consume_until(secure.plain, [buffer.BUFFER_TOPIC], done, timeout=60)
    return found


def _topic(secure: SecureKafka, prefix: str, *writers: str) -> str:
    topic = unique_topic(prefix)
    create_topic(secure.plain, topic, partitions=2)
    for user in writers:
        secure.grant(user, topic)
    return topic


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_produces_immediate_and_delayed_with_each_mechanism(
    secure: SecureKafka, proxy: Proxy, mechanism: str
) -> None:
    topic = _topic(secure, "sasl-ck", "alice")
    outcome = Outcome()
    producer = _producer(_addr(proxy), secure.client("alice", mechanism), outcome)
    msg_id = uuid.uuid4().hex
    producer.produce(topic, b"now", b"k", partition=1, on_delivery=outcome.report)
    assert producer.flush(60) == 0  # a batch of its own: a mixed one reports base + index
    hdrs: Headers = [(h.DELAY_MS, b"600000"), (h.ID, msg_id.encode())]
    producer.produce(topic, b"later", b"k", partition=1, headers=hdrs, on_delivery=outcome.report)
    assert producer.flush(60) == 0
    assert outcome.failed == []
    assert sorted(outcome.delivered) == [(b"later", -1), (b"now", 0)]
    records = consume_until(secure.plain, [topic], lambda rs: len(rs) >= 1)
    assert [(r.partition, r.value) for r in records] == [(1, b"now")]
    scheduled = _scheduled(secure, {msg_id})[msg_id]
    assert (scheduled.topic, scheduled.partition, scheduled.value) == (topic, 1, b"later")


def test_kafka_python_produces_with_scram(secure: SecureKafka, proxy: Proxy) -> None:
    topic = _topic(secure, "sasl-kp", "carol")
    assert secure.ca is not None
    producer = KafkaProducer(
        bootstrap_servers=_addr(proxy),
        security_protocol="SASL_SSL",
        ssl_cafile=str(secure.ca),
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="carol",
        sasl_plain_password=secure.password("carol"),
    )
    try:
        assert producer.send(topic, b"kp", partition=0).get(timeout=30).offset == 0
        later = [(h.DELAY_LEVEL, b"3"), (h.ID, uuid.uuid4().hex.encode())]
        assert producer.send(topic, b"kp-later", headers=later).get(timeout=30).offset == -1
    finally:
        producer.close(timeout=10)


def _java(
    secure: SecureKafka, px: Proxy, tmp: Path, user: str, password: str, *, topic: str,
    lines: list[str],
) -> list[str]:  # fmt: skip
    """ProxyProducer.java with SCRAM-SHA-512 as ``user``: one output line per record."""
    assert secure.ca is not None
    props = tmp / f"{user}.properties"
    props.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={secure.ca}\n"
    )
    props.chmod(0o600)
    result = subprocess.run(
        [str(jars.java_executable()), "-cp", jars.classpath("kafka"), str(JAVA_PRODUCER),
         _addr(px), topic, "true", "none", str(props)],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # The client's own log lines go to stdout too.
    return [line for line in result.stdout.split("\n") if line.startswith(("OK ", "ERR "))]


def test_java_client_with_scram(secure: SecureKafka, proxy: Proxy, tmp_path: Path) -> None:
    topic = _topic(secure, "sasl-java", "alice")
    msg_id = uuid.uuid4().hex
    # Another partition for the delayed one: a batch of its own (a mixed one reports
    # base + index for every record).
    lines = ["1\tk\tj-now", f"0\tk\tj-later\t{h.DELAY_MS}=600000\t{h.ID}={msg_id}"]
    out = _java(
        secure, proxy, tmp_path, "alice", secure.password("alice"), topic=topic, lines=lines
    )
    assert out == ["OK 1 0", "OK 0 -1"], out
    assert _scheduled(secure, {msg_id})[msg_id].value == b"j-later"
    # Wrong password and missing ACL: Kafka's exceptions, at once.
    wrong = _java(
        secure, proxy, tmp_path, "alice", "not-the-password", topic=topic, lines=["0\tk\tv"]
    )
    assert wrong == [f"ERR SaslAuthenticationException {WRONG}"]
    denied = _java(
        secure, proxy, tmp_path, "bob", secure.password("bob"), topic=topic, lines=["0\tk\tv"]
    )
    assert denied == [f"ERR TopicAuthorizationException Not authorized to access topics: [{topic}]"]


def _first_error(producer: Producer, outcome: Outcome, deadline_s: float = 60.0) -> KafkaError:
    """The first error librdkafka reports (its callbacks run in ``poll``)."""
    wait_until(
        lambda: producer.poll(0.1) >= 0 and bool(outcome.errors),
        timeout=deadline_s,
        what="an error callback",
    )
    return outcome.errors[0]


def test_a_wrong_password_gets_kafkas_error_at_once_as_directly(
    secure: SecureKafka, proxy: Proxy
) -> None:
    """librdkafka reports the failed login through its error callback while its message
    timeout (300 s by default) still runs: with the proxy as with Kafka itself."""
    topic = _topic(secure, "sasl-wrong", "alice")
    texts = {}
    for name, bootstrap in (("proxy", _addr(proxy)), ("kafka", secure.secure)):
        outcome = Outcome()
        conf = {**secure.client("alice"), "sasl.password": "not-the-password"}
        producer = _producer(bootstrap, conf, outcome, **{"message.timeout.ms": 300_000})
        producer.produce(topic, b"v", on_delivery=outcome.report)
        err = _first_error(producer, outcome)
        assert err.code() == KafkaError._AUTHENTICATION
        # The text names the broker and the client's state before and after Kafka's message.
        texts[name] = re.sub(r" \(after .*\)$", "", err.str().split(": ", 1)[1])
        assert outcome.delivered == []
        producer.purge()
        producer.flush(5)
    assert texts["proxy"] == texts["kafka"]
    assert texts["proxy"] == f"SASL authentication error: {WRONG}"
    failures = _metric(
        proxy,
        "kdelay_proxy_auth_failures_total",
        {"mechanism": "SCRAM-SHA-512", "reason": "invalid_credentials"},
    )
    assert failures >= 1


@pytest.mark.parametrize("kind", ["immediate", "delayed", "cancel"])
def test_a_principal_without_write_is_refused_for_every_kind_of_record(
    secure: SecureKafka, proxy: Proxy, kind: str
) -> None:
    topic = _topic(secure, f"sasl-denied-{kind}", "alice")
    secure.grant("bob", topic, "DESCRIBE")  # bob sees the topic but may not write it
    msg_id = uuid.uuid4().hex
    headers: dict[str, Headers] = {
        "immediate": [],
        "delayed": [(h.DELAY_MS, b"600000"), (h.ID, msg_id.encode())],
        "cancel": [(h.CANCEL, msg_id.encode())],
    }
    for user, expected in (("bob", KafkaError.TOPIC_AUTHORIZATION_FAILED), ("alice", None)):
        outcome = Outcome()
        producer = _producer(_addr(proxy), secure.client(user), outcome)
        producer.produce(topic, b"v", b"k", headers=headers[kind], on_delivery=outcome.report)
        assert producer.flush(60) == 0
        codes = [e.code() for e in outcome.failed]
        assert codes == ([expected] if expected else []), (user, outcome.failed)
    rejected = _metric(
        proxy, "kdelay_proxy_records_rejected_total", {"reason": "topic_authorization"}
    )
    assert rejected >= 1


def test_metadata_lists_only_what_the_principal_may_describe(
    secure: SecureKafka, proxy: Proxy
) -> None:
    mine = _topic(secure, "sasl-visible", "alice")
    hidden = _topic(secure, "sasl-hidden")
    listed = {}
    for user in ("alice", "bob"):
        outcome = Outcome()
        producer = _producer(_addr(proxy), secure.client(user), outcome)
        listed[user] = set(producer.list_topics(timeout=30).topics)
    assert mine in listed["alice"]
    assert hidden not in listed["alice"]
    assert not {mine, hidden} & listed["bob"]
    assert not any(t.startswith("__") and t != buffer.BUFFER_TOPIC for t in listed["alice"])


def test_a_revoked_acl_is_refused_once_the_cache_time_has_passed(secure: SecureKafka) -> None:
    """acl_cache_ms=1000: after Kafka applied the revocation, the proxy refuses within one
    cache period (the exact bound is held by a fake clock in tests/unit)."""
    topic = _topic(secure, "sasl-revoke", "carol")
    with running_proxy(secure.proxy_config(acl_cache_ms=1_000)) as px:
        outcome = Outcome()
        producer = _producer(_addr(px), secure.client("carol"), outcome)
        producer.produce(topic, b"before", on_delivery=outcome.report)
        assert producer.flush(60) == 0
        assert outcome.failed == []
        secure.revoke("carol", topic)
        revoked = time.monotonic()

        def refused() -> bool:
            producer.produce(topic, b"after", on_delivery=outcome.report)
            producer.flush(30)
            return bool(outcome.failed)

        wait_until(refused, timeout=60, what="the revoked ACL to apply", interval=0.1)
        print(f"\nrefused {time.monotonic() - revoked:.2f} s after the revocation (cache 1 s)")
        assert outcome.failed[-1].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_reauthentication_keeps_a_producer_going(secure: SecureKafka, proxy: Proxy) -> None:
    """PLAIN sessions last PLAIN_REAUTH_MS on this Kafka (KIP-368): librdkafka logs in again
    on the same connection before each expires, and the proxy relays that to Kafka."""
    topic = _topic(secure, "sasl-reauth", "alice")
    outcome = Outcome()
    producer = _producer(_addr(proxy), secure.client("alice", "PLAIN"), outcome)
    reauths = {"mechanism": "PLAIN", "kind": "reauthentication"}
    before = _metric(proxy, "kdelay_proxy_authentications_total", reauths)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            producer.produce(topic, b"v", on_delivery=outcome.report)
            producer.poll(0.2)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        # Two re-authentications: more than two session lifetimes.
        wait_until(
            lambda: _metric(proxy, "kdelay_proxy_authentications_total", reauths) >= before + 2,
            timeout=10 * PLAIN_REAUTH_MS / 1000,
            what="two re-authentications",
        )
    finally:
        stop.set()
        thread.join(10)
    assert producer.flush(60) == 0
    assert outcome.failed == []
    assert len(outcome.delivered) > 3
    expired = {"mechanism": "PLAIN", "reason": "session_expired"}
    assert _metric(proxy, "kdelay_proxy_auth_failures_total", expired) == 0


def test_delayed_records_sent_with_scram_are_delivered_by_a_replica(
    secure: SecureKafka, proxy: Proxy, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = _topic(secure, "sasl-release", "alice")
    with ReplicaSet(
        tmp_path, secure.plain, zookeeper.connect, count=1, partitions=3,
        buffer_topic=buffer.BUFFER_TOPIC,
    ) as rs:  # fmt: skip
        rs.start_all()
        rs.wait_master(timeout=90)
        outcome = Outcome()
        producer = _producer(_addr(proxy), secure.client("alice", "SCRAM-SHA-256"), outcome)
        msg_id = uuid.uuid4().hex
        hdrs: Headers = [
            (h.DELAY_MS, b"1000"),
            (h.ID, msg_id.encode()),
        ]
        producer.produce(topic, b"released", b"k", partition=0, headers=hdrs)
        assert producer.flush(60) == 0
        records = consume_until(secure.plain, [topic], lambda rs_: len(rs_) >= 1, timeout=90)
    assert [(r.value, r.header(h.ID)) for r in records] == [(b"released", msg_id.encode())]
