"""Idempotent-producer bookkeeping: producer ids, epochs and sequence numbers (KIP-98).

The proxy is the broker its clients see, so it must give them the broker's guarantee: a batch
retried with the same (producer id, epoch, partition, base sequence) is answered with the first
result and written once. State lives in this process only. A producer id this process did not
allocate (another proxy replica behind the same Service, or before a restart) is adopted at the
sequence it presents, so clients keep working; dedupe then starts from that batch.

Retriable failures. The proxy hands a batch to upstream before the previous batches of that
partition are acknowledged (up to five are in flight), so, unlike a broker, it cannot refuse a
later batch because an earlier one failed: when batch B1 fails with a retriable upstream error,
the later batches B2.. of that partition are already with librdkafka and may be written. What
the proxy guarantees then:

- B1's sequence range stays open: the client's retry of exactly B1 is accepted and written
  again (not answered from the cached failure, which would fail the retry forever).
- B2.. are answered with their own upstream outcome. One that was written is acknowledged, and
  its retry is a duplicate answered from that result, so it is never written twice by a retry.
  Answering it OUT_OF_ORDER_SEQUENCE instead, as a broker would, would make the client resend
  records that are already upstream.
- The cost: when B1 fails and B2 succeeds, B1's records land after B2's (reordered, not lost,
  not duplicated). And an upstream failure is ambiguous (a timed-out batch may have been
  written), so the retry of a failed batch can duplicate its records: at-least-once there.

Bounded memory. The state of a producer is forgotten when it has been idle (no InitProducerId,
no Produce) for ``ttl_s`` (default one day, Kafka's ``producer.id.expiration.ms``), and the
least recently used producer is forgotten when more than ``max_producers`` are known. A producer
that returns after it was forgotten is treated like any producer id this process did not
allocate: its next batch is adopted at the sequence it presents, and an InitProducerId with its
old id and epoch (a KIP-360 epoch bump) gets a fresh producer id. This is what a Kafka broker
does for a producer whose state expired (it accepts any sequence from a producer it has no
state for, KIP-360) and the client sees no error. What is lost is only dedupe across the gap:
a retry, sent after the eviction, of a batch written before it would be written again. Clients
stop retrying after their delivery timeout (librdkafka's ``message.timeout.ms``, 300 s; Java's
``delivery.timeout.ms``, 120 s), far below the TTL, so only an eviction by the cap can do that,
and the cap takes the producer idle the longest. An old epoch of a forgotten producer is not
fenced either.

One principal per producer id. Behind SASL a producer's state belongs to a principal: it is
kept per (principal, producer id), so no batch of one principal ever touches another's epoch or
sequence numbers. An id this process handed out through InitProducerId belongs to the principal
that asked for it: another principal's batch with it is answered ``UNKNOWN_PRODUCER_ID`` and
changes nothing, and its InitProducerId with that id and epoch gets a fresh id (a Kafka broker
too answers a non-transactional InitProducerId with a new id), never the owner's next epoch. So
no principal can fence another's producer or take the sequence number its next batch carries.
``UNKNOWN_PRODUCER_ID`` because that is what the id is to that principal (this process has no
producer of its with that id) and it is the code of a producer id a broker does not know;
``INVALID_PRODUCER_ID_MAPPING`` and ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` name a
transactional id, which these producers have none of. An id this process did not hand out (a
restart, another worker or replica, an eviction) is adopted per principal: each principal that
presents it gets a producer of its own, and none is refused, because an idempotent librdkafka
producer answered ``UNKNOWN_PRODUCER_ID`` bumps its epoch locally and presents the same id
again, so refusing the second principal could refuse the owner forever. Ids are random
(``secrets``, 46 bits), so one cannot be guessed from another. Without SASL there is no
principal (None) and nothing changes.

Only the asyncio loop thread calls into this module.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import kafka.errors as kerr

from kdelay.proxy.metrics import ProxyMetrics

NO_PRODUCER_ID = -1
#: Kafka keeps the metadata of the last five batches per producer and partition (KIP-98), the
#: most a client has in flight per partition with idempotence on.
RECENT_BATCHES = 5
_SEQ_MODULUS = 2**31
#: Kafka's default producer.id.expiration.ms (KIP-854): one day.
DEFAULT_TTL_S = 86_400.0
DEFAULT_MAX_PRODUCERS = 10_000


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a Produce response says about one partition."""

    error_code: int = 0
    base_offset: int = -1
    error_message: str | None = None
    record_errors: tuple[tuple[int, str | None], ...] = ()


