"""The master's producer: its settings, one record to produce, the errors retrying cannot fix.

:func:`make_producer` is the one idempotent, acks=all librdkafka producer of an at-least-once
master (``txn_sender.py`` makes the transactional one); :class:`ProducerLike` is the part of it
the sender uses, so tests pass a fake. :func:`produce` hands one :class:`Outgoing` record to
it, waiting out a full local queue, and returns a synchronous error instead of raising it.
:data:`PERMANENT_ERRORS` are the errors after which the master dead-letters an entry
(``release/backoff.py``) instead of retrying it for ever.

Threads: the producer belongs to the forwarder thread (``sender.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kdelay.delay_service.config import ReplicaConfig
from kdelay.immutable import immutable

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
            **cfg.kafka_connection(cfg.bootstrap_servers),
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
class Outgoing:
    """One record to produce: where, what, and its timestamp (0: the producer's time)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    headers: Headers
    timestamp_ms: int


def produce(
    producer: ProducerLike, record: Outgoing, *, on_delivery: DeliveryCallback | None
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
