"""What an open store holds: RocksDB, its column families, the state mirrored from ``meta``.

:class:`StoreState` opens RocksDB (``rocks.py``'s options), loads what ``meta`` keeps (the
entry count, the consumed offset of each buffer partition, the last checkpoint applied),
finds the scan *floor* (no live entry sorts below it), rebuilds the ``ids`` family of a store
written before buffer keys, and closes it all. ``store.Store`` holds one and hands it to its
parts, which keep no state of their own: its reads (``store/scans.py``), its writes
(``store/writes.py``) and the master's releases (``store/releases.py``); the layout, the
atomicity of each change and the concurrency contract are at the top of ``store.py``.

Its attributes are the parts' shared state, public to them: every part holds ``lock`` while it
touches any of it. Outcomes are stamped with ``wall_ms`` (the store's clock, injected in tests).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from rocksdict import Rdict, RdictIter, ReadOptions, WriteBatch

from kdelay.checkpoint import NOTHING, Checkpoint
from kdelay.delay_service.errors import StoreError
from kdelay.delay_service.store import rocks
from kdelay.delay_service.store.bulk_cancels import BulkMemory
from kdelay.delay_service.store.cancels import CancelMemory
from kdelay.delay_service.store.entry import due_bound
from kdelay.delay_service.store.ids import RecentlyDone, reindex
from kdelay.delay_service.store.in_round import InRound
from kdelay.delay_service.store.keyspace import (
    CF_IDS,
    CF_META,
    META_CHECKPOINT,
    META_OFFSET,
    META_PENDING,
    U64,
)
from kdelay.delay_service.store.keyspace import IDS_FORMAT as _IDS_FORMAT
from kdelay.delay_service.store.keyspace import META_IDS_FORMAT as _META_IDS
from kdelay.delay_service.store.outcomes import OutcomeLog
from kdelay.delay_service.store.owed_tombstones import OwedTombstones

#: How long, and how many, outcomes a replica keeps for message status (outcomes.py).
DEFAULT_STATUS_RETENTION_MS = 3_600_000
DEFAULT_STATUS_MAX_ENTRIES = 1_000_000


def wall_clock_ms() -> int:
    """The store's default clock: the wall clock, in milliseconds."""
    return int(time.time() * 1000)


class StoreState:
    """RocksDB and the state a store keeps in memory; opened by the constructor."""

    def __init__(
        self,
        path: Path,
        *,
        status_retention_ms: int = DEFAULT_STATUS_RETENTION_MS,
        status_max_entries: int = DEFAULT_STATUS_MAX_ENTRIES,
        wall_ms: Callable[[], int] = wall_clock_ms,
        outcome_log: type[OutcomeLog] = OutcomeLog,
    ) -> None:
        self.path = path
        self.wall_ms = wall_ms
        path.mkdir(parents=True, exist_ok=True)
        opts, cfs = rocks.options()
        try:
            self.db = Rdict(str(path), opts, column_families=cfs)
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise StoreError(f"cannot open RocksDB at {path}: {exc}") from exc
        self.ids = self.db.get_column_family(CF_IDS)
        self.meta = self.db.get_column_family(CF_META)
        self.ids_cf = self.db.get_column_family_handle(CF_IDS)
        self.meta_cf = self.db.get_column_family_handle(CF_META)
        self.lock = threading.Lock()
        self.closed = False
        # Records that left (delivered, cancelled, replaced): a late copy is a duplicate.
        self.done = RecentlyDone()
        self.in_round = InRound()  # entries the master is releasing (in_round.py)
        # What this replica removed as master ((buffer partition, buffer key) -> buffer
        # offset), until it reads the tombstone back: that tombstone has nothing to tell it
        # (entry and index gone, the outcome known from the master itself), so ingest skips it
        # at once, before decoding it (``StoreReleases.own_tombstone``). Bounded: the
        # oldest are forgotten first, and a forgotten one is applied the long way. An
        # OrderedDict: a plain dict's oldest key (``next(iter(d))``) is found by stepping over
        # the slots of every key deleted before it, which made each release past the bound
        # cost up to 60 µs (a release of 600,000 at once, ``bench.store_release``).
        self.released: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        raw = self.meta.get(META_PENDING)
        self.pending = U64.unpack(raw)[0] if raw else 0
        self.offsets: dict[int, int] = {}
        it = self.meta.iter()
        it.seek(META_OFFSET)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(META_OFFSET):
                break
            self.offsets[int(key[len(META_OFFSET) :])] = U64.unpack(it.value())[0]
            it.next()
        raw_cp = self.meta.get(META_CHECKPOINT)
        self.checkpoint = Checkpoint.from_bytes(bytes(raw_cp)) if raw_cp else NOTHING
        self.floor: bytes = self._first_key() or due_bound(0)
        self.cancels = CancelMemory(self.meta, self.meta_cf)
        self.bulks = BulkMemory(self.meta, self.meta_cf)
        self.owed = OwedTombstones(self.meta, self.meta_cf)  # owed_tombstones.py
        self.outcomes = outcome_log(
            self.db,
            self.meta,
            self.meta_cf,
            retention_ms=status_retention_ms,
            max_entries=status_max_entries,
        )
        if self.meta.get(_META_IDS) != _IDS_FORMAT:
            self._index_again()

    def _index_again(self) -> None:
        """Rebuild the ids family: a store written when it was keyed by the id alone (before
        buffer keys) opens with today's index keys."""
        batch = reindex(self.db, self.ids, self.ids_cf)
        batch.put(_META_IDS, _IDS_FORMAT, self.meta_cf)
        self.db.write(batch)

    def _first_key(self) -> bytes | None:
        it = self.db.iter()
        it.seek_to_first()
        return bytes(it.key()) if it.valid() else None

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

    # -- iterating from the floor (under the lock) -----------------------------------------

    def cursor_at_floor(self, upper: bytes) -> tuple[RdictIter, ReadOptions]:
        """A RocksDB iterator over the entries below ``upper``, at the first one, and its read
        options: keep them as long as the iterator. RocksDB's iterator points at the upper
        bound that rocksdict (0.3) frees with the ReadOptions object; once it was freed, a scan
        stopped wherever the reused memory sorted (after 1 of 53 entries, in a test)."""
        ro = ReadOptions()
        ro.set_iterate_upper_bound(upper)
        it = self.db.iter(ro)
        it.seek(self.floor)
        return it, ro

    def iter_from_floor(self, upper: bytes) -> Iterable[tuple[bytes, bytes]]:
        it, _bound = self.cursor_at_floor(upper)  # the bound lives as long as this generator
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    # -- writing (under the lock) ----------------------------------------------------------

    def write(self, batch: WriteBatch) -> None:
        """Write ``batch`` with the outcomes' pruning and count, and take the owed tombstones it
        records (under the lock)."""
        self.outcomes.finish(batch, self.wall_ms())
        try:
            self.db.write(batch)
        except BaseException:
            self.outcomes.abort()
            self.owed.abort()
            raise
        self.outcomes.commit()
        self.owed.commit()

    # -- life cycle ------------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise StoreError(f"store {self.path} is closed")

    def close(self) -> None:
        """Flush memtables and close RocksDB; further calls raise StoreError."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.db.flush()
            # Column-family views share the DB; all must go for RocksDB to release its LOCK.
            self.ids.close()
            self.meta.close()
            self.outcomes.close()
            del self.ids, self.meta, self.ids_cf, self.meta_cf, self.cancels, self.outcomes
            del self.bulks, self.owed
            self.db.close()
