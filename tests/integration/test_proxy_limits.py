"""The poison record against real Kafka and a real delay service: a record with 70,000
headers is refused at the proxy's door with INVALID_RECORD naming the limit (Kafka listener) or
413/422 (HTTP), and delayed messages sent afterwards are all delivered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, Message, Producer

from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.proxies import loopback_config
from tests.support.raw_client import RawClient, produce_request, record_batch
from tests.support.replicas import ReplicaSet

POISON_HEADERS = 70_000
LATER = 30


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra) -> Iterator[Proxy]:
    with running_proxy(loopback_config(kafka.bootstrap_servers)) as px:
        yield px


def _addresses(px: Proxy) -> tuple[str, str]:
    assert px.addresses is not None
    return px.addresses.kafka, px.addresses.http


def _poison(topic: str, n: int = POISON_HEADERS) -> list[tuple[str, str | bytes | None]]:
    empty: list[tuple[str, str | bytes | None]] = [("", b"")]
    return empty * n + [(h.DELAY_MS, b"1000"), (h.ID, f"poison-{topic}".encode())]


def test_the_raw_answer_names_the_limit(proxy: Proxy, kafka: KafkaInfra) -> None:
    topic = unique_topic("px-limit-raw")
    create_topic(kafka.bootstrap_servers, topic)
    headers = [("", b"")] * POISON_HEADERS + [(h.DELAY_MS, b"1000")]
    batch = record_batch([(None, b"ok", [(h.DELAY_MS, b"1000")]), (None, b"poison", headers)])
    with RawClient(_addresses(proxy)[0], timeout=60) as client:
        part = client.request(produce_request(topic, 0, batch)).responses[0].partition_responses[0]
    assert part.error_code == kerr.InvalidRecordError.errno
    assert "record 1" in part.error_message
    assert f"{POISON_HEADERS + 1:,}" in part.error_message
    assert "max_headers=1,000" in part.error_message
    assert [e.batch_index for e in part.record_errors] == [1]


def test_http_refuses_too_many_headers(proxy: Proxy, kafka: KafkaInfra) -> None:
    topic = unique_topic("px-limit-http")
    create_topic(kafka.bootstrap_servers, topic)
    with httpx.Client(base_url=_addresses(proxy)[1], timeout=60) as http:
        many = http.post(
            "/v1/messages",
            json={
                "topic": topic,
                "value": "v",
                "delay_ms": 1000,
                "headers": {f"h{i}": "" for i in range(POISON_HEADERS)},
            },
        )
        big = http.post(
            "/v1/messages",
            json={"topic": topic, "value": "v" * (1024 * 1024 + 1), "delay_ms": 1000},
        )
    assert many.status_code == 422, many.text
    assert "max_headers=1,000" in many.json()["error"]
    assert big.status_code == 413, big.text
    assert "max_value_bytes=1,048,576" in big.json()["error"]


def test_poison_record_is_refused_and_later_messages_are_delivered(
    proxy: Proxy, kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("px-limit")
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    producer = Producer({"bootstrap.servers": _addresses(proxy)[0], "linger.ms": 0})
    reports: dict[str, KafkaError | None] = {}

    def report(err: KafkaError | None, msg: Message) -> None:
        reports[(msg.value() or b"").decode()] = err

    producer.produce(topic, b"poison", partition=0, headers=_poison(topic), on_delivery=report)
    assert producer.flush(60) == 0
    err = reports["poison"]
    assert err is not None
    assert err.code() == KafkaError.INVALID_RECORD
    assert not err.retriable()

    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=1,
        partitions=3,
        buffer_topic=buffer.BUFFER_TOPIC,
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        ids = [uuid.uuid4().hex for _ in range(LATER)]
        for i, msg_id in enumerate(ids):
            hdrs: list[tuple[str, str | bytes | None]] = [
                (h.DELAY_MS, b"500"),
                (h.ID, msg_id.encode()),
            ]
            producer.produce(topic, f"later-{i}", partition=i % 2, headers=hdrs, on_delivery=report)
        assert producer.flush(60) == 0
        assert [reports[f"later-{i}"] for i in range(LATER)] == [None] * LATER

        def all_delivered(records: list[Record]) -> bool:
            return len(records) >= LATER

        records = consume_until(kafka.bootstrap_servers, [topic], all_delivered, timeout=120)
    delivered = {(r.header(h.ID) or b"").decode() for r in records}
    assert delivered == set(ids)
    assert b"poison" not in {r.value for r in records}
