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

:class:`Store` is assembled from four modules: ``state.py`` (opening RocksDB, the state
mirrored from ``meta``, the floor, closing), ``scans.py`` (the reads: due entries, held
targets passed over, counts, chunks, one id), ``writes.py`` (the writes of consumed
records) and ``releases.py`` (the master's: claims, removals, checkpoints, and the
cancels that wait on a release, ``in_round.py``).
"""

from __future__ import annotations

from kdelay.delay_service.store.apply_result import ApplyResult, Incoming
from kdelay.delay_service.store.releases import StoreReleases
from kdelay.delay_service.store.scans import StoreScans
from kdelay.delay_service.store.state import DEFAULT_STATUS_MAX_ENTRIES, DEFAULT_STATUS_RETENTION_MS

__all__ = [
    "DEFAULT_STATUS_MAX_ENTRIES",
    "DEFAULT_STATUS_RETENTION_MS",
    "ApplyResult",
    "Incoming",
    "Store",
]


class Store(StoreReleases, StoreScans):
    """The pending set of one replica; open with the constructor, close with :meth:`close`."""
