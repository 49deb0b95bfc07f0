"""A replica's pending set in RocksDB (rocksdict), with the consumed buffer offsets.

Layout (three column families, keys and values raw bytes):

- ``default`` (entries): key and value of ``entry.py`` (key = due time | order | buffer
  partition | buffer offset, so iteration order is due time, then acceptance order).
- ``ids``: (message id, buffer key) -> entry key, for cancel, tombstones and records written
  twice (``ids.py``).
- ``meta``: ``offset/<partition>`` -> next buffer offset to consume (8, big-endian);
  ``pending`` -> entry count; ``checkpoint`` -> the last checkpoint this replica applied
  (``time_ms`` (8, signed), then ``partition (4) | offset (8)`` per partition). What a
  checkpoint covers is ``kdelay.checkpoint``'s rule. ``cancel/...``: the open cancels
  (``cancels.py``: a cancel also cancels a schedule sent with it that arrives after it).
- ``outcomes``, ``outcome_time``: what became of the messages that left the store, for their
  status (``outcomes.py``), written in the same WriteBatch as the change that made them.

Every change (entries, ids, offsets, count, open cancels) is one WriteBatch, so after any crash
the store is exactly "the first K records of each buffer partition, applied".

Scans stay fast after millions of deletions: entries are deleted in key order, so the store keeps
a *floor* (no live entry sorts below it) and every scan seeks straight to it, never walking the
point tombstones in front; an iterator upper bound stops it at the due time. (rocksdict 0.3's
``set_iterate_lower_bound`` misbehaves, so the floor is a ``seek``, not a lower bound.)

Concurrency: every public method takes one lock; the ingest thread (``apply``), the forwarder
(``due``, ``remove``, ``apply_checkpoint``) and the control thread (gauges) may call any of them.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import Rdict, RdictIter, ReadOptions, WriteBatch

from delay_service import rocks
from delay_service.cancels import At, CancelBatch, CancelMemory
from delay_service.entry import (
    Entry,
    decode_entry,
    due_bound,
    entry_key,
    split_key,
)
from delay_service.errors import StoreError
from delay_service.ids import IndexedBatch, RecentlyDone, first_with_id, id_key, reindex
from delay_service.outcomes import Outcome, OutcomeLog
from delay_service.round import DueScan
from delay_service.tombstones import Retired
from kdelay.buffer import BufferRecord, Cancel, Fate, Scheduled
from kdelay.checkpoint import NOTHING, Checkpoint

_U64 = struct.Struct(">Q")
_META_PENDING = b"pending"
_META_CHECKPOINT = b"checkpoint"
_META_OFFSET = b"offset/"
_META_IDS = b"ids-format"
_IDS_FORMAT = b"2"  # index key = len(id) | id | buffer key (ids.py)
#: How long, and how many, outcomes a replica keeps for message status (outcomes.py).
DEFAULT_STATUS_RETENTION_MS = 3_600_000
DEFAULT_STATUS_MAX_ENTRIES = 1_000_000
#: Releases this replica removed as master whose tombstone it has not read back yet, at most.
RELEASED_MEMORY = 200_000


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class ApplyResult:
    """What one :meth:`Store.apply` did; counts feed the metrics."""

    scheduled: int = 0
    duplicates: int = 0
    covered: int = 0
    cancelled: int = 0  # entries a cancel removed, and schedules cancelled on arrival
    cancelled_on_arrival: int = 0  # schedules an earlier cancel cancelled (cancels.py rule 2)
    retired: list[Retired] = field(default_factory=list)  # records owed a tombstone
    tombstoned: int = 0
    invalid: int = 0
    earliest_new_ms: int | None = None


#: One consumed buffer record: partition, offset, the decoded record (None: undecodable) and,
#: optionally, its timestamp (the buffer's LogAppendTime; None or absent: unknown).
Incoming = tuple[int, int, BufferRecord | None] | tuple[int, int, BufferRecord | None, int | None]


class Store:
    """The pending set of one replica; open with :meth:`open`, close with :meth:`close`."""

    def __init__(
        self,
        path: Path,
        *,
        status_retention_ms: int = DEFAULT_STATUS_RETENTION_MS,
        status_max_entries: int = DEFAULT_STATUS_MAX_ENTRIES,
    ) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        opts, cfs = rocks.options()
        try:
            self._db = Rdict(str(path), opts, column_families=cfs)
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise StoreError(f"cannot open RocksDB at {path}: {exc}") from exc
        self._ids = self._db.get_column_family("ids")
        self._meta = self._db.get_column_family("meta")
        self._ids_cf = self._db.get_column_family_handle("ids")
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._lock = threading.Lock()
        self._closed = False
        self._done = RecentlyDone()  # delivered records: a late copy is a duplicate
        # What this replica removed as master ((buffer partition, buffer key) -> buffer
        # offset), until it reads the tombstone back: that tombstone has nothing to tell it
        # (entry and index gone, the outcome known from the master itself), so ingest skips it
        # at once, before decoding it (:meth:`own_tombstone`). Bounded: the
        # oldest are forgotten first, and a forgotten one is applied the long way. An
        # OrderedDict: a plain dict's oldest key (``next(iter(d))``) is found by stepping over
        # the slots of every key deleted before it, which made each release past the bound
        # cost up to 60 µs (a release of 600,000 at once, ``bench.store_release``).
        self._released: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        raw = self._meta.get(_META_PENDING)
        self._pending = _U64.unpack(raw)[0] if raw else 0
        self._offsets: dict[int, int] = {}
        it = self._meta.iter()
        it.seek(_META_OFFSET)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(_META_OFFSET):
                break
            self._offsets[int(key[len(_META_OFFSET) :])] = _U64.unpack(it.value())[0]
            it.next()
        raw_cp = self._meta.get(_META_CHECKPOINT)
        self._checkpoint = Checkpoint.from_bytes(bytes(raw_cp)) if raw_cp else NOTHING
        self._floor = self._first_key() or due_bound(0)
        self._cancels = CancelMemory(self._meta, self._meta_cf)
        self._outcomes = OutcomeLog(
            self._db,
            self._meta,
            self._meta_cf,
            retention_ms=status_retention_ms,
            max_entries=status_max_entries,
        )
        if self._meta.get(_META_IDS) != _IDS_FORMAT:
            self._index_again()

    def _index_again(self) -> None:
        """Rebuild the ids family: a store written when it was keyed by the id alone (before
        buffer keys) opens with today's index keys."""
        batch = reindex(self._db, self._ids, self._ids_cf)
        batch.put(_META_IDS, _IDS_FORMAT, self._meta_cf)
        self._db.write(batch)

    # -- reading ---------------------------------------------------------------------------

    def _first_key(self) -> bytes | None:
        it = self._db.iter()
        it.seek_to_first()
        return bytes(it.key()) if it.valid() else None

    @property
    def pending(self) -> int:
        """Number of pending entries (maintained, never counted by scanning)."""
        with self._lock:
            return self._pending

    def offsets(self) -> dict[int, int]:
        """Per buffer partition, the next offset to consume (everything below is applied)."""
        with self._lock:
            return dict(self._offsets)

    @property
    def open_cancels(self) -> int:
        """Cancels still able to cancel a schedule that arrives after them (cancels.py)."""
        with self._lock:
            self._check_open()
            return self._cancels.open

    @property
    def checkpoint(self) -> Checkpoint:
        """The last checkpoint applied (``kdelay.checkpoint.NOTHING`` before the first)."""
        with self._lock:
            return self._checkpoint

    def _cursor_at_floor(self, upper: bytes) -> RdictIter:
        """A RocksDB iterator over the entries below ``upper``, at the first one."""
        ro = ReadOptions()
        ro.set_iterate_upper_bound(upper)
        it = self._db.iter(ro)
        it.seek(self._floor)
        return it

    def _iter_from_floor(self, upper: bytes) -> Iterable[tuple[bytes, bytes]]:
        it = self._cursor_at_floor(upper)
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    def due(self, now_ms: int, limit: int) -> list[Entry]:
        """Entries with deliver-at <= ``now_ms`` in key order, at most ``limit`` of them."""
        out: list[Entry] = []
        with self._lock:
            self._check_open()
            for key, value in self._iter_from_floor(due_bound(now_ms + 1)):
                _, partition, offset = split_key(key)
                out.append(Entry(key, decode_entry(value), partition, offset))
                if len(out) >= limit:
                    break
            if out:
                self._floor = out[0].key
        return out

    def next_due_ms(self, after_ms: int | None = None) -> int | None:
        """The earliest deliver-at in the store (later than ``after_ms``), or None."""
        with self._lock:
            self._check_open()
            it = self._db.iter()
            start = self._floor if after_ms is None else due_bound(after_ms + 1)
            it.seek(max(start, self._floor))
            if not it.valid():
                return None
            return split_key(bytes(it.key()))[0]

    def count_due_within(self, now_ms: int, windows_ms: list[int], cap: int) -> list[int]:
        """Cumulative counts of entries due within each window (counting stops at ``cap``).

        One pass over the keys only, in key order (due time first): the count of a window is
        how many keys came before the first one at or past its bound. Each replica refreshes
        its due-window gauges with it, holding the store's lock, over up to ``cap`` entries.
        """
        if not windows_ms:
            return []
        order = sorted(range(len(windows_ms)), key=windows_ms.__getitem__)
        bounds = [due_bound(now_ms + windows_ms[i] + 1) for i in order]
        counts = [0] * len(windows_ms)
        seen = crossed = 0
        with self._lock:
            self._check_open()
            it = self._cursor_at_floor(bounds[-1])
            while it.valid() and seen < cap:
                key = it.key()
                while key >= bounds[crossed]:  # the upper bound keeps crossed in range
                    counts[order[crossed]] = seen
                    crossed += 1
                seen += 1
                it.next()
        for i in order[crossed:]:
            counts[i] = seen
        return counts

    def chunk_after(
        self, after: bytes | None, until_ms: int, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """One chunk of a long read: up to ``limit`` raw ``(key, value)`` pairs of entries
        due before ``until_ms`` whose key sorts after ``after`` (from the first entry when
        None), in key order. The lock is held for this chunk only, and the caller decodes
        outside it (``entry.split_key``, ``entry.decode_entry``), so a reader walking the
        whole store (queries.py) never stalls ingest or the forwarder for long; entries added
        or removed between two chunks may or may not be seen."""
        out: list[tuple[bytes, bytes]] = []
        with self._lock:
            self._check_open()
            ro = ReadOptions()
            ro.set_iterate_upper_bound(due_bound(until_ms))
            it = self._db.iter(ro)
            it.seek(self._floor if after is None else max(after, self._floor))
            while it.valid() and len(out) < limit:
                key = bytes(it.key())
                if key != after:
                    out.append((key, bytes(it.value())))
                it.next()
        return out

    def get(self, msg_id: str) -> Entry | None:
        """A pending entry with id ``msg_id`` (the earliest-produced one), if any."""
        with self._lock:
            self._check_open()
            key = first_with_id(self._ids, msg_id)
            if key is None:
                return None
            value = self._db.get(key)
            if value is None:
                return None
            _, partition, offset = split_key(bytes(key))
            return Entry(bytes(key), decode_entry(bytes(value)), partition, offset)

    def outcome(self, msg_id: str) -> Outcome | None:
        """What became of the last message with id ``msg_id`` that left the store, if this
        replica still remembers it (``outcomes.py``)."""
        with self._lock:
            self._check_open()
            return self._outcomes.get(msg_id)

    @property
    def outcomes(self) -> int:
        """Outcomes this replica remembers."""
        with self._lock:
            return self._outcomes.count

    def size_bytes(self) -> int:
        """RocksDB's size on disk: live SST files plus the write-ahead log."""
        total = 0
        for path in self.path.iterdir():
            if path.suffix in (".sst", ".log"):
                try:
                    total += path.stat().st_size
                except FileNotFoundError:  # compaction removed it meanwhile
                    continue
        return total

    # -- writing ---------------------------------------------------------------------------

    def apply(self, records: Iterable[Incoming], offsets: Mapping[int, int]) -> ApplyResult:
        """Apply consumed buffer records and advance the consumed offsets, atomically.

        Schedule of a record already pending (same id and buffer key): a duplicate, the first
        one stays; a schedule reusing a pending id with a new buffer key is a new message,
        unless an open cancel cancels it on arrival (``cancels.py``). Cancel: removes every
        entry with its id (retired with them), and stays open; when it matched nothing, its
        tombstone is owed when it closes.
        Tombstone: removes the entry of exactly that record (id, buffer key and offset). A
        schedule the last checkpoint covers was delivered already and is skipped.
        """
        result = ApplyResult()
        with self._lock:
            self._check_open()
            txn = IndexedBatch(self._ids, self._ids_cf, self._floor)
            cancels = self._cancels.begin(txn.batch)
            for item in records:
                record, at = item[2], (item[0], item[1], item[3] if len(item) == 4 else None)
                result.retired += cancels.advance(at[0], at[2])
                if record is None:
                    result.invalid += 1
                elif isinstance(record, Scheduled):
                    self._apply_schedule(txn, cancels, result, at, record)
                elif isinstance(record, Cancel):
                    removed, owed = cancels.cancel(txn, at, record)
                    result.cancelled += len(removed)
                    result.retired += [*removed, *owed]
                    if removed:
                        self._outcomes.cancelled(txn.batch, record.id, at[2], _wall_ms())
                else:
                    released = self._released.pop((at[0], record.buffer_key.encode()), None)
                    if released == record.offset:
                        continue  # our own release (see __init__)
                    index_key = id_key(record.id, record.uid)
                    retiring = txn.lookup(index_key)
                    if retiring is not None and split_key(retiring)[2] == record.offset:
                        txn.delete(index_key, retiring)
                        self._done.add_key(index_key, record.uid, time.monotonic())
                        result.tombstoned += 1
                    if record.fate is not None:
                        self._outcomes.learn(
                            txn.batch, record.id, record.fate, "tombstone", _wall_ms()
                        )
            new_offsets = dict(self._offsets)
            for partition, next_offset in offsets.items():
                if next_offset > new_offsets.get(partition, -1):
                    new_offsets[partition] = next_offset
                    txn.batch.put(
                        _META_OFFSET + str(partition).encode(),
                        _U64.pack(next_offset),
                        self._meta_cf,
                    )
            txn.batch.put(_META_PENDING, _U64.pack(self._pending + txn.delta), self._meta_cf)
            cancels.finish()
            self._write(txn.batch)
            cancels.commit()
            self._pending += txn.delta
            self._offsets = new_offsets
            self._floor = txn.floor
        return result

    def _apply_schedule(
        self,
        txn: IndexedBatch,
        cancels: CancelBatch,
        result: ApplyResult,
        at: At,
        record: Scheduled,
    ) -> None:
        partition, offset, _ = at
        if self._checkpoint.covers(partition, offset, record.deliver_at_ms):
            result.covered += 1
        elif (index_key := id_key(record.id, record.uid)) in self._done or txn.lookup(
            index_key
        ) is not None:
            result.duplicates += 1
        elif (retired := cancels.on_arrival(at, record)) is not None:
            result.retired.append(retired)
            self._outcomes.cancelled(txn.batch, record.id, at[2], _wall_ms(), record)
            result.cancelled += 1
            result.cancelled_on_arrival += 1
        else:
            key = entry_key(record.deliver_at_ms, partition, offset, record.seq)
            txn.put(record, key, index_key)
            result.scheduled += 1
            if result.earliest_new_ms is None or record.deliver_at_ms < result.earliest_new_ms:
                result.earliest_new_ms = record.deliver_at_ms

    def remove(self, entries: Iterable[Entry], fates: Mapping[bytes, Fate] | None = None) -> int:
        """Delete entries (delivered ones); those already gone (a cancel raced) are skipped.
        ``fates``, by entry key: what became of them (the master's outcome of each)."""
        entries = list(entries)
        index_keys = [id_key(e.message.id, e.message.uid) for e in entries]
        removed = 0
        released: list[tuple[tuple[int, bytes], int]] = []
        with self._lock:
            self._check_open()
            if not entries:
                return 0
            batch = WriteBatch(raw_mode=True)
            current = rocks.multi_get(self._ids, index_keys)
            now_ms, now = _wall_ms(), time.monotonic()
            learnt: list[tuple[str, Fate]] = []
            for entry, index_key, key in zip(entries, index_keys, current, strict=True):
                if key != entry.key:
                    continue
                batch.delete(entry.key)
                batch.delete(index_key, self._ids_cf)
                self._done.add_key(index_key, entry.message.uid, now)
                removed += 1
                if fates is not None and (fate := fates.get(entry.key)) is not None:
                    learnt.append((entry.message.id, fate))
                    buffer_key = entry.message.buffer_key.encode()
                    released.append(((entry.partition, buffer_key), entry.offset))
            self._outcomes.learn_all(batch, learnt, "master", now_ms)
            if removed:
                batch.put(_META_PENDING, _U64.pack(self._pending - removed), self._meta_cf)
                self._write(batch)
                self._pending -= removed
            self._released.update(released)
            while len(self._released) > RELEASED_MEMORY:
                self._released.popitem(last=False)
        return removed

    def own_tombstone(self, partition: int, key: bytes) -> bool:
        """Whether the buffer record with Kafka key ``key`` in ``partition`` is a tombstone of a
        record this replica released as master, not read back yet (then it is forgotten: ingest
        skips the record without decoding it). The caller checked that the record has a null
        value, as only a tombstone has. Keyed by the buffer key, not the offset the tombstone
        names (that needs decoding): any tombstone with that key retires a record this store
        no longer holds (the release removed it, a cancel removes before its tombstone, and a
        record released by another master after a failover is covered by the checkpoint its
        tombstone follows), so at worst a richer outcome is not learnt. A malformed record with
        a null value and such a key is skipped instead of dead-lettered."""
        with self._lock:
            return self._released.pop((partition, key), None) is not None

    def apply_checkpoint(self, checkpoint: Checkpoint) -> int:
        """Remember a checkpoint and drop every entry it covers; returns how many were dropped.

        Later schedules it covers (a replica still catching up) are skipped by :meth:`apply`.
        """
        dropped = 0
        cp = Checkpoint(checkpoint.time_ms, dict(checkpoint.offsets))  # a copy nobody mutates
        with self._lock:
            self._check_open()
            batch = WriteBatch(raw_mode=True)
            first_kept: bytes | None = None
            for key, value in self._iter_from_floor(due_bound(cp.time_ms + 1)):
                deliver_at, partition, offset = split_key(key)
                if cp.covers(partition, offset, deliver_at):
                    batch.delete(key)
                    message = decode_entry(value)
                    index_key = id_key(message.id, message.uid)
                    batch.delete(index_key, self._ids_cf)
                    self._done.add_key(index_key, message.uid, time.monotonic())
                    dropped += 1
                    self._outcomes.covered(batch, message, _wall_ms())
                elif first_kept is None:
                    first_kept = key
            batch.put(_META_CHECKPOINT, cp.to_bytes(), self._meta_cf)
            batch.put(_META_PENDING, _U64.pack(self._pending - dropped), self._meta_cf)
            self._write(batch)
            self._pending -= dropped
            self._checkpoint = cp
            # Never below the floor it started from: a claim behind the last scan (a round
            # cut short among entries due in the same millisecond) would send every later scan
            # back over all the deletions since, a cost that grows with each round of a burst.
            self._floor = first_kept or max(self._floor, due_bound(cp.time_ms + 1))
        return dropped

    # -- outcomes (outcomes.py) -------------------------------------------------------------

    def _write(self, batch: WriteBatch) -> None:
        """Write ``batch`` with the outcomes' pruning and count (under the lock)."""
        self._outcomes.finish(batch, _wall_ms())
        try:
            self._db.write(batch)
        except BaseException:
            self._outcomes.abort()
            raise
        self._outcomes.commit()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")

    def close(self) -> None:
        """Flush memtables and close RocksDB; further calls raise StoreError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._db.flush()
            # Column-family views share the DB; all must go for RocksDB to release its LOCK.
            self._ids.close()
            self._meta.close()
            self._outcomes.close()
            del self._ids, self._meta, self._ids_cf, self._meta_cf, self._cancels, self._outcomes
            self._db.close()

    def due_skipping(
        self,
        now_ms: int,
        limit: int,
        skip: Collection[tuple[str, int]],
        max_skipped: int,
        known: dict[bytes, tuple[str, int]] | None = None,
    ) -> DueScan:
        """Like :meth:`due`, but passes over entries whose target (topic, partition) is in
        ``skip``, so one held target cannot fill the scan and starve the others. Stops after
        ``limit`` entries returned or ``max_skipped`` passed over (``truncated``). ``known``
        caches the target of each entry passed over (a key's target never changes), so the
        next scan passes over it without decoding it again."""
        out: list[Entry] = []
        known = {} if known is None else known
        skipped, first_skipped_ms, last_ms, first, cut = 0, None, None, None, False
        with self._lock:
            self._check_open()
            for key, value in self._iter_from_floor(due_bound(now_ms + 1)):
                first = first or key
                last_ms, partition, offset = split_key(key)
                if known.get(key) not in skip:
                    message = decode_entry(value)
                    target = (message.topic, message.partition)
                    if target not in skip:
                        out.append(Entry(key, message, partition, offset))
                        cut = len(out) >= limit
                        if cut:
                            break
                        continue
                    known[key] = target
                skipped += 1
                first_skipped_ms = last_ms if first_skipped_ms is None else first_skipped_ms
                cut = skipped >= max_skipped
                if cut:
                    break
            self._floor = first or self._floor
        return DueScan(out, skipped, first_skipped_ms, last_ms, truncated=cut)
