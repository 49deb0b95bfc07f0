"""What became of a message that left the pending set: delivered, cancelled or dead-lettered.

Every replica keeps the outcome of each message that left its store for a while, so that ``GET
/v1/messages/{id}`` and ``kdelay status --id`` can answer after delivery, from any replica.
Where a replica learns it, from the richest source down:

- ``master``: the master removes what it released (the target's acknowledgement gives the
  partition and offset) — only the master's own store;
- ``tombstone``: the master's tombstone in the buffer topic carries the same facts
  (``kdelay.buffer.Fate``), so every replica learns them when it reads the tombstone;
- ``checkpoint``: a follower drops the entries a checkpoint covers (delivered or
  dead-lettered; no offset) before the tombstone arrives;
- ``cancel``: a cancel record removed it, or cancelled it on arrival.

A later, richer answer replaces an earlier one for the same id; a message that reuses the id
(or a series' next occurrence) replaces the outcome of the one before, which moves to the id's
history: its last :data:`HISTORY_MAX` outcomes, oldest first (:meth:`OutcomeLog.history`), so
``GET /v1/messages/{id}`` tells each occurrence of a series, who cancelled and why a message was
dead-lettered. Outcomes are kept :attr:`OutcomeLog.retention_ms`
(by this replica's clock when it learnt them) and at most :attr:`OutcomeLog.max_entries`, the
oldest pruned first, a bounded number per write, in the same WriteBatch as the store change
that made them.

Layout: column family ``outcomes``: id -> compact JSON of :class:`Outcome` plus the time it
was written (``w``) and the earlier outcomes' stored fields (``h``, oldest first);
``outcome_time``: ``written_ms (8) | id`` -> empty, the pruning order;
``meta`` ``outcomes`` -> count (8). Not thread-safe: the store calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import orjson
from rocksdict import WriteBatch

from kdelay.buffer import Fate, Scheduled
from kdelay.buffer import accepted_ms as buffer_accepted_ms
from kdelay.delay_service.store import rocks
from kdelay.delay_service.store.keyspace import CF_OUTCOME_TIME, CF_OUTCOMES
from kdelay.delay_service.store.keyspace import META_OUTCOMES as _META_COUNT
from kdelay.delay_service.store.keyspace import U64 as _U64
from kdelay.immutable import immutable

#: The states a message that left the store can be in (CONTRACT.md v2).
DELIVERED = "delivered"
CANCELLED = "cancelled"
DEAD_LETTERED = "dead_lettered"
#: Not a state of a message's status: what became of one a replace removed (in its history).
REPLACED = "replaced"


@immutable
class Outcome:
    """The last known outcome of message ``id``.

    ``partition`` is the target partition the record was written to (when known: a record
    released with partition -1 learns it from the acknowledgement); ``offset`` its offset there
    (None when this replica learnt of the delivery from a checkpoint rather than from the
    master's tombstone); ``at_ms`` the release or cancel time; ``source`` how this replica
    knows: ``"master"`` (it released the message), ``"tombstone"`` (the master's tombstone in
    the buffer topic), ``"checkpoint"`` (a checkpoint covered it), ``"cancel"`` (a cancel
    record removed it). ``reason``: why it was dead-lettered; ``accepted_ms`` and ``owner``:
    when a proxy accepted it and who scheduled it; ``by`` and ``admin``: who cancelled it (the
    cancel's principal; ``admin`` for an administrator's).
    """

    id: str
    state: str
    source: str
    deliver_at_ms: int | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    at_ms: int | None = None
    occurrence: int | None = None
    reason: str | None = None
    accepted_ms: int | None = None
    owner: str | None = None
    by: str | None = None
    admin: bool | None = None


#: Who sent a cancel: its principal (None when unauthenticated) and whether an administrator.
Canceller = tuple[str | None, bool]
#: Outcome sources, richest first (a poorer one never replaces a richer one of one message).
SOURCES = ("master", "tombstone", "cancel", "checkpoint")
_RANK = {s: i for i, s in enumerate(SOURCES)}
#: What is stored of an Outcome (its id is the key); not dataclasses.asdict, as it runs per release.
_FIELDS = tuple(f.name for f in fields(Outcome) if f.name != "id")
_HISTORY = "h"
#: Outcomes pruned per write at most (the rest at the next writes).
PRUNE_BATCH = 1000
#: Earlier outcomes kept per id (a series' occurrences, an id's reuses), the oldest dropped.
HISTORY_MAX = 20


class OutcomeLog:
    """The outcomes a replica remembers (see the module docstring)."""

    def __init__(
        self, db: Any, meta: Any, meta_cf: Any, *, retention_ms: int, max_entries: int
    ) -> None:
        self._db = db
        self._cf = db.get_column_family(CF_OUTCOMES)
        self._cf_handle = db.get_column_family_handle(CF_OUTCOMES)
        self._time_cf = db.get_column_family_handle(CF_OUTCOME_TIME)
        self._time = db.get_column_family(CF_OUTCOME_TIME)
        self._meta_cf = meta_cf
        raw = meta.get(_META_COUNT)
        self._count = _U64.unpack(raw)[0] if raw else 0
        self._pending_delta = 0
        self._seen: dict[bytes, bytes] = {}  # ids put in the batch being built: what it holds
        # The pruning order's floor: every time key of an earlier millisecond was pruned.
        # Pruning deletes from the front, so a scan from the first key would walk the
        # tombstones of everything pruned since the last compaction, on every write, each
        # write slower than the last (bench.outcome_pruning). Time keys are never written
        # below it (a clock that stepped back writes the floor's millisecond).
        self._floor_ms = 0
        self._next_floor_ms: int | None = None  # the floor once the batch is written
        self._batch_ms: int | None = None  # the earliest time key the batch writes
        self.retention_ms = retention_ms
        self.max_entries = max_entries

    @property
    def count(self) -> int:
        """Outcomes remembered now."""
        return self._count

    def get(self, msg_id: str) -> Outcome | None:
        """The outcome of the last message ``msg_id`` that left the store, if remembered."""
        raw = self._cf.get(msg_id.encode())
        return None if raw is None else _decode(msg_id, bytes(raw))[0]

    def history(self, msg_id: str) -> list[Outcome]:
        """The outcomes of the messages ``msg_id`` that left the store, oldest first, the last
        one :meth:`get`'s; at most :data:`HISTORY_MAX` + 1."""
        raw = self._cf.get(msg_id.encode())
        if raw is None:
            return []
        doc = orjson.loads(bytes(raw))
        doc.pop("w", None)
        earlier = doc.pop(_HISTORY, [])
        return [Outcome(id=msg_id, **body) for body in [*earlier, doc]]

    def put(self, batch: WriteBatch, outcome: Outcome, now_ms: int) -> None:
        """Record ``outcome`` in ``batch`` unless a richer one of the same message is known."""
        if self.max_entries <= 0:
            return
        key = outcome.id.encode()
        body = {f: v for f in _FIELDS if (v := getattr(outcome, f)) is not None}
        self._put(batch, key, outcome.id, body, raw=self._stored(key), now_ms=now_ms)

    def _stored(self, key: bytes) -> bytes | None:
        """The stored outcome of ``key``, or what this batch writes for it."""
        written = self._seen.get(key)
        return written if written is not None else self._cf.get(key)

    def _put(
        self,
        batch: WriteBatch,
        key: bytes,
        msg_id: str,
        body: dict[str, Any],
        *,
        raw: bytes | None,
        now_ms: int,
    ) -> None:
        """Write ``body`` (an outcome's stored fields) as message ``msg_id``'s outcome unless a
        richer one is known: ``raw`` is what the store holds for it (or this batch writes).
        An outcome of another message with the id (or another occurrence) moves to the
        history; a richer word on the same one replaces it there."""
        if raw is not None:
            doc = orjson.loads(raw)
            written = int(doc.pop("w", 0))
            earlier = doc.pop(_HISTORY, [])
            deliver_at_ms = body.get("deliver_at_ms")
            same = doc.get("deliver_at_ms") == deliver_at_ms or deliver_at_ms is None
            # A checkpoint's "delivered" may be a dead letter: the tombstone tells which.
            event = same and (doc["state"] == body["state"] or doc["source"] == "checkpoint")
            if event and doc["state"] == body["state"]:
                if _RANK[doc["source"]] < _RANK[body["source"]]:
                    return
                body = {**doc, **body}  # the richer word, with what the poorer knew besides
            if not event and _occurs_before(body, doc):
                # An earlier occurrence of the series, learnt after a later one's outcome (its
                # release settled after the store read the next occurrence): history only.
                if not any(_occurs_before(body, e) is None for e in earlier):
                    earlier = [*earlier, body][-HISTORY_MAX:]
                body = doc
            elif not event:
                earlier = [*earlier, doc][-HISTORY_MAX:]
            if earlier:
                body[_HISTORY] = earlier
            batch.delete(_U64.pack(written) + key, self._time_cf)  # (this batch's, if it wrote)
        else:
            self._pending_delta += 1
        now_ms = max(now_ms, self._floor_ms)  # never below the pruning floor
        self._batch_ms = now_ms if self._batch_ms is None else min(self._batch_ms, now_ms)
        body["w"] = now_ms
        value = orjson.dumps(body)
        self._seen[key] = value
        batch.put(key, value, self._cf_handle)
        batch.put(_U64.pack(now_ms) + key, b"", self._time_cf)

    def learn(self, batch: WriteBatch, msg_id: str, fate: Fate, source: str, now_ms: int) -> None:
        """Record what ``source`` tells of message ``msg_id`` (a tombstone's or the master's
        :class:`kdelay.buffer.Fate`)."""
        if self.max_entries <= 0:
            return
        key = msg_id.encode()
        self._put(batch, key, msg_id, _body(fate, source), raw=self._stored(key), now_ms=now_ms)

    def learn_all(
        self, batch: WriteBatch, learnt: Sequence[tuple[str, Fate]], source: str, now_ms: int
    ) -> None:
        """:meth:`learn` for many messages (the master's releases of a round), their stored
        outcomes read in one multi-get rather than a point read each."""
        if self.max_entries <= 0 or not learnt:
            return
        keys = [msg_id.encode() for msg_id, _ in learnt]
        found = rocks.multi_get(self._cf, keys)
        for (msg_id, fate), key, raw in zip(learnt, keys, found, strict=True):
            self._put(batch, key, msg_id, _body(fate, source), raw=raw, now_ms=now_ms)

    def covered(self, batch: WriteBatch, msg: Scheduled, now_ms: int, accepted: int | None) -> None:
        """``msg`` (accepted at ``accepted``) left the store because a checkpoint covers it:
        delivered (or dead-lettered: the tombstone says which, when it comes)."""
        self.put(
            batch,
            Outcome(
                msg.id,
                DELIVERED,
                "checkpoint",
                deliver_at_ms=msg.deliver_at_ms,
                topic=msg.topic,
                partition=msg.partition if msg.partition >= 0 else None,
                occurrence=msg.occurrence if msg.repeat is not None else None,
                accepted_ms=accepted,
                owner=msg.owner,
            ),
            now_ms,
        )

    def cancelled(  # noqa: PLR0917 - one cancel's facts, each a field of its outcome
        self,
        batch: WriteBatch,
        msg_id: str,
        at_ms: int | None,
        now_ms: int,
        msg: Scheduled | None = None,
        by: Canceller = (None, False),
        accepted: int | None = None,
        state: str = CANCELLED,
    ) -> None:
        """A cancel (appended at ``at_ms``, sent by ``by``: its principal and whether an
        administrator) removed message ``msg_id`` (``msg`` when known, accepted at ``accepted``
        or as its order field tells), or cancelled ``msg`` on arrival; ``state``
        :data:`REPLACED`: a replace removed it."""
        principal, admin = by
        if msg is None:
            outcome = Outcome(
                msg_id, state, "cancel", at_ms=at_ms, by=principal, admin=admin or None
            )
        else:  # one call, not a replace(): a bulk cancel records a million of these at once
            outcome = Outcome(
                msg_id,
                state,
                "cancel",
                at_ms=at_ms,
                topic=msg.topic,
                deliver_at_ms=msg.deliver_at_ms,
                occurrence=msg.occurrence if msg.repeat is not None else None,
                accepted_ms=accepted if accepted is not None else buffer_accepted_ms(msg.seq),
                owner=msg.owner,
                by=principal,
                admin=admin or None,
            )
        self.put(batch, outcome, now_ms)

    def finish(self, batch: WriteBatch, now_ms: int) -> None:
        """Prune what is too old or too many, and write the count: call once per batch."""
        over = self._count + self._pending_delta - self.max_entries
        it = self._time.iter()
        it.seek(_U64.pack(self._floor_ms))
        pruned = 0
        while it.valid() and pruned < PRUNE_BATCH:
            key = bytes(it.key())
            (written,) = _U64.unpack_from(key, 0)
            if written >= now_ms - self.retention_ms and pruned >= over:
                break
            batch.delete(key, self._time_cf)
            batch.delete(key[_U64.size :], self._cf_handle)
            pruned += 1
            self._next_floor_ms = written
            it.next()
        self._pending_delta -= pruned
        if self._pending_delta:
            batch.put(_META_COUNT, _U64.pack(self._count + self._pending_delta), self._meta_cf)

    def commit(self) -> None:
        """The batch was written: the count is what it holds now."""
        self._count += self._pending_delta
        self._pending_delta = 0
        self._seen.clear()
        if self._next_floor_ms is not None:  # not past a time key this batch wrote
            batch_ms = self._next_floor_ms if self._batch_ms is None else self._batch_ms
            self._floor_ms = min(self._next_floor_ms, batch_ms)
        self._next_floor_ms = self._batch_ms = None

    def close(self) -> None:
        """Let go of the column families (RocksDB keeps its lock while any view is open)."""
        self._cf.close()
        self._time.close()
        del self._cf, self._time, self._cf_handle, self._time_cf, self._db, self._meta_cf

    def abort(self) -> None:
        """The batch was not written."""
        self._pending_delta = 0
        self._seen.clear()
        self._next_floor_ms = self._batch_ms = None


def _body(fate: Fate, source: str) -> dict[str, Any]:
    """The stored fields of what ``source`` tells in ``fate`` (an :class:`Outcome`'s, in
    :data:`_FIELDS` order, without the id), built without the Outcome: once per release."""
    body: dict[str, Any] = {"state": fate.state, "source": source}
    if fate.deliver_at_ms is not None:
        body["deliver_at_ms"] = fate.deliver_at_ms
    if fate.topic is not None:
        body["topic"] = fate.topic
    if fate.partition is not None:
        body["partition"] = fate.partition
    if fate.offset is not None:
        body["offset"] = fate.offset
    if fate.released_ms is not None:
        body["at_ms"] = fate.released_ms
    if fate.occurrence is not None:
        body["occurrence"] = fate.occurrence
    if fate.reason is not None:
        body["reason"] = fate.reason
    if fate.accepted_ms is not None:
        body["accepted_ms"] = fate.accepted_ms
    if fate.owner is not None:
        body["owner"] = fate.owner
    return body


def _occurs_before(body: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """Whether outcome ``body`` is of an earlier occurrence of the series ``other`` is of
    (None: the same occurrence, same state; False otherwise)."""
    occurrence, then = body.get("occurrence"), other.get("occurrence")
    if occurrence is None or then is None:
        return False
    due, due_then = body.get("deliver_at_ms"), other.get("deliver_at_ms")
    if occurrence == then and due == due_then and body["state"] == other["state"]:
        return None
    return occurrence < then and due is not None and due_then is not None and due < due_then


def _decode(msg_id: str, raw: bytes) -> tuple[Outcome, int]:
    doc = orjson.loads(raw)
    written = int(doc.pop("w", 0))
    doc.pop(_HISTORY, None)
    return Outcome(id=msg_id, **doc), written
