"""Broker time, estimated so that it is never ahead: one clock, Kafka's.

The master must release a message only once the *broker's* clock has reached its due time; its
own wall clock may be seconds off. :class:`BrokerClock` produces empty probes to
:data:`CLOCK_TOPIC` (``message.timestamp.type=LogAppendTime``: the leader stamps each record
with its own clock as it appends it) and reads that stamp ``B`` from the acknowledgement.

Why the estimate is conservative: ``m0`` is read (monotonic clock) just before ``produce()``,
``m1`` in the delivery callback. The leader appended the record at an instant between the two,
when its clock read ``B`` or a little more (Kafka floors timestamps to the millisecond). So at
``m1`` broker time is at least ``B`` and at any later ``m`` at least ``B + (m - m1)*1000``,
however the round trip split between request and response (and whichever of librdkafka's
retries was appended); it is below ``B + 1 + (m - m0)*1000``. The round trip is the
uncertainty; the best lower bound of the last :data:`WINDOW_S` seconds of probes wins.

Rates: the bounds widen by :data:`MAX_DRIFT` (500 ppm, the most NTP slews a Linux clock), so
they hold between probes and while probes fail, as long as the broker's and the local monotonic
clock tick at the same rate to within that. A *step* of the broker's clock (or a new leader of
the probe partition with another clock) makes a probe contradict the others: they are dropped
(``clock.broker_clock_stepped``) and the estimate may move back, as broker time did. The local
wall clock plays no part in the estimate, only in the skew (metrics and logs).

Used by the replicas (the master's releases) and the proxy (acceptance stamps, README
"Cancelling a message"). Threads: ``start``/``close`` belong to the owner (its main thread);
the probe thread alone uses the producer and the admin client. Any thread may call ``now_ms``
(or ``wall_ms``: a BrokerClock is a :class:`Clock`), ``upper_ms``, ``skew_ms``,
``uncertainty_ms``, ``last_probe_age_s``, ``wait_ready`` and ``problem``: they read the probes
under one lock and never wait on I/O. :class:`ProbeWindow` (the arithmetic, no Kafka) is not
thread-safe on its own.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import Counter, Gauge

from kdelay import logs
from kdelay.backoff import Backoff
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.errors import BrokerClockError, InfrastructureError
from kdelay.topics import CLOCK_TOPIC, ensure_clock_topic

log = logs.get(__name__)

#: Seconds of probes whose bounds are combined (the newest is always kept).
WINDOW_S = 30.0
#: Largest rate difference assumed between the broker's clock and the local monotonic clock.
MAX_DRIFT = 500e-6
#: Probes sent back to back at start, before the clock is ready: the first one's round trip
#: includes connecting and the metadata lookup (100 ms and more on a busy machine), which would
#: keep the bounds that far apart until a better probe comes.
WARM_UP_PROBES = 5
#: acks=1: the leader answers right after appending, which keeps the bounds tight.
PRODUCER_CONFIG = {"client.id": "kdelay-clock", "acks": "1", "linger.ms": 0}

DeliveryCallback = Callable[[KafkaError | None, Message], None]


@dataclass(frozen=True, slots=True)
class Probe:
    """One acknowledged probe: monotonic seconds around it, the broker's stamp, local wall."""

    sent_mono: float  # m0: just before produce()
    acked_mono: float  # m1: in the delivery callback
    broker_ms: int  # B: LogAppendTime, floored to the millisecond by Kafka
    wall_ms: int  # the local wall clock at m1 (for the skew only)

    @property
    def round_trip_s(self) -> float:
        return self.acked_mono - self.sent_mono


