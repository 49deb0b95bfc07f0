"""The broker clock without Kafka: the bound arithmetic of ProbeWindow (never ahead of the
broker, in every simulated scenario), and BrokerClock with a fake producer, admin and clock,
stepped by the test (its probe thread, real threads and time, is in
tests/integration/test_broker_clock_thread.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    Message,
)
from confluent_kafka.admin import AdminClient

from kdelay.broker_clock import MAX_DRIFT, BrokerClock, Probe, ProbeWindow
from kdelay.clock import Clock
from kdelay.delay_service.metrics import Metrics
from kdelay.errors import BrokerClockError
from kdelay.topics import CLOCK_TOPIC, CLOCK_TOPIC_CONFIG, ensure_clock_topic
from tests.support.fakes import FakeAdmin, FakeClock

Callback = Callable[[KafkaError | None, Message], None]


# -- ProbeWindow: the arithmetic -------------------------------------------------------------


def test_nothing_is_known_before_the_first_probe() -> None:
    w = ProbeWindow()
    assert w.lower_ms(5.0) is None
    assert w.upper_ms(5.0) is None
    assert w.skew_ms(1_000, 5.0) is None
    assert w.latest is None


def test_one_probe_bounds_broker_time_from_its_round_trip() -> None:
    w = ProbeWindow(max_drift=0)
    w.add(Probe(sent_mono=10.0, acked_mono=10.02, broker_ms=1_000_000, wall_ms=1_000_010))
    # At the acknowledgement: at least B (appended before), at most B + 1 ms + the round trip.
    assert w.lower_ms(10.02) == pytest.approx(1_000_000)
    assert w.upper_ms(10.02) == pytest.approx(1_000_021)
    # 1.5 s later both moved 1.5 s: the monotonic clock carries them.
    assert w.lower_ms(11.52) == pytest.approx(1_001_500)
    assert w.upper_ms(11.52) == pytest.approx(1_001_521)
    assert w.skew_ms(1_000_010, 10.02) == pytest.approx(10 - 10.5)


def test_drift_allowance_widens_the_bounds_over_time() -> None:
    w = ProbeWindow()
    w.add(Probe(0.0, 0.0, 5_000, 0))
    assert w.lower_ms(100.0) == pytest.approx(5_000 + 100_000 * (1 - MAX_DRIFT))
    assert w.upper_ms(100.0) == pytest.approx(5_001 + 100_000 * (1 + MAX_DRIFT))


@pytest.mark.parametrize(
    ("offset_ms", "sign"), [(5_000, -1), (-5_000, 1), (0, 0)], ids=["ahead", "behind", "equal"]
)
def test_skew_is_local_minus_broker(offset_ms: int, sign: int) -> None:
    """The broker's clock reads local wall + offset: the skew is -offset, within the bounds."""
    w = ProbeWindow()
    local_at_append = 1_800_000_000_000
    rtt = 0.004
    # Appended half way: broker time at the acknowledgement is B + 2 ms.
    probe = Probe(50.0, 50.0 + rtt, local_at_append + offset_ms, local_at_append + 2)
    w.add(probe)
    skew = w.skew_ms(probe.wall_ms, probe.acked_mono)
    assert skew is not None
    assert abs(skew - (-offset_ms)) <= rtt * 1000 / 2 + 1
    assert (skew > 100) - (skew < -100) == sign


def test_the_estimate_follows_the_monotonic_clock_not_the_wall_clock() -> None:
    clock = FakeClock()
    bc = BrokerClock("unused:9092", clock=clock, producer_factory=lambda: AckingProducer(clock))
    assert bc.probe_once()
    first = bc.now_ms()
    assert first is not None
    clock.advance(2.0)  # two seconds pass; the wall clock is stepped back an hour meanwhile
    clock.now_ms -= 3_600_000
    second = bc.now_ms()
    assert second is not None
    assert 1_998 <= second - first <= 2_000
    skew = bc.skew_ms()
    assert skew is not None
    assert skew == pytest.approx(5_000 - 3_600_000, abs=10)  # it was 5 s ahead of the broker


