"""The HTTP API's one error shape and its statuses (proxy/http/errors.py), with a fake upstream:
every failure, the framework's own included, answers JSON ``{"error": ...}`` naming the field or
setting; and a repeated POST with an id writes the same buffer key (README "HTTP API")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import httpx
import kafka.errors as kerr
import pytest
from fastapi import FastAPI

from kdelay import buffer
from kdelay.headers import DelayPolicy
from kdelay.proxy.http.app import create_app
from kdelay.proxy.routing.cancel_acks import CancelAcks
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.producer import Upstream, UpstreamError
from tests.support.fakes import FakeUpstream

TOPIC = "orders"
MAX_BODY = 64 * 1024


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream(topics={TOPIC: 2, buffer.BUFFER_TOPIC: 2}, listed=[TOPIC])


class Client:
    """A synchronous face of httpx's ASGI transport, on a loop of its own (the app's futures
    and the budget live on it, as on the proxy's loop)."""

    def __init__(self, app: FastAPI) -> None:
        self.loop = asyncio.new_event_loop()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://proxy")

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, url, **kwargs))

    def get(self, url: str) -> httpx.Response:
        return self.request("GET", url)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", url, **kwargs)

    def delete(self, url: str) -> httpx.Response:
        return self.request("DELETE", url)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


def _client(upstream: FakeUpstream, **options: Any) -> Iterator[Client]:
    app = create_app(
        Topics(upstream),
        cast(Upstream, upstream),
        upstream.metrics,
        DelayPolicy(),
        availability=upstream.availability,
        **options,
    )
    client = Client(app)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def http(upstream: FakeUpstream) -> Iterator[Client]:
    yield from _client(upstream, max_body_bytes=MAX_BODY)


def _msg(**fields: Any) -> dict[str, Any]:
    return {"topic": TOPIC, "value": "v", "delay_ms": 1000, **fields}


