"""Cancels that win whatever the arrival order: each replica remembers every cancel for a while.

A client that sends a message and its cancel in one request (or one ``flush``) cannot know in
which order they reach the buffer topic: the proxy appends a request's partitions in the order
the request lists them, so the cancel is often appended *before* its message, in the same
buffer partition (both go to the partition of the id, ``kdelay/buffer/``). So a cancel does
not only remove what is pending when it is read; it is *remembered*, and cancels a schedule
that arrives after it but was sent with it.

The rule (README "Cancelling a message"). A cancel ``C`` of id ``X``, appended to buffer
partition ``p`` at ``t_C`` (its record timestamp, the broker's LogAppendTime), cancels:

1. every message with id ``X`` pending when the replicas read ``C``, and
2. every schedule ``S`` with id ``X`` appended to ``p`` *after* ``C`` that a proxy accepted no
   later than ``t_C`` + :data:`SENT_WITH_MS` (``S``'s acceptance time is the millisecond part
   of its order field ``s``: ``ms << 20 | counter``, ``ms`` the proxy's upper bound of the
   broker's clock rounded up, ``kdelay.broker_clock``), provided ``S`` was appended at most
   :data:`WINDOW_MS` after ``C`` and ``C`` is still among the newest :data:`MAX_OPEN` cancels
   of ``p`` when ``S`` is read.

Producer sequences: a cancel and a schedule of one idempotent producer and topic-partition
(``kdelay.buffer.produced_before``) go by its sequence numbers instead: rule 1 leaves what it
produced after the cancel, rule 2 takes what it produced before, whatever the acceptance time.

Owners (README "Message owners"): behind an authenticating proxy a cancel carries the
principal that sent it and whether it is a kdelay administrator; both rules then apply it only
to messages that principal owns, to any when it is an administrator, and to messages without
an owner (``kdelay.buffer.may_cancel``). A message it may not cancel stays pending; the
refusal is counted (:attr:`CancelBatch.refused`, ``kdelay_cancels_refused_total``) and
logged by ingest. This is the source of truth: the proxy refuses another principal's cancel
already when it knows the message's owner, and this covers what it could not know (a cancel
accepted before the replicas read its message, or a cancel written to the buffer topic
around the proxy). Rule 2 looks at the newest open cancel of the id only: a refused cancel
newer than an allowed one hides the allowed one from rule 2 (rule 1 is not affected).

A schedule a proxy accepted later than that is a new message (ids are reusable): one sent once
the cancel was acknowledged always is: the proxy acknowledges a cancel only once the broker's
clock is surely past ``t_C`` + :data:`SENT_WITH_MS` (proxy/routing/cancel_acks.py), and the stamp is
never behind the broker's clock. The acceptance time, and not the window
alone, decides because a client that reschedules (a cancel, then the id again once the cancel
is acknowledged) must get its new message, while within one request the client's order is
lost anyway and the cancel wins (the proxy writes a request's cancels after its other records,
proxy/kafka/broker.py, so those are cancelled by rule 1 whatever the clocks). A schedule without an
acceptance time (format 1, or ``s`` < 2**20: not written by a proxy's router) is cancelled by
rule 1 only.
A cancel is *open* from when it is read until it cannot match anything more: until the
replicas read a record of ``p`` appended more than :data:`WINDOW_MS` after it, or until
:data:`MAX_OPEN` newer cancels of ``p`` were read. Rule 2 takes the newest open cancel of ``X``
in ``p`` (the most permissive) and checks both times explicitly.

Determinism: every input is in the records of one partition (offsets, their own timestamps,
the order field), never a replica's clock, and the open cancels are stored in RocksDB in the
same WriteBatch as the consumed offsets. So every replica, and a replica restarted anywhere in
the stream, makes the same decision for the same buffer contents.

Tombstones. A cancel that removed pending messages (rule 1) is owed its tombstone at once,
right after theirs, as before. A cancel that matched nothing is owed its tombstone when it
*closes*, preceded again by the tombstones of every schedule it cancelled on arrival (queued
already then): so compaction never drops such a cancel before a schedule it cancelled, even
when a master lost its queue in a crash, and a replica rebuilt from the topic decides as the
others did. Such a cancel in a partition that receives nothing more waits for that
partition's next record. (A cancel tombstoned at once that later cancels a schedule on arrival
has that schedule's tombstone owed again at its close.) Every tombstone owed is also kept in
the store, on every replica, until that replica reads it back (``owed_tombstones.py``): no
step-down or crash loses one.

Layout: the open cancels are kept in the store's ``meta`` column family, in the keys and
formats of ``cancel_keys.py``. Not thread-safe: the store calls it under its own lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field, replace
from typing import Any

from rocksdict import WriteBatch

from kdelay import buffer
from kdelay.buffer import Cancel, Scheduled, may_cancel, own_series, produced_before
from kdelay.delay_service.store.cancel_keys import (
    UNKNOWN,
    OpenCancel,
    cancelled_by,
    cancelled_key,
    counts_key,
    decode_index,
    encode_counts,
    first_open,
    id_index_key,
    index_value,
    open_key,
    replace_of,
    sent_by,
    stamp_of,
    stored_counts,
)
from kdelay.delay_service.store.entry import split_key
from kdelay.delay_service.store.ids import IndexedBatch, uid_of
from kdelay.delay_service.store.outcomes import Canceller
from kdelay.delay_service.store.tombstones import Retired

#: The rule's window (``kdelay/buffer/cancel_rule.py``).
WINDOW_MS = buffer.CANCEL_WINDOW_MS
SENT_WITH_MS = buffer.CANCEL_SENT_WITH_MS
#: Open cancels per buffer partition at most: the oldest closes when a newer one opens beyond
#: that (about 200 bytes of RocksDB each). Config setting to come: ``cancel_window_max``.
MAX_OPEN = 50_000

#: Where a record was read: partition, offset, timestamp (None: unknown).
At = tuple[int, int, int | None]


@dataclass(frozen=True, slots=True)
class Refused:
    """A pending message a cancel may not cancel: another principal's (module docstring)."""

    id: str
    owner: str | None  # the message's
    principal: str | None  # the cancel's
    partition: int  # where the cancel (or the schedule cancelled on arrival) was read
    offset: int