@dataclass(slots=True)
class _PartitionState:
    epoch: int
    last_seq: int  # -1: nothing yet in this epoch
    recent: deque[_Entry] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))


@dataclass(slots=True)
class _Entry:
    base_seq: int
    last_seq: int
    result: asyncio.Future[PartitionResult]
    #: The producer's partition state the batch was recorded in.
    state: _PartitionState
    #: Failed retriably: the client's retry of this exact range is accepted anew.
    retry_ok: bool = False


@dataclass(slots=True)
class _Producer:
    epoch: int
    last_used: float
    #: Handed out by this process's InitProducerId (not adopted): its owner is known for sure.
    allocated: bool = False
    partitions: dict[tuple[str, int], _PartitionState] = field(default_factory=dict)


#: A producer's key: its principal (None without SASL) and its id.
_Key = tuple[str | None, int]


class Verdict(Enum):
    """The outcome of a sequence check."""

    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Check:
    """A sequence check: accept (``entry`` to complete), duplicate (``entry`` holds the first
    result) or reject (``error``)."""

    verdict: Verdict
    entry: _Entry | None = None
    error: PartitionResult | None = None


def _next(seq: int) -> int:
    return (seq + 1) % _SEQ_MODULUS


class ProducerRegistry:
    """Producer ids this proxy handed out or adopted, and the sequence state per principal,
    producer and partition, least recently used first (see "Bounded memory" and "One principal
    per producer id" in the module docstring)."""

    def __init__(
        self,
        first_id: int | None = None,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
        clock: Callable[[], float] = time.monotonic,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        #: Sequential from ``first_id`` (tests); else None: each id random, so ids from
        #: different proxy replicas do not collide and no id can be guessed from another.
        self._next_id = first_id
        self.ttl_s = ttl_s
        self.max_producers = max_producers
        self._clock = clock
        self._metrics = metrics
        self._producers: OrderedDict[_Key, _Producer] = OrderedDict()
        #: The principal of each id this process handed out and still knows.
        self._allocated: dict[int, str | None] = {}

    def __len__(self) -> int:
        """How many producers are known."""
        return len(self._producers)

    def __contains__(self, producer_id: object) -> bool:
        """Whether ``producer_id`` is known, of any principal."""
        return any(pid == producer_id for _, pid in self._producers)

    def _use(self, key: _Key, new_epoch: int | None = None) -> tuple[_Producer, bool]:
        """The state of ``key``, now the most recently used, and whether it was created
        (unknown, or ``new_epoch`` given: an id handed out now). What is due is forgotten
        first."""
        now = self._clock()
        self._evict(now)
        state = self._producers.get(key)
        created = state is None or new_epoch is not None
        if created:
            state = _Producer(new_epoch or 0, now, allocated=new_epoch is not None)
            self._producers[key] = state
            if new_epoch is not None:
                self._allocated[key[1]] = key[0]
        else:
            assert state is not None
            state.last_used = now
            self._producers.move_to_end(key)
        self._evict(now)
        return state, created

    def _evict(self, now: float) -> None:
        """Forget producers idle for the TTL, then the least recently used over the cap."""
        producers = self._producers
        expired_before = now - self.ttl_s
        while producers:
            key, oldest = next(iter(producers.items()))
            if oldest.last_used <= expired_before:
                reason = "ttl"
            elif len(producers) > self.max_producers:
                reason = "cap"
            else:
                break
            del producers[key]
            if oldest.allocated:
                self._allocated.pop(key[1], None)
            if self._metrics is not None:
                self._metrics.producer_evictions.labels(reason).inc()
        if self._metrics is not None:
            self._metrics.producer_states.set(len(producers))

    def init_producer(
        self, producer_id: int = NO_PRODUCER_ID, epoch: int = -1, *, owner: str | None = None
    ) -> tuple[int, int]:
        """InitProducerId of ``owner`` (its principal; None without SASL): a new id, or the next
        epoch of a known one of its own (KIP-360 epoch bump)."""
        if producer_id != NO_PRODUCER_ID:
            self._evict(self._clock())
            known = self._producers.get((owner, producer_id))
            if known is not None and known.epoch == epoch and epoch < 32766:
                self._use((owner, producer_id))[0].epoch = epoch + 1
                return producer_id, epoch + 1
        pid = self._new_id()
        self._use((owner, pid), 0)
        return pid, 0

    def _new_id(self) -> int:
        if self._next_id is not None:
            self._next_id += 1
            return self._next_id - 1
        while True:
            pid = secrets.randbelow(2**46) + 1
            if pid not in self:
                return pid

    def _foreign(self, producer_id: int, owner: str | None) -> Check | None:
        """The refusal of a batch with an id this process handed out to another principal."""
        if self._allocated.get(producer_id, owner) == owner:
            return None
        self._evict(self._clock())  # one handed out, then forgotten, is any principal's
        if self._allocated.get(producer_id, owner) == owner:
            return None
        return Check(
            Verdict.REJECT,
            error=PartitionResult(
                kerr.UnknownProducerIdError.errno,
                error_message=f"this proxy knows no producer {producer_id} of {owner}",
            ),
        )

    def check(
        self,
        producer_id: int,
        epoch: int,
        topic: str,
        partition: int,
        *,
        base_seq: int,
        last_seq: int,
        loop: asyncio.AbstractEventLoop,
        owner: str | None = None,
    ) -> Check:
        """Decide on a batch of ``owner`` (its principal; None without SASL) before it is
        written; an accepted one is recorded as in flight. An id handed out to another
        principal is refused; one adopted by another is a producer of its own (the module
        docstring)."""
        refused = self._foreign(producer_id, owner)
        if refused is not None:
            return refused
        producer, created = self._use((owner, producer_id))
        current = None if created else producer.epoch
        if current is not None and epoch < current:
            return Check(
                Verdict.REJECT,
                error=PartitionResult(
                    kerr.InvalidProducerEpochError.errno,
                    error_message=f"producer {producer_id} epoch {epoch} is older than {current}",
                ),
            )
        if current is None or epoch > current:
            producer.epoch = epoch
        key = (topic, partition)
        state = producer.partitions.get(key)
        if state is None or state.epoch != epoch:
            # First batch seen for this producer/epoch/partition: adopt its sequence.
            state = _PartitionState(epoch, (base_seq - 1) % _SEQ_MODULUS)
            producer.partitions[key] = state
        for entry in state.recent:
            if entry.base_seq == base_seq and entry.last_seq == last_seq:
                if entry.retry_ok:
                    entry.retry_ok = False
                    entry.result = loop.create_future()
                    return Check(Verdict.ACCEPT, entry=entry)
                return Check(Verdict.DUPLICATE, entry=entry)
        expected = _next(state.last_seq)
        if base_seq != expected:
            behind = (expected - base_seq) % _SEQ_MODULUS
            if 0 < behind < _SEQ_MODULUS // 2:
                code, what = kerr.DuplicateSequenceNumberError.errno, "already written"
            else:
                code, what = kerr.OutOfOrderSequenceNumberError.errno, "out of order"
            return Check(
                Verdict.REJECT,
                error=PartitionResult(
                    code,
                    error_message=(
                        f"batch sequence {base_seq} for {topic}-{partition} is {what}; "
                        f"expected {expected}"
                    ),
                ),
            )
        entry = _Entry(base_seq, last_seq, loop.create_future(), state)
        state.recent.append(entry)
        state.last_seq = last_seq
        return Check(Verdict.ACCEPT, entry=entry)

    def complete(
        self, producer_id: int, topic: str, partition: int, entry: _Entry, result: PartitionResult
    ) -> None:
        """Record the outcome of an accepted batch (``producer_id``, ``topic`` and ``partition``
        name it; ``entry`` knows its state).

        A retriable failure un-writes the batch's sequence range when it is still the newest;
        otherwise (later batches in flight, see the module docstring) the range stays open for
        the client's retry of exactly that batch.
        """
        if not entry.result.done():
            entry.result.set_result(result)
        if result.error_code == 0 or not kerr.for_code(result.error_code).retriable:
            return
        state = entry.state
        if not state.recent:
            return
        if state.recent[-1] is not entry:
            entry.retry_ok = True
            return
        state.recent.pop()
        state.last_seq = (entry.base_seq - 1) % _SEQ_MODULUS