def test_the_best_lower_bound_of_the_window_wins() -> None:
    w = ProbeWindow(max_drift=0)
    w.add(Probe(0.0, 0.5, 1_000, 0))  # slow round trip, appended at its very start
    w.add(Probe(1.0, 1.001, 2_000, 0))  # fast one: a tighter bound from then on
    assert w.lower_ms(2.0) == pytest.approx(2_999)  # max(1_000 + 1_500, 2_000 + 999)
    assert w.upper_ms(2.0) == pytest.approx(3_001)  # min(1_000 + 1 + 2_000, 2_000 + 1 + 1_000)


@pytest.mark.parametrize("seed", range(20))
def test_the_lower_bound_is_the_best_of_every_probe_at_any_moment(seed: int) -> None:
    """lower_ms keeps the probe with the highest bound instead of scanning the window each time
    (it is asked for every release): it must equal the scan, at every moment asked, before,
    between and after the probes' acknowledgements, as probes come and leave the window."""
    rng = random.Random(seed)
    w = ProbeWindow(window_s=rng.uniform(1, 10), max_drift=rng.choice([0, MAX_DRIFT, 0.01]))
    broker, mono = rng.uniform(0, 1e12), 0.0
    for _ in range(60):
        mono += rng.uniform(0, 1)
        rtt = rng.uniform(0, 0.2)
        w.add(Probe(mono, mono + rtt, int(broker + mono * 1000 + rng.uniform(0, rtt * 1000)), 0))
        for ask in (mono - rng.uniform(0, 2), mono + rtt, mono + rtt + rng.uniform(0, 5)):
            scan = max(w.lower_of(p, ask) for p in w.probes)
            assert w.lower_ms(ask) == scan


def test_probes_older_than_the_window_stop_counting() -> None:
    w = ProbeWindow(window_s=30.0, max_drift=0)
    w.add(Probe(0.0, 0.001, 1_000, 0))  # an excellent probe ...
    for k in range(1, 30):  # ... then pessimistic ones (appended as they were sent)
        w.add(Probe(float(k), k + 0.5, 1_000 + k * 1_000, 0))
        assert w.lower_ms(40.0) == pytest.approx(40_999)  # still the first one's bound
    w.add(Probe(30.0, 30.5, 31_000, 0))  # the first probe is now more than 30 s older
    assert w.lower_ms(40.0) == pytest.approx(40_500)


def test_the_newest_probe_is_kept_however_old() -> None:
    w = ProbeWindow(window_s=30.0, max_drift=0)
    w.add(Probe(0.0, 0.01, 1_000, 0))
    assert w.lower_ms(3_600.0) == pytest.approx(1_000 + 3_599_990)


@pytest.mark.parametrize("jump_ms", [-5_000, 5_000], ids=["back", "forward"])
def test_a_broker_clock_step_drops_the_older_probes(jump_ms: int) -> None:
    w = ProbeWindow(max_drift=0)
    for k in range(5):
        assert w.add(Probe(float(k), k + 0.01, 10_000 + k * 1_000, 0))
    assert not w.add(Probe(5.0, 5.01, 15_000 + jump_ms, 0))
    assert w.lower_ms(5.01) == pytest.approx(15_000 + jump_ms)  # broker time did move
    assert w.add(Probe(6.0, 6.01, 16_000 + jump_ms, 0))  # consistent again


def _simulate(rng: random.Random, *, rate: float, drift: float, offset_ms: float) -> int:
    """A broker whose clock reads ``offset_ms + t*1000*rate`` at monotonic ``t`` appends each
    probe at a random instant of its round trip; the bounds must hold it at every instant.
    Returns how often the middle of the bounds was ahead (what the lower bound avoids)."""
    ahead = 0

    def broker(t: float) -> float:
        return offset_ms + t * 1000 * rate

    w = ProbeWindow(max_drift=drift)
    t = rng.uniform(0, 1_000)
    for _ in range(60):
        m0 = t
        m1 = m0 + rng.choice([0.0001, 0.002, 0.05, rng.uniform(0, 0.5)])
        appended = rng.uniform(m0, m1)
        w.add(Probe(m0, m1, math.floor(broker(appended)), 0))
        for m in (m1, *(m1 + rng.expovariate(1 / 5) for _ in range(20)), m1 + 120):
            low, high = w.lower_ms(m), w.upper_ms(m)
            assert low is not None
            assert high is not None
            true_ms = broker(m)
            assert low <= true_ms, (m, low, true_ms)
            assert math.floor(low) <= math.floor(true_ms)  # what now_ms() and Kafka compare
            assert true_ms < high, (m, high, true_ms)
            ahead += (low + high) / 2 > true_ms
        t = m1 + rng.choice([1.0, 1.0, 0.1, 10.0, 45.0])  # probes late or failing for a while
    return ahead


