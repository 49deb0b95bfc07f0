"""The buffer-record contract: how a delayed message is stored in the buffer topic.

The delay service owns this format; the proxy writes it, the replicas and the verifier read it.

Buffer topic ``__kdelay_buffer`` (compacted), record key = the message id (UTF-8), so a cancel
and the tombstone for an id land in the same partition after the message they refer to.

Format version 1. Three kinds of record, told apart by value and the routing header, which is
always the *last* header and is named ``kdelay-route``; its value is compact JSON:

- schedule: value = the original value (``b""`` when it was null, flagged by ``"n": true``, so
  that a null-valued message is never mistaken for a compaction tombstone); headers = the
  producer's own headers minus the control headers, then ``kdelay-route`` =
  ``{"v": 1, "op": OP_SCHEDULE, "t": topic, "p": partition (-1: by key), "k": base64 key or
  null, "d": deliver-at epoch ms, "n": value was null}``.
- cancel: value ``b""``; ``kdelay-route`` = ``{"v": 1, "op": "cancel"}``.
- tombstone: value null (compaction removes the id); ``kdelay-route`` =
  ``{"v": 1, "op": "done", "o": buffer offset of the delivered or cancelled record}``, so a
  replica never deletes a later message that reuses the id.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from kdelay import headers as h
from kdelay.errors import BufferFormatError

BUFFER_TOPIC = "__kdelay_buffer"
DEAD_LETTER_TOPIC = "__kdelay_dead_letter"
ROUTE_HEADER = "kdelay-route"
FORMAT_VERSION = 1
#: The ``op`` of each kind of record in ``kdelay-route``.
OP_SCHEDULE = "schedule"
OP_CANCEL = "cancel"
OP_DONE = "done"
#: Every ``kdelay-route`` field of format version 1 and its type in Spark SQL DDL, for readers
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
}


def route_schema(*fields: str) -> str:
    """Spark SQL DDL (``"v INT, op STRING, ..."``) of the named route fields; all when none."""
    unknown = [f for f in fields if f not in ROUTE_FIELDS]
    if unknown:
        raise ValueError(f"not {ROUTE_HEADER} fields: {unknown}; known: {list(ROUTE_FIELDS)}")
    return ", ".join(f"{name} {ROUTE_FIELDS[name]}" for name in fields or ROUTE_FIELDS)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A message waiting in the buffer topic for its due time."""

    id: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    deliver_at_ms: int
    headers: tuple[tuple[str, bytes], ...] = field(default=())

    def delivered_headers(self) -> list[tuple[str, bytes]]:
        """Headers of the released record: the producer's own, plus the id and the due time."""
        return [
            *self.headers,
            (h.ID, self.id.encode()),
            (h.DELIVER_AT, str(self.deliver_at_ms).encode()),
        ]


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancels the pending message ``id``; a no-op when it was already delivered."""

    id: str


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Marks ``id`` as delivered or cancelled; ``offset`` is the record it retires."""

    id: str
    offset: int


BufferRecord = Scheduled | Cancel | Tombstone


@dataclass(frozen=True, slots=True)
class Encoded:
    """A buffer record as Kafka sees it."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


def _route(obj: dict[str, Any]) -> tuple[str, bytes]:
    return ROUTE_HEADER, json.dumps({"v": FORMAT_VERSION, **obj}, separators=(",", ":")).encode()


def encode(record: BufferRecord) -> Encoded:
    """The Kafka key, value and headers for a buffer record."""
    key = record.id.encode()
    if isinstance(record, Scheduled):
        route = _route(
            {
                "op": OP_SCHEDULE,
                "t": record.topic,
                "p": record.partition,
                "k": None if record.key is None else base64.b64encode(record.key).decode(),
                "d": record.deliver_at_ms,
                "n": record.value is None,
            }
        )
        value = b"" if record.value is None else record.value
        return Encoded(key, value, [*record.headers, route])
    if isinstance(record, Cancel):
        return Encoded(key, b"", [_route({"op": OP_CANCEL})])
    return Encoded(key, None, [_route({"op": OP_DONE, "o": record.offset})])


def decode(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]] | None
) -> BufferRecord:
    """Parse a buffer-topic record; raises BufferFormatError with the reason."""
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
        route = json.loads(hdrs[-1][1])
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise BufferFormatError(f"buffer record {msg_id!r}: bad {ROUTE_HEADER}: {exc}") from None
    if not isinstance(route, dict):
        raise BufferFormatError(f"buffer record {msg_id!r}: {ROUTE_HEADER} is not an object")
    version = route.get("v")
    if version != FORMAT_VERSION:
        raise BufferFormatError(
            f"buffer record {msg_id!r} has format version {version!r}; "
            f"this kdelay reads version {FORMAT_VERSION}"
        )
    try:
        return _decode_route(msg_id, value, hdrs[:-1], route)
    except (KeyError, TypeError, ValueError, OverflowError, binascii.Error) as exc:
        raise BufferFormatError(f"buffer record {msg_id!r}: bad {ROUTE_HEADER}: {exc!r}") from None


def _decode_route(
    msg_id: str, value: bytes | None, own: list[tuple[str, bytes | None]], route: dict[str, Any]
) -> BufferRecord:
    op = route["op"]
    if op == OP_SCHEDULE:
        key_b64 = route["k"]
        return Scheduled(
            id=msg_id,
            topic=str(route["t"]),
            partition=int(route["p"]),
            key=None if key_b64 is None else base64.b64decode(key_b64, validate=True),
            value=None if route["n"] else (value or b""),
            deliver_at_ms=int(route["d"]),
            headers=tuple((n, v if v is not None else b"") for n, v in own),
        )
    if op == OP_CANCEL:
        return Cancel(msg_id)
    if op == OP_DONE:
        return Tombstone(msg_id, int(route["o"]))
    raise ValueError(f"unknown op {op!r}")
