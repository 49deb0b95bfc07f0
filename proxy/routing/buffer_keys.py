"""What identifies a buffer record the proxy writes: its buffer key and its acceptance order.

Buffer keys (CONTRACT.md, ``kdelay/buffer/``): each delayed record and cancel gets a buffer key
of its own. For a batch of an idempotent producer (:class:`Origin`) the keys are derived from
(producer id, epoch, topic, partition, sequence) *and the record's content* (key, value,
headers, null values apart from empty ones, and its timestamp as the producer set it), so a
batch retried through a restarted proxy or another proxy replica (the same records again)
writes the same keys and the replicas keep one copy, while another record at the same
(producer id, epoch, partition, sequence) never does: the one 2**31 records later, after the
sequence wrapped (KIP-98), or one a proxy sees after it forgot the producer
(proxy/kafka/idempotence.py). What remains taken for a retry: a record equal to the earlier one in
all of that, content and timestamp included, which a retry cannot be told from. Records of
other producers get random keys. The ids of records sent without ``kdelay-id`` derive from
these keys (``kdelay.buffer.pinned_id``).

Producer-sequence stamps (:meth:`BatchKeys.stamp`): the same identity and sequence number,
written in clear on every delayed record and cancel (route field ``q``), so that the replicas
order a message and its cancel of one producer and topic-partition exactly
(``kdelay.buffer.produced_before``).

Acceptance order (:class:`AcceptanceOrder`): each delayed record carries the order in which
this process accepted it, which orders messages due at the same millisecond
(``kdelay.buffer.ORDER_SHIFT``), and its millisecond is when the proxy accepted it *by the
broker's clock, rounded up*: the proxy's :class:`kdelay.broker_clock.BrokerClock` upper bound
(proxy/app.py), never behind the broker's clock, so a message sent after a cancel was
acknowledged carries a later millisecond than the cancel's append time and is never cancelled
by it (``kdelay.buffer.cancels``; README "Cancelling a message"). The wall clock is only the
default of in-process callers (tests, benches).

Functions of their arguments; :class:`AcceptanceOrder` is thread-safe; a :class:`BatchKeys`
and a :class:`ReservedOrder` serve one batch on one thread.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kdelay import clock
from kdelay.buffer import producer_seq
from kdelay.errors import KdelayError
from kdelay.proxy.wire.records import Record

#: Namespace of the buffer keys derived from an idempotent producer's identity.
_DERIVED = uuid.UUID("6b64656c-6179-4b65-8b79-000000000002")
_DERIVED_BYTES = _DERIVED.bytes
_SEQUENCES = 2**31  # Kafka's sequence numbers wrap at int32


@dataclass(frozen=True, slots=True)
class Origin:
    """The idempotent producer of a batch: its records' buffer keys derive from it."""

    producer_id: int
    epoch: int
    base_sequence: int


def buffer_key(
    origin: Origin | None, topic: str, partition: int, index: int, record: Record
) -> str:
    """The buffer key of ``record``, record ``index`` of a batch: derived from the producer's
    identity, the record's sequence number and its content when the producer is idempotent,
    random otherwise."""
    return BatchKeys(origin, topic, partition).key(index, record)


def content(record: Record, head: bytes = b"") -> bytes:
    """What a derived buffer key hashes of ``record`` besides its sequence number, after
    ``head`` (one join on the hot path, not two), in one unambiguous encoding: the timestamp,
    key, value, then the header count and each header's name and value. A number is ASCII
    decimal ended by ``;``; a byte string is its length, ``:`` and its bytes, or ``-`` for
    null (a length never starts with ``-``); the timestamp is ``-`` when the record has none
    (the HTTP API). Header names are UTF-8 (lone surrogates passed through: JSON allows
    them)."""
    ts = record.timestamp
    key = record.key
    value = record.value
    headers = record.headers
    # One %-format a part: this runs for every delayed record (bench/route_cpu.py).
    parts = [
        head,
        b"-" if ts is None else b"%d;" % ts,
        b"-" if key is None else b"%d:%s" % (len(key), key),
        b"-" if value is None else b"%d:" % len(value),
        value or b"",  # not copied into a format: it may be large
        b"%d;" % len(headers),
    ]
    append = parts.append
    for name, header_value in headers:
        raw = name.encode("utf-8", "surrogatepass")
        if header_value is None:
            append(b"%d:%s-" % (len(raw), raw))
        else:
            append(b"%d:%s%d:%s" % (len(raw), raw, len(header_value), header_value))
    return b"".join(parts)


