"""The open cancels' keyspace in the store's ``meta`` column family: every key and value format
of ``cancels.py``'s memory, and the reads of what is stored there.

Layout (partition 4 bytes, offsets and times 8, all big-endian; times signed, :data:`UNKNOWN`
for a record without a timestamp):

- ``cancel/n/<p>`` -> cancels read in ``p`` (they are numbered 1, 2, ...) | of them open;
- ``cancel/w/<p><offset>`` -> ``t_C`` | number | ``len(id)`` (2) | id | buffer key: one open
  cancel, in offset order (the closing order); the buffer key is empty when no tombstone is
  owed at its close (retired at once, or format 1);
- ``cancel/i/<p><len(id)><id>`` -> offset | ``t_C`` of the newest open cancel of that id, then
  ``r`` when it is a replace's (a replace is not cancelled on arrival by an earlier replace:
  among replaces, the buffer's order decides), or ``R`` | len (1) | the replace's buffer key
  (in stores written by newer versions: nor are its own series' later occurrences,
  ``own_series``), then ``Q`` | len (2) | its producer-sequence stamp when it has one
  (``kdelay.buffer.producer_seq``; in stores written by newer versions), then ``A`` when an
  administrator sent it, or ``W`` and the principal that sent it (nothing: sent without
  authentication);
- ``cancel/s/<p><offset><partition><offset>`` -> buffer key: a record that cancel cancelled.

A store written before these keys existed simply has no open cancels. Plain values and
functions; the reads take the ``meta`` view (rocksdict) and run under the store's lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kdelay.buffer import Cancel
from kdelay.delay_service.store.ids import id_prefix
from kdelay.delay_service.store.keyspace import CANCEL_ADMIN as _ADMIN
from kdelay.delay_service.store.keyspace import CANCEL_AT as _AT
from kdelay.delay_service.store.keyspace import CANCEL_COUNTS as _COUNTS
from kdelay.delay_service.store.keyspace import CANCEL_I as _I
from kdelay.delay_service.store.keyspace import CANCEL_N as _N
from kdelay.delay_service.store.keyspace import CANCEL_OPEN as _OPEN
from kdelay.delay_service.store.keyspace import CANCEL_P as _P
from kdelay.delay_service.store.keyspace import CANCEL_PO as _PO
from kdelay.delay_service.store.keyspace import CANCEL_Q as _Q
from kdelay.delay_service.store.keyspace import CANCEL_REPLACE as _REPLACE
from kdelay.delay_service.store.keyspace import CANCEL_REPLACE_OF as _REPLACE_OF
from kdelay.delay_service.store.keyspace import CANCEL_S as _S
from kdelay.delay_service.store.keyspace import CANCEL_SENDER as _SENDER
from kdelay.delay_service.store.keyspace import CANCEL_STAMP as _STAMP
from kdelay.delay_service.store.keyspace import CANCEL_STAMP_LEN as _STAMP_LEN
from kdelay.delay_service.store.keyspace import CANCEL_W as _W

#: The stored time of a record that had none (only in-process callers omit it).
UNKNOWN = -(2**63)


@dataclass(frozen=True, slots=True)
class OpenCancel:
    """One open cancel: its offset, time, number in its partition, id, and the buffer key of
    the tombstone it owes when it closes ("" for none)."""

    offset: int
    time_ms: int
    number: int
    id: str
    uid: str

    def encode(self) -> bytes:
        raw = self.id.encode("utf-8", "surrogatepass")
        return _OPEN.pack(self.time_ms, self.number, len(raw)) + raw + self.uid.encode()

    @classmethod
    def decode(cls, offset: int, value: bytes) -> OpenCancel:
        time_ms, number, length = _OPEN.unpack_from(value, 0)
        start = _OPEN.size
        msg_id = value[start : start + length].decode("utf-8", "surrogatepass")
        return cls(offset, time_ms, number, msg_id, value[start + length :].decode())


# -- keys ------------------------------------------------------------------------------------


def counts_key(partition: int) -> bytes:
    """``cancel/n/<p>``: the counts of ``partition``'s cancels."""
    return _N + _P.pack(partition)


def encode_counts(read: int, open_: int) -> bytes:
    return _COUNTS.pack(read, open_)


def open_key(partition: int, offset: int) -> bytes:
    """``cancel/w/<p><offset>``: the open cancel read there."""
    return _W + _PO.pack(partition, offset)


def id_index_key(partition: int, msg_id: str) -> bytes:
    """``cancel/i/<p><len(id)><id>``: the newest open cancel of ``msg_id`` in ``partition``."""
    return _I + _P.pack(partition) + id_prefix(msg_id)


