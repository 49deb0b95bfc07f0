"""A replica's answers served without ZooKeeper, for the unit tests of the queries and the
listing: the replica's HTTP port (delay_service/health.py) on loopback over a real store, a
ReplicaApi whose replica list is given, and the proxy's app asking through it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any, cast
from wsgiref.simple_server import make_server

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from kdelay.delay_service import health
from kdelay.delay_service.queries.queries import Answers
from kdelay.delay_service.store.store import Store
from kdelay.headers import DelayPolicy
from kdelay.proxy.http.app import create_app
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.producer import Upstream
from kdelay.zk.replica_api import Replica, ReplicaApi


def replica_answers(store: Store, now_ms: int, max_scan: int = 1_000_000) -> Answers:
    """A master's answers over ``store``, no lag, its clock stopped at ``now_ms``."""
    a = Answers(store, "replica-1", max_scan=max_scan)
    a.attach(role=lambda: "master", lag=lambda: 0, clock=lambda: now_ms)
    return a


def replica_app(store: Store, now_ms: int) -> Any:
    """The replica's HTTP port (health.py's WSGI app) over replica_answers."""
    return health.app(
        CollectorRegistry(), lambda: None, lambda: None, replica_answers(store, now_ms)
    )


@contextlib.contextmanager
def serving(store: Store, now_ms: int) -> Iterator[int]:
    """replica_app on loopback, over ``store``: its port."""
    httpd = make_server("127.0.0.1", 0, replica_app(store, now_ms), ThreadingWSGIServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_port)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


class GivenReplicas(ReplicaApi):
    """A ReplicaApi whose replica list is given (one list per shard), not read from ZooKeeper."""

    def __init__(
        self, replicas: list[Replica], *more_shards: list[Replica], **options: Any
    ) -> None:
        super().__init__("unused:2181", **options)
        self.given = [replicas, *more_shards]

    def shards(self) -> list[list[Replica]]:
        return self.given


class UnusedUpstream:
    """Upstream the proxy's app needs to exist; its query endpoints never use it."""

    cluster_id = "fake"
    bootstrap = "fake:9092"


def proxy_app(replicas: ReplicaApi | None) -> Any:
    """The proxy's ASGI app asking ``replicas`` (None: no zk_connect), auth off."""
    fake = cast(Upstream, UnusedUpstream())
    return create_app(Topics(fake), fake, ProxyMetrics(), DelayPolicy(), replicas=replicas)


def proxy_get(app: Any, url: str) -> httpx.Response:
    """One GET of ``url`` on the proxy's app, in process."""

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(url)

    return asyncio.run(get())
