"""Attack: unauthenticated input cannot grow the proxy's metrics.

An outsider without credentials sent ApiVersions with thousands of distinct unsupported versions
and HTTP requests with made-up methods to ``kdelay up --secure``: every one became a new label
series of ``/metrics`` (11.6 KB grew to 494.5 KB). Here the same floods, in process, against the
SASL Kafka listener (in-process broker link) and the authenticating HTTP API: the series they
leave are the same after 50 attempts as after 500, each label taking its value from a closed set
(proxy/metric_labels.py) or ``other``."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import httpx
from prometheus_client import CollectorRegistry

from kdelay import buffer
from kdelay.headers import DelayPolicy
from kdelay.proxy import metric_labels
from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import LinkSettings
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.http.app import create_app
from kdelay.proxy.http.login import HttpAuthenticator, HttpAuthSettings
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.server import KafkaServer, Limits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.upstream.producer import Upstream
from kdelay.proxy.wire import protocol as p
from tests.support.fake_broker_link import FakeKafka
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import sasl_handshake_request

DEADLINE_S = 30.0
#: Families whose labels client input reaches.
FAMILIES = (
    "kdelay_proxy_requests",
    "kdelay_proxy_auth_failures",
    "kdelay_proxy_http_requests",
)


def _series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every (sample name, labels) of the families client input reaches."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in registry.collect()
        if family.name in FAMILIES
        for s in family.samples
    }


def _raw_header(api_key: int, version: int, correlation_id: int) -> bytes:
    """A request frame of only a header (v1: key, version, correlation id, null client id):
    enough for the proxy to refuse an API or version it does not speak."""
    body = struct.pack(">hhih", api_key, version, correlation_id, -1)
    return struct.pack(">i", len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(DEADLINE_S):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)


async def _drain(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(DEADLINE_S):
            while await reader.read(65536):
                pass


@contextlib.asynccontextmanager
async def _sasl_listener(metrics: ProxyMetrics) -> AsyncIterator[int]:
    kafka = FakeKafka(users={"alice": "pw"}, topics={"t": 1})
    auth = AuthSettings(
        mechanisms=("SCRAM-SHA-512", "PLAIN"),
        link=LinkSettings((("127.0.0.1", 1),)),
        cache=AclCache(5.0),
        backoff=LoginBackoff(0.0, 0.0),
        metrics=metrics,
        link_factory=kafka.factory,
    )
    upstream = FakeUpstream(topics={"t": 1})
    server = KafkaServer(metrics, Limits(), auth=auth)
    host, port = await server.bind("127.0.0.1", 0)
    broker = Broker(
        cast(Upstream, upstream), Topics(upstream), metrics, Advertised(1, host, port), sasl=True
    )
    await server.serve(broker)
    try:
        yield port
    finally:
        await server.close()


async def _kafka_flood(port: int, attempts: int) -> None:
    """Unauthenticated: ``attempts`` ApiVersions with distinct unsupported versions (answered,
    the connection stays), a tenth as many unknown API keys and unknown SASL mechanisms (each
    closes its connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(attempts):
        writer.write(_raw_header(p.API_VERSIONS, 100 + i, i))
    await writer.drain()
    for _ in range(attempts):
        await _read_frame(reader)
    writer.close()
    for i in range(attempts // 10):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_raw_header(1000 + i, i, 1))
        await _drain(reader)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        handshake = sasl_handshake_request(f"X-MECH-{i}")
        handshake.with_header(correlation_id=1, client_id="t")
        writer.write(bytes(handshake.encode(header=True, framed=True)))
        await _drain(reader)
        writer.close()


def _kafka_series(attempts: int) -> tuple[set[tuple[str, tuple[tuple[str, str], ...]]], int]:
    metrics = ProxyMetrics()

    async def run() -> None:
        async with _sasl_listener(metrics) as port:
            await _kafka_flood(port, attempts)

    asyncio.run(run())
    return _series(metrics.registry), len(metrics.exposition())


def test_unsupported_versions_and_unknown_apis_leave_a_bounded_set_of_series() -> None:
    small, small_bytes = _kafka_series(50)
    large, large_bytes = _kafka_series(500)
    assert large == small, sorted(large - small)[:5]
    # Only the digits of the counts grow.
    assert large_bytes - small_bytes < 200, (small_bytes, large_bytes)
    versions = {dict(labels).get("version") for _, labels in large} - {None}
    apis = {dict(labels).get("api") for _, labels in large} - {None}
    mechanisms = {dict(labels).get("mechanism") for _, labels in large} - {None}
    assert versions <= {metric_labels.OTHER, *map(str, range(20))}
    assert apis <= {metric_labels.OTHER, *p.API_NAMES.values()}
    assert mechanisms <= {metric_labels.OTHER, "none", "SCRAM-SHA-512", "PLAIN"}


# -- the HTTP API ----------------------------------------------------------------------------


def _http_series(tmp: Path, attempts: int) -> tuple[set[object], int]:
    """Unauthenticated requests with ``attempts`` made-up methods on made-up paths, to an
    authenticating API."""
    kafka = FakeKafka(users={"alice": "pw"}, topics={"orders": 1, buffer.BUFFER_TOPIC: 1})
    upstream = FakeUpstream(topics={"orders": 1, buffer.BUFFER_TOPIC: 1})
    metrics = upstream.metrics
    auth = HttpAuthenticator(
        HttpAuthSettings(
            mechanism="PLAIN",
            link=LinkSettings((("127.0.0.1", 1),)),
            cache=AclCache(5.0),
            backoff=LoginBackoff(0.0, 0.0),
            metrics=metrics,
            login_ttl_s=5.0,
            link_factory=kafka.factory,
        )
    )
    app = create_app(
        Topics(upstream),
        cast(Upstream, upstream),
        metrics,
        DelayPolicy(),
        availability=upstream.availability,
        auth=auth,
    )

    async def run() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for i in range(attempts):
                await client.request(f"M{i}X", f"/v1/messages/{i}")
                await client.request(f"M{i}Y", "/metrics")
                await client.request("GET", f"/nowhere/{i}")
        await auth.close()

    asyncio.run(run())
    return set(_series(metrics.registry)), len(metrics.exposition())


def test_made_up_methods_and_paths_leave_a_bounded_set_of_series(tmp_path: Path) -> None:
    small, small_bytes = _http_series(tmp_path, 50)
    large, large_bytes = _http_series(tmp_path, 500)
    assert large == small
    assert large_bytes - small_bytes < 200, (small_bytes, large_bytes)


# -- the clamps themselves -------------------------------------------------------------------


def test_each_label_takes_a_value_of_its_closed_set_or_other() -> None:
    assert metric_labels.api(p.PRODUCE) == "Produce"
    assert metric_labels.api(1234) == metric_labels.OTHER
    assert metric_labels.api_version(p.PRODUCE, 9) == "9"
    assert metric_labels.api_version(p.API_VERSIONS, 4) == "4"
    assert metric_labels.api_version(p.API_VERSIONS, 3000) == metric_labels.OTHER
    assert metric_labels.api_version(p.API_VERSIONS, -1) == metric_labels.OTHER
    assert metric_labels.api_version(1234, 0) == metric_labels.OTHER
    assert metric_labels.result("ok") == "ok"
    assert metric_labels.result("UNSUPPORTED_VERSION") == "UNSUPPORTED_VERSION"
    assert metric_labels.result("made up") == metric_labels.OTHER
    assert metric_labels.http_method("DELETE") == "DELETE"
    assert metric_labels.http_method("delete") == metric_labels.OTHER
    assert metric_labels.http_method("PROPFIND") == metric_labels.OTHER
    assert metric_labels.http_status(404) == "404"
    assert metric_labels.http_status(1000) == metric_labels.OTHER
    assert metric_labels.mechanism("PLAIN", ("PLAIN",)) == "PLAIN"
    assert metric_labels.mechanism("PLAIN", ("SCRAM-SHA-512",)) == metric_labels.OTHER
    assert metric_labels.mechanism(None, ("PLAIN",)) == "none"
    assert metric_labels.auth_reason("invalid_credentials") == "invalid_credentials"
    assert metric_labels.auth_reason("http_invalid_token") == "http_invalid_token"
    assert metric_labels.auth_reason("anything else") == metric_labels.OTHER