class ProbeWindow:
    """The recent probes and the bounds on broker time they give (pure arithmetic): at
    monotonic ``m`` it is at least the max over probes of ``B + (m - m1)*1000*(1 - drift)``
    and at most the min of ``B + 1 + (m - m0)*1000*(1 + drift)``; None before a probe."""

    def __init__(self, *, window_s: float = WINDOW_S, max_drift: float = MAX_DRIFT) -> None:
        self._window_s = window_s
        self._drift = max_drift
        self._probes: deque[Probe] = deque(maxlen=512)  # bounded, whatever the interval
        # The probe whose lower bound is the highest at any moment after every probe's ack:
        # the bounds are lines of one slope, so which one is highest does not depend on the
        # moment. lower_ms is asked for every release; this makes it O(1), not O(probes).
        self._highest_lower: Probe | None = None
        self._last_acked = 0.0  # the latest ack among the probes

    @property
    def latest(self) -> Probe | None:
        return self._probes[-1] if self._probes else None

    @property
    def probes(self) -> tuple[Probe, ...]:
        """The probes in the window, in the order they were added."""
        return tuple(self._probes)

    def lower_of(self, p: Probe, mono: float) -> float:
        """The lower bound on broker time at ``mono`` that probe ``p`` alone gives."""
        return p.broker_ms + max(0.0, mono - p.acked_mono) * 1000 * (1 - self._drift)

    def _upper(self, p: Probe, mono: float) -> float:
        return p.broker_ms + 1 + max(0.0, mono - p.sent_mono) * 1000 * (1 + self._drift)

    def add(self, probe: Probe) -> bool:
        """Add ``probe``; False if it contradicts the others (a clock step): they are dropped."""
        consistent = True
        if self._probes:
            at = probe.acked_mono
            low = max(self.lower_of(p, at) for p in self._probes)
            high = min(self._upper(p, at) for p in self._probes)
            consistent = low <= self._upper(probe, at) and probe.broker_ms <= high
            if not consistent:
                self._probes.clear()
        self._probes.append(probe)
        horizon = probe.acked_mono - self._window_s
        while len(self._probes) > 1 and self._probes[0].acked_mono < horizon:
            self._probes.popleft()
        self._last_acked = last = max(p.acked_mono for p in self._probes)
        self._highest_lower = max(self._probes, key=lambda p: self.lower_of(p, last))
        return consistent

    def lower_ms(self, mono: float) -> float | None:
        """Broker time at ``mono`` is at least this: the conservative estimate."""
        best = self._highest_lower
        if best is not None and mono >= self._last_acked:
            return self.lower_of(best, mono)
        return max((self.lower_of(p, mono) for p in self._probes), default=None)

    def upper_ms(self, mono: float) -> float | None:
        """Broker time at ``mono`` is at most this."""
        return min((self._upper(p, mono) for p in self._probes), default=None)

    def skew_ms(self, wall_ms: float, mono: float) -> float | None:
        """Local wall clock ``wall_ms`` (read at ``mono``) minus the middle of the bounds."""
        low, high = self.lower_ms(mono), self.upper_ms(mono)
        if low is None or high is None:
            return None
        return wall_ms - (low + high) / 2


class ClockMetrics(Protocol):
    """The metrics a BrokerClock updates (delay_service.metrics.Metrics has them)."""

    clock_skew: Gauge
    clock_uncertainty: Gauge
    clock_probe_failures: Counter