class BatchKeys:
    """The :func:`buffer_key` of every record of one batch: the name's part shared by the batch
    (``producer id/epoch/topic/partition/``) encoded once, not once a record."""

    __slots__ = ("_base", "_origin", "_partition", "_prefix", "_topic")

    def __init__(self, origin: Origin | None, topic: str, partition: int) -> None:
        self._origin = origin
        self._topic = topic
        self._partition = partition
        if origin is None or origin.base_sequence < 0:
            self._prefix: bytes | None = None
            self._base = 0
        else:
            name = f"{origin.producer_id}/{origin.epoch}/{topic}/{partition}/"
            self._prefix = _DERIVED_BYTES + name.encode()
            self._base = origin.base_sequence

    def stamp(self, index: int) -> str | None:
        """The producer-sequence stamp (route field ``q``, ``kdelay.buffer.producer_seq``) of
        record ``index`` of the batch; None when the producer is not idempotent."""
        if self._prefix is None or self._origin is None:
            return None
        origin = self._origin
        return producer_seq(
            origin.producer_id, origin.epoch, self._topic, self._partition, self._base + index
        )

    def key(self, index: int, record: Record) -> str:
        """The buffer key of ``record``, record ``index`` of the batch: the UUID version 5
        (RFC 4122: SHA-1 of namespace and name, version and variant bits set), as 32 hex
        digits, of the name ``prefix`` + its sequence number + ``/`` + :func:`content`, built
        without UUID objects; or a random one."""
        if self._prefix is None:
            return uuid.uuid4().hex
        seq = (self._base + index) % _SEQUENCES
        name = content(record, b"%s%d/" % (self._prefix, seq))
        digest = bytearray(hashlib.sha1(name, usedforsecurity=False).digest())
        digest[6] = (digest[6] & 0x0F) | 0x50
        digest[8] = (digest[8] & 0x3F) | 0x80
        return digest[:16].hex()


class BrokerTimeUnknownError(KdelayError):
    """A delayed record came before the proxy's first broker-clock probes (or with Kafka down
    since it started): it cannot be stamped yet; retriable."""


class AcceptanceOrder:
    """Increasing numbers in the order records were accepted: ``ms << 20 | counter``, ``ms``
    read from ``now_ms`` (the proxy's: the broker clock's upper bound), so numbers keep rising
    across a restart and numbers of different proxies interleave by time. A number's
    millisecond is never below ``now_ms`` at the moment it was reserved."""

    def __init__(self, now_ms: Callable[[], int | None] = clock.now_ms) -> None:
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._last = 0

    def next(self, count: int = 1) -> int:
        """The first of ``count`` consecutive numbers, reserved for the caller."""
        now = self._now_ms()
        if now is None:
            raise BrokerTimeUnknownError(
                "the broker's clock is not known yet (no probe of __kdelay_clock answered): "
                "delayed records are accepted once it is"
            )
        with self._lock:
            first = max(self._last + 1, now << 20)
            self._last = first + count - 1
            return first


class ReservedOrder:
    """Acceptance-order numbers for one batch's delayed records: reserved in one block, for
    the rest of the batch, at its first delayed record (one lock and clock read a batch)."""

    __slots__ = ("_end", "_next", "_order")

    def __init__(self, order: AcceptanceOrder) -> None:
        self._order = order
        self._next = self._end = 0

    def take(self, remaining: int) -> int:
        """The next number; ``remaining``: records left in the batch, this one included."""
        if self._next >= self._end:
            self._next = self._order.next(remaining)
            self._end = self._next + remaining
        self._next += 1
        return self._next - 1


#: The order of every record this process accepts (Kafka listener and HTTP API alike).
ACCEPTANCE_ORDER = AcceptanceOrder()
