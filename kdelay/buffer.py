"""The buffer-record contract: how a delayed message is stored in the buffer topic.

The delay service owns this format; the proxy writes it, the replicas and the verifier read it.

Buffer topic ``__kdelay_buffer``: compacted, ``message.timestamp.type=LogAppendTime`` (a delay
counts from the broker's append time, so every replica computes the same due time whatever the
proxy's clock says). Three kinds of record, told apart by the routing header, which is always
the *last* header and is named ``kdelay-route``; its value is compact JSON.

Format version 2 (written). Record key = the *buffer key* of that one record: unique per
scheduled message and per cancel (32 hex characters; derived from the producer id, epoch,
partition and sequence of an idempotent producer's record, so a retried batch writes the same
keys and replicas drop the copy; random otherwise). The proxy chooses the partition itself, by
:func:`partition_for` of the *message id*, so a message, its cancel and any later message that
reuses the id are in one partition, in production order (an id the proxy made up for a message
sent without one is pinned to its target partition's buffer partition, :func:`pinned_id`).
Compaction then only ever removes a record whose own tombstone was written, never a later
message that reuses its id.

- schedule: value = the original value (``b""`` when it was null, flagged by ``"n": true``, so
  that a null-valued message is never mistaken for a compaction tombstone); headers = the
  producer's own headers minus the control headers, then ``kdelay-route`` =
  ``{"v": 2, "op": "schedule", "i": id, "t": topic, "p": partition (-1: by key), "k": base64
  key or null, "n": value was null, "d": deliver-at epoch ms or null, "r": delay ms after the
  record's (append) timestamp or null, "s": order}``. Exactly one of ``d`` and ``r`` is set.
  ``s`` orders messages due at the same millisecond: the proxy's acceptance order. A
  recurring message (``kdelay/repeat.py``) adds ``"rp": its canonical kdelay-repeat value,
  "oc": occurrence number (1, 2, ...)``; the delay service writes occurrence n+1 when it
  releases occurrence n, with the same id, ``s`` and content, buffer key ``<key of
  occurrence 1>#<n+1>`` and an absolute ``d``.
- cancel: value ``b""``; ``kdelay-route`` = ``{"v": 2, "op": "cancel", "i": id}``: cancels
  every message with that id produced before it, and one sent with it but appended after it
  (:func:`cancels`).
- tombstone: value null, key = the buffer key of the record it retires; ``kdelay-route`` =
  ``{"v": 2, "op": "done", "i": id, "o": buffer offset of that record}``, plus, when the
  master knows what became of the message, ``"x": "delivered" | "dead_lettered" |
  "cancelled", "t": target topic, "tp": partition written to, "to": offset there, "ts": release
  time, "d": due time, "oc": occurrence`` (what ``GET /v1/messages/{id}`` reports).

Version 1 (read only): key = the message id; no ``i``, ``r``, ``s``; ``d`` always set.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Iterable
from dataclasses import field, replace
from typing import Any

import orjson

from kdelay import headers as h
from kdelay import partitioner
from kdelay.errors import BufferFormatError
from kdelay.immutable import immutable
from kdelay.json_bytes import dumps

BUFFER_TOPIC = "__kdelay_buffer"
_PINNED = re.compile(r"b(\d{1,9})\.[0-9a-f]{32}\Z")
DEAD_LETTER_TOPIC = "__kdelay_dead_letter"
ROUTE_HEADER = "kdelay-route"
FORMAT_VERSION = 2
#: The versions :func:`decode` reads.
READ_VERSIONS = (1, 2)
#: The ``op`` of each kind of record in ``kdelay-route``.
OP_SCHEDULE = "schedule"
OP_CANCEL = "cancel"
OP_DONE = "done"
#: Every ``kdelay-route`` field (format versions 1 and 2), its type in Spark SQL DDL, for readers
#: that parse the header without :func:`decode` (the verifier's Spark job).
ROUTE_FIELDS: dict[str, str] = {
    "v": "INT",
    "op": "STRING",
    "t": "STRING",
    "p": "INT",
    "k": "STRING",
    "d": "BIGINT",
    "n": "BOOLEAN",
    "o": "BIGINT",
    "i": "STRING",
    "r": "BIGINT",
    "s": "BIGINT",
    "rp": "STRING",
    "oc": "INT",
    "x": "STRING",
    "tp": "INT",
    "to": "BIGINT",
    "ts": "BIGINT",
}


def route_schema(*fields: str) -> str:
    """Spark SQL DDL (``"v INT, op STRING, ..."``) of the named route fields; all when none."""
    unknown = [f for f in fields if f not in ROUTE_FIELDS]
    if unknown:
        raise ValueError(f"not {ROUTE_HEADER} fields: {unknown}; known: {list(ROUTE_FIELDS)}")
    return ", ".join(f"{name} {ROUTE_FIELDS[name]}" for name in fields or ROUTE_FIELDS)


@immutable
class Scheduled:
    """A message waiting in the buffer topic for its due time."""

    id: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    deliver_at_ms: int
    headers: tuple[tuple[str, bytes], ...] = field(default=())
    uid: str = ""  # the buffer key; "" for a version-1 record, whose key is the id
    seq: int = 0  # order among messages due at the same millisecond
    delay_ms: int | None = None  # set: written as "r", due = append time + delay_ms
    repeat: str | None = None  # a recurring message's canonical kdelay-repeat value
    occurrence: int = 1  # which occurrence of its series this record is

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic."""
        return self.uid or self.id

    def delivered_headers(self) -> list[tuple[str, bytes]]:
        """Headers of the released record: the producer's own, plus the id and the due time
        (and a recurring message's occurrence number)."""
        out = [
            *self.headers,
            (h.ID, self.id.encode()),
            (h.DELIVER_AT, str(self.deliver_at_ms).encode()),
        ]
        if self.repeat is not None:
            out.append((h.OCCURRENCE, str(self.occurrence).encode()))
        return out

    def next_occurrence(self, deliver_at_ms: int, seq: int) -> Scheduled:
        """Occurrence n+1 of this recurring message, due at ``deliver_at_ms``: same id, order
        ``seq`` (occurrence 1's: its acceptance time, so a cancel of the series also cancels an
        occurrence written just after it, ``cancels.py`` rule 2) and content, buffer key ``<key
        of occurrence 1>#<n+1>`` (so a copy written twice, by two masters around a failover,
        is kept once)."""
        root = self.buffer_key.partition("#")[0]
        return replace(
            self,
            deliver_at_ms=deliver_at_ms,
            uid=f"{root}#{self.occurrence + 1}",
            delay_ms=None,
            seq=seq,
            occurrence=self.occurrence + 1,
        )


