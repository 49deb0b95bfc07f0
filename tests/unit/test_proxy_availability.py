"""Upstream availability (proxy/upstream/availability.py, proxy/upstream/producer.py) with fake
librdkafka clients: an outage report is confirmed by a metadata request before the proxy calls
upstream down, the gauge and ``/readyz``'s reason follow, each transition is logged once with its
duration, and the proxy sees upstream back by probing while nothing is produced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.upstream.availability import UpstreamAvailability
from kdelay.proxy.upstream.producer import Upstream
from tests.support.fakes import FakeProducer

DEADLINE_S = 10.0


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)  # sleep: the poll interval of a wait with a deadline (a probe thread)


def _gauge(metrics: ProxyMetrics) -> str:
    text = generate_latest(metrics.registry).decode()
    return next(line for line in text.splitlines() if line.startswith("kdelay_proxy_upstream_av"))


def test_transitions_are_logged_once_with_the_duration() -> None:
    now = [100.0]
    metrics = ProxyMetrics()
    av = UpstreamAvailability("k:9092", metrics, clock=lambda: now[0])
    assert av.problem() is None
    assert _gauge(metrics) == "kdelay_proxy_upstream_available 1.0"
    with capture_logs() as logs:
        av.down("all brokers down")
        now[0] += 12
        av.down("still down")  # no second log line
        assert av.problem() == "upstream Kafka at k:9092 is unavailable (for 12 s): still down"
        assert _gauge(metrics) == "kdelay_proxy_upstream_available 0.0"
        now[0] += 30
        av.up("metadata answered")
        av.up("a produce was acknowledged")  # already up: nothing
    assert [e["event"] for e in logs] == ["proxy.upstream_down", "proxy.upstream_back"]
    assert logs[0]["reason"] == "all brokers down"
    assert logs[1]["down_s"] == 42.0
    assert av.problem() is None
    assert _gauge(metrics) == "kdelay_proxy_upstream_available 1.0"


class FakeMeta:
    def __init__(self) -> None:
        self.brokers = {1: "broker"}


class FakeLookup:
    """Answers metadata while ``up`` is set; counts the requests."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.up = threading.Event()
        self.up.set()
        self.requests = 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> FakeMeta:
        self.requests += 1
        if not self.up.is_set():
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
        return FakeMeta()

    def close(self) -> None:
        pass


@pytest.fixture
def made() -> list[Any]:
    return []


@pytest.fixture
def upstream(made: list[Any]) -> Iterator[Upstream]:
    def factory(kind: type[Any]) -> Callable[[dict[str, Any]], Any]:
        def make(conf: dict[str, Any]) -> Any:
            made.append(kind(conf))
            return made[-1]

        return make

    up = Upstream(
        "k:9092",
        ProxyMetrics(),
        producer_factory=factory(FakeProducer),
        lookup_factory=factory(FakeLookup),
        probe_interval_s=0.05,
    )
    yield up
    up.close(timeout=DEADLINE_S)


def test_an_outage_report_confirmed_by_the_probe_is_down_until_upstream_answers(
    upstream: Upstream, made: list[Any]
) -> None:
    producer, lookup = made
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    # A report while metadata still answers (a broker closing an idle connection): not down.
    producer.conf["error_cb"](down)
    _wait(lambda: lookup.requests >= 1, "the probe")
    assert upstream.availability.available
    # A real outage: the report is confirmed, and the probe keeps asking.
    lookup.up.clear()
    with capture_logs() as logs:
        producer.conf["error_cb"](down)
        _wait(lambda: not upstream.availability.available, "upstream to be down")
        problem = upstream.availability.problem()
        assert problem is not None
        assert "1/1 brokers are down" in problem
        assert "Connection refused" in problem
        asked = lookup.requests
        _wait(lambda: lookup.requests > asked + 2, "the probe to keep asking")
        lookup.up.set()
        _wait(lambda: upstream.availability.available, "upstream to be back")
    events = [e["event"] for e in logs if e["event"].startswith("proxy.upstream_")]
    assert events == ["proxy.upstream_error", "proxy.upstream_down", "proxy.upstream_back"]
    text = generate_latest(upstream.metrics.registry).decode()
    assert 'kdelay_proxy_upstream_errors_total{error="_ALL_BROKERS_DOWN"} 2.0' in text