def accepted_ms(record: Scheduled) -> int | None:
    """When a proxy accepted ``record`` (its order field's millisecond), None if unknown."""
    return buffer.accepted_ms(record.seq)


@dataclass(slots=True)
class _Part:
    """What is known in memory about one partition's cancels."""

    read: int = 0  # cancels read (the number of the last one)
    open: int = 0  # of them open
    #: The oldest open cancel already in RocksDB; None with ``loaded``: there is none.
    head: OpenCancel | None = None
    loaded: bool = False


@dataclass(slots=True)
class _Work:
    """One partition's state inside a batch: a copy of its ``_Part``, and what opened here."""

    part: _Part
    new: deque[OpenCancel] = field(default_factory=deque)  # opened in this batch, in order
    after: int = -1  # offsets up to this one, already in RocksDB, closed in this batch


class CancelMemory:
    """The open cancels of one store (see the module docstring); :meth:`begin` per batch."""

    def __init__(self, meta: Any, meta_cf: Any) -> None:
        self._meta = meta  # the meta column family (rocksdict view)
        self._meta_cf = meta_cf  # its handle, for batches
        self._parts: dict[int, _Part] = {
            partition: _Part(read, open_) for partition, read, open_ in stored_counts(meta)
        }

    @property
    def open(self) -> int:
        """Open cancels over every partition."""
        return sum(part.open for part in self._parts.values())

    def begin(self, batch: WriteBatch) -> CancelBatch:
        """The cancels' side of one store batch; :meth:`CancelBatch.commit` after writing it."""
        return CancelBatch(self, batch)