class ProbeProducer(Protocol):
    """The part of confluent_kafka.Producer a BrokerClock uses (tests pass a fake)."""

    def produce(
        self, topic: str, value: bytes, *, partition: int, on_delivery: DeliveryCallback
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...


class BrokerClock:
    """Probes the broker's clock in the background; :meth:`now_ms` never runs ahead of it."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        config: Mapping[str, str] | None = None,
        topic: str = CLOCK_TOPIC,
        interval_s: float = 1.0,
        probe_timeout_s: float = 5.0,
        window: ProbeWindow | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics: ClockMetrics | None = None,
        producer_factory: Callable[[], ProbeProducer] | None = None,
        admin_factory: Callable[[], AdminClient] | None = None,
    ) -> None:
        base = {"bootstrap.servers": bootstrap_servers, **(config or {})}
        conf = {**PRODUCER_CONFIG, "message.timeout.ms": int(probe_timeout_s * 1000), **base}
        self._producer_factory = producer_factory or (lambda: Producer(conf))
        self._admin_factory = admin_factory or (lambda: AdminClient(dict(base)))
        self.topic = topic
        self._interval_s = interval_s
        self._timeout_s = probe_timeout_s
        self._clock = clock
        self._metrics = metrics
        self._backoff = Backoff(initial_s=min(0.1, interval_s), cap_s=max(interval_s, 10.0))
        self._lock = threading.Lock()
        self._window = window or ProbeWindow()  # guarded by _lock
        self._problem: BrokerClockError | None = None  # guarded by _lock
        self._ready = threading.Event()  # a probe succeeded
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Probe-thread state.
        self._producer: ProbeProducer | None = None
        self._admin: AdminClient | None = None  # kept: its connection outlives a failed try
        self._topic_checked = False
        self._failures = 0  # in a row
        self._succeeded = 0  # probes acknowledged, up to WARM_UP_PROBES

    # -- owner -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the probe thread: the topic is ensured, then a probe every ``interval_s``."""
        if self._thread is not None:
            raise RuntimeError("BrokerClock.start() called twice")
        self._thread = threading.Thread(target=self._run, name="broker-clock", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the probe thread and drop its producer."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- any thread ------------------------------------------------------------------------

    def now_ms(self) -> int | None:
        """Broker time now, never ahead of it; None until a probe succeeded."""
        with self._lock:
            low = self._window.lower_ms(self._clock.monotonic())
        return None if low is None else math.floor(low)

    def upper_ms(self) -> int | None:
        """Broker time now is at most this (rounded up: never behind it); None until a probe
        succeeded. The proxy stamps acceptance with it (README "Cancelling a message")."""
        with self._lock:
            high = self._window.upper_ms(self._clock.monotonic())
        return None if high is None else math.ceil(high)

    def skew_ms(self) -> float | None:
        """Local wall clock minus broker time (middle of the bounds); positive: local ahead."""
        with self._lock:
            return self._window.skew_ms(self._clock.wall_ms(), self._clock.monotonic())

    def uncertainty_ms(self) -> float | None:
        """The latest probe's round trip: how far apart the bounds can be."""
        with self._lock:
            latest = self._window.latest
        return None if latest is None else latest.round_trip_s * 1000

    def last_probe_age_s(self) -> float | None:
        """Seconds since the latest successful probe was acknowledged."""
        with self._lock:
            latest = self._window.latest
        return None if latest is None else self._clock.monotonic() - latest.acked_mono

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a probe succeeded (True), or ``timeout`` seconds passed."""
        return self._ready.wait(timeout)

    @property
    def problem(self) -> BrokerClockError | None:
        """Why probes are unusable (the topic is not LogAppendTime), or None."""
        with self._lock:
            return self._problem

    def wall_ms(self) -> int:
        """:meth:`now_ms` for code that takes a :class:`Clock` (the forwarder), once ready."""
        now = self.now_ms()
        if now is None:
            raise RuntimeError("no broker-clock probe has succeeded yet: wait_ready() first")
        return now

    def monotonic(self) -> float:
        """The local monotonic clock (a :class:`Clock`'s other half)."""
        return self._clock.monotonic()

    # -- the probe thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    ok = self._step()
                except Exception as exc:
                    log.exception("clock.probe_thread_error", error=str(exc))
                    self._producer = None
                    self._failed("internal", str(exc))
                    ok = False
                self._failures = 0 if ok else self._failures + 1
                warming = ok and self._succeeded < WARM_UP_PROBES
                delay = (
                    0.0
                    if warming
                    else self._interval_s
                    if ok
                    else self._backoff.delay(self._failures)
                )
                self._stop.wait(delay)
        finally:
            if self._producer is not None:
                self._producer.flush(1)

    def _step(self) -> bool:
        """Ensure the topic if not done yet, then probe once; False if either failed."""
        if not self._topic_checked:
            try:
                self._admin = self._admin or self._admin_factory()
                ensure_clock_topic(self._admin, self.topic, timeout=10.0)
            except (BrokerClockError, InfrastructureError) as exc:
                problem = exc if isinstance(exc, BrokerClockError) else None
                self._failed("topic", str(exc), problem=problem)
                return False
            self._topic_checked = True
        return self.probe_once()

    def probe_once(self) -> bool:
        """Produce one probe and wait for its acknowledgement (the probe thread, or a test)."""
        producer = self._producer = self._producer or self._producer_factory()
        outcome: list[Probe | BrokerClockError | str] = []
        m0 = self._clock.monotonic()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            m1, wall = self._clock.monotonic(), self._clock.wall_ms()
            if err is not None:
                outcome.append(f"{err.name()}: {err.str()}")
                return
            kind, stamp = msg.timestamp()
            if kind != TIMESTAMP_LOG_APPEND_TIME:
                found = {1: "CreateTime"}.get(kind, f"none ({kind})")  # TIMESTAMP_CREATE_TIME
                outcome.append(BrokerClockError(self.topic, found))
            else:
                outcome.append(Probe(m0, m1, stamp, wall))

        try:
            producer.produce(self.topic, b"", partition=0, on_delivery=on_delivery)
        except (BufferError, KafkaException) as exc:
            self._failed("produce", str(exc))
            return False
        deadline = m0 + self._timeout_s + 5  # librdkafka reports by message.timeout.ms
        while not outcome and not self._stop.is_set():
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                self._producer = None  # stuck: a fresh producer next time
                self._failed("timeout", "no acknowledgement in time")
                return False
            producer.poll(min(remaining, 0.1))
        if not outcome:
            return False  # closing
        if isinstance(result := outcome[0], Probe):
            self._record(result)
            return True
        problem = result if isinstance(result, BrokerClockError) else None
        self._topic_checked &= problem is None  # else its configuration is read again first
        self._failed("delivery", str(result), problem=problem)
        return False

    def _record(self, probe: Probe) -> None:
        with self._lock:
            consistent = self._window.add(probe)
            skew = self._window.skew_ms(probe.wall_ms, probe.acked_mono) or 0.0  # never None
            self._problem = None
        if not consistent:
            log.warning("clock.broker_clock_stepped", topic=self.topic, broker_ms=probe.broker_ms)
        if self._metrics is not None:
            self._metrics.clock_skew.set(skew / 1000)
            self._metrics.clock_uncertainty.set(probe.round_trip_s)
        self._succeeded = min(self._succeeded + 1, WARM_UP_PROBES)
        if self._succeeded < WARM_UP_PROBES and self._thread is not None:
            return  # the probe thread warms up: ready once the bounds are tight
        if not self._ready.is_set() or self._failures:
            rtt_ms = round(probe.round_trip_s * 1000, 3)
            log.info("clock.probing", skew_ms=round(skew, 1), round_trip_ms=rtt_ms)
        self._ready.set()

    def _failed(self, stage: str, error: str, *, problem: BrokerClockError | None = None) -> None:
        """Count a failed probe; warn once per problem and once per run of failures."""
        if self._metrics is not None:
            self._metrics.clock_probe_failures.inc()
        with self._lock:
            known, self._problem = self._problem, problem or self._problem
        if problem is not None and known is None:
            log.warning("clock.topic_not_log_append_time", topic=self.topic, error=error)
        elif problem is None and self._failures == 0:
            log.warning("clock.probe_failed", topic=self.topic, stage=stage, error=error)
        else:
            log.debug("clock.probe_failed", topic=self.topic, stage=stage, error=error)