@pytest.mark.parametrize("seed", range(40))
def test_never_ahead_of_the_broker_with_a_random_append_instant(seed: int) -> None:
    rng = random.Random(seed)
    offset = rng.choice([-5_000.0, 0.0, 5_000.0]) + rng.uniform(-1, 1) + 1.8e12
    ahead = _simulate(rng, rate=1.0, drift=0.0, offset_ms=offset)
    # Clocks ticking at different rates, within the allowance.
    rate = 1 + rng.uniform(-0.9, 0.9) * MAX_DRIFT
    ahead += _simulate(rng, rate=rate, drift=MAX_DRIFT, offset_ms=offset)
    assert ahead > 0  # the scenario is sharp enough: a naive estimate does run ahead


# -- BrokerClock with fakes ------------------------------------------------------------------


@dataclass
class AckingProducer:
    """Acknowledges at poll(), ``rtt`` seconds after produce(), with ``stamp(clock)``.

    ``answer`` is ``"ok"``, ``"error"``, ``"create_time"`` or ``"never"``.
    """

    clock: FakeClock
    rtt: float = 0.004
    answer: str = "ok"
    broker_offset_ms: int = -5_000  # the local wall clock is 5 s ahead of the broker
    queued: list[Callback] = field(default_factory=list)

    def produce(self, topic: str, value: bytes, *, partition: int, on_delivery: Callback) -> None:
        assert (topic, value, partition) == (CLOCK_TOPIC, b"", 0)
        self.queued.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        if self.answer == "never":
            self.clock.advance(max(timeout, 0))
            return 0
        self.clock.advance(self.rtt / 2)
        stamp = self.clock.now_ms + self.broker_offset_ms  # appended half way
        self.clock.advance(self.rtt / 2)
        done, self.queued = self.queued, []
        for cb in done:
            if self.answer == "error":
                cb(KafkaError(KafkaError._MSG_TIMED_OUT), Message(topic=CLOCK_TOPIC))
            else:
                kind = TIMESTAMP_CREATE_TIME if self.answer == "create_time" else None
                kind = TIMESTAMP_LOG_APPEND_TIME if kind is None else kind
                cb(None, Message(topic=CLOCK_TOPIC, timestamp=(kind, stamp)))
        return len(done)

    def flush(self, timeout: float = -1) -> int:
        return len(self.queued)


def _clock_with(**producer: Any) -> tuple[BrokerClock, FakeClock, Metrics, list[AckingProducer]]:
    clock, metrics = FakeClock(), Metrics()
    made: list[AckingProducer] = []

    def factory() -> AckingProducer:
        made.append(AckingProducer(clock, **producer))
        return made[-1]

    bc = BrokerClock("unused:9092", clock=clock, metrics=metrics, producer_factory=factory)
    return bc, clock, metrics, made


def _sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_a_probe_gives_time_skew_uncertainty_and_metrics() -> None:
    bc, clock, metrics, _ = _clock_with(rtt=0.004)
    assert bc.now_ms() is None
    assert bc.skew_ms() is None
    assert bc.uncertainty_ms() is None
    assert bc.last_probe_age_s() is None
    assert not bc.wait_ready(0)
    assert bc.probe_once()
    assert bc.wait_ready(0)
    broker_now = clock.now_ms - 5_000 - 2  # appended 2 ms ago, by a clock 5 s behind
    assert bc.now_ms() == broker_now
    skew = bc.skew_ms()
    assert skew is not None
    assert 4_996 <= skew <= 5_004
    assert bc.uncertainty_ms() == pytest.approx(4.0)
    assert bc.last_probe_age_s() == 0
    clock.advance(0.25)
    assert bc.last_probe_age_s() == pytest.approx(0.25)
    assert bc.problem is None
    assert _sample(metrics, "kdelay_clock_skew_seconds") == pytest.approx(5.0, abs=0.004)
    assert _sample(metrics, "kdelay_clock_uncertainty_seconds") == pytest.approx(0.004)
    assert _sample(metrics, "kdelay_clock_probe_failures_total") == 0


