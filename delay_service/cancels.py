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
clock is surely past ``t_C`` + :data:`SENT_WITH_MS` (proxy/cancel_acks.py), and the stamp is
never behind the broker's clock. The acceptance time, and not the window
alone, decides because a client that reschedules (a cancel, then the id again once the cancel
is acknowledged) must get its new message, while within one request the client's order is
lost anyway and the cancel wins (the proxy writes a request's cancels after its other records,
proxy/broker.py, so those are cancelled by rule 1 whatever the clocks). A schedule without an
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
has that schedule's tombstone owed again at its close; only a crash that loses that first
tombstone, then compaction and a replica rebuilt from the topic, could still see the schedule.)

Layout, in the store's ``meta`` column family (partition 4 bytes, offsets and times 8, all
big-endian; times signed, :data:`UNKNOWN` for a record without a timestamp):

- ``cancel/n/<p>`` -> cancels read in ``p`` (they are numbered 1, 2, ...) | of them open;
- ``cancel/w/<p><offset>`` -> ``t_C`` | number | ``len(id)`` (2) | id | buffer key: one open
  cancel, in offset order (the closing order); the buffer key is empty when no tombstone is
  owed at its close (retired at once, or format 1);
- ``cancel/i/<p><len(id)><id>`` -> offset | ``t_C`` of the newest open cancel of that id, then
  ``r`` when it is a replace's (a replace is not cancelled on arrival by an earlier replace:
  among replaces, the buffer's order decides), or ``R`` | len (1) | the replace's buffer key
  (written since issue 48: nor are its own series' later occurrences, ``own_series``), then
  ``A`` when an administrator sent it, or ``W`` and the principal that sent it (nothing: sent
  without authentication);
- ``cancel/s/<p><offset><partition><offset>`` -> buffer key: a record that cancel cancelled.

A store written before these keys existed simply has no open cancels. Not thread-safe: the
store calls it under its own lock.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field, replace
from typing import Any

from rocksdict import WriteBatch

from delay_service.entry import split_key
from delay_service.ids import IndexedBatch, id_prefix, uid_of
from delay_service.outcomes import Canceller
from delay_service.tombstones import Retired
from kdelay import buffer
from kdelay.buffer import Cancel, Scheduled, may_cancel, own_series

#: The rule's window (``kdelay/buffer/cancel_rule.py``).
WINDOW_MS = buffer.CANCEL_WINDOW_MS
SENT_WITH_MS = buffer.CANCEL_SENT_WITH_MS
#: Open cancels per buffer partition at most: the oldest closes when a newer one opens beyond
#: that (about 200 bytes of RocksDB each). Config setting to come: ``cancel_window_max``.
MAX_OPEN = 50_000
#: The stored time of a record that had none (only in-process callers omit it).
UNKNOWN = -(2**63)

_N = b"cancel/n/"
_W = b"cancel/w/"
_I = b"cancel/i/"
_S = b"cancel/s/"
_P = struct.Struct(">I")
_PO = struct.Struct(">IQ")
_COUNTS = struct.Struct(">QQ")
_AT = struct.Struct(">Qq")  # offset, time (then b"r" or b"R..." when it is a replace's)
_REPLACE = b"r"
_REPLACE_OF = b"R"  # then len (1 byte) and the replace's buffer key
_ADMIN = b"A"
_SENDER = b"W"
_OPEN = struct.Struct(">qQH")  # time, number, len(id): at most kdelay.buffer.MAX_ID_BYTES

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


def _sender(record: Cancel) -> bytes:
    """The open-cancel index's suffix naming who sent ``record``."""
    if record.admin:
        return _ADMIN
    return b"" if record.owner is None else _SENDER + record.owner.encode()


def _sent_by(suffix: bytes) -> tuple[str | None, bool]:
    """(principal, admin) from an open-cancel index value's suffix after ``_AT``."""
    suffix = _replace_of(suffix)[2]
    if suffix[:1] == _ADMIN:
        return None, True
    if suffix[:1] == _SENDER:
        return suffix[1:].decode(), False
    return None, False


def _replace_of(suffix: bytes) -> tuple[bool, str, bytes]:
    """(a replace's, its buffer key or "", the rest) of an open-cancel index value's suffix."""
    if suffix[:1] == _REPLACE_OF:
        end = 2 + suffix[1]
        return True, suffix[2:end].decode(), suffix[end:]
    if suffix[:1] == _REPLACE:
        return True, "", suffix[1:]
    return False, "", suffix


def _replace_mark(series: str) -> bytes:
    """The index value's replace marker for a replace with buffer key ``series``."""
    raw = series.encode()
    return _REPLACE_OF + bytes([len(raw)]) + raw if 0 < len(raw) < 256 else _REPLACE


def accepted_ms(record: Scheduled) -> int | None:
    """When a proxy accepted ``record`` (its order field's millisecond), None if unknown."""
    return buffer.accepted_ms(record.seq)


@dataclass(frozen=True, slots=True)
class _Open:
    """One open cancel."""

    offset: int
    time_ms: int
    number: int
    id: str
    uid: str

    def encode(self) -> bytes:
        raw = self.id.encode("utf-8", "surrogatepass")
        return _OPEN.pack(self.time_ms, self.number, len(raw)) + raw + self.uid.encode()

    @classmethod
    def decode(cls, offset: int, value: bytes) -> _Open:
        time_ms, number, length = _OPEN.unpack_from(value, 0)
        start = _OPEN.size
        msg_id = value[start : start + length].decode("utf-8", "surrogatepass")
        return cls(offset, time_ms, number, msg_id, value[start + length :].decode())


@dataclass(slots=True)
class _Part:
    """What is known in memory about one partition's cancels."""

    read: int = 0  # cancels read (the number of the last one)
    open: int = 0  # of them open
    #: The oldest open cancel already in RocksDB; None with ``loaded``: there is none.
    head: _Open | None = None
    loaded: bool = False


@dataclass(slots=True)
class _Work:
    """One partition's state inside a batch: a copy of its ``_Part``, and what opened here."""

    part: _Part
    new: deque[_Open] = field(default_factory=deque)  # opened in this batch, in order
    after: int = -1  # offsets up to this one, already in RocksDB, closed in this batch


class CancelMemory:
    """The open cancels of one store (see the module docstring); :meth:`begin` per batch."""

    def __init__(self, meta: Any, meta_cf: Any) -> None:
        self._meta = meta  # the meta column family (rocksdict view)
        self._meta_cf = meta_cf  # its handle, for batches
        self._parts: dict[int, _Part] = {}
        it = meta.iter()
        it.seek(_N)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(_N):
                break
            (partition,) = _P.unpack_from(key, len(_N))
            read, open_ = _COUNTS.unpack(bytes(it.value()))
            self._parts[partition] = _Part(read, open_)
            it.next()

    @property
    def open(self) -> int:
        """Open cancels over every partition."""
        return sum(part.open for part in self._parts.values())

    def begin(self, batch: WriteBatch) -> CancelBatch:
        """The cancels' side of one store batch; :meth:`CancelBatch.commit` after writing it."""
        return CancelBatch(self, batch)

    def _first_stored(self, partition: int, after: int) -> _Open | None:
        """The oldest open cancel of ``partition`` in RocksDB with an offset above ``after``."""
        prefix = _W + _P.pack(partition)
        it = self._meta.iter()
        it.seek(prefix + struct.pack(">Q", after + 1))
        if not it.valid():
            return None
        key = bytes(it.key())
        if not key.startswith(prefix):
            return None
        (offset,) = struct.unpack_from(">Q", key, len(prefix))
        return _Open.decode(offset, bytes(it.value()))

    def _cancelled_by(self, partition: int, offset: int) -> list[tuple[bytes, int, int, str]]:
        """(key, partition, offset, buffer key) of each record, as stored in RocksDB, that
        the cancel at ``partition``/``offset`` cancelled."""
        prefix = _S + _PO.pack(partition, offset)
        out = []
        it = self._meta.iter()
        it.seek(prefix)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                break
            p, o = _PO.unpack_from(key, len(prefix))
            out.append((key, p, o, bytes(it.value()).decode()))
            it.next()
        return out


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
    ) -> tuple[list[Retired], list[Retired]]:
        """Apply the cancel ``record`` read at ``at``: remove every pending entry with its id
        that its sender may cancel (rule 1; ``owner_of`` gives an entry key's owner, the others
        go to :attr:`refused`; the removed entries' keys go to ``keys`` when given) and open it.
        Returns the records removed, and the tombstones owed: the cancel's own when it removed
        any (right after theirs), those of older cancels that the count bound closed.
        ``series``: a replace's own buffer key, whose series it never cancels (``own_series``).
        An entry ``in_release`` (the master is releasing it, ``in_round.py``) stays pending:
        its key goes to ``deferred``, and the cancel waits for that release's outcome."""
        partition, offset, time_ms = at
        removed = []
        for index_key, key in list(txn.with_id(record.id)):
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
        opened = _Open(offset, stamp, number, record.id, owed_at_close)
        work.new.append(opened)
        work.part.open += 1
        self._batch.put(_W + _PO.pack(partition, offset), opened.encode(), self._cf)
        index_key = _I + _P.pack(partition) + id_prefix(record.id)
        self._index[index_key] = (
            _AT.pack(offset, stamp) + (_replace_mark(series) if replace else b"") + _sender(record)
        )
        self._batch.put(index_key, self._index[index_key], self._cf)
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
        accepted = accepted_ms(record)
        work = self._work.get(partition)
        part = work.part if work is not None else self._memory._parts.get(partition)
        if accepted is None or part is None or part.open == 0:
            return None
        index_key = _I + _P.pack(partition) + id_prefix(record.id)
        found = self._index[index_key] if index_key in self._index else self._stored(index_key)
        if found is None:
            return None
        by, cancel_ms = _AT.unpack_from(found)
        suffix = found[_AT.size :]
        by_replace, series, _ = _replace_of(suffix)
        # A later replace in the buffer wins over an earlier one; a replace's own series is
        # the new message, not what it replaced.
        if by_replace and (record.replace or own_series(series, record.buffer_key)):
            return None
        if by >= offset:  # a schedule before its cancel was removed when the cancel was read
            return None
        known = None if cancel_ms == UNKNOWN else cancel_ms
        if buffer.cancels(by, known, offset, time_ms, accepted) and self._allowed(
            partition, offset, record, suffix
        ):
            return int(by), _sent_by(suffix)
        return None

    def _allowed(self, partition: int, offset: int, record: Scheduled, suffix: bytes) -> bool:
        """Whether the open cancel whose index value ends with ``suffix`` may cancel
        ``record`` (its owner's, module docstring); a refusal goes to :attr:`refused`."""
        principal, admin = _sent_by(suffix)
        if may_cancel(principal, admin, record.owner):
            return True
        self.refused.append(Refused(record.id, record.owner, principal, partition, offset))
        return False

    def _cancelled(self, partition: int, by: int, retired: Retired) -> None:
        """Remember that the cancel at ``partition``/``by`` cancelled ``retired``: its
        tombstone is owed again when that cancel closes."""
        key = _S + _PO.pack(partition, by) + _PO.pack(retired.partition, retired.offset)
        self._batch.put(key, retired.uid.encode(), self._cf)
        self._owed.setdefault((partition, by), []).append(retired)

    # -- closing ---------------------------------------------------------------------------

    def _close_while(
        self, partition: int, work: _Work, closes: Callable[[_Open], bool]
    ) -> list[Retired]:
        owed: list[Retired] = []
        while work.part.open > 0:
            oldest = self._oldest(partition, work)
            if oldest is None or not closes(oldest):
                break
            owed += self._close(partition, work, oldest)
        return owed

    def _oldest(self, partition: int, work: _Work) -> _Open | None:
        if work.part.open > len(work.new):  # some are in RocksDB: they are older
            if not work.part.loaded:
                work.part.head = self._memory._first_stored(partition, work.after)
                work.part.loaded = True
            if work.part.head is not None:
                return work.part.head
        return work.new[0] if work.new else None

    def _close(self, partition: int, work: _Work, cancel: _Open) -> list[Retired]:
        if work.new and work.new[0] is cancel:
            work.new.popleft()
        else:
            work.after = cancel.offset
            work.part.head, work.part.loaded = None, False
        work.part.open -= 1
        self._batch.delete(_W + _PO.pack(partition, cancel.offset), self._cf)
        index_key = _I + _P.pack(partition) + id_prefix(cancel.id)
        found = self._index[index_key] if index_key in self._index else self._stored(index_key)
        if found is not None and _AT.unpack_from(found)[0] == cancel.offset:
            self._batch.delete(index_key, self._cf)
            self._index[index_key] = None
        owed = []
        for key, p, o, uid in self._memory._cancelled_by(partition, cancel.offset):
            self._batch.delete(key, self._cf)
            owed.append(Retired(cancel.id, uid, p, o))
        for retired in self._owed.pop((partition, cancel.offset), []):
            self._batch.delete(
                _S
                + _PO.pack(partition, cancel.offset)
                + _PO.pack(retired.partition, retired.offset),
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
                _N + _P.pack(partition), _COUNTS.pack(work.part.read, work.part.open), self._cf
            )

    def commit(self) -> None:
        """The batch was written: its state is the memory's now."""
        for partition, work in self._work.items():
            part = work.part
            if part.head is None:  # what opened here is in RocksDB now: look there next time
                part.loaded = False
            self._memory._parts[partition] = part
