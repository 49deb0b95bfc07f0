"""The store's side of the master's releases: claiming entries for a release, removing what
was released, the cancels that wait on a release (``in_round.py``), checkpoints.

- :meth:`StoreReleases.claim_release` (the forwarder, just before producing): the entries
  still pending, marked in release; a cancel that meets one of them waits for its outcome;
- :meth:`StoreReleases.remove` (the forwarder): the entries the master delivered or
  dead-lettered, and what became of each (a cancel that waited on one lost: the message was
  released); :meth:`StoreReleases.own_tombstone` then lets ingest skip the tombstones of those
  releases when they come back;
- :meth:`StoreReleases.not_released` and :meth:`StoreReleases.end_releases` (the forwarder):
  releases that surely did not happen, or a term that ended: the cancels that waited apply;
- :meth:`StoreReleases.apply_checkpoint` (either): drop every entry a checkpoint covers.

Each change is one WriteBatch with the entry count and the outcomes (``StoreState.write``;
the store's clock, ``StoreState.wall_ms``, stamps them). A part of ``store.Store``, working on
its ``StoreState``. Concurrency: see the top of ``store.py``; every method holds its lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from rocksdict import WriteBatch

from kdelay.buffer import Fate, Scheduled, accepted_ms
from kdelay.buffer.records import REPEAT_ERRORS
from kdelay.checkpoint import Checkpoint
from kdelay.delay_service.store import rocks
from kdelay.delay_service.store import writes as store_writes
from kdelay.delay_service.store.entry import Entry, decode_entry, due_bound, entry_seq, split_key
from kdelay.delay_service.store.ids import id_key
from kdelay.delay_service.store.in_round import Waiting
from kdelay.delay_service.store.keyspace import META_CHECKPOINT, META_PENDING, U64
from kdelay.delay_service.store.outcomes import DELIVERED
from kdelay.delay_service.store.state import StoreState
from kdelay.delay_service.store.tombstones import Retired


class StoreReleases:
    """The master's changes to the pending set: releases and the cancels waiting on them."""

    def __init__(self, state: StoreState) -> None:
        self._st = state

    def claim_release(self, entries: Sequence[Entry]) -> list[Entry]:
        """Those of ``entries`` still pending, each marked in release (``in_round.py``): the
        forwarder produces only these. One a cancel removed since the round's scan is left
        out: it is never released."""
        if not entries:
            return []
        index_keys = [id_key(e.message.id, e.message.uid) for e in entries]
        kept: list[Entry] = []
        with self._st.lock:
            self._st.check_open()
            current = rocks.multi_get(self._st.ids, index_keys)
            for entry, key in zip(entries, current, strict=True):
                if key == entry.key:
                    self._st.in_round.claim(entry.key)
                    kept.append(entry)
        return kept

    def in_release(self, key: bytes) -> bool:
        """Whether pending entry ``key`` is in a release whose outcome is not known yet."""
        with self._st.lock:
            return key in self._st.in_round

    def not_released(self, keys: Iterable[bytes]) -> list[Retired]:
        """The releases of entries ``keys`` surely were not written (an aborted transaction, a
        record refused): they leave the release, and a cancel that waited on one applies now.
        Returns the records those cancels removed, owed a tombstone."""
        with self._st.lock:
            self._st.check_open()
            return self._apply_waiting([(key, self._st.in_round.settle(key)) for key in keys])

    def end_releases(self) -> list[Retired]:
        """The term as master ended: nothing is in release any more, and every cancel that
        waited applies in this store (as the followers applied it, ``in_round.py``). Returns
        the records removed, owed a tombstone."""
        with self._st.lock:
            if self._st.closed:
                return []
            return self._apply_waiting(self._st.in_round.settle_all())

    def _apply_waiting(self, settled: Iterable[tuple[bytes, list[Waiting]]]) -> list[Retired]:
        """Apply the first cancel waiting on each entry still pending (under the lock)."""
        batch = WriteBatch(raw_mode=True)
        retired: list[Retired] = []
        now_ms, now = self._st.wall_ms(), time.monotonic()
        for key, waiting in settled:
            if not waiting or (value := self._st.db.get(key)) is None:
                continue
            msg = decode_entry(bytes(value))
            index_key = id_key(msg.id, msg.uid)
            if self._st.ids.get(index_key) != key:
                continue
            batch.delete(key)
            batch.delete(index_key, self._st.ids_cf)
            self._st.done.add_key(index_key, msg.uid, now)
            first = waiting[0]
            accepted = accepted_ms(entry_seq(key))
            self._st.outcomes.cancelled(
                batch, msg.id, first.at_ms, now_ms, msg, first.by, accepted, first.state
            )
            _, partition, offset = split_key(key)
            retired.append(Retired(msg.id, msg.uid, partition, offset))
        if retired:
            self._st.owed.begin()
            self._st.owed.owe(batch, retired)  # owed_tombstones.py: whoever is master writes them
            batch.put(META_PENDING, U64.pack(self._st.pending - len(retired)), self._st.meta_cf)
            self._st.write(batch)
            self._st.pending -= len(retired)
        return retired

    def remove(self, entries: Iterable[Entry], fates: Mapping[bytes, Fate] | None = None) -> int:
        """Delete entries (delivered or dead-lettered ones); ``fates``, by entry key: what
        became of them (the master's outcome of each). A cancel that waited on one of them
        lost (``in_round.py``): the message was released, its outcome says so. Those already
        gone are skipped: a tombstone of another master retired them (claim_release keeps a
        cancelled entry from being released at all)."""
        entries = list(entries)
        index_keys = [id_key(e.message.id, e.message.uid) for e in entries]
        removed = 0
        released: list[tuple[tuple[int, bytes], int]] = []
        with self._st.lock:
            self._st.check_open()
            if not entries:
                return 0
            batch = WriteBatch(raw_mode=True)
            current = rocks.multi_get(self._st.ids, index_keys)
            now_ms, now = self._st.wall_ms(), time.monotonic()
            learnt: list[tuple[str, Fate]] = []
            for entry, index_key, key in zip(entries, index_keys, current, strict=True):
                waited = self._st.in_round.settle(entry.key)
                if key != entry.key:
                    continue
                batch.delete(entry.key)
                batch.delete(index_key, self._st.ids_cf)
                self._st.done.add_key(index_key, entry.message.uid, now)
                removed += 1
                if fates is not None and (fate := fates.get(entry.key)) is not None:
                    learnt.append((entry.message.id, fate))
                    if waited and fate.state == DELIVERED:
                        self._await_next(entry.message)
                    buffer_key = entry.message.buffer_key.encode()
                    released.append(((entry.partition, buffer_key), entry.offset))
            self._st.outcomes.learn_all(batch, learnt, "master", now_ms)
            if removed:
                batch.put(META_PENDING, U64.pack(self._st.pending - removed), self._st.meta_cf)
                self._st.write(batch)
                self._st.pending -= removed
            self._st.released.update(released)
            while len(self._st.released) > store_writes.RELEASED_MEMORY:
                self._st.released.popitem(last=False)
        return removed

    def _await_next(self, msg: Scheduled) -> None:
        """Occurrence ``msg`` of a series was released while a cancel waited on it: its
        release wrote the next occurrence, which decides that cancel (``in_round.py``), unless
        the store read it already or the series ends here."""
        try:
            due = msg.next_due()
        except REPEAT_ERRORS:
            return  # the series ended here (release/series.py)
        if due is None:
            return
        uid = msg.next_occurrence(due, 0).uid
        index_key = id_key(msg.id, uid)
        if index_key not in self._st.done and self._st.ids.get(index_key) is None:
            self._st.in_round.await_next(msg.id, uid)

    def awaits_next(self, msg_id: str) -> bool:
        """Whether a cancel of ``msg_id`` waits for its series' next occurrence to be read."""
        with self._st.lock:
            return self._st.in_round.awaits(msg_id)

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
        with self._st.lock:
            return self._st.released.pop((partition, key), None) is not None

    def apply_checkpoint(self, checkpoint: Checkpoint) -> int:
        """Remember a checkpoint and drop every entry it covers; returns how many were dropped.

        Later schedules it covers (a replica still catching up) are skipped by :meth:`apply`.
        """
        dropped = 0
        cp = Checkpoint(checkpoint.time_ms, dict(checkpoint.offsets))  # a copy nobody mutates
        with self._st.lock:
            self._st.check_open()
            batch = WriteBatch(raw_mode=True)
            first_kept: bytes | None = None
            for key, value in self._st.iter_from_floor(due_bound(cp.time_ms + 1)):
                deliver_at, partition, offset = split_key(key)
                if cp.covers(partition, offset, deliver_at):
                    batch.delete(key)
                    message = decode_entry(value)
                    index_key = id_key(message.id, message.uid)
                    batch.delete(index_key, self._st.ids_cf)
                    self._st.done.add_key(index_key, message.uid, time.monotonic())
                    dropped += 1
                    accepted = accepted_ms(entry_seq(key))
                    self._st.outcomes.covered(batch, message, self._st.wall_ms(), accepted)
                elif first_kept is None:
                    first_kept = key
            batch.put(META_CHECKPOINT, cp.to_bytes(), self._st.meta_cf)
            batch.put(META_PENDING, U64.pack(self._st.pending - dropped), self._st.meta_cf)
            self._st.write(batch)
            self._st.pending -= dropped
            self._st.checkpoint = cp
            # Never below the floor it started from: a claim behind the last scan (a round
            # cut short among entries due in the same millisecond) would send every later scan
            # back over all the deletions since, a cost that grows with each round of a burst.
            self._st.floor = first_kept or max(self._st.floor, due_bound(cp.time_ms + 1))
        return dropped