def test_a_broker_clock_is_a_clock_for_the_forwarder_once_ready() -> None:
    bc, clock, _, _ = _clock_with()
    as_clock: Clock = bc  # what Forwarder(clock=...) takes
    with pytest.raises(RuntimeError, match="wait_ready"):
        as_clock.wall_ms()
    assert bc.probe_once()
    clock.advance(1.0)
    broker_now = clock.now_ms - 5_000 - 2
    # A second after the probe the drift allowance (500 ppm) costs half a millisecond.
    assert as_clock.wall_ms() == bc.now_ms() == broker_now - 1
    assert as_clock.monotonic() == clock.mono


def test_a_failed_delivery_counts_and_gives_no_time() -> None:
    bc, _, metrics, _ = _clock_with(answer="error")
    assert not bc.probe_once()
    assert bc.now_ms() is None
    assert bc.problem is None
    assert _sample(metrics, "kdelay_clock_probe_failures_total") == 1


def test_a_topic_without_log_append_time_is_a_named_problem() -> None:
    bc, _, metrics, _ = _clock_with(answer="create_time")
    assert not bc.probe_once()
    assert not bc.probe_once()
    assert bc.now_ms() is None
    problem = bc.problem
    assert isinstance(problem, BrokerClockError)
    assert CLOCK_TOPIC in str(problem)
    assert "message.timestamp.type=CreateTime" in str(problem)
    assert "message.timestamp.type=LogAppendTime" in str(problem)
    assert _sample(metrics, "kdelay_clock_probe_failures_total") == 2


def test_a_probe_never_acknowledged_replaces_the_producer() -> None:
    clock, metrics = FakeClock(), Metrics()
    made: list[AckingProducer] = []

    def factory() -> AckingProducer:  # the first one is stuck
        made.append(AckingProducer(clock, answer="ok" if made else "never"))
        return made[-1]

    bc = BrokerClock("unused:9092", clock=clock, metrics=metrics, producer_factory=factory)
    start = clock.mono
    assert not bc.probe_once()
    assert clock.mono - start >= 5.0  # waited out the probe timeout
    assert _sample(metrics, "kdelay_clock_probe_failures_total") == 1
    assert bc.probe_once()
    assert [p.answer for p in made] == ["never", "ok"]


# -- the topic and the thread ----------------------------------------------------------------


@pytest.mark.parametrize(("brokers", "replication"), [(1, 1), (2, 2), (3, 3), (5, 3)])
def test_the_clock_topic_is_created_with_log_append_time(brokers: int, replication: int) -> None:
    admin = FakeAdmin(brokers=brokers)
    assert ensure_clock_topic(cast(AdminClient, admin))
    (topic,) = admin.created
    assert (topic.topic, topic.num_partitions, topic.replication_factor) == (
        CLOCK_TOPIC,
        1,
        replication,
    )
    assert topic.config == CLOCK_TOPIC_CONFIG
    assert CLOCK_TOPIC_CONFIG["message.timestamp.type"] == "LogAppendTime"


def test_an_existing_clock_topic_is_checked() -> None:
    good = FakeAdmin(existing={CLOCK_TOPIC: "LogAppendTime"})
    assert not ensure_clock_topic(cast(AdminClient, good))
    assert not good.created
    bad = FakeAdmin(existing={"other": "CreateTime"})
    with pytest.raises(BrokerClockError, match=r"other has message\.timestamp\.type=CreateTime"):
        ensure_clock_topic(cast(AdminClient, bad), "other")
    racing = FakeAdmin(race=True)  # created meanwhile, and wrongly
    with pytest.raises(BrokerClockError):
        ensure_clock_topic(cast(AdminClient, racing))
