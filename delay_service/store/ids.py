"""The store's ids index, and one write batch that keeps it and the entries in step.

The ``ids`` column family maps ``len(id) (2) | id | buffer key`` (UTF-8) to the entry key, so:

- a schedule whose (id, buffer key) is already pending is the same record written twice (a
  producer's retry through another proxy, or the buffer topic read again): the first stays;
- a schedule that *reuses* an id with a new buffer key is a new message, pending beside any
  earlier one with that id (ids are safe to reuse; the buffer-record contract in
  ``kdelay/buffer/`` keeps them in one partition, in order), unless it was sent with a
  cancel of that id that reached the buffer before it: an open cancel (``cancels.py``) then
  cancels it on arrival. Sent means accepted by a proxy (by the broker's clock); a reuse sent
  once the cancel was acknowledged is new;
- a cancel finds every pending message with its id by the prefix ``len(id) | id``;
- a tombstone finds exactly the record it retires: its (id, buffer key), at its offset.

Records of buffer format version 1 have no buffer key (""), so for them the index is by id
alone, as it was. Not thread-safe: the store calls it under its own lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from rocksdict import WriteBatch

from kdelay.buffer import Scheduled
from kdelay.delay_service.store.entry import decode_entry, encode_entry
from kdelay.delay_service.store.keyspace import ID_LEN as _LEN


def id_prefix(msg_id: str) -> bytes:
    """The index prefix of every message with id ``msg_id``."""
    raw = msg_id.encode("utf-8", "surrogatepass")
    return _LEN.pack(min(len(raw), 0xFFFF)) + raw


def id_key(msg_id: str, uid: str) -> bytes:
    """The index key of one scheduled record."""
    return id_prefix(msg_id) + uid.encode("utf-8", "surrogatepass")


def uid_of(index_key: bytes) -> str:
    """The buffer key in an index key."""
    (length,) = _LEN.unpack_from(index_key, 0)
    return index_key[_LEN.size + length :].decode("utf-8", "surrogatepass")


def first_with_id(ids: Any, msg_id: str) -> bytes | None:
    """The entry key of the first pending message with id ``msg_id`` in the ``ids`` family."""
    prefix = id_prefix(msg_id)
    it = ids.iter()
    it.seek(prefix)
    if it.valid() and bytes(it.key()).startswith(prefix):
        return bytes(it.value())
    return None


def reindex(db: Any, ids: Any, ids_cf: Any) -> WriteBatch:
    """A batch that replaces every key of the ids family with the index key of its entry."""
    batch = WriteBatch(raw_mode=True)
    it = ids.iter()
    it.seek_to_first()
    while it.valid():
        batch.delete(bytes(it.key()), ids_cf)
        it.next()
    it = db.iter()
    it.seek_to_first()
    while it.valid():
        message = decode_entry(bytes(it.value()))
        batch.put(id_key(message.id, message.uid), bytes(it.key()), ids_cf)
        it.next()
    return batch


class RecentlyDone:
    """Index keys of records that left the store recently (delivered, covered by a
    checkpoint, cancelled, bulk-cancelled or replaced), remembered for 2.5 to 5 minutes: a
    copy of such a record that arrives later (an idempotent producer's retry through a
    restarted proxy, written after the first copy was delivered or cancelled) is a duplicate,
    not a new message. A new message reusing the id has a new buffer key, so it is not one.
    Only records of format 2 (a buffer key) are remembered.

    Kept as 16-byte BLAKE2b digests in two generations: keys go into the current set; every
    ``ttl_s / 2`` the current set becomes the previous one and the previous one is dropped,
    so a key is remembered for at least ``ttl_s / 2`` and at most ``ttl_s``. A generation
    holds at most ``cap / 2`` keys (at 2,000 deliveries a second, all of them); past that it
    rotates early. About 90 bytes a key, so ``cap`` = 500,000 costs about 45 MB. In memory:
    a replica restart forgets them. Not thread-safe: the store calls it under its own lock."""

    def __init__(self, ttl_s: float = 300.0, cap: int = 500_000) -> None:
        self._half_s = ttl_s / 2
        self._half_cap = max(1, cap // 2)
        self._current: set[bytes] = set()
        self._previous: set[bytes] = set()
        self._rotated: float | None = None

    @staticmethod
    def _digest(index_key: bytes) -> bytes:
        return hashlib.blake2b(index_key, digest_size=16).digest()

    def add(self, msg_id: str, uid: str, now: float) -> None:
        """Remember that record (``msg_id``, ``uid``) left the store at monotonic ``now``."""
        self.add_key(id_key(msg_id, uid), uid, now)

    def add_key(self, index_key: bytes, uid: str, now: float) -> None:
        """:meth:`add` with the record's index key at hand. A record without a buffer key
        (``uid`` "", format 1) is not remembered, though it counts for the rotation."""
        if self._rotated is None:
            self._rotated = now
        if now - self._rotated >= self._half_s or len(self._current) >= self._half_cap:
            self._previous = self._current if now - self._rotated < 2 * self._half_s else set()
            self._current = set()
            self._rotated = now
        if uid:
            self._current.add(self._digest(index_key))

    def __contains__(self, index_key: object) -> bool:
        if not isinstance(index_key, bytes):
            return False
        digest = self._digest(index_key)
        return digest in self._current or digest in self._previous

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)


class IndexedBatch:
    """One WriteBatch of entries and their index keys, which sees its own writes."""

    def __init__(self, ids: Any, ids_cf: Any, floor: bytes) -> None:
        self._ids = ids  # the ids column family (rocksdict view)
        self._ids_cf = ids_cf  # its handle, for the batch
        self.batch = WriteBatch(raw_mode=True)
        self.overlay: dict[bytes, bytes | None] = {}  # index key -> entry key; None: deleted
        self.delta = 0  # entries added minus removed
        self.floor = floor  # no live entry sorts below it

    def lookup(self, index_key: bytes) -> bytes | None:
        """The entry key of one record, if pending."""
        if index_key in self.overlay:
            return self.overlay[index_key]
        found = self._ids.get(index_key)
        return None if found is None else bytes(found)

    def with_id(self, msg_id: str) -> Iterator[tuple[bytes, bytes]]:
        """(index key, entry key) of every pending message with id ``msg_id``."""
        prefix = id_prefix(msg_id)
        it = self._ids.iter()
        it.seek(prefix)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                break
            if key not in self.overlay:
                yield key, bytes(it.value())
            it.next()
        for key, entry in list(self.overlay.items()):
            if entry is not None and key.startswith(prefix):
                yield key, entry

    def put(self, record: Scheduled, key: bytes, index_key: bytes | None = None) -> None:
        """Add a pending entry under ``key`` (``index_key``: its :func:`id_key`, when known)."""
        if index_key is None:
            index_key = id_key(record.id, record.uid)
        self.batch.put(key, encode_entry(record))
        self.batch.put(index_key, key, self._ids_cf)
        self.overlay[index_key] = key
        self.delta += 1
        self.floor = min(self.floor, key)

    def delete(self, index_key: bytes, key: bytes) -> None:
        """Remove the pending entry ``key`` and its index key."""
        self.batch.delete(key)
        self.batch.delete(index_key, self._ids_cf)
        self.overlay[index_key] = None
        self.delta -= 1
