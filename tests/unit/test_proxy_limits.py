"""The per-record limits (proxy/limits.py) on both paths: routing, the Kafka listener's broker
(INVALID_RECORD naming the limit, nothing of the batch written) and the HTTP API (413/422)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import kafka.errors as kerr
import pytest
from fastapi import FastAPI

from kdelay import headers as h
from kdelay.proxy.config import ProxyConfig
from kdelay.proxy.http.app import create_app
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Incoming, Kind, RejectedRecordError, route
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.wire import protocol as p
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import produce_request, record_batch

NOW = 1_700_000_000_000
POLICY = h.DelayPolicy()
SMALL = RecordLimits(
    max_headers=10,
    max_header_name_bytes=64,
    max_header_value_bytes=100,
    max_key_bytes=50,
    max_value_bytes=200,
)
DELAYED: list[tuple[str, bytes | None]] = [(h.DELAY_MS, b"1000")]

# One record over each limit (and the same record at the limit is accepted), as
# (setting, limit value, key, value, headers).
OVER: list[tuple[str, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    ("max_headers", 10, None, b"v", [(f"h{i}", b"") for i in range(11)]),
    ("max_header_name_bytes", 64, None, b"v", [("n" * 65, b"x")]),
    ("max_header_name_bytes", 64, None, b"v", [("é" * 33, b"x")]),  # 66 bytes, 33 characters
    ("max_header_value_bytes", 100, None, b"v", [("a", b"x" * 101)]),
    ("max_key_bytes", 50, b"k" * 51, b"v", []),
    ("max_value_bytes", 200, None, b"v" * 201, []),
]
AT_LIMIT: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (None, b"v", [(f"h{i}", b"") for i in range(10)]),
    (None, b"v", [("n" * 64, b"x" * 100), ("é" * 32, None)]),
    (b"k" * 50, b"v" * 200, []),
    (None, None, []),
]


def _ids(case: tuple[Any, ...]) -> str:
    return str(case[0])


# -- routing: the one place ------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], DELAYED], ids=["immediate", "delayed"])
@pytest.mark.parametrize("case", OVER, ids=_ids)
def test_a_record_over_a_limit_is_rejected_naming_the_limit(
    case: tuple[str, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]],
    extra: list[tuple[str, bytes | None]],
) -> None:
    setting, limit, key, value, headers = case
    if setting == "max_headers":
        headers = headers[: limit + 1 - len(extra)]  # the control header counts too
    records = [Incoming(None, b"ok", []), Incoming(key, value, [*headers, *extra])]
    with pytest.raises(RejectedRecordError) as rejected:
        route("t", 0, records, NOW, POLICY, limits=SMALL)
    exc = rejected.value
    assert exc.index == 1
    assert exc.limit is not None
    assert exc.limit.setting == setting
    assert exc.reason == setting
    assert f"{setting}={limit}" in str(exc)
    assert str(exc).startswith("record 1: ")


@pytest.mark.parametrize("case", AT_LIMIT)
def test_a_record_at_the_limits_is_routed(
    case: tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]],
) -> None:
    key, value, headers = case
    out, counts = route("t", 0, [Incoming(key, value, headers)], NOW, POLICY, limits=SMALL)
    assert counts[Kind.IMMEDIATE] == 1
    assert out[0].headers == headers


def test_default_limits_reject_the_poison_record_of_issue_10() -> None:
    poison = Incoming(None, b"v", [("", b"") for _ in range(70_000)] + DELAYED)
    with pytest.raises(RejectedRecordError, match=r"max_headers=1,000"):
        route("t", 0, [poison], NOW, POLICY)


def test_the_id_length_limit_holds_on_the_kafka_path() -> None:
    rec = Incoming(None, b"v", [*DELAYED, (h.ID, b"x" * (h.MAX_ID_BYTES + 1))])
    with pytest.raises(RejectedRecordError, match="the maximum is 255") as rejected:
        route("t", 0, [rec], NOW, POLICY)
    assert rejected.value.header_error is not None
    assert rejected.value.reason == "invalid_record"


def test_config_builds_the_limits_and_describes_them() -> None:
    cfg = ProxyConfig(max_headers=20, max_value_bytes=4096)
    assert cfg.limits == RecordLimits(max_headers=20, max_value_bytes=4096)
    assert ProxyConfig().limits == RecordLimits()
    for name in ("max_headers", "max_header_name_bytes", "max_header_value_bytes"):
        assert ProxyConfig.model_fields[name].description
    with pytest.raises(ValueError, match="max_headers"):
        ProxyConfig(max_headers=1)


# -- the Kafka listener ------------------------------------------------------------------------


def _produce(batch: bytes, limits: RecordLimits) -> tuple[Any, FakeUpstream, ProxyMetrics]:
    async def run() -> tuple[Any, FakeUpstream, ProxyMetrics]:
        upstream = FakeUpstream()
        metrics = ProxyMetrics()
        broker = Broker(upstream, Topics(upstream), metrics, Advertised(1, "h", 1), limits=limits)
        req = produce_request("t", 0, batch)
        req.with_header(correlation_id=1, client_id="t")
        reply = await (await broker.handle(p.decode_request(bytes(req.encode(header=True)))))
        return reply.response.responses[0].partition_responses[0], upstream, metrics

    return asyncio.run(run())


@pytest.mark.parametrize("extra", [[], DELAYED], ids=["immediate", "delayed"])
@pytest.mark.parametrize("case", OVER, ids=_ids)
def test_the_broker_answers_invalid_record_and_writes_nothing(
    case: tuple[str, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]],
    extra: list[tuple[str, bytes]],
) -> None:
    setting, limit, key, value, headers = case
    if setting == "max_headers":
        headers = headers[: limit + 1 - len(extra)]
    batch = record_batch(
        [(b"a", b"ok", []), (key, value, cast(list[tuple[str, bytes]], [*headers, *extra]))]
    )
    part, upstream, metrics = _produce(batch, SMALL)
    assert part.error_code == kerr.InvalidRecordError.errno
    assert f"{setting}={limit}" in part.error_message
    assert "record 1" in part.error_message
    assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
        (1, part.error_message)
    ]
    assert upstream.written == []
    rejected = metrics.registry.get_sample_value
    assert rejected("kdelay_proxy_records_rejected_total", {"reason": setting}) == 2
    assert rejected("kdelay_proxy_records_total", {"kind": "rejected"}) == 2


def test_the_broker_passes_a_batch_within_the_limits() -> None:
    part, upstream, _ = _produce(record_batch([(b"k" * 50, b"v" * 200, [("a", b"x")])]), SMALL)
    assert part.error_code == 0
    assert len(upstream.written) == 1


# -- the HTTP API ------------------------------------------------------------------------------


def _app(limits: RecordLimits = SMALL) -> tuple[FastAPI, FakeUpstream, ProxyMetrics]:
    upstream = FakeUpstream()
    metrics = ProxyMetrics()
    app = create_app(
        Topics(upstream), cast(Any, upstream), metrics, POLICY, limits=limits, now_ms=lambda: NOW
    )
    return app, upstream, metrics


def _call(app: FastAPI, *requests: tuple[str, str, dict[str, Any] | None]) -> list[httpx.Response]:
    """The responses of ``app`` to (method, path, JSON body) requests, in order."""

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return [await client.request(m, path, json=body) for m, path, body in requests]

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("body", "status", "setting"),
    [
        ({"headers": {f"h{i}": "" for i in range(9)}}, 422, "max_headers"),  # + delay_ms = 10+1
        ({"headers": {"n" * 65: "x"}}, 413, "max_header_name_bytes"),
        ({"headers": {"a": "x" * 101}}, 413, "max_header_value_bytes"),
        ({"key": "k" * 51}, 413, "max_key_bytes"),
        ({"value": "v" * 201}, 413, "max_value_bytes"),
    ],
)
def test_http_rejects_a_message_over_a_limit(
    body: dict[str, Any], status: int, setting: str
) -> None:
    app, upstream, metrics = _app()
    msg = {"topic": "t", "value": "v", "delay_ms": 1000, "id": "m1", **body}
    (resp,) = _call(app, ("POST", "/v1/messages", msg))
    assert resp.status_code == status, resp.text
    assert setting in resp.json()["error"]
    assert upstream.written == []
    labels = {"reason": setting}
    assert metrics.registry.get_sample_value("kdelay_proxy_records_rejected_total", labels) == 1


def test_http_accepts_a_message_at_the_limits_and_keeps_400_for_a_long_id() -> None:
    app, upstream, _ = _app()
    (ok,) = _call(
        app,
        (
            "POST",
            "/v1/messages",
            {"topic": "t", "key": "k" * 50, "value": "v" * 200, "delay_ms": 1},
        ),
    )
    assert ok.status_code == 202, ok.text
    assert len(upstream.written) == 1
    # The id keeps its own 1-255 byte limit and its 400 (CONTRACT.md v1), within the default
    # header value limit.
    (long_id,) = _call(
        _app(RecordLimits())[0],
        ("POST", "/v1/messages", {"topic": "t", "value": "v", "delay_ms": 1, "id": "x" * 256}),
    )
    assert long_id.status_code == 400
    assert "maximum is 255" in long_id.json()["error"]


def test_readyz_names_a_component_that_is_down() -> None:
    upstream = FakeUpstream()
    down: list[str] = []
    app = create_app(
        Topics(upstream),
        cast(Any, upstream),
        ProxyMetrics(),
        POLICY,
        not_ready=lambda: down[0] if down else None,
    )
    (ready,) = _call(app, ("GET", "/readyz", None))
    assert ready.status_code == 200
    down.append("upstream_poll is down (RuntimeError: boom), restarting")
    (resp,) = _call(app, ("GET", "/readyz", None))
    assert resp.status_code == 503
    assert "upstream_poll" in resp.json()["error"]
