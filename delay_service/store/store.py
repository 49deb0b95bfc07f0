"""A replica's pending set in RocksDB (rocksdict), with the consumed buffer offsets.

Its column families, key prefixes and byte formats are all in ``keyspace.py``.

Every change (entries, ids, offsets, count, open cancels, owed tombstones) is one WriteBatch,
so after any crash the store is exactly "the first K records of each buffer partition, applied".

Scans stay fast after millions of deletions: entries are deleted in key order, so the store keeps
a *floor* (no live entry sorts below it) and every scan seeks straight to it, never walking the
point tombstones in front; an iterator upper bound stops it at the due time. (rocksdict 0.3's
``set_iterate_lower_bound`` misbehaves, so the floor is a ``seek``, not a lower bound.)

Concurrency: every public method takes one lock; the ingest thread (``apply``), the forwarder
(``due``, ``remove``, ``apply_checkpoint``) and the control thread (gauges) may call any of them.

:class:`Store` holds a ``StoreState`` (``state.py``: opening RocksDB, the state mirrored
from ``meta``, the floor, closing) and three parts that work on it and keep no state of their
own: ``scans`` (``scans.py``: the reads: due entries, held targets passed over, counts,
chunks, one id), ``writes`` (``writes.py``: the writes of consumed records) and ``releases``
(``releases.py``: the master's claims, removals, checkpoints, and the cancels that wait on a
release, ``in_round.py``). Its methods hand each call to the part that owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kdelay.buffer import Cancel, Fate
from kdelay.checkpoint import Checkpoint
from kdelay.delay_service.store.apply_result import ApplyResult, Incoming
from kdelay.delay_service.store.cancels import At
from kdelay.delay_service.store.due_scan import DueScan, Target
from kdelay.delay_service.store.entry import Entry
from kdelay.delay_service.store.outcomes import Outcome, OutcomeLog
from kdelay.delay_service.store.releases import StoreReleases
from kdelay.delay_service.store.scans import StoreScans
from kdelay.delay_service.store.state import (
    DEFAULT_STATUS_MAX_ENTRIES,
    DEFAULT_STATUS_RETENTION_MS,
    StoreState,
    wall_clock_ms,
)
from kdelay.delay_service.store.tombstones import Retired
from kdelay.delay_service.store.writes import BULK_STEP, StoreWrites

__all__ = [
    "DEFAULT_STATUS_MAX_ENTRIES",
    "DEFAULT_STATUS_RETENTION_MS",
    "ApplyResult",
    "Incoming",
    "Store",
]


class Store:
    """The pending set of one replica; open with the constructor, close with :meth:`close`.

    ``wall_ms`` stamps the outcomes (the wall clock; tests pass their own), ``outcome_log``
    is the class that keeps them (``outcomes.py``'s, or a test's spy).
    """

    def __init__(
        self,
        path: Path,
        *,
        status_retention_ms: int = DEFAULT_STATUS_RETENTION_MS,
        status_max_entries: int = DEFAULT_STATUS_MAX_ENTRIES,
        wall_ms: Callable[[], int] = wall_clock_ms,
        outcome_log: type[OutcomeLog] = OutcomeLog,
    ) -> None:
        self.state = StoreState(
            path,
            status_retention_ms=status_retention_ms,
            status_max_entries=status_max_entries,
            wall_ms=wall_ms,
            outcome_log=outcome_log,
        )
        self.path = path
        self.scans = StoreScans(self.state)
        self.writes = StoreWrites(self.state)
        self.releases = StoreReleases(self.state)

    # -- what the store holds --------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Number of pending entries (maintained, never counted by scanning)."""
        with self.state.lock:
            return self.state.pending

    def offsets(self) -> dict[int, int]:
        """Per buffer partition, the next offset to consume (everything below is applied)."""
        with self.state.lock:
            return dict(self.state.offsets)

    @property
    def open_cancels(self) -> int:
        """Cancels still able to cancel a schedule that arrives after them (cancels.py)."""
        with self.state.lock:
            self.state.check_open()
            return self.state.cancels.open

    @property
    def checkpoint(self) -> Checkpoint:
        """The last checkpoint applied (``kdelay.checkpoint.NOTHING`` before the first)."""
        with self.state.lock:
            return self.state.checkpoint

    @property
    def outcomes(self) -> int:
        """Outcomes this replica remembers."""
        with self.state.lock:
            return self.state.outcomes.count

    @property
    def floor(self) -> bytes:
        """The scan floor: no live entry sorts below this key (the top of ``store.py``)."""
        with self.state.lock:
            return self.state.floor

    @property
    def unread_releases(self) -> int:
        """Releases this replica removed as master whose tombstone it has not read back yet
        (remembered up to ``writes.RELEASED_MEMORY``, ``StoreReleases.own_tombstone``)."""
        with self.state.lock:
            return len(self.state.released)

    def owed_tombstones(self) -> list[Retired]:
        """The tombstones this store owes the buffer topic, in the order they were owed
        (``owed_tombstones.py``): what a master writes when its term begins."""
        with self.state.lock:
            if self.state.closed:
                return []
            return self.state.owed.all()

    def size_bytes(self) -> int:
        """RocksDB's size on disk: live SST files plus the write-ahead log."""
        return self.state.size_bytes()

    def close(self) -> None:
        """Flush memtables and close RocksDB; further calls raise StoreError."""
        self.state.close()

    # -- writes (writes.py) ----------------------------------------------------------------

    def apply(self, records: Iterable[Incoming], offsets: Mapping[int, int]) -> ApplyResult:
        """:meth:`StoreWrites.apply`: consumed records and offsets, atomically."""
        return self.writes.apply(records, offsets)

    def bulk_step(
        self, at: At, record: Cancel, limit: int = BULK_STEP
    ) -> tuple[list[Retired], bool]:
        """:meth:`StoreWrites.bulk_step`: a bulk cancel's next step."""
        return self.writes.bulk_step(at, record, limit)

    # -- reads (scans.py) ------------------------------------------------------------------

    def due(self, now_ms: int, limit: int) -> list[Entry]:
        """:meth:`StoreScans.due`: entries due by ``now_ms``, in key order."""
        return self.scans.due(now_ms, limit)

    def due_skipping(
        self,
        now_ms: int,
        limit: int,
        skip: Collection[Target],
        max_skipped: int,
        known: dict[bytes, Target] | None = None,
        *,
        start: bytes | None = None,
    ) -> DueScan:
        """:meth:`StoreScans.due_skipping`: due entries, passing over held targets."""
        return self.scans.due_skipping(now_ms, limit, skip, max_skipped, known, start=start)

    def next_due_ms(self, after_ms: int | None = None) -> int | None:
        """:meth:`StoreScans.next_due_ms`: the earliest deliver-at (after ``after_ms``)."""
        return self.scans.next_due_ms(after_ms)

    def count_due_within(self, now_ms: int, windows_ms: list[int], cap: int) -> list[int]:
        """:meth:`StoreScans.count_due_within`: cumulative counts per window."""
        return self.scans.count_due_within(now_ms, windows_ms, cap)

    def chunk_after(
        self, after: bytes | None, until_ms: int, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """:meth:`StoreScans.chunk_after`: one chunk of a long read."""
        return self.scans.chunk_after(after, until_ms, limit)

    def get(self, msg_id: str) -> Entry | None:
        """:meth:`StoreScans.get`: a pending entry with id ``msg_id``."""
        return self.scans.get(msg_id)

    def bulk_result(self, bulk_id: str) -> dict[str, Any] | None:
        """:meth:`StoreScans.bulk_result`: what bulk cancel ``bulk_id`` did here."""
        return self.scans.bulk_result(bulk_id)

    def outcome(self, msg_id: str) -> Outcome | None:
        """:meth:`StoreScans.outcome`: what became of the last message ``msg_id``."""
        return self.scans.outcome(msg_id)

    def history(self, msg_id: str) -> list[Outcome]:
        """:meth:`StoreScans.history`: what became of the messages ``msg_id``."""
        return self.scans.history(msg_id)

    # -- the master's releases (releases.py) -----------------------------------------------

    def claim_release(self, entries: Sequence[Entry]) -> list[Entry]:
        """:meth:`StoreReleases.claim_release`: those still pending, marked in release."""
        return self.releases.claim_release(entries)

    def in_release(self, key: bytes) -> bool:
        """:meth:`StoreReleases.in_release`: whether entry ``key`` is in a release."""
        return self.releases.in_release(key)

    def awaits_next(self, msg_id: str) -> bool:
        """:meth:`StoreReleases.awaits_next`: a cancel of ``msg_id`` awaits its next occurrence."""
        return self.releases.awaits_next(msg_id)

    def not_released(self, keys: Iterable[bytes]) -> list[Retired]:
        """:meth:`StoreReleases.not_released`: releases that surely were not written."""
        return self.releases.not_released(keys)

    def end_releases(self) -> list[Retired]:
        """:meth:`StoreReleases.end_releases`: the term as master ended."""
        return self.releases.end_releases()

    def remove(self, entries: Iterable[Entry], fates: Mapping[bytes, Fate] | None = None) -> int:
        """:meth:`StoreReleases.remove`: delete delivered or dead-lettered entries."""
        return self.releases.remove(entries, fates)

    def own_tombstone(self, partition: int, key: bytes) -> bool:
        """:meth:`StoreReleases.own_tombstone`: a tombstone of this replica's own release."""
        return self.releases.own_tombstone(partition, key)

    def apply_checkpoint(self, checkpoint: Checkpoint) -> int:
        """:meth:`StoreReleases.apply_checkpoint`: drop every entry ``checkpoint`` covers."""
        return self.releases.apply_checkpoint(checkpoint)
