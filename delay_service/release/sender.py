"""Every record the delay service produces to Kafka: released messages, dead letters, tombstones.

One idempotent, acks=all producer (librdkafka) serves all three. Released messages keep their
exact topic and partition (-1: the partitioner picks from the key, like a Java producer) and get
the release time as record timestamp. Dead letters go to ``__kdelay_dead_letter`` with the error
in a ``kdelay-error`` header and the original target in ``kdelay-target``. Tombstones for
delivered and cancelled ids go to the id's buffer partition and are not waited for: a lost one
only leaves an entry for compaction or the next checkpoint to clean up.

:meth:`Sender.submit` and :meth:`Sender.submit_dead_letters` produce records and return at
once; every record stays *in flight* (tracked by its entry's key and counted per release
target) until its delivery report, which :meth:`Sender.pump` serves and
:meth:`Sender.take_completed` hands over. Nothing here waits for a slow target: the forwarder
waits a bounded time (:meth:`Sender.wait`) and leaves the rest in flight. A record with no report
by its deadline (``message.timeout.ms`` + 30 s) or a fatal producer error drops the producer:
everything still in flight counts as timed out (it may yet be written: a duplicate at worst)
and the next record creates a new producer.

Order: the forwarder sends a target nothing new while it has records in flight, so records of
different rounds never overtake each other. Within one submission a failed record cannot recall
the ones after it to the same partition: librdkafka's idempotent producer skips records that
time out and writes the later ones (its INTRODUCTION.md, "Message timeout considerations": 1,
2..5 with 2, 3 timed out are written as 1, 4, 5), so a retried record can land after later ones
of its own batch. Records of one batch are produced within milliseconds of each other and time
out together, which keeps that rare.

Threads: a Sender belongs to the forwarder thread; librdkafka calls the delivery callbacks
from ``poll()`` on that thread.

Where each part lives: the producer's settings, one produce call and the permanent-error table
in ``producer.py``; the records in flight, their delivery reports and deadlines, and the
producer's replacement in ``in_flight.py`` (a Sender's ``flights``, which its methods for the
records in flight hand each call to); a recurring message's next occurrence in ``series.py``.
Here: what each kind of record carries.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import cast

from confluent_kafka import KafkaError, KafkaException

from kdelay import logs
from kdelay.buffer import DEAD_LETTER_TOPIC, tombstone_route
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.release.in_flight import Completion, InFlight
from kdelay.delay_service.release.producer import (
    Headers,
    Outgoing,
    ProducerLike,
    error_name,
    make_producer,
    produce,
)
from kdelay.delay_service.release.series import next_occurrence
from kdelay.delay_service.store.due_scan import Target
from kdelay.delay_service.store.entry import Entry
from kdelay.delay_service.store.tombstones import Retired

log = logs.get(__name__)

#: Records released with one reading of the clock (their timestamp, when the target keeps
#: the producer's): producing this many takes well under a millisecond or two.
_CLOCK_EVERY = 32
ERROR_HEADER = "kdelay-error"
TARGET_HEADER = "kdelay-target"


class Sender:
    """Produces for the master; owns the producer and re-creates it when it breaks.

    ``on_poll_error`` sees a producer error raised by ``poll()`` first (``in_flight.py``).
    """

    def __init__(
        self,
        producer_factory: Callable[[], ProducerLike],
        *,
        buffer_topic: str,
        produce_timeout_ms: int,
        clock: Clock = SYSTEM_CLOCK,
        on_poll_error: Callable[[KafkaException], None] = lambda _exc: None,
    ) -> None:
        self.flights = InFlight(
            producer_factory,
            produce_timeout_ms=produce_timeout_ms,
            clock=clock,
            on_poll_error=on_poll_error,
        )
        self._clock = clock
        self._buffer_topic = buffer_topic
        self._claim: Callable[[Sequence[Entry]], Sequence[Entry]] = _all

    def claim_with(self, claim: Callable[[Sequence[Entry]], Sequence[Entry]]) -> None:
        """Produce a release or dead letter only for the entries ``claim`` returns, called
        just before (the forwarder's ``Store.claim_release``: those still pending, marked in
        release, so a cancel read after the round's scan keeps its message from leaving)."""
        self._claim = claim

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig, clock: Clock = SYSTEM_CLOCK) -> Sender:
        """A sender with a real producer configured for ``cfg``, stamping records by ``clock``."""
        return cls(
            lambda: make_producer(cfg),
            buffer_topic=cfg.buffer_topic,
            produce_timeout_ms=cfg.produce_timeout_ms,
            clock=clock,
        )

    def start(self) -> None:
        """Create the producer now rather than at the first record."""
        self.flights.get_producer()

    # -- the records in flight (in_flight.py) ----------------------------------------------

    @property
    def in_flight(self) -> int:
        """Records produced and not yet acknowledged (or failed)."""
        return self.flights.in_flight

    def in_flight_targets(self) -> set[Target]:
        """Release targets with a record in flight (a release or a dead letter for it)."""
        return self.flights.in_flight_targets()

    def is_in_flight(self, key: bytes) -> bool:
        """Whether the entry with ``key`` has a record in flight."""
        return self.flights.is_in_flight(key)

    @property
    def has_completed(self) -> bool:
        """:meth:`take_completed` would return something."""
        return self.flights.has_completed

    def take_completed(self) -> list[Completion]:
        """Every record acknowledged or failed since the last call, in completion order."""
        return self.flights.take_completed()

    def pump(self, timeout: float = 0) -> None:
        """Serve delivery reports for up to ``timeout`` seconds (``InFlight.pump``)."""
        self.flights.pump(timeout)

    def wait(self, keys: Collection[bytes], deadline: float) -> None:
        """Pump until none of ``keys`` is in flight, or the monotonic ``deadline``."""
        self.flights.wait(keys, deadline)

    def wait_all(self, deadline: float) -> None:
        """Pump until nothing is in flight, or until the monotonic ``deadline``."""
        self.flights.wait_all(deadline)

    def abandon(self) -> None:
        """Forget every record in flight (the term as master ended, ``InFlight.abandon``)."""
        self.flights.abandon()

    # -- producing -------------------------------------------------------------------------

    def submit(self, entries: Sequence[Entry]) -> None:
        """Release ``entries`` to their targets, in order, without waiting; their
        :class:`Completion` comes from :meth:`take_completed` after a :meth:`pump`."""
        entries = self._claim(entries) if entries else entries
        if not entries:
            return  # no producer is created for nothing
        released_ms = 0
        launch = self.flights.launch
        # One deadline for the submission: its records leave within milliseconds.
        deadline = self._clock.monotonic() + self.flights.ack_timeout_s
        for i, entry in enumerate(entries):
            msg = entry.message
            # The release time, read as the records leave: again every _CLOCK_EVERY records
            # (a few ms apart at most), not for each one (the broker clock is a lock and a
            # bound computed under it).
            if i % _CLOCK_EVERY == 0:
                released_ms = self._clock.wall_ms()
            record = Outgoing(
                msg.topic,
                msg.key,
                msg.value,
                msg.partition,
                cast("Headers", msg.delivered_headers()),  # a fresh list
                released_ms,
            )
            launch(
                entry,
                record,
                cause=None,
                then=next_occurrence(entry, self._buffer_topic),
                deadline=deadline,
            )
        self.pump(0)

    def submit_dead_letters(self, failures: Sequence[tuple[Entry, KafkaError]]) -> None:
        """Send permanently failing entries to the dead-letter topic without waiting."""
        if failures:
            claimed = {e.key for e in self._claim([e for e, _ in failures])}
            failures = [(e, err) for e, err in failures if e.key in claimed]
        for entry, err in failures:
            msg = entry.message
            error = dead_letter_error(err)
            log.warning(
                "sender.dead_lettering",
                id=msg.id,
                topic=msg.topic,
                partition=msg.partition,
                error=error,
            )
            headers: Headers = [
                *msg.delivered_headers(),
                (ERROR_HEADER, error.encode()),
                (TARGET_HEADER, f"{msg.topic}/{msg.partition}".encode()),
            ]
            record = Outgoing(
                DEAD_LETTER_TOPIC, msg.key, msg.value, -1, headers, self._clock.wall_ms()
            )
            self.flights.launch(entry, record, cause=err)
        if failures:
            self.pump(0)

    def tombstones(self, retired: Iterable[Retired]) -> None:
        """Tombstones for buffer records that were delivered or cancelled."""
        producer = self.flights.get_producer()
        topic = self._buffer_topic
        for r in retired:
            record = Outgoing(
                topic,
                r.buffer_key.encode(),
                None,
                r.partition,
                [tombstone_route(r.id, r.offset, r.fate)],
                0,
            )
            produce(producer, record, on_delivery=None)
        producer.poll(0)

    def close(self) -> None:
        """Wait briefly for outstanding records and drop the producer."""
        self.abandon()
        if self.flights.producer is not None:
            remaining = self.flights.producer.flush(10)
            if remaining:
                log.warning("sender.unacknowledged_at_shutdown", count=remaining)
            self.flights.producer = None


def _all(entries: Sequence[Entry]) -> Sequence[Entry]:
    return entries


def dead_letter_error(err: KafkaError) -> str:
    """A dead letter's ``kdelay-error``: the target's error, by name and message."""
    return f"{error_name(err)}: {err.str()}"
