"""BrokerClock's probe thread, a real thread on the real clock, with a fake producer and admin
(moved from tests/unit: it waits, so it is no unit test). What is asserted does not depend on
speed: the probes happen, the thread ends on close, a failing topic check is retried with the
back-off the thread asked for (recorded, not timed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient

from dev.stack import wait_until
from kdelay import broker_clock
from kdelay.backoff import Backoff
from kdelay.broker_clock import BrokerClock
from kdelay.clock import SYSTEM_CLOCK
from kdelay.delay_service.metrics import Metrics
from kdelay.topics import CLOCK_TOPIC
from tests.support.fakes import FakeAdmin

Callback = Callable[[KafkaError | None, Message], None]
DEADLINE_S = 10.0


def _thread_running() -> bool:
    return any(t.name == "broker-clock" for t in threading.enumerate())


def test_the_probe_thread_probes_until_closed() -> None:
    probes: list[int] = []

    @dataclass
    class Immediate:
        queued: list[Callback] = field(default_factory=list)

        def produce(
            self, topic: str, value: bytes, *, partition: int, on_delivery: Callback
        ) -> None:
            self.queued.append(on_delivery)

        def poll(self, timeout: float = -1) -> int:
            done, self.queued = self.queued, []
            for cb in done:
                probes.append(time.time_ns() // 1_000_000)
                cb(None, Message(timestamp=(TIMESTAMP_LOG_APPEND_TIME, probes[-1])))
            return len(done)

        def flush(self, timeout: float = -1) -> int:
            return 0

    admin = FakeAdmin()
    bc = BrokerClock(
        "unused:9092",
        interval_s=0.01,
        clock=SYSTEM_CLOCK,
        producer_factory=Immediate,
        admin_factory=lambda: cast(AdminClient, admin),
    )
    bc.start()
    try:
        assert bc.wait_ready(DEADLINE_S)
        wait_until(lambda: len(probes) >= 5, timeout=DEADLINE_S, what="five probes")
        now = bc.now_ms()
        assert now is not None
        assert now <= time.time_ns() // 1_000_000  # never ahead of the (here: local) broker
        with pytest.raises(RuntimeError):
            bc.start()
    finally:
        bc.close()
    assert not _thread_running()  # joined: stopped
    assert [t.topic for t in admin.created] == [CLOCK_TOPIC]  # ensured once


def test_a_failing_topic_check_is_retried_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    asked: list[float] = []  # the waits the thread asked for, in order

    class Recording(Backoff):
        def delay(self, consecutive: int) -> float:
            asked.append(super().delay(consecutive))
            return asked[-1]

    monkeypatch.setattr(broker_clock, "Backoff", Recording)

    class Admin(FakeAdmin):
        def list_topics(self, *args: Any, **kwargs: Any) -> SimpleNamespace:
            calls.append(time.monotonic())
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    metrics = Metrics()
    interval_s = 1.0
    bc = BrokerClock(
        "unused:9092",
        interval_s=interval_s,
        metrics=metrics,
        admin_factory=lambda: cast(AdminClient, Admin()),
    )
    bc.start()
    try:
        wait_until(lambda: len(calls) >= 3, timeout=DEADLINE_S, what="three topic checks")
    finally:
        bc.close()
    assert len(asked) >= 2
    assert asked[0] < interval_s  # promptly, not after a whole interval
    assert asked[1] > asked[0]  # and backing off
    failures = metrics.registry.get_sample_value("kdelay_clock_probe_failures_total")
    assert (failures or 0) >= 3
    assert bc.now_ms() is None
    assert bc.problem is None  # unreachable is not a configuration problem
