"""Safe by default, through a real proxy in front of real Kafka, with real clients.

- Internal topics are refused on every path: TOPIC_AUTHORIZATION_FAILED naming the rule on the
  Kafka listener, 403 over HTTP, and nothing reaches the buffer topic.
- A rejected record's reason and index travel in the Produce response (KIP-467); what
  confluent-kafka shows of it is pinned here, as the README quotes it.
- Look-alike header names and epoch seconds in ``kdelay-deliver-at`` are rejected.
- Delivery reports of delayed records count up from the -1 base offset (README).
- A consumer pointed at the proxy fails fast with an authorization error instead of
  reconnecting for ever; a transactional producer fails in ``init_transactions``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import kafka.errors as kerr
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import about, consume_until, create_topic, unique_topic
from tests.support.proxies import loopback_config
from tests.support.raw_client import RawClient, produce_request, record_batch

TOPIC_DENIED = kerr.TopicAuthorizationFailedError.errno
#: How long a client may take to report what the proxy answered: a deadline to wait on, not a
#: speed being measured (the proxy answers at once).
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra) -> Iterator[Proxy]:
    with running_proxy(loopback_config(kafka.bootstrap_servers)) as px:
        yield px


@pytest.fixture
def addr(proxy: Proxy) -> str:
    assert proxy.addresses is not None
    return proxy.addresses.kafka


@pytest.fixture
def topic(kafka: KafkaInfra) -> str:
    name = unique_topic("px-safe")
    create_topic(kafka.bootstrap_servers, name)
    return name


def _partition(response: Any) -> Any:
    return response.responses[0].partition_responses[0]


def _requests(proxy: Proxy, api: str) -> float:
    """How many requests of ``api`` the proxy has answered so far (any version, any result)."""
    return sum(
        s.value
        for m in proxy.metrics.registry.collect()
        for s in m.samples
        if s.name == "kdelay_proxy_requests_total" and s.labels["api"] == api
    )


def _reports(
    bootstrap: str, topic: str, records: list[list[tuple[str, str | bytes | None]]]
) -> list[Message]:
    """Delivery reports of ``records`` (their headers; one batch to partition 0), in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200})
    reports: list[Message] = []
    for i, headers in enumerate(records):
        producer.produce(
            topic,
            f"v{i}".encode(),
            partition=0,
            headers=headers,
            on_delivery=lambda _err, msg: reports.append(msg),
        )
    assert producer.flush(DEADLINE_S) == 0
    return reports


def test_internal_topics_are_refused_on_every_path(
    kafka: KafkaInfra, proxy: Proxy, addr: str, topic: str
) -> None:
    refused_id = f"refused-{uuid.uuid4().hex}"
    delayed = [(h.DELAY_MS, b"1000"), (h.ID, refused_id.encode())]
    with RawClient(addr) as c:
        for target, headers in [
            (buffer.BUFFER_TOPIC, delayed),
            ("__kdelay_dead_letter", []),
            ("__consumer_offsets", []),
        ]:
            batch = record_batch([(b"k", b"v", headers)])
            part = _partition(c.request(produce_request(target, 0, batch)))
            assert part.error_code == TOPIC_DENIED, target
            assert f"topic {target!r} is internal to" in part.error_message

    # confluent-kafka: the proxy's Metadata already refuses the topic.
    (report,) = _reports(addr, "__kdelay_dead_letter", [[]])
    err = report.error()
    assert err is not None
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    assert proxy.addresses is not None
    with httpx.Client(base_url=proxy.addresses.http, timeout=30) as http:
        resp = http.post(
            "/v1/messages", json={"topic": buffer.BUFFER_TOPIC, "value": "v", "delay_ms": 1000}
        )
    assert resp.status_code == 403
    assert "is internal to kdelay" in resp.json()["error"]

    # A delayed record for a real topic afterwards: once it is in the buffer, so would the
    # refused one be, had it been written.
    sentinel = f"sentinel-{uuid.uuid4().hex}"
    with RawClient(addr) as c:
        ok = record_batch([(b"k", b"v", [(h.DELAY_MS, b"3600000"), (h.ID, sentinel.encode())])])
        assert _partition(c.request(produce_request(topic, 0, ok))).error_code == 0
    records = consume_until(
        kafka.bootstrap_servers, [buffer.BUFFER_TOPIC], lambda rs: bool(about(rs, sentinel))
    )
    assert about(records, refused_id) == []


