"""One batch of records handed to upstream Kafka: its delivery reports become one asyncio future.

A delivery callback (librdkafka's poll thread) only counts down its batch; the batch's future is
resolved with one ``call_soon_threadsafe`` when its last record is acknowledged, so the loop is
woken once per batch, not per record. The future raises UpstreamError, with the Kafka error code
a client should see, when any record failed (proxy/upstream/producer.py owns the producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import kafka.errors as kerr
from confluent_kafka import KafkaError, Message

from kdelay.errors import KdelayError

#: librdkafka errors that may mean upstream is unreachable: they wake the probe.
OUTAGE_CODES = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)


class UpstreamError(KdelayError):
    """Upstream Kafka did not take a batch; ``code`` is the Kafka error to give the client,
    ``name`` librdkafka's name of the error (the metric's label), ``outage`` whether it may
    mean upstream is unreachable."""

    def __init__(self, code: int, message: str, *, name: str = "", outage: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.outage = outage


def kafka_code(err: KafkaError) -> int:
    """The Kafka error code a client should see for a librdkafka delivery error.

    Broker errors keep their own code; librdkafka-local ones (timeouts, transport, fatal
    idempotence states) become retriable codes, because nothing of that batch is known durable.
    """
    if err.fatal():
        # The producer is replaced (see the module docstring): a retry goes to a new one.
        return int(kerr.KafkaStorageError.errno)
    code = int(err.code())
    if code > 0:
        return code
    if code in (KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC):
        return int(kerr.UnknownTopicOrPartitionError.errno)
    return int(kerr.RequestTimedOutError.errno)


class Batch:
    """Countdown of one batch's deliveries; touched by the poll thread only after produce."""

    __slots__ = ("base", "error", "failed", "future", "generation", "lock", "loop", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, generation: int = 0) -> None:
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()
        #: Offset of the first immediate record (-1: none, or not yet).
        self.base = -1
        self.remaining = size
        self.error: KafkaError | None = None
        self.failed: KafkaError | None = None
        self.generation = generation
        self.lock = threading.Lock()

    def delivered(self, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report of one record (poll thread)."""
        if err is not None:
            self.error = err
        self.countdown(1)

    def delivered_base(self, err: KafkaError | None, msg: Message) -> None:
        """The delivery report of the record whose offset the batch reports."""
        if err is None:
            self.base = msg.offset() or 0
        self.delivered(err, msg)

    def countdown(self, n: int) -> None:
        # The poll thread counts deliveries; the loop thread counts records it never produced.
        with self.lock:
            self.remaining -= n
            last = self.remaining == 0
        if last:
            self._wake()

    def fail(self, err: KafkaError) -> None:
        """Resolve now with ``err`` whatever is still outstanding (any thread)."""
        with self.lock:
            self.failed = err
            self.remaining = -(2**31)  # later deliveries no longer reach zero
        self._wake()

    def _wake(self) -> None:
        # The loop may be gone when a disposed producer reports late (shutdown).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self.future.done():
            return
        err = self.failed or self.error
        if err is not None:
            self.future.set_exception(
                UpstreamError(
                    kafka_code(err),
                    f"upstream Kafka: {err.str()}",
                    name=err.name(),
                    outage=err.code() in OUTAGE_CODES,
                )
            )
        else:
            self.future.set_result(self.base)
