"""Bulk cancels: one buffer record that cancels every pending message whose id starts with a
prefix (optionally only those for one target topic), and the count it cancelled.

The rule (README "Bulk cancel", ``kdelay.buffer``'s contract). A bulk cancel ``B`` with prefix
``P`` (and topic ``T``), appended to buffer partition ``q`` at ``t_B`` (LogAppendTime), cancels
each message with an id starting with ``P`` (for target ``T``) that

1. is pending when the replica reads ``B``, or is read after ``B`` while ``B`` is *open*, and
2. a proxy accepted no later than ``t_B`` + :data:`SENT_WITH_MS` (its order field's
   millisecond, the broker clock's upper bound, as for a single cancel:
   ``kdelay.buffer.cancels``), and
3. ``B``'s sender may cancel (``kdelay.buffer.may_cancel``: its own, any for a kdelay
   administrator, and messages without an owner).

A message without an acceptance time (format 1, or not written by a proxy's router) is
cancelled only when pending as ``B`` is read. So a message accepted before the bulk cancel was
sent is cancelled whichever buffer partition it is in and whether the replica reads it before
or after ``B`` (within :data:`WINDOW_MS`), and one sent after ``B`` was acknowledged never is:
the proxy acknowledges a bulk cancel only once the broker's clock is surely past ``t_B`` +
:data:`SENT_WITH_MS` (proxy/routing/cancel_acks.py). ``B`` is open from when it is read until the
replica reads any record appended more than :data:`WINDOW_MS` after ``t_B``; its own tombstone
is owed when it closes.

Copies: a proxy writes a bulk cancel as one copy in *every* buffer partition, all with one id
``bulk.p<N>.<hex>`` (``N``: the buffer's partition count then; proxy/http/cancel_wait.py), so
whatever the shard layout when it is read (a reshard after it was written, a proxy that could
not ask ZooKeeper how many shards there are), each shard reads the copies of its own
partitions. The copy in partition ``q`` applies to the messages of partition ``q`` only (rules
1 and 2, each in its partition): every message is decided by exactly one copy, from the order
of its own partition alone, and counted once. A store adds each copy's counts to the result
of that id and lists the partitions whose copy it applied (``partitions``); a copy read again
changes nothing (its own tombstone is owed at once). A bulk cancel of an id without ``p<N>``
(an older proxy's: one record per shard) applies to every partition of the store that reads
it, as before.

Owners: a message ``B`` may not cancel stays pending and is counted (``refused``), not logged
one by one (a bulk cancel may cover millions).

The count: every replica records, keyed by the bulk cancel's id, how many messages it
cancelled (rule 1 at once, rule 2 added as they arrive) and how many it left to other
principals; ``GET /v1/bulk-cancels/<id>`` on the replica's port answers it (queries.py), the
master's being the reference. A rebuilt store (a reshard, a new volume) counts again as it
reads the copies again: the same decisions, so the same counts. Results are kept
:data:`RESULT_RETENTION_MS` after the bulk cancel was applied.

Layout, in the store's ``meta`` column family:

- ``bulk/o/<q (4)><offset (8)>`` -> JSON of one open bulk cancel (:class:`OpenBulk`);
- ``bulk/r/<id>`` -> JSON ``{"cancelled", "refused", "applied_ms", "at"}``, and
  ``"partitions"`` (those whose copy was applied) for an id of copies;
- ``bulk/t/<applied_ms (8)><id>`` -> empty: the results in the order they are pruned;
- ``bulk/p/<q (4)><offset (8)>`` -> JSON ``{"cursor", "cancelled", "refused"}``: how far the
  steps of a bulk cancel not applied yet got.

Steps: a bulk cancel may cover millions of pending messages; one WriteBatch for all of them
would hold the store's lock (and stall the forwarder's releases) for as long as that takes.
So ingest first applies it in steps (``Store.bulk_step``, at most ``BULK_STEP`` entries each,
one WriteBatch each with the step's progress), releasing the lock in between, then applies its
poll's batch as usual, which does the rest from where the steps got to (and the messages of
that batch) and opens the bulk cancel. After a crash between steps, the record is read again
and the steps go on from the progress written: the outcome and the count are the same.

Determinism: the decisions depend on the records (offsets, append times, order fields) and,
for a bulk cancel of one record per shard, on what the replica has read of the other partitions
when it reads ``B`` (a copy: of its own partition only); a message read before or after ``B``
gets the same decision by rules 1 and 2, except one read after ``B`` closed (a replica that
lags one partition by more than :data:`WINDOW_MS` behind another).

Not thread-safe: the store calls it under its own lock, inside its WriteBatch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from rocksdict import WriteBatch

from kdelay import buffer
from kdelay.buffer import Cancel, Scheduled, may_cancel
from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.delay_service.store.ids import IndexedBatch
from kdelay.delay_service.store.keyspace import BULK_BY_TIME as _BY_TIME
from kdelay.delay_service.store.keyspace import BULK_LEN as _LEN
from kdelay.delay_service.store.keyspace import BULK_MS as _MS
from kdelay.delay_service.store.keyspace import BULK_OPEN as _OPEN
from kdelay.delay_service.store.keyspace import BULK_PO as _PO
from kdelay.delay_service.store.keyspace import BULK_PROGRESS as _PROGRESS
from kdelay.delay_service.store.keyspace import BULK_RESULT as _RESULT
from kdelay.delay_service.store.keyspace import NEXT_KEY
from kdelay.delay_service.store.tombstones import Retired
from kdelay.json_bytes import dumps

WINDOW_MS = buffer.CANCEL_WINDOW_MS
SENT_WITH_MS = buffer.CANCEL_SENT_WITH_MS
#: How long a replica remembers a bulk cancel's count after applying it.
RESULT_RETENTION_MS = 24 * 3_600_000


@dataclass(slots=True)
class OpenBulk:
    """A bulk cancel still able to cancel a message read after it."""

    partition: int
    offset: int
    id: str
    uid: str
    prefix: str
    topic: str | None
    owner: str | None
    admin: bool
    time_ms: int | None

    def to_json(self) -> bytes:
        return dumps(
            {
                "i": self.id,
                "u": self.uid,
                "px": self.prefix,
                "t": self.topic,
                "w": self.owner,
                "a": self.admin,
                "ms": self.time_ms,
            }
        )

    @classmethod
    def from_json(cls, partition: int, offset: int, raw: bytes) -> OpenBulk:
        doc = orjson.loads(raw)
        return cls(
            partition,
            offset,
            doc["i"],
            doc["u"],
            doc["px"],
            doc["t"],
            doc["w"],
            doc["a"],
            doc["ms"],
        )

    def accepts(self, msg: Scheduled, accepted: int | None, partition: int) -> bool:
        """Whether ``msg`` (accepted by a proxy at ``accepted``, read from buffer
        ``partition``) is in this bulk cancel's scope, owners aside: its id and topic match,
        it was sent with or before it, and it is in this copy's partition when it has one."""
        if bulk_copies(self.id) is not None and partition != self.partition:
            return False
        if not msg.id.startswith(self.prefix):
            return False
        if self.topic is not None and msg.topic != self.topic:
            return False
        if accepted is None or self.time_ms is None:
            return True
        return accepted <= self.time_ms + SENT_WITH_MS

    def allows(self, msg: Scheduled) -> bool:
        """Whether its sender may cancel ``msg`` (module docstring, "Owners")."""
        return may_cancel(self.owner, self.admin, msg.owner)


