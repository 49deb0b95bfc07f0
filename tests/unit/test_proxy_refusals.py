"""Safe by default, on the Kafka listener's broker and the HTTP API with in-process fakes:
internal topics refused (TOPIC_AUTHORIZATION_FAILED / 403), look-alike headers and epoch seconds
rejected with the failing record's index (KIP-467), and consumers and transactional producers
answered with an authorization error naming where to go (proxy/kafka/refusals.py).

Every response is encoded to the wire and decoded again, so what is asserted is what a client
reads.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import kafka.errors as kerr
import pytest
from fastapi import FastAPI
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest
from structlog.testing import capture_logs

from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy.http.app import create_app
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.refusals import ConsumerRefusals
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Kind
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.wire import protocol as p
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import (
    init_producer_id_request,
    metadata_request,
    produce_request,
    record_batch,
)

NOW = 1_700_000_000_000
BOOTSTRAP = "kafka-0.kafka:9092,kafka-1.kafka:9092"
TOPIC_DENIED = kerr.TopicAuthorizationFailedError.errno
LISTED = ["orders", buffer.BUFFER_TOPIC, "__kdelay_dead_letter", "__consumer_offsets"]


def _ask(request: Any, upstream: FakeUpstream | None = None) -> tuple[Any, FakeUpstream, Any]:
    """The decoded response of a fresh broker to ``request``, its upstream and its metrics."""
    upstream = upstream or FakeUpstream(listed=LISTED)
    metrics = ProxyMetrics()

    async def run() -> Any:
        broker = Broker(
            upstream,
            Topics(upstream),
            metrics,
            Advertised(1, "proxy", 9192),
            clock_ms=lambda: NOW,
            consume_from=BOOTSTRAP,
        )
        request.with_header(correlation_id=7, client_id="t")
        req = p.decode_request(bytes(request.encode(header=True)))
        reply = await (await broker.handle(req))
        frame = p.encode_response(req, reply.response)
        return p.APIS[req.api_key].response.decode(frame[4:], version=req.api_version, header=True)

    return asyncio.run(run()), upstream, metrics


def _partition(response: Any) -> Any:
    return response.responses[0].partition_responses[0]


# -- internal topics on the Kafka listener ------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["__kdelay_dead_letter", "__kdelay_missing", "__consumer_offsets"]
)
@pytest.mark.parametrize("headers", [[], [(h.DELAY_MS, b"1000")]], ids=["immediate", "delayed"])
def test_produce_to_an_internal_topic_is_topic_authorization_failed(
    topic: str, headers: list[tuple[str, bytes]]
) -> None:
    batch = record_batch([(b"k", b"v", headers), (b"k", b"w", [])])
    response, upstream, metrics = _ask(produce_request(topic, 0, batch), None)
    part = _partition(response)
    assert part.error_code == TOPIC_DENIED
    assert f"topic {topic!r} is internal to" in part.error_message
    assert part.record_errors == []  # the whole topic, no record in particular
    assert upstream.written == []
    assert upstream.looked_up == []  # refused before asking upstream: nothing auto-created
    labels = {"reason": "internal_topic"}
    assert metrics.registry.get_sample_value("kdelay_proxy_records_rejected_total", labels) == 2


def test_the_buffer_topic_carries_cancels_and_refuses_the_rest_with_the_index() -> None:
    cancel = (None, b"", [(h.CANCEL, b"m-1")])
    ok, upstream, _ = _ask(produce_request(buffer.BUFFER_TOPIC, 0, record_batch([cancel])))
    assert _partition(ok).error_code == 0
    assert [o.kind for o in upstream.written] == [Kind.CANCEL]

    delayed = (b"k", b"v", [(h.DELAY_MS, b"1000")])
    batch = record_batch([cancel, delayed])
    refused, upstream, _ = _ask(produce_request(buffer.BUFFER_TOPIC, 0, batch))
    part = _partition(refused)
    assert part.error_code == TOPIC_DENIED
    assert part.error_message.startswith("record 1: topic '__kdelay_buffer' is internal")
    assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
        (1, part.error_message)
    ]
    assert upstream.written == []


def test_metadata_refuses_internal_topics_without_asking_upstream() -> None:
    names = ["orders", "__kdelay_x", "__transaction_state", buffer.BUFFER_TOPIC]
    response, upstream, _ = _ask(metadata_request(names, create=True))
    errors = {t.name: t.error_code for t in response.topics}
    assert errors == {
        "orders": 0,
        "__kdelay_x": TOPIC_DENIED,
        "__transaction_state": TOPIC_DENIED,
        buffer.BUFFER_TOPIC: 0,  # `kdelay cancel` produces to it
    }
    assert upstream.looked_up == ["orders", buffer.BUFFER_TOPIC]
    listing, _, _ = _ask(metadata_request(None))
    assert sorted(t.name for t in listing.topics) == [buffer.BUFFER_TOPIC, "orders"]


# -- per-record errors (KIP-467) for header mistakes --------------------------------------------


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (("kdelay-delay-ms", b"abc"), "header 'kdelay-delay-ms': 'abc' is not an integer"),
        (("KDELAY-DELAY-MS", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay_delay_ms", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay-delay", b"5000"), "did you mean 'kdelay-delay-ms'?"),
        (("kdelay-repeat", b"R5/PT0.01S"), "occurrences must be at least 100 ms apart"),
        (("kdelay-deliver-at", b"1763900000"), "it looks like epoch seconds"),
    ],
)
@pytest.mark.parametrize("version", [8, 9, 12])
def test_a_header_mistake_is_answered_with_the_record_index_and_message(
    header: tuple[str, bytes], said: str, version: int
) -> None:
    batch = record_batch([(b"k", b"ok", []), (b"k", b"ok", []), (b"k", b"bad", [header])])
    response, upstream, _ = _ask(produce_request("orders", 0, batch, version=version))
    part = _partition(response)
    assert part.error_code == kerr.InvalidRecordError.errno
    assert part.error_message.startswith(f"record 2: header {header[0]!r}: ")
    assert said in part.error_message
    assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
        (2, part.error_message)
    ]
    assert upstream.written == []


# -- consumers and transactional producers ------------------------------------------------------


def _fetch(version: int) -> Any:
    fp = FetchRequest.FetchTopic.FetchPartition
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                topic="orders",
                partitions=[
                    fp(partition=i, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1024)
                    for i in (0, 2)
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
        version=version,
    )


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_is_topic_authorization_failed_per_partition(version: int) -> None:
    response, upstream, _ = _ask(_fetch(version))
    assert response.error_code == 0  # a top-level error would hide the partitions' errors
    (topic,) = response.responses
    assert topic.topic == "orders"
    assert [(q.partition_index, q.error_code) for q in topic.partitions] == [
        (0, TOPIC_DENIED),
        (2, TOPIC_DENIED),
    ]
    assert upstream.looked_up == []


@pytest.mark.parametrize("version", [1, 5, 11])
def test_list_offsets_is_topic_authorization_failed_per_partition(version: int) -> None:
    lp = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name="orders", partitions=[lp(partition_index=1, timestamp=-2)]
            )
        ],
        timeout_ms=1000,
        version=version,
    )
    response, _, _ = _ask(request)
    (topic,) = response.topics
    assert [(q.partition_index, q.error_code, q.offset) for q in topic.partitions] == [
        (1, TOPIC_DENIED, -1)
    ]


_GROUP = (0, kerr.GroupAuthorizationFailedError.errno, f"bootstrap.servers={BOOTSTRAP}")
_TRANSACTION = (1, kerr.TransactionalIdAuthorizationFailedError.errno, "not transactional")


@pytest.mark.parametrize(
    ("version", "key_type", "code", "said"),
    [(v, *_GROUP) for v in range(7)] + [(v, *_TRANSACTION) for v in range(1, 7)],  # v0: groups
)
def test_find_coordinator_is_refused_naming_where_to_go(
    version: int, key_type: int, code: int, said: str
) -> None:
    request = FindCoordinatorRequest(
        key="k1", key_type=key_type, coordinator_keys=["k1", "k2"], version=version
    )
    response, _, _ = _ask(request)
    if version >= 4:
        assert [(c.key, c.error_code) for c in response.coordinators] == [
            ("k1", code),
            ("k2", code),
        ]
        assert all(said in c.error_message for c in response.coordinators)
    else:
        assert response.error_code == code
        assert response.node_id == -1
        if version >= 1:
            assert said in response.error_message


def test_transactional_init_producer_id_is_refused() -> None:
    response, _, _ = _ask(init_producer_id_request(transactional_id="tx"))
    assert response.error_code == kerr.TransactionalIdAuthorizationFailedError.errno


def test_api_versions_lists_the_apis_consumers_start_with() -> None:
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1", version=3)
    response, _, _ = _ask(request)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[p.FETCH] == (4, 12)
    assert ranges[p.LIST_OFFSETS][1] >= 7
    assert ranges[p.FIND_COORDINATOR] == (0, 6)


def test_a_refused_consumer_is_logged_once_a_minute_per_client_and_api() -> None:
    now = [0.0]
    refusals = ConsumerRefusals(BOOTSTRAP, clock=lambda: now[0])
    fetch = _fetch(12)
    fetch.with_header(correlation_id=1, client_id="c1")
    req = p.decode_request(bytes(fetch.encode(header=True)))
    with capture_logs() as logs:
        for t in (0.0, 1.0, 59.0, 61.0):
            now[0] = t
            refusals.answer(req)
    refused = [e for e in logs if e["event"] == "proxy.consumer_refused"]
    assert len(refused) == 2
    assert refused[0]["client_id"] == "c1"
    assert refused[0]["consume_from"] == BOOTSTRAP


# -- the HTTP API -------------------------------------------------------------------------------


def _post(body: dict[str, Any]) -> tuple[httpx.Response, FakeUpstream]:
    upstream = FakeUpstream(listed=LISTED)
    app: FastAPI = create_app(
        Topics(upstream), cast(Any, upstream), ProxyMetrics(), h.DelayPolicy(), now_ms=lambda: NOW
    )

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.post("/v1/messages", json=body)

    return asyncio.run(run()), upstream


@pytest.mark.parametrize(
    "topic", [buffer.BUFFER_TOPIC, "__kdelay_dead_letter", "__consumer_offsets"]
)
def test_http_refuses_an_internal_topic_with_403(topic: str) -> None:
    resp, upstream = _post({"topic": topic, "value": "v", "delay_ms": 1000})
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"].startswith(f"topic: topic {topic!r} is internal to")
    assert upstream.written == []


@pytest.mark.parametrize("name", ["KDELAY-DELAY-MS", "kdelay_id", "KDELAY_REPEAT"])
def test_http_rejects_a_look_alike_header_with_400(name: str) -> None:
    resp, upstream = _post({"topic": "t", "value": "v", "delay_ms": 5, "headers": {name: "1"}})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith(f"headers.{name}: ")
    assert upstream.written == []


def test_http_rejects_deliver_at_in_seconds() -> None:
    resp, upstream = _post({"topic": "t", "value": "v", "deliver_at": 1_763_900_000})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith("deliver_at: 1763900000 read as epoch milliseconds")
    assert "looks like epoch seconds" in resp.json()["error"]
    assert upstream.written == []


# -- recurring messages over HTTP ----------------------------------------------------------------


def test_http_takes_a_series_with_or_without_a_timing_field() -> None:
    resp, upstream = _post({"topic": "t", "value": "v", "repeat": "R3/PT1S", "delay_ms": 500})
    assert resp.status_code == 202, resp.text
    assert resp.json()["deliver_at"] == NOW + 500
    resp, upstream = _post({"topic": "t", "value": "v", "repeat": "R3/PT1S"})  # at once
    assert resp.status_code == 202, resp.text
    assert resp.json()["deliver_at"] == NOW
    (record,) = upstream.written
    route = dict(record.headers)[buffer.ROUTE_HEADER]
    assert b'"rp":"R3/PT1S"' in (route or b"")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"repeat": "R3/P1M"}, "repeat: 'P1M' is not an ISO 8601 duration"),
        ({"repeat": "R/PT1H"}, "needs 'kdelay-id'"),
        ({"repeat": "R3/PT1S", "delay_ms": 1, "deliver_at": 5}, "give exactly one of"),
    ],
)
def test_http_rejects_a_bad_series_with_400_naming_the_field(
    body: dict[str, Any], said: str
) -> None:
    resp, upstream = _post({"topic": "t", "value": "v", **body})
    assert resp.status_code == 400, resp.text
    assert said in resp.json()["error"]
    assert upstream.written == []
