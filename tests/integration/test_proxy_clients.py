"""Real clients through the proxy into real Kafka: librdkafka, kafka-python and the Java producer.

Immediate records must appear at once in the partition the client chose, unchanged; delayed ones
must appear in the buffer topic with the routing the delay service needs.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from kafka import KafkaProducer

from kdelay import buffer, jars
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    Record,
    consume_until,
    create_topic,
    decode_buffer,
    unique_topic,
)
from tests.support.proxies import loopback_config

JAVA_PRODUCER = Path(__file__).parents[1] / "support" / "java" / "ProxyProducer.java"


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra) -> Iterator[Proxy]:
    cfg = loopback_config(kafka.bootstrap_servers)
    with running_proxy(cfg) as px:
        yield px


def _addr(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _buffer_records(bootstrap: str, ids: set[str]) -> dict[str, buffer.Scheduled]:
    """The schedule records for ``ids`` in the buffer topic (other tests share the topic)."""
    found: dict[str, buffer.Scheduled] = {}

    def done(records: list[Record]) -> bool:
        for r in records:
            decoded = decode_buffer(r)
            if isinstance(decoded, buffer.Scheduled) and decoded.id in ids:
                found.setdefault(decoded.id, decoded)
        return set(found) == ids

    consume_until(bootstrap, [buffer.BUFFER_TOPIC], done, timeout=60)
    return found


def _check_routing(
    bootstrap: str, topic: str, sent_ids: dict[str, bytes], immediate: list[bytes]
) -> None:
    """Immediate values in partition 1 of ``topic`` with key/headers; delayed ones buffered."""
    records = consume_until(bootstrap, [topic], lambda rs: len(rs) >= len(immediate), timeout=60)
    assert sorted(r.value or b"" for r in records) == sorted(immediate)
    for r in records:
        assert r.partition == 1
        assert r.key == b"k-" + (r.value or b"")
        assert r.header("app") == b"yes"
        assert r.header(h.DELAY_MS) is None
    scheduled = _buffer_records(bootstrap, set(sent_ids))
    for msg_id, value in sent_ids.items():
        s = scheduled[msg_id]
        assert (s.topic, s.partition, s.value) == (topic, 1, value)
        assert s.key == b"k-" + value
        assert s.headers == (("app", b"yes"),)
        assert s.deliver_at_ms > 0


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("idempotence", [True, False])
def test_confluent_kafka_immediate_and_delayed(
    kafka: KafkaInfra, proxy: Proxy, compression: str, idempotence: bool
) -> None:
    topic = unique_topic("px-ck")
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    producer = Producer(
        {
            "bootstrap.servers": _addr(proxy),
            "enable.idempotence": idempotence,
            "compression.type": compression,
            "linger.ms": 5,
        }
    )
    errors: list[KafkaError] = []
    offsets: dict[bytes, int] = {}

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets[msg.value() or b""] = msg.offset() or 0

    immediate = [f"now-{i}".encode() for i in range(5)]
    delayed = {uuid.uuid4().hex: f"later-{i}".encode() for i in range(3)}
    for v in immediate:
        producer.produce(topic, v, b"k-" + v, partition=1, headers=[("app", b"yes")],
                         on_delivery=report)  # fmt: skip
    producer.flush(30)
    for msg_id, v in delayed.items():
        hdrs: list[tuple[str, str | bytes | None]] = [
            ("app", b"yes"),
            (h.DELAY_MS, b"60000"),
            (h.ID, msg_id.encode()),
        ]
        producer.produce(topic, v, b"k-" + v, partition=1, headers=hdrs, on_delivery=report)
    assert producer.flush(30) == 0
    assert errors == []
    assert sorted(offsets[v] for v in immediate) == list(range(5))
    _check_routing(kafka.bootstrap_servers, topic, delayed, immediate)


def test_null_and_empty_keys_survive(kafka: KafkaInfra, proxy: Proxy) -> None:
    topic = unique_topic("px-keys")
    create_topic(kafka.bootstrap_servers, topic)
    producer = Producer({"bootstrap.servers": _addr(proxy), "enable.idempotence": True})
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    producer.produce(topic, b"a", None)
    producer.produce(topic, b"b", b"")
    producer.produce(topic, b"c", None, headers=[(h.DELAY_MS, b"1000"), (h.ID, ids[0].encode())])
    producer.produce(topic, b"d", b"", headers=[(h.DELAY_MS, b"1000"), (h.ID, ids[1].encode())])
    assert producer.flush(30) == 0
    records = consume_until(kafka.bootstrap_servers, [topic], lambda rs: len(rs) >= 2)
    assert {r.value: r.key for r in records} == {b"a": None, b"b": b""}
    scheduled = _buffer_records(kafka.bootstrap_servers, set(ids))
    assert scheduled[ids[0]].key is None
    assert scheduled[ids[1]].key == b""


def test_kafka_python_producer(kafka: KafkaInfra, proxy: Proxy) -> None:
    topic = unique_topic("px-kp")
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    producer = KafkaProducer(
        bootstrap_servers=_addr(proxy), enable_idempotence=True, compression_type="gzip"
    )
    try:
        immediate = [b"kp-0", b"kp-1"]
        for v in immediate:
            md = producer.send(topic, v, key=b"k-" + v, partition=1, headers=[("app", b"yes")])
            assert md.get(timeout=30).offset >= 0
        delayed = {uuid.uuid4().hex: b"kp-later"}
        for msg_id, v in delayed.items():
            hdrs = [("app", b"yes"), (h.DELAY_LEVEL, b"3"), (h.ID, msg_id.encode())]
            md = producer.send(topic, v, key=b"k-" + v, partition=1, headers=hdrs)
            assert md.get(timeout=30).offset == -1
    finally:
        producer.close(timeout=10)
    _check_routing(kafka.bootstrap_servers, topic, delayed, immediate)


@pytest.mark.parametrize(("idempotence", "compression"), [("true", "zstd"), ("false", "none")])
def test_java_producer(kafka: KafkaInfra, proxy: Proxy, idempotence: str, compression: str) -> None:
    topic = unique_topic("px-java")
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    immediate = [b"j-0", b"j-1", b"j-2"]
    delayed = {uuid.uuid4().hex: b"j-later"}
    lines = [f"1\tk-{v.decode()}\t{v.decode()}\tapp=yes" for v in immediate]
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    lines += [
        f"1\tk-{v.decode()}\t{v.decode()}\tapp=yes\t{h.DELIVER_AT}={at}\t{h.ID}={i}"
        for i, v in delayed.items()
    ]
    result = subprocess.run(
        [str(jars.java_executable()), "-cp", jars.classpath("kafka"), str(JAVA_PRODUCER),
         _addr(proxy), topic, idempotence, compression],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.split("\n")
    assert all(line.startswith("OK 1 ") for line in out if line), result.stdout
    assert len([line for line in out if line]) == 4
    _check_routing(kafka.bootstrap_servers, topic, delayed, immediate)


def test_tls_listener(kafka: KafkaInfra, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    topic = unique_topic("px-tls")
    create_topic(kafka.bootstrap_servers, topic)
    cfg = loopback_config(
        kafka.bootstrap_servers,
        tls_cert=cert,
        tls_key=key,
    )
    with running_proxy(cfg) as px:
        producer = Producer(
            {
                "bootstrap.servers": _addr(px),
                "security.protocol": "SSL",
                "ssl.ca.location": str(cert),
                "enable.idempotence": True,
            }
        )
        producer.produce(topic, b"secret", b"k")
        assert producer.flush(30) == 0
    records = consume_until(kafka.bootstrap_servers, [topic], lambda rs: len(rs) >= 1)
    assert [r.value for r in records] == [b"secret"]
