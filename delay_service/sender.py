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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from delay_service.clock import SYSTEM_CLOCK, Clock
from delay_service.config import ReplicaConfig
from delay_service.entry import Entry, entry_seq
from delay_service.round import Target
from delay_service.tombstones import Retired
from kdelay import logs
from kdelay.buffer import DEAD_LETTER_TOPIC, encode, tombstone_route
from kdelay.errors import KdelayError
from kdelay.immutable import immutable
from kdelay.repeat import parse_repeat

log = logs.get(__name__)

#: Records released with one reading of the clock (their timestamp, when the target keeps
#: the producer's): producing this many takes well under a millisecond or two.
_CLOCK_EVERY = 32
#: The proxy checked each gap of a series against its maximum horizon; no second check here.
_NO_HORIZON = 2**62
ERROR_HEADER = "kdelay-error"
TARGET_HEADER = "kdelay-target"

#: Errors retrying cannot fix: after ``dead_letter_after`` attempts the record is dead-lettered.
PERMANENT_ERRORS = frozenset(
    {
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._INVALID_ARG,
    }
)

Headers = list[tuple[str, str | bytes | None]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def is_permanent(err: KafkaError) -> bool:
    """Whether retrying cannot fix ``err`` (see :data:`PERMANENT_ERRORS`)."""
    return err.code() in PERMANENT_ERRORS


def error_name(err: KafkaError) -> str:
    """The error's symbolic name (``_MSG_TIMED_OUT``), as metrics label it."""
    return str(err.name())


class ProducerLike(Protocol):
    """The part of confluent_kafka.Producer the sender uses (tests pass a fake)."""

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...


def make_producer(cfg: ReplicaConfig) -> Producer:
    """An idempotent, acks=all producer for targets, dead letters and tombstones."""
    return Producer(
        {
            "bootstrap.servers": cfg.bootstrap_servers,
            "client.id": f"kdelay-replica-{cfg.name}",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": cfg.produce_timeout_ms,
            # Java clients' default, so partition -1 lands where a Java producer would put it.
            "partitioner": "murmur2_random",
        }
    )


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


@immutable
class _Record:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    headers: Headers
    timestamp_ms: int


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


class Sender:
    """Produces for the master; owns the producer and re-creates it when it breaks."""

    def __init__(
        self,
        producer_factory: Callable[[], ProducerLike],
        *,
        buffer_topic: str,
        produce_timeout_ms: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._factory = producer_factory
        self._buffer_topic = buffer_topic
        # librdkafka fails a record after message.timeout.ms; the margin covers its last retry.
        self._ack_timeout_s = produce_timeout_ms / 1000 + 30
        self._clock = clock
        self._producer: ProducerLike | None = None
        self._flights: dict[bytes, _Flight] = {}  # by entry key: one record per entry at most
        self._targets: Counter[Target] = Counter()  # records in flight per release target
        self._done: list[Completion] = []
        self._broken = False  # a fatal error: the producer must go

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
        self._get_producer()

    # -- in flight -------------------------------------------------------------------------

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
        if self._flights and self._producer is not None:
            try:
                self._producer.poll(timeout)
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

    # -- producing -------------------------------------------------------------------------

    def submit(self, entries: Sequence[Entry]) -> None:
        """Release ``entries`` to their targets, in order, without waiting; their
        :class:`Completion` comes from :meth:`take_completed` after a :meth:`pump`."""
        if not entries:
            return  # no producer is created for nothing
        released_ms = 0
        launch = self._launch
        # One deadline for the submission: its records leave within milliseconds.
        deadline = self._clock.monotonic() + self._ack_timeout_s
        for i, entry in enumerate(entries):
            msg = entry.message
            # The release time, read as the records leave: again every _CLOCK_EVERY records
            # (a few ms apart at most), not for each one (the broker clock is a lock and a
            # bound computed under it).
            if i % _CLOCK_EVERY == 0:
                released_ms = self._clock.wall_ms()
            record = _Record(
                msg.topic,
                msg.key,
                msg.value,
                msg.partition,
                cast("Headers", msg.delivered_headers()),  # a fresh list
                released_ms,
            )
            launch(entry, record, cause=None, then=self._next_occurrence(entry), deadline=deadline)
        self.pump(0)

    def _next_occurrence(self, entry: Entry) -> _Record | None:
        """A recurring message's next occurrence, for the buffer topic, or None (not recurring,
        or the series ends here). It is produced with the release and the entry completes only
        when both are acknowledged (exactly-once: in the same transaction), so a series loses
        no occurrence whoever is master; written twice, the copies share a buffer key."""
        msg = entry.message
        if msg.repeat is None:
            return None
        try:
            due = parse_repeat(msg.repeat, _NO_HORIZON).after(msg.occurrence, msg.deliver_at_ms)
        except (KdelayError, ValueError, OverflowError) as exc:
            # A value this version cannot follow (or a bug computing it) must not stop every
            # release: this occurrence goes out, the series ends here, loudly.
            log.exception(
                "sender.series_ended",
                id=msg.id,
                repeat=msg.repeat,
                occurrence=msg.occurrence,
                error=f"{type(exc).__name__}: {exc}",
                consequence="this occurrence is released; no later one is scheduled",
            )
            return None
        if due is None:
            return None
        enc = encode(msg.next_occurrence(due, entry_seq(entry.key)))
        return _Record(
            self._buffer_topic, enc.key, enc.value, entry.partition, list(enc.headers), 0
        )

    def submit_dead_letters(self, failures: Sequence[tuple[Entry, KafkaError]]) -> None:
        """Send permanently failing entries to the dead-letter topic without waiting."""
        for entry, err in failures:
            msg = entry.message
            error = f"{error_name(err)}: {err.str()}"
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
            record = _Record(
                DEAD_LETTER_TOPIC, msg.key, msg.value, -1, headers, self._clock.wall_ms()
            )
            self._launch(entry, record, cause=err)
        if failures:
            self.pump(0)

    def tombstones(self, retired: Iterable[Retired]) -> None:
        """Tombstones for buffer records that were delivered or cancelled."""
        producer = self._get_producer()
        topic = self._buffer_topic
        for r in retired:
            record = _Record(
                topic,
                r.buffer_key.encode(),
                None,
                r.partition,
                [tombstone_route(r.id, r.offset, r.fate)],
                0,
            )
            self._produce(producer, record, on_delivery=None)
        producer.poll(0)

    def close(self) -> None:
        """Wait briefly for outstanding records and drop the producer."""
        self.abandon()
        if self._producer is not None:
            remaining = self._producer.flush(10)
            if remaining:
                log.warning("sender.unacknowledged_at_shutdown", count=remaining)
            self._producer = None

    # -- internals -------------------------------------------------------------------------

    def _get_producer(self) -> ProducerLike:
        if self._producer is None:
            self._producer = self._factory()
        return self._producer

    def _launch(
        self,
        entry: Entry,
        record: _Record,
        *,
        cause: KafkaError | None,
        then: _Record | None = None,
        deadline: float | None = None,
    ) -> None:
        """Produce ``record`` for ``entry`` (its dead letter if ``cause`` is given), and
        ``then`` with it, and track them until their delivery reports or the monotonic
        ``deadline`` (default: the acknowledgement timeout from now): the entry completes with
        the first error, or when both are acknowledged."""
        if entry.key in self._flights:
            raise ValueError(f"entry {entry.message.id} already has a record in flight")
        producer = self._get_producer()
        if deadline is None:
            deadline = self._clock.monotonic() + self._ack_timeout_s
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
            err = self._produce(producer, record, on_delivery=on_delivery)
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
            err = self._produce(producer, rec, on_delivery=callback)
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
        self._producer = None
        self._broken = False

    @staticmethod
    def _produce(
        producer: ProducerLike, record: _Record, *, on_delivery: DeliveryCallback | None
    ) -> KafkaError | None:
        """produce(), waiting out a full local queue; a synchronous error is returned."""
        while True:
            try:
                producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    on_delivery=on_delivery,
                    timestamp=record.timestamp_ms,
                    headers=record.headers,
                )
            except BufferError:
                producer.poll(0.05)
                continue
            except KafkaException as exc:
                err = exc.args[0]
                return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL)
            return None