@immutable
class Cancel:
    """Cancels the pending messages ``id`` produced before it; a no-op for delivered ones."""

    id: str
    uid: str = ""  # the buffer key; "" for a version-1 record

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic."""
        return self.uid or self.id


@immutable
class Fate:
    """What became of a message, as its tombstone tells: ``state`` is ``delivered``,
    ``dead_lettered`` or ``cancelled``; ``partition``/``offset`` where it was written."""

    state: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    released_ms: int | None = None
    deliver_at_ms: int | None = None
    occurrence: int | None = None


@immutable
class Tombstone:
    """Retires the record at ``offset`` (message ``id``, buffer key ``uid``): delivered or
    cancelled."""

    id: str
    offset: int
    uid: str = ""  # the retired record's buffer key; "" for version 1 (the id)
    fate: Fate | None = None  # what became of it, when the master knows

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic: the retired record's."""
        return self.uid or self.id


BufferRecord = Scheduled | Cancel | Tombstone


@immutable
class Encoded:
    """A buffer record as Kafka sees it."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


def _route(obj: dict[str, Any]) -> tuple[str, bytes]:
    return ROUTE_HEADER, dumps({"v": FORMAT_VERSION, **obj})


#: How long after its own append time a cancel still cancels a schedule appended after it (5
#: minutes of the records' append time; covers a proxy's upstream delivery timeout, 30 s by
#: default, with room to spare).
CANCEL_WINDOW_MS = 300_000
#: A schedule accepted by a proxy up to this long after the cancel's append time counts as sent
#: with it (the proxy's clock against the broker's): the cancel wins.
CANCEL_ACCEPT_SLACK_MS = 1_000
#: The order field ``s`` a proxy writes: its wall-clock millisecond of acceptance << this | a
#: counter (proxy/routing.py ``AcceptanceOrder``).
ORDER_SHIFT = 20


def accepted_ms(seq: int) -> int | None:
    """When a proxy accepted a schedule with order field ``seq`` (its millisecond), None if
    unknown (format 1, or not written by a proxy's router)."""
    ms = seq >> ORDER_SHIFT
    return ms if ms > 0 else None


def cancels(
    cancel_offset: int,
    cancel_ms: int | None,
    offset: int,
    time_ms: int | None,
    accepted: int | None,
) -> bool:
    """Whether a cancel of an id, at ``cancel_offset`` of a buffer partition and appended at
    ``cancel_ms``, cancels a schedule of that id in the same partition at ``offset``, appended
    at ``time_ms`` and accepted by a proxy at ``accepted`` (README "Cancelling a message"):
    the schedule comes before the cancel (then only a delivery first escapes it), or after it
    but was accepted no later than :data:`CANCEL_ACCEPT_SLACK_MS` after the cancel's append and
    appended within :data:`CANCEL_WINDOW_MS` of it (sent with it: the cancel wins).

    The replicas also close a cancel once 50,000 newer ones of its partition are open
    (``delay_service/cancels.py``); this rule of one cancel and one schedule does not count.
    """
    if offset < cancel_offset:
        return True
    if offset == cancel_offset or cancel_ms is None or accepted is None:
        return False
    if accepted > cancel_ms + CANCEL_ACCEPT_SLACK_MS:
        return False
    return time_ms is None or time_ms - cancel_ms <= CANCEL_WINDOW_MS


def partition_for(msg_id: str, partitions: int) -> int:
    """The buffer partition of every record about ``msg_id``: Kafka's own murmur2 key hash
    (what the Java client's default partitioner does with the id as key), except for an id of
    the form ``b<n>.<32 hex digits>`` (:func:`pinned_id`), which names partition ``n``."""
    pinned = _PINNED.match(msg_id)
    if pinned:
        return int(pinned[1]) % partitions
    return partitioner.partition(msg_id.encode(), partitions)


def pinned_id(uid: str, topic: str, partition: int, partitions: int) -> str:
    """The id the proxy gives a message sent without ``kdelay-id``: its buffer key, pinned to
    the buffer partition of its target partition. So a producer's records for one target
    partition share a buffer partition, are appended together and tie on their due times in
    production order (the order field breaks the tie), and a cancel by this id finds them."""
    return f"b{target_pin(topic, partition, partitions)}.{uid}"


@functools.lru_cache(maxsize=65536)
def target_pin(topic: str, partition: int, partitions: int) -> int:
    """The buffer partition of a target partition's records without an id (computed once per
    target partition, not once per record)."""
    return partition_for(f"{topic}/{partition}", partitions)


def encode(record: BufferRecord) -> Encoded:
    """The Kafka key, value and headers for a buffer record (format version 2)."""
    key = record.buffer_key.encode()
    if isinstance(record, Scheduled):
        value, headers = encode_schedule(
            record.id,
            topic=record.topic,
            partition=record.partition,
            key=record.key,
            value=record.value,
            headers=record.headers,
            deliver_at_ms=record.deliver_at_ms,
            delay_ms=record.delay_ms,
            seq=record.seq,
            repeat=record.repeat,
            occurrence=record.occurrence,
        )
        return Encoded(key, value, headers)
    if isinstance(record, Cancel):
        return Encoded(key, b"", [_route({"op": OP_CANCEL, "i": record.id})])
    return Encoded(key, None, [tombstone_route(record.id, record.offset, record.fate)])


def tombstone_route(msg_id: str, offset: int, fate: Fate | None) -> tuple[str, bytes]:
    """The routing header of a tombstone (its key is the retired record's buffer key, its value
    null): what :func:`encode` writes for a :class:`Tombstone`, for the master's hot path,
    which writes one per released message."""
    done: dict[str, Any] = {"v": FORMAT_VERSION, "op": OP_DONE, "i": msg_id, "o": offset}
    if fate is not None:
        done["x"] = fate.state
        if fate.topic is not None:
            done["t"] = fate.topic
        if fate.partition is not None:
            done["tp"] = fate.partition
        if fate.offset is not None:
            done["to"] = fate.offset
        if fate.released_ms is not None:
            done["ts"] = fate.released_ms
        if fate.deliver_at_ms is not None:
            done["d"] = fate.deliver_at_ms
        if fate.occurrence is not None:
            done["oc"] = fate.occurrence
    return ROUTE_HEADER, dumps(done)


def encode_schedule(
    msg_id: str,
    *,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes]],
    deliver_at_ms: int,
    delay_ms: int | None,
    seq: int,
    repeat: str | None = None,
    occurrence: int = 1,
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The value and headers of a schedule's buffer record (its key is its buffer key): what
    :func:`encode` writes for a :class:`Scheduled`, for the proxy's hot path, which has the
    fields at hand and no use for the object."""
    relative = delay_ms is not None
    fields: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "op": OP_SCHEDULE,
        "i": msg_id,
        "t": topic,
        "p": partition,
        "k": None if key is None else base64.b64encode(key).decode(),
        "n": value is None,
        "d": None if relative else deliver_at_ms,
        "r": delay_ms,
        "s": seq,
    }
    if repeat is not None:
        fields["rp"] = repeat
        fields["oc"] = occurrence
    return (b"" if value is None else value), [*headers, (ROUTE_HEADER, dumps(fields))]


def decode(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None,
    timestamp_ms: int | None = None,
) -> BufferRecord:
    """Parse a buffer-topic record; raises BufferFormatError with the reason.

    ``timestamp_ms`` is the record's timestamp (its append time on the buffer topic): a
    relative delay counts from it, so a schedule with ``"r"`` cannot be decoded without it.
    """
    if not key:
        raise BufferFormatError("buffer record has no key (the message id)")
    try:
        msg_id = key.decode("utf-8")
    except UnicodeDecodeError:
        raise BufferFormatError("buffer record key is not UTF-8") from None
    hdrs = list(headers or [])
    if not hdrs or hdrs[-1][0] != ROUTE_HEADER or hdrs[-1][1] is None:
        raise BufferFormatError(f"buffer record {msg_id!r} lacks a trailing {ROUTE_HEADER} header")
    try:
        route = orjson.loads(hdrs[-1][1])
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise BufferFormatError(f"buffer record {msg_id!r}: bad {ROUTE_HEADER}: {exc}") from None
    if not isinstance(route, dict):
        raise BufferFormatError(f"buffer record {msg_id!r}: {ROUTE_HEADER} is not an object")
    version = route.get("v")
    if version not in READ_VERSIONS:
        raise BufferFormatError(
            f"buffer record {msg_id!r} has format version {version!r}; "
            f"this kdelay reads versions {list(READ_VERSIONS)}"
        )
    try:
        if version == 1:
            return _decode_route(msg_id, "", value, hdrs[:-1], route, None)
        return _decode_route(str(route["i"]), msg_id, value, hdrs[:-1], route, timestamp_ms)
    except (KeyError, TypeError, ValueError, OverflowError, binascii.Error) as exc:
        raise BufferFormatError(f"buffer record {msg_id!r}: bad {ROUTE_HEADER}: {exc!r}") from None


def _fate(route: dict[str, Any]) -> Fate | None:
    state = route.get("x")
    if state is None:
        return None
    get = route.get
    topic, tp, to, ts, d, oc = get("t"), get("tp"), get("to"), get("ts"), get("d"), get("oc")
    return Fate(
        str(state),
        None if topic is None else str(topic),
        None if tp is None else int(tp),
        None if to is None else int(to),
        None if ts is None else int(ts),
        None if d is None else int(d),
        None if oc is None else int(oc),
    )


def _decode_route(  # noqa: PLR0917 - the parts of one record, in one private call
    msg_id: str,
    uid: str,
    value: bytes | None,
    own: list[tuple[str, bytes | None]],
    route: dict[str, Any],
    timestamp_ms: int | None,
) -> BufferRecord:
    op = route["op"]
    if op == OP_SCHEDULE:
        key_b64 = route["k"]
        delay = route.get("r")
        if delay is None:
            due, delay_ms = int(route["d"]), None
        elif timestamp_ms is None or timestamp_ms < 0:
            raise ValueError("a relative delay needs the record's timestamp")
        else:
            delay_ms = int(delay)
            if delay_ms < 0:
                raise ValueError(f"negative delay {delay_ms}")
            due = timestamp_ms + delay_ms
        return Scheduled(
            id=msg_id,
            topic=str(route["t"]),
            partition=int(route["p"]),
            key=None if key_b64 is None else base64.b64decode(key_b64, validate=True),
            value=None if route["n"] else (value or b""),
            deliver_at_ms=due,
            headers=tuple((n, v if v is not None else b"") for n, v in own),
            uid=uid,
            seq=int(route.get("s") or 0),
            delay_ms=delay_ms,
            repeat=None if route.get("rp") is None else str(route["rp"]),
            occurrence=int(route.get("oc") or 1),
        )
    if op == OP_CANCEL:
        return Cancel(msg_id, uid)
    if op == OP_DONE:
        return Tombstone(msg_id, int(route["o"]), uid, _fate(route))
    raise ValueError(f"unknown op {op!r}")
