"""What an open store holds: RocksDB, its column families, the state mirrored from ``meta``.

:class:`StoreState` opens RocksDB (``rocks.py``'s options), loads what ``meta`` keeps (the
entry count, the consumed offset of each buffer partition, the last checkpoint applied),
finds the scan *floor* (no live entry sorts below it), rebuilds the ``ids`` family of a store
written before buffer keys, and closes it all. It is the base of ``store.Store``: its reads are
in ``store/scans.py``, its writes in ``store/writes.py``; the layout, the atomicity of each
change and the concurrency contract are at the top of ``store.py``.

Concurrency: the subclasses' public methods hold ``_lock`` while they touch any of this state;
the properties here take it themselves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from rocksdict import Rdict, RdictIter, ReadOptions

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
from kdelay.delay_service.store.tombstones import Retired

#: How long, and how many, outcomes a replica keeps for message status (outcomes.py).
DEFAULT_STATUS_RETENTION_MS = 3_600_000
DEFAULT_STATUS_MAX_ENTRIES = 1_000_000


class StoreState:
    """RocksDB and the state a store keeps in memory; opened by the constructor."""

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
        self._ids = self._db.get_column_family(CF_IDS)
        self._meta = self._db.get_column_family(CF_META)
        self._ids_cf = self._db.get_column_family_handle(CF_IDS)
        self._meta_cf = self._db.get_column_family_handle(CF_META)
        self._lock = threading.Lock()
        self._closed = False
        # Records that left (delivered, cancelled, replaced): a late copy is a duplicate.
        self._done = RecentlyDone()
        self._in_round = InRound()  # entries the master is releasing (in_round.py)
        # What this replica removed as master ((buffer partition, buffer key) -> buffer
        # offset), until it reads the tombstone back: that tombstone has nothing to tell it
        # (entry and index gone, the outcome known from the master itself), so ingest skips it
        # at once, before decoding it (``Store.own_tombstone``). Bounded: the
        # oldest are forgotten first, and a forgotten one is applied the long way. An
        # OrderedDict: a plain dict's oldest key (``next(iter(d))``) is found by stepping over
        # the slots of every key deleted before it, which made each release past the bound
        # cost up to 60 µs (a release of 600,000 at once, ``bench.store_release``).
        self._released: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        raw = self._meta.get(META_PENDING)
        self._pending = U64.unpack(raw)[0] if raw else 0
        self._offsets: dict[int, int] = {}
        it = self._meta.iter()
        it.seek(META_OFFSET)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(META_OFFSET):
                break
            self._offsets[int(key[len(META_OFFSET) :])] = U64.unpack(it.value())[0]
            it.next()
        raw_cp = self._meta.get(META_CHECKPOINT)
        self._checkpoint = Checkpoint.from_bytes(bytes(raw_cp)) if raw_cp else NOTHING
        self._floor = self._first_key() or due_bound(0)
        self._cancels = CancelMemory(self._meta, self._meta_cf)
        self._bulks = BulkMemory(self._meta, self._meta_cf)
        self._owed = OwedTombstones(self._meta, self._meta_cf)  # owed_tombstones.py
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

    def _first_key(self) -> bytes | None:
        it = self._db.iter()
        it.seek_to_first()
        return bytes(it.key()) if it.valid() else None

    # -- counters kept in meta -------------------------------------------------------------

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

    @property
    def outcomes(self) -> int:
        """Outcomes this replica remembers."""
        with self._lock:
            return self._outcomes.count

    def owed_tombstones(self) -> list[Retired]:
        """The tombstones this store owes the buffer topic, in the order they were owed
        (``owed_tombstones.py``): what a master writes when its term begins."""
        with self._lock:
            if self._closed:
                return []
            return self._owed.all()

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

    def _cursor_at_floor(self, upper: bytes) -> tuple[RdictIter, ReadOptions]:
        """A RocksDB iterator over the entries below ``upper``, at the first one, and its read
        options: keep them as long as the iterator. RocksDB's iterator points at the upper
        bound that rocksdict (0.3) frees with the ReadOptions object; once it was freed, a scan
        stopped wherever the reused memory sorted (after 1 of 53 entries, in a test)."""
        ro = ReadOptions()
        ro.set_iterate_upper_bound(upper)
        it = self._db.iter(ro)
        it.seek(self._floor)
        return it, ro

    def _iter_from_floor(self, upper: bytes) -> Iterable[tuple[bytes, bytes]]:
        it, _bound = self._cursor_at_floor(upper)  # the bound lives as long as this generator
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    # -- life cycle ------------------------------------------------------------------------

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
            del self._bulks, self._owed
            self._db.close()
