"""Bad input and retries, sent as raw Kafka protocol built with kafka-python's classes.

Each bad input must get its documented answer (a Kafka error, or the connection closed) while
the proxy keeps serving other connections, and nothing of a rejected batch may be written.

Missing topics: the session Kafka auto-creates topics, so "auto-create off" is exercised the way
a client asks for it: a Metadata request with allow_auto_topic_creation=false must not create
the topic, and a Produce to a missing topic never creates it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import kafka.errors as kerr
import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import consume_until, create_topic, unique_topic
from tests.support.proxies import loopback_config
from tests.support.raw_client import (
    RawClient,
    init_producer_id_request,
    metadata_request,
    produce_request,
    record_batch,
)

MAX_REQUEST = 64 * 1024


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra) -> Iterator[Proxy]:
    cfg = loopback_config(
        kafka.bootstrap_servers,
        max_request_bytes=MAX_REQUEST,
        max_horizon_ms=24 * 3600 * 1000,
    )
    with running_proxy(cfg) as px:
        yield px


@pytest.fixture
def addr(proxy: Proxy) -> str:
    assert proxy.addresses is not None
    return proxy.addresses.kafka


def _partition(response: Any) -> Any:
    return response.responses[0].partition_responses[0]


def _api_versions_ok(client: RawClient) -> bool:
    resp = client.request(ApiVersionsRequest(client_software_name="t", client_software_version="1",
                                             version=3))  # fmt: skip
    return bool(resp.error_code == 0 and resp.api_keys)


def test_retried_idempotent_batch_is_written_once(kafka: KafkaInfra, addr: str) -> None:
    topic = unique_topic("px-dedupe")
    create_topic(kafka.bootstrap_servers, topic)
    with RawClient(addr) as c:
        init = c.request(init_producer_id_request())
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        batch = record_batch(
            [(b"k", b"once-0", []), (b"k", b"once-1", [])],
            producer_id=pid,
            epoch=epoch,
            base_sequence=0,
        )
        first = _partition(c.request(produce_request(topic, 0, batch)))
        retry = _partition(c.request(produce_request(topic, 0, batch)))
        assert first.error_code == 0
        assert retry.error_code == 0
        assert retry.base_offset == first.base_offset

        gap = record_batch([(b"k", b"gap", [])], producer_id=pid, epoch=epoch, base_sequence=5)
        resp = _partition(c.request(produce_request(topic, 0, gap)))
        assert resp.error_code == kerr.OutOfOrderSequenceNumberError.errno

        bumped = c.request(init_producer_id_request(producer_id=pid, epoch=epoch))
        assert (bumped.producer_id, bumped.producer_epoch) == (pid, epoch + 1)
        stale = record_batch([(b"k", b"stale", [])], producer_id=pid, epoch=epoch, base_sequence=2)
        resp = _partition(c.request(produce_request(topic, 0, stale)))
        assert resp.error_code == kerr.InvalidProducerEpochError.errno

        fresh = record_batch(
            [(b"k", b"sentinel", [])], producer_id=pid, epoch=epoch + 1, base_sequence=0
        )
        assert _partition(c.request(produce_request(topic, 0, fresh))).error_code == 0
    records = consume_until(
        kafka.bootstrap_servers, [topic], lambda rs: any(r.value == b"sentinel" for r in rs)
    )
    assert [r.value for r in records] == [b"once-0", b"once-1", b"sentinel"]


BAD_HEADERS = [
    pytest.param([(h.DELAY_MS, b"soon")], h.DELAY_MS, id="delay-ms-not-integer"),
    pytest.param([(h.DELAY_MS, b"-5")], h.DELAY_MS, id="delay-ms-negative"),
    pytest.param([(h.DELIVER_AT, b"tomorrow")], h.DELIVER_AT, id="deliver-at-garbage"),
    pytest.param([(h.DELAY_LEVEL, b"0")], h.DELAY_LEVEL, id="level-zero"),
    pytest.param([(h.DELAY_MS, b"1"), (h.DELAY_LEVEL, b"2")], h.DELAY_LEVEL, id="two-timing"),
    pytest.param([(h.DELAY_MS, b"1"), (h.DELAY_MS, b"2")], h.DELAY_MS, id="repeated-header"),
    pytest.param([(h.DELAY_MS, str(2 * 24 * 3600 * 1000).encode())], h.DELAY_MS, id="horizon"),
    pytest.param([(h.DELAY_MS, b"1"), (h.ID, b"x" * 256)], h.ID, id="id-too-long"),
    pytest.param([(h.CANCEL, b"abc"), (h.DELAY_MS, b"1")], h.CANCEL, id="cancel-with-delay"),
    pytest.param([(h.ID, b"abc")], h.ID, id="id-without-timing"),
    pytest.param([(h.REPEAT, b"R/PT1H")], "needs 'kdelay-id'", id="endless-series-without-id"),
    pytest.param([(h.REPEAT, b"R3/P1M"), (h.ID, b"x")], "months and years", id="repeat-months"),
    pytest.param([(h.REPEAT, b"cron:61 * * * *"), (h.ID, b"x")], "cron", id="repeat-bad-cron"),
]


@pytest.mark.parametrize(("bad", "named"), BAD_HEADERS)
def test_bad_control_headers_reject_the_whole_batch(
    kafka: KafkaInfra, addr: str, bad: list[tuple[str, bytes]], named: str
) -> None:
    topic = unique_topic("px-bad")
    create_topic(kafka.bootstrap_servers, topic)
    with RawClient(addr) as c:
        batch = record_batch([(b"k", b"good", []), (b"k", b"bad", bad)])
        resp = _partition(c.request(produce_request(topic, 0, batch, version=9)))
        assert resp.error_code == kerr.InvalidRecordError.errno
        assert named in resp.error_message
        assert [e.batch_index for e in resp.record_errors] == [1]
        ok = record_batch([(b"k", b"sentinel", [])])
        assert _partition(c.request(produce_request(topic, 0, ok))).error_code == 0
    records = consume_until(
        kafka.bootstrap_servers, [topic], lambda rs: any(r.value == b"sentinel" for r in rs)
    )
    assert [r.value for r in records] == [b"sentinel"]


def test_missing_topic_without_auto_create(kafka: KafkaInfra, addr: str) -> None:
    topic = unique_topic("px-missing")
    with RawClient(addr) as c:
        meta = c.request(metadata_request([topic], create=False))
        assert meta.topics[0].error_code == kerr.UnknownTopicOrPartitionError.errno
        resp = _partition(c.request(produce_request(topic, 0, record_batch([(None, b"x", [])]))))
        assert resp.error_code == kerr.UnknownTopicOrPartitionError.errno
        again = c.request(metadata_request([topic], create=False))
        assert again.topics[0].error_code == kerr.UnknownTopicOrPartitionError.errno


def test_metadata_names_the_proxy_as_only_broker(kafka: KafkaInfra, addr: str) -> None:
    topic = unique_topic("px-meta")
    create_topic(kafka.bootstrap_servers, topic, partitions=3)
    with RawClient(addr) as c:
        meta = c.request(metadata_request([topic], create=False))
    host, port = addr.rsplit(":", 1)
    assert [(b.host, b.port) for b in meta.brokers] == [(host, int(port))]
    (t,) = meta.topics
    assert t.error_code == 0
    assert sorted(p.partition_index for p in t.partitions) == [0, 1, 2]
    assert {p.leader_id for p in t.partitions} == {meta.brokers[0].node_id}


def test_transactional_producers_get_a_clear_error(addr: str) -> None:
    with RawClient(addr) as c:
        resp = c.request(init_producer_id_request(transactional_id="tx-1"))
    assert resp.error_code == kerr.TransactionalIdAuthorizationFailedError.errno


def test_unsupported_api_versions_version_falls_back_to_v0(addr: str) -> None:
    with RawClient(addr) as c:
        req = ApiVersionsRequest(client_software_name="t", client_software_version="1", version=3)
        frame = bytearray(c.encode(req))
        struct.pack_into(">h", frame, 6, 99)  # api version 99
        c.send_bytes(bytes(frame))
        raw = c.read_frame()
        assert raw is not None
        resp = ApiVersionsResponse.decode(raw, version=0, header=True)
        assert resp.error_code == kerr.UnsupportedVersionError.errno
        assert 0 in {k.api_key for k in resp.api_keys}
        assert _api_versions_ok(c)  # the handshake continues on the same connection


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


BAD_FRAMES = [
    pytest.param(struct.pack(">i", 100) + b"\x00" * 10, True, id="truncated-frame"),
    pytest.param(struct.pack(">i", MAX_REQUEST + 1) + b"\x00" * 16, False, id="size-over-limit"),
    pytest.param(struct.pack(">i", -7), False, id="negative-size"),
    pytest.param(_frame(struct.pack(">hhi", 9999, 0, 1) + b"\x00\x00"), False, id="unknown-api"),
    pytest.param(_frame(struct.pack(">hhi", 1, 12, 1) + b"\x00\x00"), False, id="malformed-fetch"),
    pytest.param(_frame(struct.pack(">hhi", 0, 9, 1) + os.urandom(40)), False, id="bad-produce"),
    pytest.param(os.urandom(512), False, id="random-bytes"),
]


@pytest.mark.parametrize(("data", "half_close"), BAD_FRAMES)
def test_malformed_input_closes_only_that_connection(
    addr: str, data: bytes, half_close: bool
) -> None:
    with RawClient(addr) as healthy, RawClient(addr, timeout=15) as bad:
        assert _api_versions_ok(healthy)
        bad.send_bytes(data)
        if half_close:
            bad.sock.shutdown(socket.SHUT_WR)
        assert bad.closed_by_peer()
        assert _api_versions_ok(healthy)
    with RawClient(addr) as fresh:
        assert _api_versions_ok(fresh)
