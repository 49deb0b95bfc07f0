"""Records in flight: produced, not yet acknowledged; their delivery reports, their deadlines.

:class:`InFlight` is held by the :class:`~delay_service.release.sender.Sender` (its ``flights``),
which decides what each record carries. It owns the producer (created by its factory at the
first record, or by the sender's ``start``) and tracks every record it launches by its entry's
key, one record per entry at most (two with a recurring message's next occurrence), counted
per release target. librdkafka's delivery callbacks, served by :meth:`InFlight.pump`,
turn each into a :class:`Completion`, which :meth:`InFlight.take_completed` hands over: with
the first error, or when every record of the entry is acknowledged.

A record with no report by its deadline (``message.timeout.ms`` + 30 s) or a fatal producer
error drops the producer: everything still in flight counts as timed out (it may yet be
written: a duplicate at worst, never a loss) and the next record creates a new producer.
:meth:`InFlight.abandon` forgets everything when a term as master ends: late reports are
ignored, and the entries stay in the store for the next master.

Threads: the forwarder thread only; librdkafka calls the delivery callbacks from ``poll()`` on
that thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message

from kdelay import logs
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.release.producer import Outgoing, ProducerLike, produce
from kdelay.delay_service.store.due_scan import Target
from kdelay.delay_service.store.entry import Entry
from kdelay.immutable import immutable

log = logs.get(__name__)


@immutable
class Completion:
    """How one record fared: acknowledged (``error`` None) or not, and its timestamp.

    ``dead_letter`` tells the entry's dead letter from its release; ``cause`` is, for a dead
    letter, the target's error that sent it there.
    """

    entry: Entry
    dead_letter: bool
    error: KafkaError | None
    timestamp_ms: int
    cause: KafkaError | None = None
    partition: int | None = None  # where the record was written (acknowledged ones)
    offset: int | None = None


@dataclass(slots=True)
class _Flight:
    """A record produced and not yet acknowledged."""

    entry: Entry
    dead_letter: bool
    timestamp_ms: int
    deadline: float  # monotonic seconds: after this, it is declared timed out
    cause: KafkaError | None  # a dead letter's reason
    target: Target  # the release target it holds while in flight
    parts: int = 1  # records still unacknowledged: 2 with a recurring message's next one
    written: tuple[int, int] | None = None  # the release's partition and offset


class InFlight:
    """The producer and the records it has in flight, until their delivery reports."""

    def __init__(
        self,
        producer_factory: Callable[[], ProducerLike],
        *,
        produce_timeout_ms: int,
        clock: Clock = SYSTEM_CLOCK,
        on_poll_error: Callable[[KafkaException], None] = lambda _exc: None,
    ) -> None:
        self._factory = producer_factory
        # librdkafka fails a record after message.timeout.ms; the margin covers its last retry.
        self.ack_timeout_s = produce_timeout_ms / 1000 + 30
        self._clock = clock
        #: The producer, None until the first record (or the sender's ``start``) creates it.
        self.producer: ProducerLike | None = None
        # Sees a producer error raised by poll() first (and may raise it as another error).
        self._on_poll_error = on_poll_error
        self._flights: dict[bytes, _Flight] = {}  # by entry key: one record per entry at most
        self._targets: Counter[Target] = Counter()  # records in flight per release target
        self._done: list[Completion] = []
        self._broken = False  # a fatal error: the producer must go

    @property
    def in_flight(self) -> int:
        """Records produced and not yet acknowledged (or failed)."""
        return len(self._flights)

    def in_flight_targets(self) -> set[Target]:
        """Release targets with a record in flight (a release or a dead letter for it)."""
        return set(self._targets)

    def is_in_flight(self, key: bytes) -> bool:
        """Whether the entry with ``key`` has a record in flight."""
        return key in self._flights

    def take_completed(self) -> list[Completion]:
        """Every record acknowledged or failed since the last call, in completion order."""
        done, self._done = self._done, []
        return done

    @property
    def has_completed(self) -> bool:
        """:meth:`take_completed` would return something."""
        return bool(self._done)

    def pump(self, timeout: float = 0) -> None:
        """Serve delivery reports for up to ``timeout`` seconds (librdkafka returns early when
        one arrives); declare records past their acknowledgement deadline timed out."""
        if self._flights and self.producer is not None:
            try:
                self.producer.poll(timeout)
            except KafkaException as exc:  # librdkafka raises a fatal error from poll()
                self._poll_failed(exc)
        # Deadlines grow with insertion order (one timeout, a monotonic clock): the first is
        # the earliest.
        oldest = next(iter(self._flights.values()), None)
        if self._broken or (oldest is not None and oldest.deadline <= self._clock.monotonic()):
            self._replace_producer()

    def _poll_failed(self, exc: KafkaException) -> None:
        """A producer error raised by ``poll()`` (a fatal one): the producer must go; what it
        holds is declared timed out below (a duplicate at worst)."""
        self._on_poll_error(exc)
        err = exc.args[0]
        log.error("sender.producer_failed", error=str(err))
        self._broken = True

    def wait(self, keys: Collection[bytes], deadline: float) -> None:
        """Pump until none of the entries ``keys`` has a record in flight, or until the
        monotonic ``deadline``: a slow target never holds the caller longer than that."""
        waiting = list(keys)
        first = 0  # keys before it are acknowledged: no new record is launched meanwhile
        while True:
            while first < len(waiting) and waiting[first] not in self._flights:
                first += 1
            if first == len(waiting):
                break
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                break
            self.pump(min(remaining, 0.05))

    def wait_all(self, deadline: float) -> None:
        """Pump until nothing is in flight, or until the monotonic ``deadline``."""
        self.wait(list(self._flights), deadline)

    def abandon(self) -> None:
        """Forget every record in flight (the term as master ended): their reports, if any
        arrive, are ignored, and their entries stay in the store for the next master."""
        self._flights.clear()
        self._targets.clear()
        self._done.clear()

    def get_producer(self) -> ProducerLike:
        """The producer, created by the factory when there is none."""
        if self.producer is None:
            self.producer = self._factory()
        return self.producer

    def launch(
        self,
        entry: Entry,
        record: Outgoing,
        *,
        cause: KafkaError | None,
        then: Outgoing | None = None,
        deadline: float | None = None,
    ) -> None:
        """Produce ``record`` for ``entry`` (its dead letter if ``cause`` is given), and
        ``then`` with it, and track them until their delivery reports or the monotonic
        ``deadline`` (default: the acknowledgement timeout from now): the entry completes with
        the first error, or when both are acknowledged."""
        if entry.key in self._flights:
            raise ValueError(f"entry {entry.message.id} already has a record in flight")
        producer = self.get_producer()
        if deadline is None:
            deadline = self._clock.monotonic() + self.ack_timeout_s
        message = entry.message
        target = (message.topic, message.partition)
        flight = _Flight(entry, cause is not None, record.timestamp_ms, deadline, cause, target)
        key = entry.key
        flights = self._flights

        def on_delivery(err: KafkaError | None, msg: Message | None) -> None:
            if flights.get(key) is not flight:
                return  # abandoned, or already declared timed out
            if err is None and msg is not None:
                partition, offset = msg.partition(), msg.offset()
                if partition is not None and offset is not None and offset >= 0:
                    flight.written = (partition, offset)
            self._part_done(key, flight, err)

        flights[key] = flight
        self._targets[target] += 1
        if then is None:  # one record, one callback
            err = produce(producer, record, on_delivery=on_delivery)
            if err is not None:
                self._finish(key, err)
            return

        def on_part(err: KafkaError | None, msg: Message | None) -> None:
            if flights.get(key) is flight:
                self._part_done(key, flight, err)

        flight.parts = 2
        for rec, callback in ((record, on_delivery), (then, on_part)):
            if flights.get(key) is not flight:
                continue
            err = produce(producer, rec, on_delivery=callback)
            if err is not None:
                self._finish(key, err)

    def _part_done(self, key: bytes, flight: _Flight, err: KafkaError | None) -> None:
        """One record of ``flight`` was acknowledged or failed: it completes with the first
        error, or with the last acknowledgement."""
        flight.parts -= 1
        if err is None and flight.parts > 0:
            return
        self._finish(key, err)
        if err is not None and err.fatal():
            self._broken = True

    def _finish(self, key: bytes, err: KafkaError | None) -> None:
        flight = self._flights.pop(key)
        left = self._targets[flight.target] - 1
        if left > 0:
            self._targets[flight.target] = left
        else:
            del self._targets[flight.target]
        partition, offset = flight.written or (None, None)
        self._done.append(
            Completion(
                flight.entry,
                flight.dead_letter,
                err,
                flight.timestamp_ms,
                flight.cause,
                partition if err is None else None,
                offset if err is None else None,
            )
        )

    def _replace_producer(self) -> None:
        """Drop a broken or stuck producer; everything it still holds counts as timed out (it
        may yet be written: a duplicate at worst, never a loss)."""
        log.error(
            "sender.producer_recreated", unacknowledged=len(self._flights), fatal=self._broken
        )
        timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
        for key in list(self._flights):
            self._finish(key, timed_out)
        self.producer = None
        self._broken = False
