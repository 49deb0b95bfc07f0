"""A pending entry: its sort key and its value format in the store (see store.py's layout).

Key = ``deliver_at_ms (8) | order (8) | buffer partition (4) | buffer offset (8)``, all
big-endian, so byte order is due time, then the order the proxy accepted the messages in (the
buffer record's ``s``), then arrival. Keys written before the order field existed are 20 bytes
(no order); both kinds sort by due time first and :func:`split_key` reads both. Value =
:func:`encode_entry`, a compact versioned serialization of the scheduled message. Both are
persisted: changing them needs a new format version.

Value format version 3 (written): ``version (1) | deliver_at_ms (8, signed) | partition (4,
signed) | header count (4)``, then id, buffer key (uid), topic, key, value and each header's
name and value as ``length (4) | bytes`` (length ``0xFFFFFFFF``: null). Version 2 (read only)
had no buffer key; version 1 also had a 2-byte header count, so a record with 65,536 headers
could not be stored at all. Version 4 is version 3 followed by a recurring message's series
fields, ``repeat`` (``length (4) | bytes``) and ``occurrence (4)``; an entry of a message that
does not repeat is written as version 3. Version 5, an owned message's (README "Message
owners"), is version 3 followed by ``repeat`` (null when it does not repeat), ``occurrence``
and ``owner`` (``length (4) | bytes``); a message without an owner is written as before.
Version 6, a message stamped with its producer's sequence (``kdelay.buffer.producer_seq``, the
cancel rule's), is version 5 with ``owner`` nullable, followed by that stamp (``length (4) |
bytes``); a message without a stamp is written as before.
Every field is as wide as Kafka's own (int32 counts and sizes, int64 times): whatever one
Kafka record can carry encodes; :func:`check_storable` names what cannot (a due time beyond
int64, a string that is not encodable as UTF-8), and ingest dead-letters such records
instead of storing them.

Pure functions and immutable values; any thread may use them.
"""

from __future__ import annotations

import struct

from kdelay.buffer import I64_RANGE, Scheduled
from kdelay.delay_service.errors import StoreError, UnstorableError
from kdelay.delay_service.store.keyspace import ENTRY_HEAD as _HEAD
from kdelay.delay_service.store.keyspace import ENTRY_HEAD_V1 as _HEAD_V1
from kdelay.delay_service.store.keyspace import ENTRY_KEY as _KEY
from kdelay.delay_service.store.keyspace import ENTRY_KEY_V1 as _KEY_V1
from kdelay.delay_service.store.keyspace import ENTRY_LEN as _LEN
from kdelay.delay_service.store.keyspace import ENTRY_OCCURRENCE as _OCCURRENCE
from kdelay.immutable import immutable

_HEADS = {1: _HEAD_V1, 2: _HEAD, 3: _HEAD, 4: _HEAD, 5: _HEAD, 6: _HEAD}
_NULL = 0xFFFFFFFF
_NULL_LEN = _LEN.pack(_NULL)
#: The largest length field: ``_NULL`` marks a null.
MAX_FIELD_BYTES = _NULL - 1
ENTRY_VERSION = 3
SERIES_VERSION = 4
OWNER_VERSION = 5
SEQUENCE_VERSION = 6
_OWNED = (bytes([OWNER_VERSION]), bytes([SEQUENCE_VERSION]))
_STAMPED = bytes([SEQUENCE_VERSION])
_U64_MAX = 2**64 - 1
_I32 = (-(2**31), 2**31 - 1)


def entry_key(deliver_at_ms: int, partition: int, offset: int, seq: int = 0) -> bytes:
    """The sort key of a pending entry: due time, then order, buffer partition and offset."""
    return _KEY.pack(max(0, deliver_at_ms), min(max(0, seq), _U64_MAX), partition, offset)


def due_bound(deliver_at_ms: int) -> bytes:
    """A key below every entry due at ``deliver_at_ms`` or later and above every earlier one."""
    return _KEY_V1.pack(max(0, deliver_at_ms), 0, 0)