def _problem(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body: dict[str, Any] = resp.json()
    assert set(body) <= {"error", "field"}
    assert isinstance(body["error"], str)
    assert body["error"]
    return body


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        pytest.param(b'{"topic": "orders",\n  "value": }', 400, "line 2, column 12", id="json"),
        pytest.param(b'{"delay_ms": ' + b"9" * 5000 + b"}", 400, "4,300 digits", id="digits"),
        pytest.param(b"[1, 2]", 400, "body: must be a JSON object", id="array"),
        pytest.param(b"", 400, "body: a JSON object is required", id="empty"),
        pytest.param(b"\xff\xfe{", 400, "body: ", id="not-utf8"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(
    http: Client, body: bytes, status: int, says: str
) -> None:
    resp = http.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert says in _problem(resp, status)["error"]


@pytest.mark.parametrize(
    ("fields", "status", "field", "says"),
    [
        ({"delay_ms": "soon"}, 400, "delay_ms", "integer"),
        ({"topic": None}, 400, "topic", "string"),
        ({"surprise": 1}, 400, "surprise", "not permitted"),
        ({"delay_level": 2}, 400, "delay_ms", "exactly one"),
        ({"delay_ms": None, "deliver_at": "next week"}, 400, "deliver_at", ""),
        ({"delay_ms": 10**15}, 400, "delay_ms", "horizon"),
        ({"id": "x" * 256}, 400, "id", "255"),
        ({"value": None, "value_b64": "***"}, 400, "value_b64", "base64"),
        ({"headers": {"kdelay-id": "a"}}, 400, "headers.kdelay-id", "JSON field"),
        ({"topic": "nowhere"}, 400, "topic", "does not exist"),
        ({"partition": 7}, 400, "partition", "2 partitions"),
        ({"headers": {f"h{i}": "" for i in range(1001)}}, 422, "headers", "max_headers=1,000"),
    ],
)
def test_field_errors_name_the_field(
    http: Client, fields: dict[str, Any], status: int, field: str, says: str
) -> None:
    body = {k: v for k, v in _msg(**fields).items() if v is not None or k == "topic"}
    problem = _problem(http.post("/v1/messages", json=body), status)
    assert problem["error"].startswith(f"{field}:"), problem
    assert problem.get("field") == field
    assert says in problem["error"]


def test_value_over_max_value_bytes_is_413_naming_the_setting(upstream: FakeUpstream) -> None:
    for client in _client(upstream):
        resp = client.post("/v1/messages", json=_msg(value="v" * (1024 * 1024 + 1)))
    problem = _problem(resp, 413)
    assert problem["field"] == "value"
    assert "max_value_bytes=1,048,576" in problem["error"]


def test_body_over_max_request_bytes_is_413_before_it_is_read(http: Client) -> None:
    resp = http.post("/v1/messages", json=_msg(value="v" * MAX_BODY))
    assert "max_request_bytes=65,536" in _problem(resp, 413)["error"]


@pytest.mark.parametrize(
    ("error", "status", "says"),
    [
        (kerr.MessageSizeTooLargeError, 413, "message.max.bytes"),
        (kerr.RecordListTooLargeError, 413, "max.message.bytes"),
        (kerr.RequestTimedOutError, 503, "REQUEST_TIMED_OUT"),
        (kerr.NotEnoughReplicasError, 503, "NOT_ENOUGH_REPLICAS"),
        (kerr.TopicAuthorizationFailedError, 502, "TOPIC_AUTHORIZATION_FAILED"),
    ],
)
def test_upstream_refusals_keep_permanent_and_retriable_apart(
    http: Client, upstream: FakeUpstream, error: type[Exception], status: int, says: str
) -> None:
    upstream.fail = UpstreamError(int(getattr(error, "errno", -1)), "upstream Kafka: no")
    resp = http.post("/v1/messages", json=_msg(id="m1"))
    assert says in _problem(resp, status)["error"]
    assert ("retry-after" in resp.headers) == (status == 503)
    assert _problem(http.delete("/v1/messages/m1"), status)


def test_routes_methods_and_bugs_answer_the_same_shape(
    http: Client, upstream: FakeUpstream
) -> None:
    assert "GET /nope: no such route" in _problem(http.get("/nope"), 404)["error"]
    not_allowed = http.put("/v1/messages", json=_msg())
    assert "allowed: POST" in _problem(not_allowed, 405)["error"]
    assert not_allowed.headers["allow"] == "POST"
    assert _problem(http.delete("/v1/messages/" + "y" * 300), 400)["field"] == "id"
    upstream.fail = RuntimeError("a bug")
    assert "RuntimeError" in _problem(http.post("/v1/messages", json=_msg()), 500)["error"]


def test_readyz_and_writes_name_upstream_while_it_is_down(
    http: Client, upstream: FakeUpstream
) -> None:
    assert http.get("/readyz").json() == {"status": "ready"}
    upstream.availability.down("Local: All broker connections are down")
    problem = _problem(http.get("/readyz"), 503)
    assert "upstream Kafka at fake:9092 is unavailable" in problem["error"]
    assert "All broker connections are down" in problem["error"]
    # Writes answer the same 503 at once instead of waiting for the upstream timeout.
    cancel = http.delete("/v1/messages/m1")
    assert _problem(cancel, 503)["error"] == problem["error"]
    assert cancel.headers["retry-after"] == "1"
    assert upstream.written == []
    upstream.availability.up("test")
    assert http.get("/readyz").status_code == 200
    assert http.delete("/v1/messages/m1").status_code == 202


def _buffer_key(upstream: FakeUpstream) -> bytes | None:
    return upstream.written[-1].key


def test_the_same_post_twice_writes_the_same_buffer_key(
    http: Client, upstream: FakeUpstream
) -> None:
    body = _msg(id="order-1", key="k", headers={"trace": "t1"}, partition=1)
    keys = []
    for sent in (body, body, {**body, "value": "other"}, {**body, "headers": {"trace": "t2"}}):
        assert http.post("/v1/messages", json=sent).status_code == 202
        keys.append(_buffer_key(upstream))
    assert keys[0] == keys[1]
    assert len(set(keys)) == 3
    # The same bytes as value or value_b64 are the same message.
    http.post("/v1/messages", json={**body, "value": None, "value_b64": "dg=="})
    assert _buffer_key(upstream) == keys[0]
    # Without an id every POST is a message of its own.
    anonymous = []
    for _ in range(2):
        http.post("/v1/messages", json=_msg())
        anonymous.append(_buffer_key(upstream))
    assert anonymous[0] != anonymous[1]


BODY = {"topic": TOPIC, "value": "v", "delay_ms": 60_000}


class _UnknownClock:
    """A broker clock no probe has answered yet."""

    def now_ms(self) -> int | None:
        return None

    def upper_ms(self) -> int | None:
        return None


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("DELETE", "/v1/messages/order-1"),
        ("DELETE", "/v1/messages?id_prefix=order-"),
        ("PUT", "/v1/messages/order-1"),
    ],
)
def test_a_cancel_answers_503_at_once_while_the_broker_clock_is_unknown(
    upstream: FakeUpstream, method: str, url: str
) -> None:
    """Its acknowledgement would wait for the clock however long that takes (a bulk cancel's
    client once waited out its 60-s timeout): 503 at once, naming the clock, nothing written."""
    acks = CancelAcks(_UnknownClock())
    for client in _client(upstream, cancel_acks=acks):
        resp = client.loop.run_until_complete(
            asyncio.wait_for(client.client.request(method, url, json=BODY), timeout=20)
        )
        assert resp.status_code == 503, resp.text
        assert "__kdelay_clock" in resp.json()["error"]
        assert "Retry-After" in resp.headers
    assert upstream.written == []
