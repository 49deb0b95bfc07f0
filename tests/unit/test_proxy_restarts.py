"""Supervision of the proxy's long-running parts (proxy/restarts.py): a failure is logged
with its traceback, counted, shown by readiness and restarted with backoff, or the supervisor
gives up so that the process exits."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

from structlog.testing import capture_logs

from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.server import KafkaServer
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.restarts import MAX_BACKOFF_S, SupervisedComponents
from kdelay.proxy.routing.route import Outgoing
from kdelay.proxy.routing.topics import Advertised, TopicInfo, Topics
from kdelay.proxy.upstream.producer import POLL_COMPONENT, Upstream

DEADLINE_S = 10.0


def _failures(metrics: ProxyMetrics, component: str) -> float:
    labels = {"component": component}
    return metrics.registry.get_sample_value("kdelay_component_failures_total", labels) or 0.0


def test_a_failure_is_logged_counted_and_backed_off() -> None:
    metrics = ProxyMetrics()
    gave_up: list[str] = []
    sup = SupervisedComponents(metrics, backoff_s=1.0, max_failures=8, on_give_up=gave_up.append)

    def crash() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        try:
            crash()
        except RuntimeError as exc:
            first = sup.failed("http", exc)
    assert first == 1.0
    (event,) = [e for e in logs if e["event"] == "proxy.component_failed"]
    assert event["component"] == "http"
    assert event["exc_info"][1].args == ("boom",)
    assert event["exc_info"][2] is not None  # the traceback is logged
    assert _failures(metrics, "http") == 1
    assert sup.not_ready() == "http is down (RuntimeError: boom), restarting"
    backoffs = [sup.failed("http", RuntimeError("again")) for _ in range(6)]
    assert backoffs == [2.0, 4.0, 8.0, 16.0, MAX_BACKOFF_S, MAX_BACKOFF_S]
    sup.recovered("http")
    assert sup.not_ready() is None
    assert sup.failed("http", RuntimeError("after recovery")) == 1.0
    assert gave_up == []


def test_the_supervisor_gives_up_after_consecutive_failures() -> None:
    gave_up: list[str] = []
    sup = SupervisedComponents(
        ProxyMetrics(), backoff_s=0.1, max_failures=3, on_give_up=gave_up.append
    )
    assert sup.failed("upstream_poll", RuntimeError("1")) is not None
    assert sup.failed("upstream_poll", RuntimeError("2")) is not None
    with capture_logs() as logs:
        assert sup.failed("upstream_poll", RuntimeError("3")) is None
    assert gave_up == ["upstream_poll"]
    assert any(e["event"] == "proxy.component_gave_up" for e in logs)
    assert sup.not_ready() == "gave up on upstream_poll; the process is exiting"
    sup.failed("http", RuntimeError("x"))
    sup.failed("http", RuntimeError("x"))
    sup.failed("http", RuntimeError("x"))
    assert gave_up == ["upstream_poll"]  # told once


def test_keep_running_restarts_a_failed_task_until_it_runs() -> None:
    metrics = ProxyMetrics()
    sup = SupervisedComponents(metrics, backoff_s=0.001, max_failures=10)
    runs: list[int] = []
    seen_down: list[str | None] = []

    async def main() -> None:
        stopped = asyncio.Event()
        running = asyncio.Event()

        async def run() -> None:
            runs.append(len(runs))
            seen_down.append(sup.not_ready())
            if len(runs) == 1:
                raise RuntimeError("crashed")
            if len(runs) == 2:
                return  # ended on its own: a failure too
            sup.recovered("http")
            running.set()
            await stopped.wait()

        task = asyncio.create_task(sup.keep_running("http", run, stopped))
        async with asyncio.timeout(DEADLINE_S):
            await running.wait()
        assert sup.not_ready() is None
        stopped.set()
        async with asyncio.timeout(DEADLINE_S):
            await task

    asyncio.run(main())
    assert len(runs) == 3
    assert seen_down[1] == "http is down (RuntimeError: crashed), restarting"
    assert seen_down[2] is not None
    assert "stopped on its own" in seen_down[2]
    assert _failures(metrics, "http") == 2


def test_keep_running_stops_at_once_during_a_backoff() -> None:
    sup = SupervisedComponents(ProxyMetrics(), backoff_s=MAX_BACKOFF_S, max_failures=10)

    async def main() -> None:
        stopped = asyncio.Event()
        failed = asyncio.Event()

        async def run() -> None:
            failed.set()
            raise RuntimeError("down")

        task = asyncio.create_task(sup.keep_running("http", run, stopped))
        async with asyncio.timeout(DEADLINE_S):
            await failed.wait()
        stopped.set()
        async with asyncio.timeout(DEADLINE_S):
            await task

    asyncio.run(main())


class RaisingProducer:
    """A librdkafka producer whose poll() raises what a delivery callback raised, once."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.raised = threading.Event()
        self.polled_after = threading.Event()

    def poll(self, timeout: float) -> int:
        if not self.raised.is_set():
            self.raised.set()
            raise RuntimeError("callback bug")
        self.polled_after.set()
        self.raised.wait(timeout)
        return 0

    def produce(self, topic: str, **kwargs: Any) -> None:
        raise AssertionError("not used")

    def purge(self) -> None:
        pass

    def flush(self, timeout: float = 0) -> int:
        return 0

    def close(self) -> bool:
        return True


