"""A pending entry: its sort key and its value format in the store (see store.py's layout).

Key = ``deliver_at_ms (8, big-endian) | buffer partition (4) | buffer offset (8)``, so byte order
is due time, then arrival. Value = :func:`encode_entry`, a compact versioned serialization of the
scheduled message. Both are persisted: changing them needs a new format version.

Pure functions and immutable values; any thread may use them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from delay_service.errors import StoreError
from kdelay.buffer import Scheduled

_KEY = struct.Struct(">QIQ")
KEY_SIZE = _KEY.size  # 20
_HEAD = struct.Struct("<BqiH")  # version, deliver_at_ms, partition, header count
_LEN = struct.Struct("<I")
_NULL = 0xFFFFFFFF
ENTRY_VERSION = 1


def entry_key(deliver_at_ms: int, partition: int, offset: int) -> bytes:
    """The sort key of a pending entry: due time, then buffer partition and offset."""
    return _KEY.pack(max(0, deliver_at_ms), partition, offset)


def split_key(key: bytes) -> tuple[int, int, int]:
    """``(deliver_at_ms, partition, offset)`` of an entry key."""
    deliver_at, partition, offset = _KEY.unpack(key)
    return int(deliver_at), int(partition), int(offset)


def _put_bytes(out: list[bytes], data: bytes | None) -> None:
    if data is None:
        out.append(_LEN.pack(_NULL))
    else:
        out.append(_LEN.pack(len(data)))
        out.append(data)


def encode_entry(msg: Scheduled) -> bytes:
    """A compact, versioned serialization of a scheduled message (the entry value)."""
    out = [_HEAD.pack(ENTRY_VERSION, msg.deliver_at_ms, msg.partition, len(msg.headers))]
    _put_bytes(out, msg.id.encode())
    _put_bytes(out, msg.topic.encode())
    _put_bytes(out, msg.key)
    _put_bytes(out, msg.value)
    for name, value in msg.headers:
        _put_bytes(out, name.encode())
        _put_bytes(out, value)
    return b"".join(out)


def decode_entry(data: bytes) -> Scheduled:
    """Inverse of :func:`encode_entry`; raises StoreError on anything else."""
    if not data or data[0] != ENTRY_VERSION:
        version = data[0] if data else None
        raise StoreError(f"store entry has format version {version}; this build reads 1")
    try:
        _, deliver_at, partition, count = _HEAD.unpack_from(data, 0)
        pos = _HEAD.size

        def take() -> bytes | None:
            nonlocal pos
            (length,) = _LEN.unpack_from(data, pos)
            pos += _LEN.size
            if length == _NULL:
                return None
            chunk = data[pos : pos + length]
            if len(chunk) != length:
                raise StoreError("store entry is truncated")
            pos += length
            return chunk

        msg_id = (take() or b"").decode()
        topic = (take() or b"").decode()
        key = take()
        value = take()
        headers = tuple(((take() or b"").decode(), take() or b"") for _ in range(count))
    except (struct.error, UnicodeDecodeError) as exc:
        raise StoreError(f"store entry is corrupt: {exc}") from None
    return Scheduled(msg_id, topic, partition, key, value, deliver_at, headers)


@dataclass(frozen=True, slots=True)
class Entry:
    """A pending message and where it came from in the buffer topic."""

    key: bytes
    message: Scheduled
    partition: int
    offset: int
