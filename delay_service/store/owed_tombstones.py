"""The tombstones this replica's store owes the buffer topic, kept in RocksDB so no term as
master, step-down or crash loses one (DESIGN.md "Compaction is an adversary").

A record retired by a cancel, a replace or a bulk cancel (the messages it removed, and the
cancel records themselves once they close) must get its tombstone, or compaction keeps it
while removing what retired it, and a store rebuilt from the topic holds it as pending
again. So every replica, followers too, records each tombstone owed in the same WriteBatch
that retires the record; a master writes what its store owes at the start of its term
(``Forwarder.activate``) and as they arise; a replica forgets one once it has read a
tombstone with that key back from the buffer topic (any null-value record with that key
after the retired record lets compaction remove it). The order they were owed in is kept
(a number per tombstone): a message's tombstone is written before its cancel's.

Layout, in the store's ``meta`` column family (numbers big-endian):

- ``owed/<p (4)><buffer key>`` -> number (8) | offset (8) | len(id) (2) | id | uid: the
  tombstone owed for the record with that buffer key in buffer partition ``p``.

Not thread-safe: the store calls it under its own lock; :meth:`OwedTombstones.owe` and
:meth:`OwedTombstones.paid` stage changes in a WriteBatch, :meth:`OwedTombstones.commit`
takes them once it is written (``abort`` when it is not).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rocksdict import WriteBatch

from kdelay.delay_service.store.keyspace import OWED_P as _P
from kdelay.delay_service.store.keyspace import OWED_PREFIX as _PREFIX
from kdelay.delay_service.store.keyspace import OWED_VALUE as _VALUE
from kdelay.delay_service.store.tombstones import Retired


def _key(partition: int, buffer_key: str) -> bytes:
    return _PREFIX + _P.pack(partition) + buffer_key.encode()


class OwedTombstones:
    """The owed tombstones of one store: their keys in memory, everything in ``meta``."""

    def __init__(self, meta: Any, meta_cf: Any) -> None:
        self._meta = meta
        self._meta_cf = meta_cf
        self._numbers: dict[bytes, int] = {}  # key -> number: what is owed
        self._next = 1
        it = meta.iter()
        it.seek(_PREFIX)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(_PREFIX):
                break
            number = _VALUE.unpack_from(bytes(it.value()), 0)[0]
            self._numbers[key] = number
            self._next = max(self._next, number + 1)
            it.next()
        self._staged: dict[bytes, int | None] = {}  # key -> number, None: paid; to commit

    def begin(self) -> None:
        """A new WriteBatch: forget what a batch that was never written staged."""
        self._staged = {}

    def __len__(self) -> int:
        return len(self._numbers)

    def owe(self, batch: WriteBatch, retired: Iterable[Retired]) -> None:
        """Record in ``batch`` the tombstones of ``retired``, in that order."""
        for r in retired:
            key = _key(r.partition, r.buffer_key)
            raw = r.id.encode("utf-8", "surrogatepass")
            value = _VALUE.pack(self._next, r.offset, len(raw)) + raw + r.uid.encode()
            batch.put(key, value, self._meta_cf)
            self._staged[key] = self._next
            self._next += 1

    def paid(self, batch: WriteBatch, partition: int, buffer_key: str) -> None:
        """A tombstone with ``buffer_key`` was read in ``partition``: forget the one owed."""
        key = _key(partition, buffer_key)
        if key in self._numbers or self._staged.get(key) is not None:
            batch.delete(key, self._meta_cf)
            self._staged[key] = None

    def commit(self) -> None:
        """The batch was written: what it staged holds."""
        for key, number in self._staged.items():
            if number is None:
                self._numbers.pop(key, None)
            else:
                self._numbers[key] = number
        self._staged = {}

    def abort(self) -> None:
        """The batch was not written."""
        self._staged = {}

    def all(self) -> list[Retired]:
        """Every tombstone owed, in the order they were owed."""
        out: list[tuple[int, Retired]] = []
        for key in self._numbers:
            value = self._meta.get(key)
            if value is None:
                continue
            value = bytes(value)
            number, offset, length = _VALUE.unpack_from(value, 0)
            start = _VALUE.size
            msg_id = value[start : start + length].decode("utf-8", "surrogatepass")
            uid = value[start + length :].decode()
            (partition,) = _P.unpack_from(key, len(_PREFIX))
            out.append((number, Retired(msg_id, uid, partition, offset)))
        out.sort(key=lambda item: item[0])
        return [r for _, r in out]