def split_key(key: bytes) -> tuple[int, int, int]:
    """``(deliver_at_ms, partition, offset)`` of an entry key."""
    if len(key) == _KEY_V1.size:
        deliver_at, partition, offset = _KEY_V1.unpack(key)
    else:
        deliver_at, _, partition, offset = _KEY.unpack(key)
    return int(deliver_at), int(partition), int(offset)


def entry_seq(key: bytes) -> int:
    """The order field of an entry key (0 for a key written before it existed)."""
    return 0 if len(key) == _KEY_V1.size else int(_KEY.unpack(key)[1])


def _utf8(what: str, text: str) -> bytes:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnstorableError(f"{what} is not encodable as UTF-8: {exc.reason}") from None
    if len(data) > MAX_FIELD_BYTES:
        raise UnstorableError(f"{what} is {len(data)} bytes, more than a store field holds")
    return data


def _checked(what: str, data: bytes | None) -> bytes | None:
    if data is not None and len(data) > MAX_FIELD_BYTES:
        raise UnstorableError(f"{what} is {len(data)} bytes, more than a store field holds")
    return data


def check_storable(msg: Scheduled) -> None:
    """Raise UnstorableError naming the field when :func:`encode_entry` cannot encode ``msg``.

    Nothing a Kafka record can carry fails this; a record written by hand can (a due time
    beyond int64, a partition beyond int32, a string with lone surrogates from JSON escapes).
    Ingest calls it for every record: the common case (ASCII strings, fields of any size a
    Kafka record has) is settled without encoding anything; only the rest is encoded, to name
    what fails.
    """
    if (
        I64_RANGE[0] <= msg.deliver_at_ms <= I64_RANGE[1]
        and _I32[0] <= msg.partition <= _I32[1]
        and msg.id.isascii()
        and msg.uid.isascii()
        and msg.topic.isascii()
        and (msg.repeat is None or (msg.repeat.isascii() and 1 <= msg.occurrence <= _NULL))
        and (msg.owner is None or msg.owner.isascii())
        and (msg.producer_seq is None or msg.producer_seq.isascii())
        and all(name.isascii() for name, _ in msg.headers)
        and _size(msg) < MAX_FIELD_BYTES
    ):
        return
    _encode_parts(msg)


def _size(msg: Scheduled) -> int:
    """An upper bound of any one field's length (the sum of them all)."""
    return (
        len(msg.id)
        + len(msg.uid)
        + len(msg.topic)
        + len(msg.key or b"")
        + len(msg.value or b"")
        + sum(len(n) + len(v or b"") for n, v in msg.headers)
        + len(msg.repeat or "")
        + len(msg.owner or "")
        + len(msg.producer_seq or "")
    )


def _encode_parts(msg: Scheduled) -> list[bytes]:
    if not I64_RANGE[0] <= msg.deliver_at_ms <= I64_RANGE[1]:
        raise UnstorableError(f"due time {msg.deliver_at_ms} is beyond a signed 64-bit integer")
    if not _I32[0] <= msg.partition <= _I32[1]:
        raise UnstorableError(f"partition {msg.partition} is beyond a signed 32-bit integer")
    if len(msg.headers) > MAX_FIELD_BYTES:
        raise UnstorableError(f"{len(msg.headers)} headers are more than a store entry holds")
    version = _version(msg)
    out = [_HEAD.pack(version, msg.deliver_at_ms, msg.partition, len(msg.headers))]
    fields: list[bytes | None] = [
        _utf8("id", msg.id),
        _utf8("buffer key", msg.uid),
        _utf8("topic", msg.topic),
        _checked("key", msg.key),
        _checked("value", msg.value),
    ]
    for i, (name, value) in enumerate(msg.headers):
        fields.append(_utf8(f"header {i} name", name))
        fields.append(_checked(f"header {i} value", value))
    if version >= SERIES_VERSION:
        fields.append(None if msg.repeat is None else _utf8("repeat", msg.repeat))
    for data in fields:
        if data is None:
            out.append(_LEN.pack(_NULL))
        else:
            out.append(_LEN.pack(len(data)))
            out.append(data)
    if version >= SERIES_VERSION:
        if not 1 <= msg.occurrence <= _NULL:
            raise UnstorableError(f"occurrence {msg.occurrence} is beyond 32 bits")
        out.append(_OCCURRENCE.pack(msg.occurrence))
    return out + _tail(msg, version)


