"""The store's writes: consumed records, the master's removals, checkpoints; one WriteBatch each.

- :meth:`StoreWrites.apply` (the ingest thread): consumed buffer records and the offsets they
  advance, with the index (``ids.py``), the open cancels (``cancels.py``) and the outcomes
  they decide;
- :meth:`StoreWrites.bulk_step` (the ingest thread): a bulk cancel's next step;
- the master's releases and checkpoints: ``store/releases.py``.

A cancel that meets an entry the master is releasing leaves it and waits for the release's
outcome (``in_round.py``). What a cancel, a bulk cancel or a replace removed is remembered
as delivered records are (``ids.RecentlyDone``): a later copy of it is a duplicate.

Each is one WriteBatch with the entry count and the outcomes' pruning (``StoreState.write``),
so after any crash the store is exactly "the first K records of each buffer partition, applied".
Outcomes are stamped with the store's clock (``StoreState.wall_ms``, injected in tests).

A part of ``store.Store``: it keeps no state of its own beyond one apply's, and works on the
store's ``StoreState``. Concurrency: see the top of ``store.py``; every method holds its lock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from kdelay.buffer import (
    CANCEL_SENT_WITH_MS as SENT_WITH_MS,
)
from kdelay.buffer import (
    Cancel,
    Scheduled,
    accepted_ms,
    may_cancel,
)
from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.delay_service.store.apply_result import ApplyResult, Incoming
from kdelay.delay_service.store.bulk_cancels import ids_with_prefix, matching
from kdelay.delay_service.store.cancels import At, CancelBatch
from kdelay.delay_service.store.entry import (
    decode_entry,
    entry_key,
    entry_owner,
    entry_producer_seq,
    entry_seq,
    split_key,
)
from kdelay.delay_service.store.ids import IndexedBatch, id_key, uid_of
from kdelay.delay_service.store.in_round import Waiting
from kdelay.delay_service.store.keyspace import META_OFFSET, META_PENDING, U64
from kdelay.delay_service.store.outcomes import CANCELLED, DELIVERED, REPLACED, Canceller
from kdelay.delay_service.store.state import StoreState
from kdelay.delay_service.store.tombstones import Retired

#: Pending entries one :meth:`StoreWrites.bulk_step` examines at most (one WriteBatch; the
#: store's lock held about 0.25 s at 25 µs an entry, bench/bulk_cancel.py).
BULK_STEP = 10_000
#: Releases this replica removed as master whose tombstone it has not read back yet, at most.
RELEASED_MEMORY = 200_000


class StoreWrites:
    """Changes to the pending set, each atomic with the offsets, count and outcomes."""

    def __init__(self, state: StoreState) -> None:
        self._st = state
        #: Owners of the entries the running :meth:`apply` added, by entry key.
        self._owners: dict[bytes, str | None] = {}
        #: The entries the running :meth:`apply` added, by entry key (for a bulk cancel).
        self._added: dict[bytes, Scheduled] = {}

    def apply(self, records: Iterable[Incoming], offsets: Mapping[int, int]) -> ApplyResult:
        """Apply consumed buffer records and advance the consumed offsets, atomically.

        Schedule of a record already pending (same id and buffer key): a duplicate, the first
        one stays; a schedule reusing a pending id with a new buffer key is a new message,
        unless an open cancel cancels it on arrival (``cancels.py``). Cancel: removes every
        entry with its id (retired with them), and stays open; when it matched nothing, its
        tombstone is owed when it closes. Replace (a schedule with ``replace``): unless an
        open cancel cancels it on arrival (then it does nothing at all: what it would replace
        was sent after it), a cancel of its id at its own position, then pending itself.
        Tombstone: removes the entry of exactly that record (id, buffer key and offset). A
        schedule the last checkpoint covers was delivered already and is skipped. Cancels and
        replaces leave pending what their sender may not cancel (another principal's message,
        README "Message owners"): ``result.refused``.
        """
        result = ApplyResult()
        with self._st.lock:
            self._st.check_open()
            txn = IndexedBatch(self._st.ids, self._st.ids_cf, self._st.floor)
            cancels = self._st.cancels.begin(txn.batch)
            self._st.bulks.begin()
            self._owners, self._added = {}, {}
            self._st.owed.begin()
            owed = 0  # result.retired[:owed] are recorded as owed (owed_tombstones.py)
            for item in records:
                record, at = item[2], (item[0], item[1], item[3] if len(item) == 4 else None)
                result.retired += cancels.advance(at[0], at[2])
                result.retired += self._st.bulks.advance(txn.batch, at[2])
                if record is None:
                    result.invalid += 1
                elif isinstance(record, Scheduled):
                    self._apply_schedule(txn, cancels, result, at, record)
                elif isinstance(record, Cancel) and record.prefix is not None:
                    self._apply_bulk(txn, result, at, record)
                elif isinstance(record, Cancel):
                    self._apply_cancel(txn, cancels, result, at, record)
                else:
                    self._st.owed.owe(txn.batch, result.retired[owed:])
                    owed = len(result.retired)
                    self._st.owed.paid(txn.batch, at[0], record.buffer_key)
                    released = self._st.released.pop((at[0], record.buffer_key.encode()), None)
                    if released == record.offset:
                        continue  # our own release (see state.py)
                    index_key = id_key(record.id, record.uid)
                    retiring = txn.lookup(index_key)
                    if retiring is not None and split_key(retiring)[2] == record.offset:
                        txn.delete(index_key, retiring)
                        self._st.done.add_key(index_key, record.uid, time.monotonic())
                        result.tombstoned += 1
                    if record.fate is not None:
                        self._st.outcomes.learn(
                            txn.batch, record.id, record.fate, "tombstone", self._st.wall_ms()
                        )
            new_offsets = dict(self._st.offsets)
            for partition, next_offset in offsets.items():
                if next_offset > new_offsets.get(partition, -1):
                    new_offsets[partition] = next_offset
                    txn.batch.put(
                        META_OFFSET + str(partition).encode(),
                        U64.pack(next_offset),
                        self._st.meta_cf,
                    )
            self._st.owed.owe(txn.batch, result.retired[owed:])
            txn.batch.put(META_PENDING, U64.pack(self._st.pending + txn.delta), self._st.meta_cf)
            cancels.finish()
            self._st.write(txn.batch)
            cancels.commit()
            result.refused = cancels.refused
            self._st.pending += txn.delta
            self._st.offsets = new_offsets
            self._st.floor = txn.floor
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
        self._st.in_round.arrived(record.buffer_key)  # a cancel may await it (in_round.py)
        if self._st.checkpoint.covers(partition, offset, record.deliver_at_ms):
            result.covered += 1
        elif (index_key := id_key(record.id, record.uid)) in self._st.done or txn.lookup(
            index_key
        ) is not None:
            result.duplicates += 1
        elif (found := cancels.on_arrival(at, record)) is not None:
            retired, by = found
            result.retired.append(retired)
            self._gone([retired])
            self._st.outcomes.cancelled(txn.batch, record.id, at[2], self._st.wall_ms(), record, by)
            result.cancelled += 1
            result.cancelled_on_arrival += 1
        elif self._st.bulks.open and (
            bulk := self._st.bulks.on_arrival(txn.batch, record, accepted_ms(record.seq), partition)
        ):
            result.retired.append(Retired(record.id, record.uid, partition, offset))
            self._gone(result.retired[-1:])
            by = (bulk.owner, bulk.admin)
            self._st.outcomes.cancelled(txn.batch, record.id, at[2], self._st.wall_ms(), record, by)
            result.cancelled += 1
            result.cancelled_on_arrival += 1
            result.bulk_cancelled += 1
        else:
            if record.replace:
                # A cancel of everything before it with its id (and, while open, of what was
                # sent with it), owing no tombstone of its own: its delivery retires it.
                keys: list[bytes] = []
                deferred: list[bytes] = []
                removed, owed = cancels.cancel(
                    txn,
                    at,
                    Cancel(
                        record.id,
                        owner=record.owner,
                        admin=record.admin,
                        producer_seq=record.producer_seq,
                    ),
                    in_release=self._st.in_round,
                    deferred=deferred,
                    replace=True,
                    owner_of=self._owner_of,
                    keys=keys,
                    series=record.buffer_key,  # its own series is not cancelled by it
                    sequence_of=self._sequence_of,
                )
                result.cancelled += len(removed)
                result.replaced += len(removed)
                result.retired += [*removed, *owed]
                self._gone(removed)
                self._wait_on(deferred, at, (record.owner, record.admin), REPLACED)
                self._record_cancels(
                    txn, record.id, at, keys, (record.owner, record.admin), REPLACED
                )
            key = entry_key(record.deliver_at_ms, partition, offset, record.seq)
            txn.put(record, key, index_key)
            self._owners[key] = record.owner
            self._added[key] = record
            result.scheduled += 1
            if result.earliest_new_ms is None or record.deliver_at_ms < result.earliest_new_ms:
                result.earliest_new_ms = record.deliver_at_ms

    def _apply_cancel(
        self, txn: IndexedBatch, cancels: CancelBatch, result: ApplyResult, at: At, record: Cancel
    ) -> None:
        """Apply the cancel of one id ``record`` read at ``at`` (``cancels.py``), and count
        what it found (``result.cancel_outcomes``)."""
        keys: list[bytes] = []
        deferred: list[bytes] = []
        removed, owed = cancels.cancel(
            txn,
            at,
            record,
            owner_of=self._owner_of,
            keys=keys,
            in_release=self._st.in_round,
            deferred=deferred,
            sequence_of=self._sequence_of,
        )
        result.cancelled += len(removed)
        result.retired += [*removed, *owed]
        self._gone(removed)
        self._wait_on(deferred, at, (record.owner, record.admin), CANCELLED)
        if deferred and not removed:  # it met only a message being released: delivered?
            result.cancel_outcomes["already_delivered"] += 1
            return
        if removed:
            self._record_cancels(txn, record.id, at, keys, (record.owner, record.admin))
            result.cancel_outcomes["cancelled"] += 1
            return
        last = self._st.outcomes.get(record.id)
        delivered = last is not None and last.state == DELIVERED
        result.cancel_outcomes["already_delivered" if delivered else "unknown"] += 1

    def _apply_bulk(self, txn: IndexedBatch, result: ApplyResult, at: At, record: Cancel) -> None:
        """Apply bulk cancel ``record`` read at ``at`` to every pending entry in its scope
        (``bulk_cancels.py``: rule 1) that :meth:`bulk_step` did not reach yet, then open it
        (rule 2) with its count, the steps' included."""
        assert record.prefix is not None
        if self._st.bulks.applied(record.id, at[0]):  # its partition's copy, read again
            result.retired.append(Retired(record.id, record.uid, at[0], at[1]))
            return
        now = self._st.wall_ms()
        cursor, cancelled, refused = self._st.bulks.progress(at)
        done = cancelled
        for index_key, key in matching(txn, self._st.ids, record.prefix, after=cursor):
            found = self._bulk_one(txn, record, at, index_key, key, result.retired, now)
            cancelled += found > 0
            refused += found < 0
        first = self._st.bulks.opened(txn.batch, at, record, cancelled, refused, now)
        result.cancelled += cancelled - done
        result.bulk_cancels += first
        result.bulk_cancelled += cancelled - done
        result.bulk_refused += refused
        result.bulk_total += cancelled

    def _bulk_one(  # noqa: PLR0917 - one entry of one bulk cancel, in one private call
        self,
        txn: IndexedBatch,
        record: Cancel,
        at: At,
        index_key: bytes,
        key: bytes,
        retired: list[Retired],
        now_ms: int,
    ) -> int:
        """Bulk cancel ``record`` (read at ``at``) on the pending entry ``key``: 1 cancelled
        (deleted in ``txn``, its record in ``retired``), -1 refused (another principal's), 0
        not in its scope (another topic, sent after it, or another partition than that of its
        copy: ``bulk_cancels.py``, "Copies")."""
        _, p, o = split_key(key)
        time_ms = at[2]
        accepted = accepted_ms(entry_seq(key))
        late = time_ms is not None and accepted is not None and accepted > time_ms + SENT_WITH_MS
        if late or (p != at[0] and bulk_copies(record.id) is not None):
            return 0  # sent after the bulk cancel, or another copy's partition
        msg = self._added.get(key)
        if msg is None:
            value = self._st.db.get(key)
            if value is None:
                return 0
            msg = decode_entry(bytes(value))
        if record.topic is not None and msg.topic != record.topic:
            return 0
        if not may_cancel(record.owner, record.admin, msg.owner):
            return -1
        by = (record.owner, record.admin)
        if key in self._st.in_round:  # being released: it applies only if the release does not
            self._wait_on([key], at, by, CANCELLED)
            return 0
        txn.delete(index_key, key)
        retired.append(Retired(msg.id, uid_of(index_key), p, o))
        self._gone(retired[-1:])
        self._st.outcomes.cancelled(txn.batch, msg.id, time_ms, now_ms, msg, by, accepted)
        return 1

    def bulk_step(
        self, at: At, record: Cancel, limit: int = BULK_STEP
    ) -> tuple[list[Retired], bool]:
        """Apply bulk cancel ``record`` (read at ``at``, not applied yet) to up to ``limit``
        more of the pending entries in its scope, in a WriteBatch of its own with its progress
        (where it got to, what it counted: ``bulk_cancels.py``), so the store's lock is free
        between steps for the forwarder and the queries; :meth:`apply` does the rest and
        opens it. Ingest calls it until it returns done, then applies its batch. Returns the
        records it cancelled (owed tombstones) and whether its scope is exhausted. A record
        already applied (its offset consumed): nothing, done. After a crash the next step
        starts where the last written one stopped."""
        assert record.prefix is not None
        with self._st.lock:
            self._st.check_open()
            if at[1] < self._st.offsets.get(at[0], 0) or self._st.bulks.applied(record.id, at[0]):
                return [], True
            self._added = {}
            self._st.owed.begin()
            txn = IndexedBatch(self._st.ids, self._st.ids_cf, self._st.floor)
            cursor, cancelled, refused = self._st.bulks.progress(at)
            retired: list[Retired] = []
            now, visited, done = self._st.wall_ms(), 0, True
            for index_key, key in ids_with_prefix(self._st.ids, record.prefix, after=cursor):
                if visited >= limit:
                    done = False
                    break
                visited += 1
                cursor = index_key
                found = self._bulk_one(txn, record, at, index_key, key, retired, now)
                cancelled += found > 0
                refused += found < 0
            if not visited:
                return [], True
            assert cursor is not None
            self._st.bulks.step(txn.batch, at, cursor, cancelled, refused)
            self._st.owed.owe(txn.batch, retired)
            txn.batch.put(META_PENDING, U64.pack(self._st.pending + txn.delta), self._st.meta_cf)
            self._st.write(txn.batch)
            self._st.pending += txn.delta
            self._st.floor = txn.floor
        return retired, done

    def _record_cancels(  # noqa: PLR0917 - one cancel's facts, in one private call
        self,
        txn: IndexedBatch,
        msg_id: str,
        at: At,
        keys: list[bytes],
        by: Canceller,
        state: str = CANCELLED,
    ) -> None:
        """The outcome of each pending entry ``keys`` of ``msg_id`` that a cancel (or a
        replace, ``state``) read at ``at`` and sent by ``by`` removed: each in the history."""
        now = self._st.wall_ms()
        for key in keys:
            msg = self._message_at(key)
            accepted = accepted_ms(entry_seq(key))
            self._st.outcomes.cancelled(txn.batch, msg_id, at[2], now, msg, by, accepted, state)

    def _gone(self, removed: Iterable[Retired]) -> None:
        """Remember records a cancel or replace removed: a later copy is a duplicate."""
        for r in removed:
            self._st.done.add(r.id, r.uid, time.monotonic())

    def _wait_on(self, keys: Iterable[bytes], at: At, by: Canceller, state: str) -> None:
        """A cancel read at ``at`` met entries ``keys`` in release: it waits for the outcome."""
        for key in keys:
            self._st.in_round.wait(key, Waiting(at[2], by, state))

    def _message_at(self, key: bytes) -> Scheduled | None:
        """The message of the pending entry ``key`` (under the lock, inside :meth:`apply`):
        one this batch added, or one in the store."""
        if key in self._added:
            return self._added[key]
        value = self._st.db.get(key)
        return None if value is None else decode_entry(bytes(value))

    def _owner_of(self, key: bytes) -> str | None:
        """The owner of the pending entry ``key`` (under the lock, inside :meth:`apply`):
        one this batch added, or one in the store."""
        if key in self._owners:
            return self._owners[key]
        value = self._st.db.get(key)
        return None if value is None else entry_owner(bytes(value))

    def _sequence_of(self, key: bytes) -> str | None:
        """The producer-sequence stamp of the pending entry ``key`` (as :meth:`_owner_of`)."""
        if key in self._added:
            return self._added[key].producer_seq
        value = self._st.db.get(key)
        return None if value is None else entry_producer_seq(bytes(value))
