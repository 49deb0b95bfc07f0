"""Supervision of a replica's threads, and the health endpoints that report on it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from structlog.testing import capture_logs

from kdelay.backoff import Backoff
from kdelay.delay_service import health
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.threads import SupervisedThreads
from kdelay.supervision import RestartPolicy

FAST = RestartPolicy(Backoff(0.001, 0.002), max_failures=3)


class Flaky:
    """A component loop that fails ``failures`` times, then runs until told to stop."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.running = threading.Event()
        self.stop = threading.Event()

    def __call__(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise RuntimeError(f"boom {self.runs}")
        self.running.set()
        self.stop.wait()


def failures(metrics: Metrics, component: str) -> float | None:
    return metrics.registry.get_sample_value(
        "kdelay_component_failures_total", {"component": component}
    )


def test_a_failed_loop_is_logged_counted_and_run_again() -> None:
    metrics = Metrics()
    fatal: list[str] = []
    seen: list[BaseException] = []
    sup = SupervisedThreads(metrics, FAST, on_fatal=fatal.append)
    loop = Flaky(failures=2)
    with capture_logs() as logs:
        sup.start("ingest", loop, on_failure=seen.append)
        assert loop.running.wait(30)
    assert loop.runs == 3
    assert [str(e) for e in seen] == ["boom 1", "boom 2"]
    assert failures(metrics, "ingest") == 2
    failed = [e for e in logs if e["event"] == "supervisor.component_failed"]
    assert [e["consecutive"] for e in failed] == [1, 2]
    assert all(isinstance(e["exc_info"], RuntimeError) for e in failed)  # the traceback
    assert fatal == []
    assert sup.dead() == []
    loop.stop.set()
    assert sup.join("ingest", 30)


def test_too_many_failures_in_a_row_give_up_and_report_fatal() -> None:
    metrics = Metrics()
    fatal: list[str] = []
    sup = SupervisedThreads(metrics, FAST, on_fatal=fatal.append)
    sup.start("forwarder", Flaky(failures=10))
    assert sup.join("forwarder", 30)
    assert fatal == ["forwarder"]
    assert failures(metrics, "forwarder") == FAST.max_failures
    assert sup.dead() == ["forwarder"]  # /healthz fails until the process is gone


def test_a_loop_that_returns_is_not_restarted_and_stop_ends_a_backoff() -> None:
    sup = SupervisedThreads(Metrics(), FAST, on_fatal=lambda _n: None)
    sup.start("quiet", lambda: None)
    assert sup.join("quiet", 30)
    slow = SupervisedThreads(
        Metrics(), RestartPolicy(Backoff(3600, 3600)), on_fatal=lambda _n: None
    )
    failed = threading.Event()
    slow.start("ingest", Flaky(failures=1), on_failure=lambda _e: failed.set())
    assert failed.wait(30)
    assert slow.backing_off() == ["ingest"]
    slow.stop()
    assert slow.join("ingest", 30), "stop() did not cut the backoff short"
    assert slow.dead() == []


def call(app: Any, path: str) -> tuple[str, bytes]:
    status: list[str] = []

    def start_response(s: str, _headers: Iterable[tuple[str, str]], _exc: object = None) -> None:
        status.append(s)

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""},
                        start_response))  # fmt: skip
    return status[0], body


class FakeIngest:
    def __init__(self) -> None:
        self.caught_up = threading.Event()
        self.progress = 0.0

    def last_progress(self) -> float:
        return self.progress


def test_health_endpoints_report_catch_up_stalls_and_failures() -> None:
    metrics = Metrics()
    sup = SupervisedThreads(metrics, FAST, on_fatal=lambda _n: None)
    stopping = threading.Event()
    h = health.Health(ReplicaConfig(name="r", ingest_stall_s=30), sup, stopping)
    app = health.app(metrics.registry, live=h.live, ready=h.ready)

    assert call(app, "/healthz") == ("200 OK", b'{"status": "ok", "reason": ""}')
    status, body = call(app, "/readyz")
    assert status.startswith("503")
    assert json.loads(body) == {"status": "fail", "reason": "catching up with the buffer topic"}

    ingest = FakeIngest()
    h.ingest = ingest  # type: ignore[assignment]
    ingest.caught_up.set()
    ingest.progress = h.beat()
    assert call(app, "/readyz")[0] == "200 OK"
    ingest.progress = h.beat() - 31  # as if ingest had not moved for 31 s
    assert "no progress for" in json.loads(call(app, "/readyz")[1])["reason"]

    h.fatal = "forwarder"
    assert call(app, "/healthz")[0].startswith("503")
    stopping.set()
    assert json.loads(call(app, "/readyz")[1])["reason"] == "stopping"

    status, body = call(app, "/metrics")
    assert status == "200 OK"
    assert b"kdelay_replica_ingest_last_progress_seconds" in body


def test_failures_in_a_row_start_over_after_a_long_enough_run() -> None:
    backoff = Backoff(1.0, 30.0, reset_after_s=60.0)
    assert backoff.consecutive(0, 0.5) == 1
    assert backoff.consecutive(3, 59.9) == 4
    assert backoff.consecutive(3, 60.0) == 1