def _tail(msg: Scheduled, version: int) -> list[bytes]:
    """The owner (nullable in version 6) and the producer-sequence stamp of an entry."""
    out = []
    if msg.owner is not None:
        owner = _utf8("owner", msg.owner)
        out += [_LEN.pack(len(owner)), owner]
    elif version == SEQUENCE_VERSION:
        out.append(_NULL_LEN)
    if msg.producer_seq is not None:
        stamp = _utf8("producer sequence", msg.producer_seq)
        out += [_LEN.pack(len(stamp)), stamp]
    return out


def _version(msg: Scheduled) -> int:
    if msg.producer_seq is not None:
        return SEQUENCE_VERSION
    if msg.owner is not None:
        return OWNER_VERSION
    return ENTRY_VERSION if msg.repeat is None else SERIES_VERSION


def encode_entry(msg: Scheduled) -> bytes:
    """A compact, versioned serialization of a scheduled message (the entry value).

    Raises UnstorableError (see :func:`check_storable`) rather than a codec error.
    """
    try:
        data = _encode_fast(msg)
    except (UnicodeEncodeError, struct.error):
        data = b""
    if not data:  # something is out of range: say what
        return b"".join(_encode_parts(msg))
    return data


def _encode_fast(msg: Scheduled) -> bytes:
    """:func:`_encode_parts` without naming what fails: b"" (or a codec error) when a field
    is out of range. The hot path of ingest, with one call per field less."""
    headers = msg.headers
    repeat = msg.repeat
    stamp = msg.producer_seq
    if msg.owner is not None:
        return b""  # an owned message's entry (version 5 or 6): the general path
    out = [
        _HEAD.pack(
            SEQUENCE_VERSION
            if stamp is not None
            else ENTRY_VERSION
            if repeat is None
            else SERIES_VERSION,
            msg.deliver_at_ms,
            msg.partition,
            len(headers),
        )
    ]
    add = out.append
    pack = _LEN.pack
    fields: list[bytes | None] = [
        msg.id.encode(),
        msg.uid.encode(),
        msg.topic.encode(),
        msg.key,
        msg.value,
    ]
    for name, value in headers:
        fields.append(name.encode())
        fields.append(value)
    series = repeat is not None or stamp is not None
    if series:
        fields.append(None if repeat is None else repeat.encode())
    for data in fields:
        if data is None:
            add(_NULL_LEN)
        else:
            add(pack(len(data)))
            add(data)
    if series:
        if not 1 <= msg.occurrence <= _NULL:
            return b""
        add(_OCCURRENCE.pack(msg.occurrence))
    if stamp is not None:
        raw = stamp.encode()
        out += [_NULL_LEN, pack(len(raw)), raw]  # no owner, then the stamp
    joined = b"".join(out)
    # Every field shorter than a length field's null marker (any record Kafka carries is):
    # the whole entry is, less its fixed parts.
    return joined if len(joined) < MAX_FIELD_BYTES else b""


