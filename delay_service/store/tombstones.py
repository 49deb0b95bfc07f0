"""Tombstones the master owes the buffer topic, so that compaction shrinks it to the pending set.

Each tombstone names a buffer record (id, buffer key, partition, offset) whose entry left the
store because its target (or the dead-letter topic) acknowledged it, because a cancel removed
it (or cancelled it on arrival), or, for a cancel itself, because it removed pending records
(named with them) or, having matched nothing, because its window closed (``cancels.py``: a
cancel stays open for a while to cancel a message sent with it that arrives after it). Such a
closing cancel names again every record it cancelled on arrival, before itself, so compaction
never removes it while a schedule it cancelled is still in the topic. Producing
a tombstone is therefore correct whoever is master and whenever it happens; it is only a matter
of keeping the compacted topic small.

Nothing is dropped silently: the queue has no length limit and is never cleared. The forwarder
produces it after every checkpoint write and when a term as master ends (deactivated, fenced or
stopping: the tombstones still name acknowledged or cancelled entries). Memory stays bounded by
*backpressure*: once :data:`FLUSH_AT` tombstones are queued, :meth:`TombstoneQueue.add` tells
the caller to wake the forwarder, which writes its checkpoint early and produces the queue
(producing itself blocks while librdkafka's queue is full). A master that crashes loses what
it had queued: a delivered record's tombstone (at most one checkpoint interval's worth, or
:data:`FLUSH_AT`) then stays in the compacted topic, harmlessly, since every replica skips
records the checkpoint covers. What cancels, replaces and bulk cancels retired is not lost:
every replica's store keeps it owed (``owed_tombstones.py``) until it reads the tombstone
back, and a master queues what its store owes when its term begins. Cancels a follower
ingests are not queued: its store owes them.

Threads: the ingest thread adds cancelled records and closed cancels, the forwarder thread adds
deliveries and takes the queue; one lock guards it and nothing blocks under it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from kdelay.buffer import Fate

#: Queued tombstones at which the forwarder writes its checkpoint early and produces them.
FLUSH_AT = 100_000


class Retired(NamedTuple):
    """A buffer record whose tombstone is owed: its message id, buffer key (its Kafka key;
    "" for a format-1 record, keyed by the id), partition and offset, and what became of the
    message when the master knows (the tombstone tells every replica, for its status)."""

    id: str
    uid: str
    partition: int
    offset: int
    fate: Fate | None = None

    @property
    def buffer_key(self) -> str:
        """The Kafka key of the retired record (and of its tombstone)."""
        return self.uid or self.id


class TombstoneQueue:
    """The tombstones owed, in the order their entries left the store."""

    def __init__(self, flush_at: int | None = None) -> None:
        self._flush_at = FLUSH_AT if flush_at is None else flush_at
        self._lock = threading.Lock()
        self._items: deque[Retired] = deque()

    def add(self, retired: Iterable[Retired]) -> bool:
        """Queue tombstones; True once the queue should be produced without waiting."""
        with self._lock:
            self._items.extend(retired)
            return len(self._items) >= self._flush_at

    def prepend(self, retired: Iterable[Retired]) -> None:
        """Queue tombstones before everything queued: what the store owed when a term began
        (``owed_tombstones.py``), which was owed before anything queued since."""
        with self._lock:
            self._items.extendleft(reversed(list(retired)))

    def take(self) -> list[Retired]:
        """Everything queued, emptying the queue."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    @property
    def full(self) -> bool:
        """At least ``flush_at`` tombstones wait: produce them now."""
        with self._lock:
            return len(self._items) >= self._flush_at

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