class FakeLookup:
    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_upstream_poll_thread_survives_a_callback_error() -> None:
    metrics = ProxyMetrics()
    sup = SupervisedComponents(metrics, backoff_s=0.001)
    made: list[RaisingProducer] = []

    def factory(conf: dict[str, Any]) -> RaisingProducer:
        made.append(RaisingProducer(conf))
        return made[-1]

    with capture_logs() as logs:
        up = Upstream(
            "fake:9092",
            metrics,
            producer_factory=factory,
            lookup_factory=FakeLookup,
            supervisor=sup,
        )
        try:
            assert made[0].polled_after.wait(DEADLINE_S)
            # recovered() runs right after that successful poll; readiness follows it.
            assert made[0].raised.is_set()
        finally:
            up.close(timeout=DEADLINE_S)
    assert _failures(metrics, POLL_COMPONENT) == 1
    assert any(
        e["event"] == "proxy.component_failed" and e["component"] == POLL_COMPONENT for e in logs
    )
    assert sup.not_ready() is None


class _Upstream:
    cluster_id: str | None = "fake"

    async def submit(self, records: list[Outgoing]) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future

    def topic(self, name: str, *, create: bool) -> TopicInfo:
        return TopicInfo(0, 1)

    def all_topics(self) -> dict[str, TopicInfo]:
        return {}


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S):
            return True
    except OSError:
        return False


def _open_connections(metrics: ProxyMetrics) -> float:
    return metrics.registry.get_sample_value("kdelay_proxy_connections") or 0.0


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not condition():  # noqa: ASYNC110 - a gauge the server sets, no event to await
            await asyncio.sleep(0.01)


def test_the_kafka_listener_accepts_again_after_it_was_closed() -> None:
    async def main() -> None:
        metrics = ProxyMetrics()
        server = KafkaServer(metrics)
        host, port = await server.bind("127.0.0.1", 0)
        upstream = _Upstream()
        await server.serve(Broker(upstream, Topics(upstream), metrics, Advertised(1, host, port)))
        assert server.serving
        inner = server.listener
        assert inner is not None
        inner.close()  # what no code of the proxy does but stop(): the listener is gone
        await inner.wait_closed()
        assert not server.serving
        assert not await asyncio.to_thread(_connects, port)
        await server.resume()
        assert server.serving
        client = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), DEADLINE_S)
        # The connection is served, then ends, before the server closes: closing a server
        # while asyncio is still accepting a connection leaks that socket (CPython asserts in
        # Server._attach), which would surface as a ResourceWarning in a later test.
        await _until(lambda: _open_connections(metrics) == 1)
        client.close()
        await _until(lambda: _open_connections(metrics) == 0)
        await server.close()

    asyncio.run(main())
