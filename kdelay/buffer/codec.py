"""The buffer records' wire format (version 2 written, 1 and 2 read): the topic names, the
``kdelay-route`` header and its fields, :func:`encode` and :func:`decode` (the contract is
:mod:`kdelay.buffer`'s docstring).

Functions of their arguments; safe from any thread.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

import orjson

from kdelay.buffer.records import BufferRecord, Cancel, Fate, Scheduled, Tombstone
from kdelay.buffer.sequences import valid_producer_seq
from kdelay.errors import BufferFormatError
from kdelay.immutable import immutable
from kdelay.json_bytes import dumps

BUFFER_TOPIC = "__kdelay_buffer"
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
    "rx": "BOOLEAN",
    "w": "STRING",
    "a": "BOOLEAN",
    "x": "STRING",
    "tp": "INT",
    "to": "BIGINT",
    "ts": "BIGINT",
    "px": "STRING",
    "dr": "STRING",
    "ac": "BIGINT",
    "q": "STRING",
}


def route_schema(*fields: str) -> str:
    """Spark SQL DDL (``"v INT, op STRING, ..."``) of the named route fields; all when none."""
    unknown = [f for f in fields if f not in ROUTE_FIELDS]
    if unknown:
        raise ValueError(f"not {ROUTE_HEADER} fields: {unknown}; known: {list(ROUTE_FIELDS)}")
    return ", ".join(f"{name} {ROUTE_FIELDS[name]}" for name in fields or ROUTE_FIELDS)


@immutable
class Encoded:
    """A buffer record as Kafka sees it."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _route(obj: dict[str, Any]) -> tuple[str, bytes]:
    return ROUTE_HEADER, dumps({"v": FORMAT_VERSION, **obj})


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
            replace=record.replace,
            owner=record.owner,
            admin=record.admin,
            producer_seq=record.producer_seq,
        )
        return Encoded(key, value, headers)
    if isinstance(record, Cancel):
        fields: dict[str, Any] = {"op": OP_CANCEL, "i": record.id}
        if record.owner is not None:
            fields["w"] = record.owner
        if record.admin:
            fields["a"] = True
        if record.prefix is not None:
            fields["px"] = record.prefix
            if record.topic is not None:
                fields["t"] = record.topic
        if record.producer_seq is not None:
            fields["q"] = record.producer_seq
        return Encoded(key, b"", [_route(fields)])
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
        if fate.reason is not None:
            done["dr"] = fate.reason
        if fate.accepted_ms is not None:
            done["ac"] = fate.accepted_ms
        if fate.owner is not None:
            done["w"] = fate.owner
    return ROUTE_HEADER, dumps(done)


def encode_schedule(
    msg_id: str,
    *,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]],
    deliver_at_ms: int,
    delay_ms: int | None,
    seq: int,
    repeat: str | None = None,
    occurrence: int = 1,
    replace: bool = False,
    owner: str | None = None,
    admin: bool = False,
    producer_seq: str | None = None,
) -> tuple[bytes, list[tuple[str, bytes | None]]]:
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
    if replace:
        fields["rx"] = True
    if owner is not None:
        fields["w"] = owner
    if admin:
        fields["a"] = True
    if producer_seq is not None:
        fields["q"] = producer_seq
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


#: The widest id or buffer key a replica keeps (its cancel index stores the length in 16 bits).
MAX_ID_BYTES = 65_535
#: A signed 64-bit integer's range: what a replica stores (the store's entries, orjson).
I64_RANGE = (-(2**63), 2**63 - 1)


def _i64(value: Any) -> int:
    """An integer field of a tombstone's fate or offset: it must fit a signed 64-bit integer,
    as every replica stores and re-encodes it (JSON and RocksDB keys)."""
    number = int(value)
    if not I64_RANGE[0] <= number <= I64_RANGE[1]:
        raise ValueError(f"{number} is beyond a signed 64-bit integer")
    return number


def _id(what: str, text: str) -> str:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValueError(f"{what} is longer than {MAX_ID_BYTES} bytes")
    return text


def _owner(route: dict[str, Any]) -> str | None:
    owner = route.get("w")
    return None if owner is None else _id("the owner", str(owner))


def _fate(route: dict[str, Any]) -> Fate | None:
    state = route.get("x")
    if state is None:
        return None
    get = route.get
    topic, tp, to, ts, d, oc = get("t"), get("tp"), get("to"), get("ts"), get("d"), get("oc")
    reason, ac = get("dr"), get("ac")
    return Fate(
        str(state),
        None if topic is None else str(topic),
        None if tp is None else _i64(tp),
        None if to is None else _i64(to),
        None if ts is None else _i64(ts),
        None if d is None else _i64(d),
        None if oc is None else _i64(oc),
        None if reason is None else str(reason),
        None if ac is None else _i64(ac),
        _owner(route),
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
            headers=tuple(own),
            uid=uid,
            seq=int(route.get("s") or 0),
            delay_ms=delay_ms,
            repeat=None if route.get("rp") is None else str(route["rp"]),
            occurrence=int(route.get("oc") or 1),
            replace=route.get("rx") is True,
            owner=_owner(route),
            admin=route.get("a") is True,
            producer_seq=valid_producer_seq(route.get("q")),
        )
    if op == OP_CANCEL:
        prefix, topic = route.get("px"), route.get("t")
        if prefix is not None and not str(prefix):
            raise ValueError("a bulk cancel's prefix (px) is empty")
        return Cancel(
            _id("the cancelled id", msg_id),
            _id("the buffer key", uid),
            owner=_owner(route),
            admin=route.get("a") is True,
            prefix=None if prefix is None else _id("the prefix", str(prefix)),
            topic=None if prefix is None or topic is None else str(topic),
            producer_seq=None if prefix is not None else valid_producer_seq(route.get("q")),
        )
    if op == OP_DONE:
        return Tombstone(
            _id("the id", msg_id), _i64(route["o"]), _id("the buffer key", uid), _fate(route)
        )
    raise ValueError(f"unknown op {op!r}")