class CancelBatch:
    """The cancels' side of one store batch: it sees its own writes."""

    def __init__(self, memory: CancelMemory, batch: WriteBatch) -> None:
        self._memory = memory
        self._batch = batch
        self._cf = memory._meta_cf
        self._work: dict[int, _Work] = {}
        self._index: dict[bytes, bytes | None] = {}  # cancel/i keys written here; None: deleted
        self._owed: dict[tuple[int, int], list[Retired]] = {}  # cancelled here, by cancel
        #: Messages a cancel of this batch may not cancel (another principal's), in order.
        self.refused: list[Refused] = []

    def _get(self, partition: int) -> _Work:
        work = self._work.get(partition)
        if work is None:
            known = self._memory._parts.get(partition) or _Part()
            work = self._work[partition] = _Work(replace(known))
        return work

    # -- the rule --------------------------------------------------------------------------

    def advance(self, partition: int, time_ms: int | None) -> list[Retired]:
        """A record of ``partition`` appended at ``time_ms`` was read: close the cancels whose
        window it ends; returns the tombstones they owe."""
        if time_ms is None:
            return []
        work = self._work.get(partition)
        if work is None:
            known = self._memory._parts.get(partition)
            if known is None or known.open == 0:
                return []  # the common case: nothing open, nothing copied
            work = self._get(partition)
        return self._close_while(
            partition, work, lambda c: c.time_ms != UNKNOWN and c.time_ms < time_ms - WINDOW_MS
        )

    def cancel(
        self,
        txn: IndexedBatch,
        at: At,
        record: Cancel,
        *,
        replace: bool = False,
        owner_of: Callable[[bytes], str | None] = lambda key: None,
        keys: list[bytes] | None = None,
        in_release: Container[bytes] = frozenset(),
        deferred: list[bytes] | None = None,
        series: str = "",
        sequence_of: Callable[[bytes], str | None] = lambda key: None,
    ) -> tuple[list[Retired], list[Retired]]:
        """Apply the cancel ``record`` read at ``at``: remove every pending entry with its id
        that its sender may cancel (rule 1; ``owner_of`` gives an entry key's owner, the others
        go to :attr:`refused`; the removed entries' keys go to ``keys`` when given) and open it.
        Returns the records removed, and the tombstones owed: the cancel's own when it removed
        any (right after theirs), those of older cancels that the count bound closed.
        ``series``: a replace's own buffer key, whose series it never cancels (``own_series``).
        An entry ``in_release`` (the master is releasing it, ``in_round.py``) stays pending:
        its key goes to ``deferred``, and the cancel waits for that release's outcome.
        ``sequence_of`` gives an entry key's producer-sequence stamp: one its own producer
        produced after the cancel stays pending (module docstring)."""
        partition, offset, time_ms = at
        removed = []
        sent_as = record.producer_seq
        for index_key, key in list(txn.with_id(record.id)):
            if sent_as is not None and produced_before(sent_as, sequence_of(key)) is False:
                continue
            if not record.admin:
                owner = owner_of(key)
                if not may_cancel(record.owner, record.admin, owner):
                    self.refused.append(Refused(record.id, owner, record.owner, partition, offset))
                    continue
            if key in in_release:
                if deferred is not None:
                    deferred.append(key)
                continue
            txn.delete(index_key, key)
            _, p, o = split_key(key)
            removed.append(Retired(record.id, uid_of(index_key), p, o))
            if keys is not None:
                keys.append(key)
        work = self._get(partition)
        work.part.read += 1
        number = work.part.read
        owed = self._close_while(partition, work, lambda c: c.number <= number - MAX_OPEN)
        stamp = UNKNOWN if time_ms is None else time_ms
        # Matched: retired now, with what it removed (the order compaction needs); otherwise
        # its tombstone waits for its close.
        owed_at_close = "" if removed else record.uid
        if removed and record.uid:
            owed.insert(0, Retired(record.id, record.uid, partition, offset))
        opened = OpenCancel(offset, stamp, number, record.id, owed_at_close)
        work.new.append(opened)
        work.part.open += 1
        self._batch.put(open_key(partition, offset), opened.encode(), self._cf)
        by_id = id_index_key(partition, record.id)
        self._index[by_id] = index_value(offset, stamp, record, replace=replace, series=series)
        self._batch.put(by_id, self._index[by_id], self._cf)
        return removed, owed

    def on_arrival(self, at: At, record: Scheduled) -> tuple[Retired, Canceller] | None:
        """Whether an open cancel cancels the schedule ``record`` read at ``at`` (rule 2):
        then the record to retire, whose tombstone that cancel owes again when it closes, and
        who sent that cancel."""
        found = self._match(*at, record)
        if found is None:
            return None
        by, sender = found
        retired = Retired(record.id, record.uid, at[0], at[1])
        self._cancelled(at[0], by, retired)
        return retired, sender

    def _match(
        self, partition: int, offset: int, time_ms: int | None, record: Scheduled
    ) -> tuple[int, Canceller] | None:
        """The offset of the open cancel that cancels schedule ``record`` (rule 2) and who sent
        it, or None."""
        work = self._work.get(partition)
        part = work.part if work is not None else self._memory._parts.get(partition)
        if part is None or part.open == 0:
            return None
        key = id_index_key(partition, record.id)
        found = self._index[key] if key in self._index else self._stored(key)
        if found is None:
            return None
        by, cancel_ms, suffix = decode_index(found)
        by_replace, series, _ = replace_of(suffix)
        order = produced_before(stamp_of(suffix)[0], record.producer_seq)
        # A later replace in the buffer wins over an earlier one (unless one producer's
        # sequence orders them); a replace's own series is the new message.
        if by_replace and (
            (record.replace and order is None) or own_series(series, record.buffer_key)
        ):
            return None
        if by >= offset:  # a schedule before its cancel was removed when the cancel was read
            return None
        known = None if cancel_ms == UNKNOWN else cancel_ms
        if buffer.cancels(
            by, known, offset, time_ms, accepted_ms(record), order=order
        ) and self._allowed(partition, offset, record, suffix):
            return int(by), sent_by(suffix)
        return None

    def _allowed(self, partition: int, offset: int, record: Scheduled, suffix: bytes) -> bool:
        """Whether the open cancel whose index value ends with ``suffix`` may cancel
        ``record`` (its owner's, module docstring); a refusal goes to :attr:`refused`."""
        principal, admin = sent_by(suffix)
        if may_cancel(principal, admin, record.owner):
            return True
        self.refused.append(Refused(record.id, record.owner, principal, partition, offset))
        return False

    def _cancelled(self, partition: int, by: int, retired: Retired) -> None:
        """Remember that the cancel at ``partition``/``by`` cancelled ``retired``: its
        tombstone is owed again when that cancel closes."""
        key = cancelled_key(partition, by, retired.partition, retired.offset)
        self._batch.put(key, retired.uid.encode(), self._cf)
        self._owed.setdefault((partition, by), []).append(retired)

    # -- closing ---------------------------------------------------------------------------

    def _close_while(
        self, partition: int, work: _Work, closes: Callable[[OpenCancel], bool]
    ) -> list[Retired]:
        owed: list[Retired] = []
        while work.part.open > 0:
            oldest = self._oldest(partition, work)
            if oldest is None or not closes(oldest):
                break
            owed += self._close(partition, work, oldest)
        return owed

    def _oldest(self, partition: int, work: _Work) -> OpenCancel | None:
        if work.part.open > len(work.new):  # some are in RocksDB: they are older
            if not work.part.loaded:
                work.part.head = first_open(self._memory._meta, partition, work.after)
                work.part.loaded = True
            if work.part.head is not None:
                return work.part.head
        return work.new[0] if work.new else None

    def _close(self, partition: int, work: _Work, cancel: OpenCancel) -> list[Retired]:
        if work.new and work.new[0] is cancel:
            work.new.popleft()
        else:
            work.after = cancel.offset
            work.part.head, work.part.loaded = None, False
        work.part.open -= 1
        self._batch.delete(open_key(partition, cancel.offset), self._cf)
        key = id_index_key(partition, cancel.id)
        found = self._index[key] if key in self._index else self._stored(key)
        if found is not None and decode_index(found)[0] == cancel.offset:
            self._batch.delete(key, self._cf)
            self._index[key] = None
        owed = []
        for stored, p, o, uid in cancelled_by(self._memory._meta, partition, cancel.offset):
            self._batch.delete(stored, self._cf)
            owed.append(Retired(cancel.id, uid, p, o))
        for retired in self._owed.pop((partition, cancel.offset), []):
            self._batch.delete(
                cancelled_key(partition, cancel.offset, retired.partition, retired.offset),
                self._cf,
            )
            owed.append(retired)
        if cancel.uid:  # format 2, not retired yet: the cancel has a key of its own to retire
            owed.append(Retired(cancel.id, cancel.uid, partition, cancel.offset))
        return owed

    def _stored(self, index_key: bytes) -> bytes | None:
        found = self._memory._meta.get(index_key)
        return None if found is None else bytes(found)

    # -- the end of the batch --------------------------------------------------------------

    def finish(self) -> None:
        """Put each touched partition's counts into the batch (before it is written)."""
        for partition, work in self._work.items():
            self._batch.put(
                counts_key(partition), encode_counts(work.part.read, work.part.open), self._cf
            )

    def commit(self) -> None:
        """The batch was written: its state is the memory's now."""
        for partition, work in self._work.items():
            part = work.part
            if part.head is None:  # what opened here is in RocksDB now: look there next time
                part.loaded = False
            self._memory._parts[partition] = part
