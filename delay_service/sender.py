"""Every record the delay service produces to Kafka: released messages, dead letters, tombstones.

One idempotent, acks=all producer (librdkafka) serves all three. Released messages keep their
exact topic and partition (-1: the partitioner picks from the key, like a Java producer) and get
the release time as record timestamp. Dead letters go to ``__kdelay_dead_letter`` with the error
in a ``kdelay-error`` header and the original target in ``kdelay-target``. Tombstones for
delivered and cancelled ids go to the id's buffer partition and are not waited for: a lost one
only leaves an entry for compaction or the next checkpoint to clean up.

:meth:`Sender.send` and :meth:`Sender.dead_letter` produce their records in order and return
only once every one is acknowledged or the acknowledgement deadline (``message.timeout.ms`` + 30
s) has passed. A fatal producer error or a missing acknowledgement drops the producer; the next
call creates a new one. Within one call a failed record cannot recall the ones after it to the
same partition; librdkafka's idempotent producer fails the rest of that partition's queue with
it, which keeps the order in practice.

Threads: a Sender belongs to the forwarder thread; librdkafka calls the delivery callbacks
from ``poll()`` on that thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from delay_service.clock import SYSTEM_CLOCK, Clock
from delay_service.config import ReplicaConfig
from delay_service.entry import Entry
from kdelay import logs
from kdelay.buffer import DEAD_LETTER_TOPIC, Tombstone, encode

log = logs.get(__name__)

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


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one released record fared: acknowledged (``error`` None) or not, and its timestamp."""

    error: KafkaError | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class _Record:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    headers: Headers
    timestamp_ms: int


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

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig) -> Sender:
        """A sender with a real producer configured for ``cfg``."""
        return cls(
            lambda: make_producer(cfg),
            buffer_topic=cfg.buffer_topic,
            produce_timeout_ms=cfg.produce_timeout_ms,
        )

    def start(self) -> None:
        """Create the producer now rather than at the first record."""
        self._get_producer()

    def send(self, entries: Sequence[Entry]) -> list[Outcome]:
        """Release ``entries`` to their targets, in order; one outcome per entry."""
        if not entries:
            return []  # no producer is created for nothing

        def records() -> Iterator[_Record]:
            for entry in entries:
                msg = entry.message
                yield _Record(
                    msg.topic,
                    msg.key,
                    msg.value,
                    msg.partition,
                    list(msg.delivered_headers()),
                    self._clock.wall_ms(),  # taken as each record leaves: the release time
                )

        return [Outcome(err, rec.timestamp_ms) for rec, err in self._produce_all(records())]

    def dead_letter(self, failures: Sequence[tuple[Entry, KafkaError]]) -> list[bool]:
        """Send permanently failing entries to the dead-letter topic; True where acknowledged."""
        if not failures:
            return []

        def records() -> Iterator[_Record]:
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
                yield _Record(
                    DEAD_LETTER_TOPIC, msg.key, msg.value, -1, headers, self._clock.wall_ms()
                )

        acked: list[bool] = []
        for (entry, _), (_, err) in zip(failures, self._produce_all(records()), strict=True):
            if err is not None:
                log.error("sender.dead_letter_failed", id=entry.message.id, error=str(err))
            acked.append(err is None)
        return acked

    def tombstones(self, retired: Iterable[tuple[str, int, int]]) -> None:
        """Tombstones for ids (id, buffer partition, offset) that were delivered or cancelled."""
        producer = self._get_producer()
        for msg_id, partition, offset in retired:
            enc = encode(Tombstone(msg_id, offset))
            record = _Record(
                self._buffer_topic, enc.key, enc.value, partition, list(enc.headers), 0
            )
            self._produce(producer, record, on_delivery=None)
        producer.poll(0)

    def close(self) -> None:
        """Wait briefly for outstanding records and drop the producer."""
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

    def _produce_all(self, records: Iterable[_Record]) -> list[tuple[_Record, KafkaError | None]]:
        """Produce ``records`` in order and wait for every acknowledgement (or the deadline);
        a record never acknowledged gets ``_MSG_TIMED_OUT``."""
        producer = self._get_producer()
        results: list[tuple[_Record, KafkaError | None]] = []
        unacked: set[int] = set()

        def acknowledge(i: int) -> DeliveryCallback:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                results[i] = (results[i][0], err)
                unacked.discard(i)

            return on_delivery

        timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
        for i, record in enumerate(records):
            results.append((record, timed_out))
            unacked.add(i)
            err = self._produce(producer, record, on_delivery=acknowledge(i))
            if err is not None:
                results[i] = (record, err)
                unacked.discard(i)
            producer.poll(0)
        deadline = self._clock.monotonic() + self._ack_timeout_s
        while unacked and self._clock.monotonic() < deadline:
            producer.poll(0.05)
        fatal = any(err is not None and err.fatal() for _, err in results)
        if fatal or unacked:
            log.error("sender.producer_recreated", unacknowledged=len(unacked))
            self._producer = None
        return results

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