def decode_entry(data: bytes) -> Scheduled:
    """Inverse of :func:`encode_entry` (format versions 1-6); StoreError on anything else."""
    head = _HEADS.get(data[0]) if data else None
    if head is None:
        version = data[0] if data else None
        raise StoreError(
            f"store entry has format version {version}; this build reads {sorted(_HEADS)}"
        )
    version = data[0]
    try:
        _, deliver_at, partition, count = head.unpack_from(data, 0)
        # The length-prefixed fields in order: id, [uid,] topic, key, value, each header's
        # name and value, [repeat]. One loop, no call per field: the forwarder's scan decodes
        # every entry it releases.
        series = version >= SERIES_VERSION
        wanted = (4 if version < 3 else 5) + 2 * count + series
        fields: list[bytes | None] = []
        add = fields.append
        unpack = _LEN.unpack_from
        pos, end = head.size, len(data)
        for _ in range(wanted):
            (length,) = unpack(data, pos)
            pos += 4
            if length == _NULL:
                add(None)
                continue
            nxt = pos + length
            if nxt > end:
                raise StoreError("store entry is truncated")
            add(data[pos:nxt])
            pos = nxt
        occurrence = 1
        if series:
            (occurrence,) = _OCCURRENCE.unpack_from(data, pos)
            pos += _OCCURRENCE.size
        owner = stamp = None
        if version >= OWNER_VERSION:
            owner, pos = _text(data, pos)
        if version == SEQUENCE_VERSION:
            stamp, pos = _text(data, pos)
        if version < 3:
            fields.insert(1, b"")  # no buffer key before version 3
        msg_id, uid, topic, key, value = fields[:5]
        headers = tuple(
            ((fields[i] or b"").decode(), fields[i + 1]) for i in range(5, 5 + 2 * count, 2)
        )
        repeat = None if not series or fields[-1] is None else fields[-1].decode()
        result = Scheduled(
            (msg_id or b"").decode(),
            (topic or b"").decode(),
            partition,
            key,
            value,
            deliver_at,
            headers,
            (uid or b"").decode(),
            repeat=repeat,
            occurrence=occurrence,
            owner=owner,
            producer_seq=stamp,
        )
    except (struct.error, UnicodeDecodeError) as exc:
        raise StoreError(f"store entry is corrupt: {exc}") from None
    if pos != len(data):
        raise StoreError(f"store entry is corrupt: {len(data) - pos} bytes after the last field")
    return result


def entry_target(data: bytes) -> tuple[str, int]:
    """The (topic, partition) of the entry ``data``, reading only its head and first fields:
    the forwarder's scan passes over far more entries than it releases (held targets, a
    throttled topic's backlog) and needs only this of them. Anything it cannot read is left to
    :func:`decode_entry`, which names what is wrong."""
    head = _HEADS.get(data[0]) if data else None
    if head is not None:
        try:
            partition = head.unpack_from(data, 0)[2]
            pos = head.size
            for _ in range(1 if data[0] < 3 else 2):  # id, and the buffer key since version 3
                (length,) = _LEN.unpack_from(data, pos)
                pos += _LEN.size + (0 if length == _NULL else length)
            (length,) = _LEN.unpack_from(data, pos)
            pos += _LEN.size
            if length != _NULL and pos + length <= len(data):
                return data[pos : pos + length].decode(), partition
        except (struct.error, UnicodeDecodeError):
            pass
    message = decode_entry(data)
    return message.topic, message.partition


def _text(data: bytes, pos: int) -> tuple[str | None, int]:
    """A nullable ``length (4) | UTF-8`` field at ``pos``, and the position after it."""
    (length,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    if length == _NULL:
        return None, pos
    if pos + length > len(data):
        raise StoreError("store entry is truncated")
    return data[pos : pos + length].decode(), pos + length


def entry_owner(data: bytes) -> str | None:
    """The owner of the entry ``data`` (None: it has none); decodes only an owned one."""
    return decode_entry(data).owner if data[:1] in _OWNED else None


def entry_producer_seq(data: bytes) -> str | None:
    """The producer-sequence stamp of the entry ``data`` (None: it has none)."""
    return decode_entry(data).producer_seq if data[:1] == _STAMPED else None


@immutable
class Entry:
    """A pending message and where it came from in the buffer topic."""

    key: bytes
    message: Scheduled
    partition: int
    offset: int