def test_kdelay_cancel_still_reaches_the_buffer_through_its_carrier(
    kafka: KafkaInfra, addr: str
) -> None:
    msg_id = f"cancel-{uuid.uuid4().hex}"
    with RawClient(addr) as c:
        batch = record_batch([(None, b"", [(h.CANCEL, msg_id.encode())])])
        part = _partition(c.request(produce_request(buffer.BUFFER_TOPIC, 0, batch)))
    assert part.error_code == 0
    records = consume_until(
        kafka.bootstrap_servers, [buffer.BUFFER_TOPIC], lambda rs: bool(about(rs, msg_id))
    )
    assert isinstance(about(records, msg_id)[0], buffer.Cancel)


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (("kdelay-delay-ms", b"abc"), "header 'kdelay-delay-ms': 'abc' is not an integer"),
        (("KDELAY-DELAY-MS", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay_delay_ms", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay-delay", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay-deliver-at", b"1763900000"), "it looks like epoch seconds"),
    ],
)
def test_a_rejected_record_has_its_reason_and_index_in_the_response(
    addr: str, topic: str, header: tuple[str, bytes], said: str
) -> None:
    with RawClient(addr) as c:
        batch = record_batch([(b"k", b"ok", []), (b"k", b"bad", [header])])
        part = _partition(c.request(produce_request(topic, 0, batch, version=9)))
    assert part.error_code == kerr.InvalidRecordError.errno
    assert part.error_message.startswith(f"record 1: header {header[0]!r}: ")
    assert said in part.error_message
    assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
        (1, part.error_message)
    ]


def test_what_confluent_kafka_shows_of_a_rejected_record(addr: str, topic: str) -> None:
    """The README quotes this transcript ("Errors from the proxy"): update both together."""
    reports = _reports(addr, topic, [[], [("kdelay-delay-ms", b"abc")], []])
    shown = [(str(m.error()), m.offset()) for m in reports]
    generic = (
        'KafkaError{code=INVALID_RECORD,val=87,str="Broker: Broker failed to validate record"}'
    )
    # librdkafka keeps the proxy's message per record (rd_kafka_message_produce_errstr()), but
    # confluent-kafka's KafkaError shows only the code's generic text, for every record of the
    # batch; the offsets count up from the -1 of a failed batch.
    assert shown == [(generic, None), (generic, 0), (generic, 1)]


def test_delivery_reports_of_delayed_records_count_up_from_minus_one(addr: str, topic: str) -> None:
    reports = _reports(addr, topic, [[(h.DELAY_MS, b"3600000")]] * 3)
    assert [m.error() for m in reports] == [None, None, None]
    # The response's base offset is -1 (CONTRACT.md); librdkafka adds each record's index.
    assert [m.offset() for m in reports] == [None, 0, 1]


def test_a_librdkafka_consumer_gets_an_error_naming_the_bootstrap(
    kafka: KafkaInfra, proxy: Proxy, addr: str, topic: str
) -> None:
    connections = _requests(proxy, "ApiVersions")
    errors: list[KafkaError] = []
    consumer = Consumer(
        {
            "bootstrap.servers": addr,
            "group.id": f"g-{uuid.uuid4().hex}",
            "error_cb": errors.append,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + DEADLINE_S
        codes: set[int] = set()
        while codes != {
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
        }:
            assert time.monotonic() < deadline, f"no error reported, only {errors}"
            msg = consumer.poll(0.2)
            err = None if msg is None else msg.error()
            if err is not None:
                codes.add(err.code())
                if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    assert f"bootstrap.servers={kafka.bootstrap_servers}" in err.str()
    finally:
        consumer.close()
    # One connection for the bootstrap, one to the "broker": the consumer stayed connected
    # (before, each Fetch closed its connection and the client reconnected in a loop).
    assert _requests(proxy, "ApiVersions") - connections <= 3


def test_a_kafka_python_consumer_raises_topic_authorization_failed(addr: str, topic: str) -> None:
    consumer = KafkaConsumer(bootstrap_servers=addr, enable_auto_commit=False)
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(kerr.TopicAuthorizationFailedError):
            _poll_until_raised(consumer)
    finally:
        consumer.close()


def _poll_until_raised(consumer: KafkaConsumer) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        consumer.poll(200)


def test_a_transactional_producer_fails_in_init_transactions(addr: str) -> None:
    producer = Producer({"bootstrap.servers": addr, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(DEADLINE_S)
    err = raised.value.args[0]
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert err.fatal()
    assert "supports idempotent, not transactional, producers" in err.str()
