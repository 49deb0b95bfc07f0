"""One proxy process: upstream producer, Kafka listener and HTTP API on one event loop.

``Proxy`` is used by ``kdelay proxy`` (foreground, until a signal) and ``running_proxy`` runs
one on a background thread with its own loop (tests, benchmarks, embedding).

Supervision (proxy/restarts.py): the HTTP server and the Kafka listener are watched by tasks
on the loop and restarted after a failure; the upstream poll thread supervises itself. When the
supervisor gives up on a component, ``gave_up`` is set and ``kdelay proxy`` exits with status 70.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import uvicorn

from kdelay import logs
from kdelay.broker_clock import BrokerClock
from kdelay.errors import InfrastructureError
from kdelay.proxy.auth import upstream_acls
from kdelay.proxy.auth.owners import Owners
from kdelay.proxy.auth.prelogin import PreloginGate
from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.config import ProxyConfig
from kdelay.proxy.http import authenticate
from kdelay.proxy.http.app import create_app
from kdelay.proxy.http.login import HttpAuthenticator
from kdelay.proxy.kafka.auth_settings import AuthSettings, listener_auth
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.idempotence import ProducerRegistry
from kdelay.proxy.kafka.server import KafkaServer, Limits, reuse_port_socket, tls_context
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.restarts import ComponentStoppedError, SupervisedComponents
from kdelay.proxy.routing.buffer_keys import AcceptanceOrder
from kdelay.proxy.routing.cancel_acks import CancelAcks
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.upstream.producer import Upstream
from kdelay.topics import ensure_internal_topics
from kdelay.zk.replica_api import ReplicaApi

log = logs.get(__name__)

#: How often the Kafka listener is checked to be accepting.
LISTENER_CHECK_S = 1.0


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


def _http_authenticator(
    cfg: ProxyConfig, metrics: ProxyMetrics, listener: AuthSettings | None
) -> HttpAuthenticator | None:
    """The HTTP API's authentication (proxy/http/login.py), sharing the Kafka listener's ACL
    cache, login backoff and cap on concurrent logins when it has SASL."""
    return authenticate.authenticator(
        cfg,
        metrics,
        cache=listener.cache if listener else None,
        backoff=listener.backoff if listener else None,
        logins=listener.logins if listener else None,
    )


class Proxy:
    """The proxy's components, started and stopped together."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ProxyMetrics()
        self.upstream: Upstream | None = None
        self.kafka: KafkaServer | None = None
        self.replicas: ReplicaApi | None = None
        self.clock: BrokerClock | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._http_config: uvicorn.Config | None = None
        #: The HTTP API's logins to Kafka (``http_auth = "kafka"``), else None.
        self.http_auth: HttpAuthenticator | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._stop_requested: asyncio.Event | None = None
        self.addresses: Addresses | None = None
        #: Set (on the loop) when the supervisor gave up on a component: the process must exit.
        self.gave_up: asyncio.Event | None = None
        self.supervisor = SupervisedComponents(
            self.metrics,
            backoff_s=cfg.component_restart_backoff_s,
            max_failures=cfg.component_max_failures,
            on_give_up=self._give_up,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    def _give_up(self, _component: str) -> None:
        """The supervisor gave up (any thread): wake whoever waits on ``gave_up``."""
        loop, event = self._loop, self.gave_up
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: stopping anyway
                loop.call_soon_threadsafe(event.set)

    async def start(self) -> Addresses:
        """Create the internal topics, connect upstream, open both listeners."""
        cfg = self.cfg
        self._loop = asyncio.get_running_loop()
        self.gave_up = asyncio.Event()
        self._stop_requested = asyncio.Event()
        await asyncio.to_thread(upstream_acls.check, cfg)  # least privilege (kdelay/acls.py)
        if cfg.ensure_topics:
            await asyncio.to_thread(
                ensure_internal_topics,
                cfg.bootstrap_servers,
                partitions=cfg.buffer_partitions,
                replication=cfg.buffer_replication,
                min_insync=cfg.buffer_min_insync_replicas,
                client_config=cfg.upstream_client_config(),
            )
        self.upstream = Upstream(
            cfg.bootstrap_servers,
            self.metrics,
            timeout_ms=cfg.upstream_timeout_ms,
            linger_ms=cfg.upstream_linger_ms,
            extra=cfg.upstream_client_config(),
            supervisor=self.supervisor,
            probe_interval_s=cfg.upstream_probe_interval_s,
        )
        order, cancel_acks = await self._start_clock()
        topics = Topics(self.upstream, ttl_s=cfg.metadata_ttl_s)
        # One budget for both listeners: request bytes in memory, process-wide.
        budget = RequestBudget(cfg.max_buffered_request_bytes, self.metrics)
        self.kafka = KafkaServer(
            self.metrics,
            Limits(cfg.max_request_bytes, cfg.max_inflight_per_connection, cfg.idle_timeout_s),
            tls_context(cfg.tls_cert, cfg.tls_key),
            budget,
            reuse_port=cfg.reuse_port,
            auth=listener_auth(cfg, self.metrics),
            prelogin=PreloginGate(
                cfg.prelogin_max_connections, cfg.prelogin_max_connections_per_address
            ),
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
            producers=ProducerRegistry(
                ttl_s=cfg.producer_state_ttl_s,
                max_producers=cfg.max_producer_states,
                metrics=self.metrics,
            ),
            limits=cfg.limits,
            max_decompressed_bytes=cfg.decompressed_limit,
            consume_from=cfg.bootstrap_servers,
            sasl=cfg.sasl_enabled,
            order=order,
            cancel_acks=cancel_acks,
            owners=Owners(lambda: self.replicas),
        )
        await self.kafka.serve(broker)

        http_host, http_port = cfg.http_address
        # The status and timeline questions go to the replicas (zk/replica_api.py); their
        # ZooKeeper session starts with the first question, so ZooKeeper never delays start-up.
        if cfg.zk_connect is not None:
            self.replicas = ReplicaApi(
                cfg.zk_connect,
                cfg.zk_root,
                timeout_s=cfg.replica_timeout_ms / 1000,
                security=cfg,
            )
        self.http_auth = _http_authenticator(cfg, self.metrics, self.kafka.auth)
        app = create_app(
            topics,
            self.upstream,
            self.metrics,
            cfg.policy,
            limits=cfg.limits,
            not_ready=self.not_ready,
            max_body_bytes=cfg.max_request_bytes,
            budget=budget,
            availability=self.upstream.availability,
            replicas=self.replicas,
            pending_timeout_s=cfg.pending_timeout_ms / 1000,
            order=order,
            cancel_acks=cancel_acks,
            auth=self.http_auth,
            body_timeout_s=cfg.http_body_timeout_ms / 1000,
        )
        # HTTPS when http_tls_cert and http_tls_key are set (uvicorn loads them at each start).
        self._http_config = uvicorn.Config(
            app,
            host=http_host,
            port=http_port,
            log_config=None,
            lifespan="off",
            ssl_certfile=cfg.http_tls_cert,
            ssl_keyfile=cfg.http_tls_key,
            # X-Forwarded-For is believed only from http_trusted_proxies (uvicorn's default
            # believes 127.0.0.1, or $FORWARDED_ALLOW_IPS: never implicitly).
            proxy_headers=bool(cfg.http_trusted_proxies),
            forwarded_allow_ips=list(cfg.http_trusted_proxies),
        )
        first = await self._start_http()
        assert self._http is not None
        sock = self._http.servers[0].sockets[0].getsockname()
        self._watchers = [
            asyncio.create_task(self._supervise_http(first)),
            asyncio.create_task(
                self.supervisor.keep_running(
                    "kafka_listener", self._watch_listener, self._stop_requested
                )
            ),
        ]
        self.addresses = Addresses(
            f"{advertised.host}:{advertised.port}",
            f"{'https' if cfg.https else 'http'}://{sock[0]}:{sock[1]}",
        )
        log.info(
            "proxy.started",
            kafka=f"{bound_host}:{bound_port}",
            advertised=self.addresses.kafka,
            http=self.addresses.http,
            upstream=cfg.bootstrap_servers,
            tls=cfg.tls_cert is not None,
            listener=cfg.listener_protocol,
        )
        return self.addresses

    def not_ready(self) -> str | None:
        """Why the proxy is not ready (a supervised component is down), or None."""
        return self.supervisor.not_ready()

    async def _start_http(self) -> asyncio.Task[None]:
        """A new uvicorn server, listening; returns its serving task."""
        assert self._http_config is not None
        server = _EmbeddedUvicorn(self._http_config)
        sockets = None
        if self.cfg.reuse_port:  # uvicorn has no such setting: it is given the socket
            try:
                sockets = [reuse_port_socket(*self.cfg.http_address)]
            except OSError as exc:
                raise InfrastructureError(
                    f"HTTP API could not listen on {self.cfg.http_listen}: {exc}"
                ) from None

        async def serve() -> None:
            try:
                await server.serve(sockets)
            except SystemExit as exc:  # uvicorn's reaction to a failed start
                raise InfrastructureError(f"HTTP API stopped (exit status {exc.code})") from None

        task = asyncio.create_task(serve())
        while not server.started:
            if task.done():
                with contextlib.suppress(Exception):
                    task.result()
                raise InfrastructureError(f"HTTP API could not listen on {self.cfg.http_listen}")
            await asyncio.sleep(0.01)
        self._http = server
        return task

    async def _supervise_http(self, first: asyncio.Task[None]) -> None:
        current: asyncio.Task[None] | None = first

        async def run() -> None:
            nonlocal current
            if current is None:
                current = await self._start_http()
                self.supervisor.recovered("http")
            try:
                await current
            finally:
                current = None

        assert self._stop_requested is not None
        await self.supervisor.keep_running("http", run, self._stop_requested)

    async def _watch_listener(self) -> None:
        """Raise when the Kafka listener stopped accepting (supervised: the next run resumes
        it)."""
        kafka, stop = self.kafka, self._stop_requested
        assert kafka is not None
        assert stop is not None
        if not kafka.serving:
            await kafka.resume()
            self.supervisor.recovered("kafka_listener")
        while not stop.is_set():
            if not kafka.serving:
                raise ComponentStoppedError("the Kafka listener stopped accepting connections")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTENER_CHECK_S):
                    await stop.wait()

    async def _start_clock(self) -> tuple[AcceptanceOrder, CancelAcks]:
        """The broker clock that stamps each delayed record's and cancel's acceptance (README
        "Cancelling a message") and holds a cancel's answer (proxy/routing/cancel_acks.py), probing
        ``__kdelay_clock``; waits up to ``upstream_timeout_ms`` for its first probes: until
        then a delayed record is refused, retriable (LEADER_NOT_AVAILABLE, HTTP 503)."""
        cfg = self.cfg
        clock = self.clock = BrokerClock(
            cfg.bootstrap_servers, config=cfg.upstream_client_config(), metrics=self.metrics
        )
        clock.start()
        wait_s = cfg.upstream_timeout_ms / 1000
        if not await asyncio.to_thread(clock.wait_ready, wait_s):
            # Serving anyway (immediate records, /readyz); delayed ones wait for the clock.
            log.warning(
                "proxy.broker_clock_unknown",
                waited_s=wait_s,
                problem=str(clock.problem or "Kafka did not acknowledge a probe"),
                effect="delayed records and HTTP schedules answered retriable until it is known",
            )
        return AcceptanceOrder(clock.upper_ms), CancelAcks(clock)

    async def stop(self) -> None:
        """Close listeners, then deliver what is queued upstream."""
        if self._stop_requested is not None:
            self._stop_requested.set()
        if self._http is not None:
            self._http.should_exit = True
        for task in self._watchers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        if self.kafka is not None:
            await self.kafka.close()
        if self.http_auth is not None:  # the HTTP callers' own connections to Kafka
            await self.http_auth.close()
        if self.upstream is not None:
            await asyncio.to_thread(self.upstream.close)
        if self.replicas is not None:
            await asyncio.to_thread(self.replicas.close)
        if self.clock is not None:
            await asyncio.to_thread(self.clock.close)
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
