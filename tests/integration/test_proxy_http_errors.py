"""The HTTP API's errors against real Kafka ("Safe by default"): one JSON shape with the right
status for every failure, a repeated POST with an id delivered once by real replicas, and an
upstream outage (a dedicated broker stopped and started again) visible in ``/readyz`` and in
``kdelay_proxy_upstream_available``."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dev.stack import KafkaSettings, LocalKafka, wait_until
from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support import infra
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

MAX_BODY = 4 * 1024 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra) -> Iterator[Proxy]:
    with running_proxy(loopback_config(kafka.bootstrap_servers, max_request_bytes=MAX_BODY)) as px:
        yield px


@pytest.fixture
def http(proxy: Proxy) -> Iterator[httpx.Client]:
    assert proxy.addresses is not None
    with httpx.Client(base_url=proxy.addresses.http, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def topic(kafka: KafkaInfra) -> str:
    name = unique_topic("px-errors")
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    return name


def _msg(**fields: Any) -> dict[str, Any]:
    return {"topic": "T", "value": "v", "delay_ms": 60_000, **fields}


def _chunks(total: int) -> Iterator[bytes]:
    """A JSON body of ``total`` bytes sent chunked (no Content-Length)."""
    yield b'{"topic": "x", "value": "'
    for _ in range(total // 65536):
        yield b"v" * 65536
    yield b'", "delay_ms": 1}'


@dataclass(frozen=True)
class Case:
    """One failing request and the answer it must get."""

    method: str
    path: str
    request: Any  # JSON (dict), raw bytes, a chunk iterator, or None
    status: int
    field: str | None
    says: str  # in the error message


CASES = [
    Case("POST", "/v1/messages", b'{"topic": "T",\n "value": ,}', 400, None, "line 2, column 11"),
    Case("POST", "/v1/messages", b'{"delay_ms": ' + b"7" * 5000 + b"}", 400, None, "4,300 digits"),
    Case("POST", "/v1/messages", b'"just a string"', 400, None, "JSON object"),
    Case("POST", "/v1/messages", _msg(delay_ms="soon"), 400, "delay_ms", "integer"),
    Case("POST", "/v1/messages", _msg(delay_ms=None), 400, "delay_ms", "exactly one"),
    Case("POST", "/v1/messages", _msg(deliver_at="next week", delay_ms=None), 400, "deliver_at",
         "RFC 3339"),
    Case("POST", "/v1/messages", _msg(id="i" * 256), 400, "id", "255"),
    Case("POST", "/v1/messages", _msg(extra=1), 400, "extra", "not permitted"),
    Case("POST", "/v1/messages", _msg(topic="px-errors-none"), 400, "topic", "does not exist"),
    Case("POST", "/v1/messages", _msg(partition=9), 400, "partition", "2 partitions"),
    Case("POST", "/v1/messages", _msg(headers={f"h{i}": "" for i in range(1001)}), 422, "headers",
         "max_headers=1,000"),
    Case("POST", "/v1/messages", _msg(value="v" * (2 << 20)), 413, "value", "max_value_bytes"),
    # Under max_value_bytes, over the upstream producer's message.max.bytes (1,000,000): upstream
    # refuses it for good, which is a 413 naming what to raise, not a retriable 503.
    Case("POST", "/v1/messages", _msg(value="v" * 1_040_000), 413, "value", "message.max.bytes"),
    Case("POST", "/v1/messages", _msg(value="v" * MAX_BODY), 413, None,
         "max_request_bytes=4,194,304"),
    Case("POST", "/v1/messages", _chunks(MAX_BODY + 65536), 413, None, "max_request_bytes"),
    Case("DELETE", "/v1/messages/" + "y" * 300, None, 400, "id", "255"),
    Case("GET", "/v1/nothing-here", None, 404, None, "no such route"),
    Case("PUT", "/v1/messages", _msg(), 405, None, "allowed: POST"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"{c.status}-{i}" for i, c in enumerate(CASES)])
def test_every_error_is_one_json_shape_with_the_right_status(
    http: httpx.Client, topic: str, case: Case
) -> None:
    kwargs: dict[str, Any] = {}
    if isinstance(case.request, dict):
        body = {k: v for k, v in case.request.items() if v is not None}
        kwargs["json"] = {**body, "topic": topic} if body.get("topic") == "T" else body
    elif case.request is not None:
        kwargs.update(content=case.request, headers=JSON)
    resp = http.request(case.method, case.path, **kwargs)
    assert resp.status_code == case.status, resp.text
    assert resp.headers["content-type"] == "application/json"
    problem = resp.json()
    assert set(problem) <= {"error", "field"}, problem
    assert case.says in problem["error"], problem
    assert problem.get("field") == case.field, problem


def _delivered(records: list[Record]) -> Counter[tuple[str, bytes]]:
    return Counter(((r.header(h.ID) or b"").decode(), r.value or b"") for r in records)


def test_a_repeated_post_is_delivered_once_and_a_new_message_with_its_id_too(
    proxy: Proxy,
    http: httpx.Client,
    kafka: KafkaInfra,
    zookeeper: ZooKeeperInfra,
    tmp_path: Path,
) -> None:
    """A client that retries its POST (after a timeout, say) writes the same buffer record
    twice; the replicas keep it once. A different message with the same id is a new one."""
    target = unique_topic("px-http-retry")
    create_target(kafka.bootstrap_servers, target)
    msg_id = f"retry-{uuid.uuid4().hex}"
    body = {"topic": target, "value": "first", "delay_ms": 1000, "id": msg_id}
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
        answers = [
            http.post("/v1/messages", json=body),
            http.post("/v1/messages", json=body),
            http.post("/v1/messages", json={**body, "value": "second"}),
            # Due after the others on the same one-partition target: once it is delivered, a
            # copy of the first would have been delivered before it.
            http.post("/v1/messages", json={**body, "value": "last", "id": None, "delay_ms": 4000}),
        ]
        assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
        records = consume_until(
            kafka.bootstrap_servers,
            [target],
            lambda rs_: any(r.value == b"last" for r in rs_),
            timeout=90,
        )
    got = _delivered(records)
    assert got[(msg_id, b"first")] == 1
    assert got[(msg_id, b"second")] == 1
    assert sum(got.values()) == 3  # first, second, last: the repeated POST is not a message
    assert_not_early(records)


def _http(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.http


def _metric(http: httpx.Client, name: str) -> float | None:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def test_an_upstream_outage_shows_in_readyz_and_metrics_until_kafka_is_back(
    tmp_path: Path,
) -> None:
    if infra.backend() != "local":
        pytest.skip("stopping a broker needs the local backend (KDELAY_TEST_INFRA=local)")
    settings = KafkaSettings(num_partitions=1, auto_create_topics=True)
    with LocalKafka(tmp_path / "kafka", settings=settings) as broker:
        cfg = loopback_config(
            broker.bootstrap_servers, upstream_timeout_ms=3000, upstream_probe_interval_s=0.5
        )
        with running_proxy(cfg) as px, httpx.Client(base_url=_http(px), timeout=60) as http:
            assert http.get("/readyz").status_code == 200
            assert _metric(http, "kdelay_proxy_upstream_available") == 1
            broker.stop_node(0)
            wait_until(
                lambda: http.get("/readyz").status_code == 503,
                timeout=60,
                what="/readyz to answer 503 while Kafka is stopped",
            )
            problem = http.get("/readyz").json()
            assert problem["error"].startswith(f"upstream Kafka at {broker.bootstrap_servers}")
            assert _metric(http, "kdelay_proxy_upstream_available") == 0
            cancel = http.delete("/v1/messages/some-id")
            assert cancel.status_code == 503, cancel.text
            assert cancel.headers["retry-after"] == "1"
            assert "error" in cancel.json()
            errors = http.get("/metrics").text
            assert 'kdelay_proxy_upstream_errors_total{error="_' in errors
            broker.start_node(0)
            broker.wait_ready()
            wait_until(
                lambda: http.get("/readyz").status_code == 200,
                timeout=60,
                what="/readyz to answer 200 once Kafka is back",
            )
            assert _metric(http, "kdelay_proxy_upstream_available") == 1
