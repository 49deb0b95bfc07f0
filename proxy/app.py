"""One proxy process: upstream producer, Kafka listener and HTTP API on one event loop.

``Proxy`` is used by ``kdelay proxy`` (foreground, until a signal) and ``running_proxy`` runs
one on a background thread with its own loop (tests, benchmarks, embedding).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import uvicorn

from kdelay import logs
from kdelay.errors import InfrastructureError
from kdelay.topics import ensure_internal_topics
from proxy.broker import Broker
from proxy.config import ProxyConfig
from proxy.http import create_app
from proxy.metrics import ProxyMetrics
from proxy.server import KafkaServer, Limits
from proxy.topics import Advertised, Topics
from proxy.upstream import Upstream

log = logs.get(__name__)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the proxy owns the process's signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where a started proxy listens."""

    kafka: str
    http: str


def _ssl_context(cfg: ProxyConfig) -> ssl.SSLContext | None:
    if cfg.tls_cert is None or cfg.tls_key is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
    return ctx


class Proxy:
    """The proxy's components, started and stopped together."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ProxyMetrics()
        self.upstream: Upstream | None = None
        self.kafka: KafkaServer | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self.addresses: Addresses | None = None

    async def start(self) -> Addresses:
        """Create the internal topics, connect upstream, open both listeners."""
        cfg = self.cfg
        if cfg.ensure_topics:
            await asyncio.to_thread(
                ensure_internal_topics,
                cfg.bootstrap_servers,
                partitions=cfg.buffer_partitions,
                replication=cfg.buffer_replication,
                client_config=dict(cfg.upstream_config),
            )
        self.upstream = Upstream(
            cfg.bootstrap_servers,
            self.metrics,
            timeout_ms=cfg.upstream_timeout_ms,
            linger_ms=cfg.upstream_linger_ms,
            extra=dict(cfg.upstream_config),
        )
        topics = Topics(self.upstream, ttl_s=cfg.metadata_ttl_s)
        self.kafka = KafkaServer(
            self.metrics,
            Limits(cfg.max_request_bytes, cfg.max_inflight_per_connection, cfg.idle_timeout_s),
            _ssl_context(cfg),
        )
        bound_host, bound_port = await self.kafka.bind(*cfg.listen_address)
        adv_host = cfg.advertised_host or (
            socket.getfqdn() if bound_host in ("0.0.0.0", "::") else bound_host
        )
        advertised = Advertised(cfg.node_id, adv_host, cfg.advertised_port or bound_port)
        broker = Broker(
            self.upstream,
            topics,
            self.metrics,
            advertised,
            policy=cfg.policy,
            max_decompressed_bytes=cfg.decompressed_limit,
        )
        await self.kafka.serve(broker)

        http_host, http_port = cfg.http_address
        app = create_app(topics, self.upstream, self.metrics, cfg.policy)
        self._http = _EmbeddedUvicorn(
            uvicorn.Config(app, host=http_host, port=http_port, log_config=None, lifespan="off")
        )
        self._http_task = asyncio.create_task(self._http.serve())
        while not self._http.started:
            if self._http_task.done():
                raise InfrastructureError(f"HTTP API could not listen on {cfg.http_listen}")
            await asyncio.sleep(0.01)
        sock = self._http.servers[0].sockets[0].getsockname()
        self.addresses = Addresses(
            f"{advertised.host}:{advertised.port}", f"http://{sock[0]}:{sock[1]}"
        )
        log.info(
            "proxy.started",
            kafka=f"{bound_host}:{bound_port}",
            advertised=self.addresses.kafka,
            http=self.addresses.http,
            upstream=cfg.bootstrap_servers,
            tls=cfg.tls_cert is not None,
        )
        return self.addresses

    async def stop(self) -> None:
        """Close listeners, then deliver what is queued upstream."""
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            with contextlib.suppress(Exception):
                await self._http_task
        if self.kafka is not None:
            await self.kafka.close()
        if self.upstream is not None:
            await asyncio.to_thread(self.upstream.close)
        log.info("proxy.stopped")


@contextlib.contextmanager
def running_proxy(cfg: ProxyConfig, timeout: float = 60.0) -> Iterator[Proxy]:
    """A proxy serving on a background thread's event loop until the block exits."""
    loop = asyncio.new_event_loop()
    proxy = Proxy(cfg)
    ready = threading.Event()
    failure: list[Exception] = []
    stop = asyncio.Event()

    async def main() -> None:
        try:
            await proxy.start()
        except Exception as exc:
            log.exception("proxy.start_failed")
            failure.append(exc)
            ready.set()
            await proxy.stop()
            return
        ready.set()
        await stop.wait()
        await proxy.stop()

    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(),), name="kdelay-proxy", daemon=True
    )
    thread.start()
    if not ready.wait(timeout):
        raise InfrastructureError(f"proxy did not start within {timeout} s")
    if failure:
        thread.join(timeout)
        raise failure[0]
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        loop.close()