def cancelled_key(partition: int, by: int, record_partition: int, record_offset: int) -> bytes:
    """``cancel/s/...``: the cancel at ``partition``/``by`` cancelled the record there."""
    return _S + _PO.pack(partition, by) + _PO.pack(record_partition, record_offset)


# -- the id index's values ---------------------------------------------------------------------


def index_value(offset: int, time_ms: int, record: Cancel, *, replace: bool, series: str) -> bytes:
    """The id index's value of the cancel ``record`` read at ``offset``, ``time_ms``: a
    replace's when ``replace`` (``series``: its own buffer key), then who sent it."""
    return (
        _AT.pack(offset, time_ms)
        + (_replace_mark(series) if replace else b"")
        + _stamp(record.producer_seq)
        + _sender(record)
    )


def _stamp(stamp: str | None) -> bytes:
    """The index value's mark of a cancel's producer-sequence stamp (none when it has none)."""
    if stamp is None:
        return b""
    raw = stamp.encode()
    return _STAMP + _STAMP_LEN.pack(len(raw)) + raw if len(raw) <= 0xFFFF else b""


def stamp_of(suffix: bytes) -> tuple[str | None, bytes]:
    """(the producer-sequence stamp or None, the rest) of an open-cancel index value's suffix
    after ``_AT``."""
    suffix = replace_of(suffix)[2]
    if suffix[:1] != _STAMP:
        return None, suffix
    (length,) = _STAMP_LEN.unpack_from(suffix, 1)
    end = 1 + _STAMP_LEN.size + length
    return suffix[1 + _STAMP_LEN.size : end].decode(), suffix[end:]


def decode_index(value: bytes) -> tuple[int, int, bytes]:
    """(offset, time, suffix) of an id index value; the suffix for :func:`replace_of` and
    :func:`sent_by`."""
    offset, time_ms = _AT.unpack_from(value)
    return offset, time_ms, value[_AT.size :]


def _sender(record: Cancel) -> bytes:
    """The open-cancel index's suffix naming who sent ``record``."""
    if record.admin:
        return _ADMIN
    return b"" if record.owner is None else _SENDER + record.owner.encode()


def sent_by(suffix: bytes) -> tuple[str | None, bool]:
    """(principal, admin) from an open-cancel index value's suffix after ``_AT``."""
    suffix = stamp_of(suffix)[1]
    if suffix[:1] == _ADMIN:
        return None, True
    if suffix[:1] == _SENDER:
        return suffix[1:].decode(), False
    return None, False


def replace_of(suffix: bytes) -> tuple[bool, str, bytes]:
    """(a replace's, its buffer key or "", the rest) of an open-cancel index value's suffix."""
    if suffix[:1] == _REPLACE_OF:
        end = 2 + suffix[1]
        return True, suffix[2:end].decode(), suffix[end:]
    if suffix[:1] == _REPLACE:
        return True, "", suffix[1:]
    return False, "", suffix


def _replace_mark(series: str) -> bytes:
    """The index value's replace marker for a replace with buffer key ``series``."""
    raw = series.encode()
    return _REPLACE_OF + bytes([len(raw)]) + raw if 0 < len(raw) < 256 else _REPLACE


# -- reads -------------------------------------------------------------------------------------


def stored_counts(meta: Any) -> Iterator[tuple[int, int, int]]:
    """(partition, cancels read, of them open) of every partition with cancels in ``meta``."""
    it = meta.iter()
    it.seek(_N)
    while it.valid():
        key = bytes(it.key())
        if not key.startswith(_N):
            break
        (partition,) = _P.unpack_from(key, len(_N))
        read, open_ = _COUNTS.unpack(bytes(it.value()))
        yield partition, read, open_
        it.next()


def first_open(meta: Any, partition: int, after: int) -> OpenCancel | None:
    """The oldest open cancel of ``partition`` in ``meta`` with an offset above ``after``."""
    prefix = _W + _P.pack(partition)
    it = meta.iter()
    it.seek(prefix + _Q.pack(after + 1))
    if not it.valid():
        return None
    key = bytes(it.key())
    if not key.startswith(prefix):
        return None
    (offset,) = _Q.unpack_from(key, len(prefix))
    return OpenCancel.decode(offset, bytes(it.value()))


def cancelled_by(meta: Any, partition: int, offset: int) -> list[tuple[bytes, int, int, str]]:
    """(key, partition, offset, buffer key) of each record, as stored in ``meta``, that the
    cancel at ``partition``/``offset`` cancelled."""
    prefix = _S + _PO.pack(partition, offset)
    out = []
    it = meta.iter()
    it.seek(prefix)
    while it.valid():
        key = bytes(it.key())
        if not key.startswith(prefix):
            break
        p, o = _PO.unpack_from(key, len(prefix))
        out.append((key, p, o, bytes(it.value()).decode()))
        it.next()
    return out
