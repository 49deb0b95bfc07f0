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
  (``cancels.py``, ``cancel_keys.py``: a cancel also cancels a schedule sent with it that
  arrives after it); ``bulk/...``: bulk cancels (``bulk_cancels.py``); ``owed/<partition>
  <buffer key>``: the tombstones this store owes the buffer topic until it reads them back
  (``owed_tombstones.py``).
- ``outcomes``, ``outcome_time``: what became of the messages that left the store, for their
  status (``outcomes.py``), written in the same WriteBatch as the change that made them.

Every change (entries, ids, offsets, count, open cancels, owed tombstones) is one WriteBatch,
so after any crash the store is exactly "the first K records of each buffer partition, applied".

Scans stay fast after millions of deletions: entries are deleted in key order, so the store keeps
a *floor* (no live entry sorts below it) and every scan seeks straight to it, never walking the
point tombstones in front; an iterator upper bound stops it at the due time. (rocksdict 0.3's
``set_iterate_lower_bound`` misbehaves, so the floor is a ``seek``, not a lower bound.)

Concurrency: every public method takes one lock; the ingest thread (``apply``), the forwarder
(``due``, ``remove``, ``apply_checkpoint``) and the control thread (gauges) may call any of them.

:class:`Store` is assembled from four modules: ``store_state.py`` (opening RocksDB, the state
mirrored from ``meta``, the floor, closing), ``store_scans.py`` (the reads: due entries, held
targets passed over, counts, chunks, one id), ``store_writes.py`` (the writes of consumed
records) and ``store_releases.py`` (the master's: claims, removals, checkpoints, and the
cancels that wait on a release, ``in_round.py``).
"""

from __future__ import annotations

from kdelay.delay_service.apply_result import ApplyResult, Incoming
from kdelay.delay_service.store_releases import StoreReleases
from kdelay.delay_service.store_scans import StoreScans
from kdelay.delay_service.store_state import DEFAULT_STATUS_MAX_ENTRIES, DEFAULT_STATUS_RETENTION_MS

__all__ = [
    "DEFAULT_STATUS_MAX_ENTRIES",
    "DEFAULT_STATUS_RETENTION_MS",
    "ApplyResult",
    "Incoming",
    "Store",
]


class Store(StoreReleases, StoreScans):
    """The pending set of one replica; open with the constructor, close with :meth:`close`."""