def ids_with_prefix(
    ids: Any, prefix: str, after: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """(index key, entry key) of every pending message in the ``ids`` family (``ids.py``:
    ``len(id) (2) | id | buffer key``) whose id starts with ``prefix``, in index order, those
    up to ``after`` (an index key) left out: one range per id length that has any, found by
    seeking (at most two seeks per length present)."""
    raw = prefix.encode("utf-8", "surrogatepass")
    length = len(raw)
    if after is not None:
        length = max(length, _LEN.unpack_from(after, 0)[0])
    it = ids.iter()
    while length <= 0xFFFF:
        start = _LEN.pack(length) + raw
        resume = after is not None and after.startswith(start)
        it.seek(after + NEXT_KEY if resume and after is not None else start)
        if not it.valid():
            return
        key = bytes(it.key())
        (found,) = _LEN.unpack_from(key, 0)
        if found != length:  # no id of this length starts with the prefix
            length = found
            continue
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(start):
                break
            yield key, bytes(it.value())
            it.next()
        length += 1


def _id_of(index_key: bytes) -> bytes:
    (length,) = _LEN.unpack_from(index_key, 0)
    return index_key[_LEN.size : _LEN.size + length]


def matching(
    txn: IndexedBatch, ids: Any, prefix: str, after: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """(index key, entry key) of every entry with an id starting with ``prefix``, as ``txn``
    sees them (its own additions and deletions included), those in RocksDB up to ``after``
    left out (a :meth:`Store.bulk_step` did them). Lazily: the caller may delete what
    it is given in ``txn`` meanwhile (only its WriteBatch and overlay change; RocksDB does not
    until the batch is written)."""
    raw = prefix.encode("utf-8", "surrogatepass")
    overlay = txn.overlay
    added = [(k, v) for k, v in overlay.items() if v is not None and _id_of(k).startswith(raw)]
    for key, value in ids_with_prefix(ids, prefix, after):
        if key not in overlay:
            yield key, value
    yield from added


class BulkMemory:
    """The open bulk cancels and their counts (module docstring)."""

    def __init__(self, meta: Any, meta_cf: Any) -> None:
        self._meta = meta
        self._meta_cf = meta_cf
        self.open: list[OpenBulk] = []
        self._pending: dict[str, dict[str, Any]] = {}  # counts changed in the running batch
        it = meta.iter()
        it.seek(_OPEN)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(_OPEN):
                break
            partition, offset = _PO.unpack_from(key, len(_OPEN))
            self.open.append(OpenBulk.from_json(partition, offset, bytes(it.value())))
            it.next()

    def result(self, bulk_id: str) -> dict[str, Any] | None:
        """The count of bulk cancel ``bulk_id``, if this replica applied it (and remembers)."""
        raw = self._meta.get(_RESULT + bulk_id.encode())
        if raw is None:
            return None
        doc: dict[str, Any] = orjson.loads(bytes(raw))
        return doc

    def progress(self, at: tuple[int, int, int | None]) -> tuple[bytes | None, int, int]:
        """How far the steps of the bulk cancel read at ``at`` got: the last index key they
        examined (None: none did), and what they cancelled and refused."""
        raw = self._meta.get(_PROGRESS + _PO.pack(at[0], at[1]))
        if raw is None:
            return None, 0, 0
        doc = orjson.loads(bytes(raw))
        return bytes.fromhex(doc["cursor"]), int(doc["cancelled"]), int(doc["refused"])

    def step(
        self,
        batch: WriteBatch,
        at: tuple[int, int, int | None],
        cursor: bytes,
        cancelled: int,
        refused: int,
    ) -> None:
        """A step of the bulk cancel read at ``at`` examined every entry up to ``cursor``."""
        doc = {"cursor": cursor.hex(), "cancelled": cancelled, "refused": refused}
        batch.put(_PROGRESS + _PO.pack(at[0], at[1]), dumps(doc), self._meta_cf)

    def opened(  # noqa: PLR0917 - one record's parts, in one call from the store
        self,
        batch: WriteBatch,
        at: tuple[int, int, int | None],
        record: Cancel,
        cancelled: int,
        refused: int,
        now_ms: int,
    ) -> bool:
        """Bulk cancel ``record`` was read at ``at`` and cancelled ``cancelled`` pending
        messages: open it and record its count (in ``batch``). Whether it is the first copy
        of its id this store read (the one the metrics count)."""
        assert record.prefix is not None
        partition, offset, time_ms = at
        bulk = OpenBulk(
            partition,
            offset,
            record.id,
            record.uid,
            record.prefix,
            record.topic,
            record.owner,
            record.admin,
            time_ms,
        )
        self.open.append(bulk)
        batch.put(_OPEN + _PO.pack(partition, offset), bulk.to_json(), self._meta_cf)
        batch.delete(_PROGRESS + _PO.pack(partition, offset), self._meta_cf)
        doc: dict[str, Any] = {
            "cancelled": cancelled,
            "refused": refused,
            "applied_ms": now_ms,
            "at": time_ms,
        }
        before = self._pending.get(record.id) or self.result(record.id)
        if bulk_copies(record.id) is not None:  # one copy of several: added to those read before
            doc["partitions"] = [partition]
            if before is not None:
                doc = {
                    **before,
                    "cancelled": before["cancelled"] + cancelled,
                    "refused": before["refused"] + refused,
                    "partitions": sorted({*before.get("partitions", ()), partition}),
                }
        self._put_result(batch, record.id, doc)
        if before is None or doc["applied_ms"] == now_ms:
            batch.put(_BY_TIME + _MS.pack(now_ms) + record.id.encode(), b"", self._meta_cf)
        self._prune(batch, now_ms)
        return before is None

    def applied(self, bulk_id: str, partition: int) -> bool:
        """Whether this store applied the copy of bulk cancel ``bulk_id`` in ``partition``
        already (a copy of several, read again: module docstring, "Copies")."""
        doc = self._pending.get(bulk_id) or self.result(bulk_id)
        return doc is not None and partition in doc.get("partitions", ())

    def _put_result(self, batch: WriteBatch, bulk_id: str, doc: dict[str, Any]) -> None:
        batch.put(_RESULT + bulk_id.encode(), dumps(doc), self._meta_cf)
        self._pending[bulk_id] = doc

    def begin(self) -> None:
        """A new store batch starts: counts changed in it are kept here until written."""
        self._pending = {}

    def _current(self, bulk_id: str) -> dict[str, Any]:
        doc = self._pending.get(bulk_id) or self.result(bulk_id)
        return doc or {"cancelled": 0, "refused": 0, "applied_ms": 0, "at": None}

    def on_arrival(
        self, batch: WriteBatch, msg: Scheduled, accepted: int | None, partition: int
    ) -> OpenBulk | None:
        """The open bulk cancel that cancels ``msg``, read from ``partition`` after it (rule 2;
        ``accepted`` is required: without an acceptance time only rule 1 applies), its count
        updated in ``batch``; None when none does. A refusal is counted by each bulk cancel
        that matches."""
        if accepted is None:
            return None
        for bulk in self.open:
            if not bulk.accepts(msg, accepted, partition):
                continue
            doc = self._current(bulk.id)
            if bulk.allows(msg):
                self._put_result(batch, bulk.id, {**doc, "cancelled": doc["cancelled"] + 1})
                return bulk
            self._put_result(batch, bulk.id, {**doc, "refused": doc["refused"] + 1})
        return None

    def advance(self, batch: WriteBatch, time_ms: int | None) -> list[Retired]:
        """A record appended at ``time_ms`` was read: close the bulk cancels whose window it
        ends; returns their own records, owed a tombstone now."""
        if time_ms is None or not self.open:
            return []
        owed = []
        keep = []
        for bulk in self.open:
            if bulk.time_ms is not None and bulk.time_ms < time_ms - WINDOW_MS:
                batch.delete(_OPEN + _PO.pack(bulk.partition, bulk.offset), self._meta_cf)
                if bulk.uid:
                    owed.append(Retired(bulk.id, bulk.uid, bulk.partition, bulk.offset))
            else:
                keep.append(bulk)
        self.open = keep
        return owed

    def _prune(self, batch: WriteBatch, now_ms: int) -> None:
        """Forget the counts of bulk cancels applied more than RESULT_RETENTION_MS ago."""
        it = self._meta.iter()
        it.seek(_BY_TIME)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(_BY_TIME):
                break
            (applied,) = _MS.unpack_from(key, len(_BY_TIME))
            if applied >= now_ms - RESULT_RETENTION_MS:
                break
            batch.delete(key, self._meta_cf)
            batch.delete(_RESULT + key[len(_BY_TIME) + _MS.size :], self._meta_cf)
            it.next()
