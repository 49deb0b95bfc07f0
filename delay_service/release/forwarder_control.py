"""What other threads ask of the forwarder: start or stop a term, pause, wake it, stop it.

:class:`ForwarderControl` is the base of the :class:`~delay_service.release.forwarder.Forwarder`:
the state other threads flip, all under one Condition, never waiting for the forwarder thread.

- the replica's control thread: :meth:`~ForwarderControl.activate` (a term as master begins,
  with the ZooKeeper checkpoint store of that term), :meth:`~ForwarderControl.deactivate`
  (step-down, lost session, fenced), :meth:`~ForwarderControl.pause` and
  :meth:`~ForwarderControl.resume` (ZooKeeper SUSPENDED and CONNECTED),
  :meth:`~ForwarderControl.clear_fenced`, :meth:`~ForwarderControl.shutdown`;
- the ingest thread: :meth:`~ForwarderControl.notify_new` (an entry due earlier than the next
  wake-up) and :meth:`~ForwarderControl.add_tombstones` (cancelled records, whose tombstones
  the master writes; the store also keeps them owed, ``owed_tombstones.py``).

Every activation and deactivation bumps a *generation*: the forwarder thread serves the
generation it started with, and stops sending the moment it is stale (``_may_forward``).
``active`` is set while the forwarder releases as master, for any thread to read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from kdelay import logs
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.tombstones import Retired, TombstoneQueue

log = logs.get(__name__)


class CheckpointWriter(Protocol):
    """The part of zk.CheckpointStore the forwarder uses (tests pass a fake)."""

    def claim_epoch(self) -> int: ...

    def load(self) -> bytes | None: ...

    def write(self, data: bytes) -> object: ...


class ForwarderControl:
    """The forwarder's state that other threads change; any thread, never blocks."""

    def __init__(self, metrics: Metrics, owed: Callable[[], list[Retired]] = lambda: []) -> None:
        self._metrics = metrics
        self._owed = owed  # the tombstones the store owes (Store.owed_tombstones)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        # State flipped by other threads, guarded by _cond.
        self._checkpoints: CheckpointWriter | None = None
        self._generation = 0  # bumped by every activate/deactivate
        self._paused = False
        self._fenced = False
        self._wake_at_ms: int | None = None
        self._tombstones = TombstoneQueue()  # thread-safe on its own
        self.active = threading.Event()  # set while forwarding as master

    @property
    def engaged(self) -> bool:
        """Activated (becoming or being master), or fenced and not yet cleared by the owner."""
        with self._cond:
            return self._checkpoints is not None or self._fenced

    def clear_fenced(self) -> None:
        """The owner has left and rejoined the election after a fence: may activate again."""
        with self._cond:
            self._fenced = False

    def activate(self, checkpoints: CheckpointWriter) -> int:
        """Become master: claim an epoch, load the checkpoint, catch up, then forward.

        Returns the generation the forwarder thread serves from now on (see forward_once).
        The tombstones the store owes are queued first (``owed_tombstones.py``): those owed
        as a follower, and those an earlier term left unwritten (exactly-once queues them for
        the next transaction, which a step-down may never begin). Read after the term began,
        so whatever ingest retires meanwhile is in the store, the queue, or both (a tombstone
        written twice is harmless), and what was owed first is written first.
        """
        with self._cond:
            self._checkpoints = checkpoints
            self._generation += 1
            self._paused = False
            self._cond.notify_all()
            generation = self._generation
        self._tombstones.prepend(self._owed())
        return generation

    def deactivate(self, reason: str) -> None:
        """Stop forwarding at once (step-down, lost session, fenced)."""
        with self._cond:
            if self._checkpoints is not None:
                log.info("forwarder.stopped", reason=reason)
            self._checkpoints = None
            self._generation += 1
            self.active.clear()
            self._cond.notify_all()
        self._metrics.is_master.set(0)

    def pause(self) -> None:
        """Hold forwarding (ZooKeeper SUSPENDED): leadership is uncertain."""
        with self._cond:
            if not self._paused and self._checkpoints is not None:
                log.info("forwarder.paused")
            self._paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        """Forward again after :meth:`pause` (ZooKeeper CONNECTED)."""
        with self._cond:
            if self._paused and self._checkpoints is not None:
                log.info("forwarder.resumed")
            self._paused = False
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Make the forwarder thread return after the current round and a last checkpoint."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()

    def notify_new(self, deliver_at_ms: int) -> None:
        """Ingest stored an entry due at ``deliver_at_ms``: wake up if it is earlier."""
        with self._cond:
            if self._wake_at_ms is None or deliver_at_ms < self._wake_at_ms:
                self._wake_at_ms = deliver_at_ms
                self._cond.notify_all()

    def add_tombstones(self, retired: Iterable[Retired]) -> None:
        """Cancelled records whose tombstones the master writes. A follower drops them: its
        store keeps them owed until it reads them back, and writes them if it becomes master
        first (:meth:`activate`)."""
        with self._cond:
            if self._checkpoints is not None and self._tombstones.add(retired):
                self._wake_at_ms = 0  # full: the next round writes the checkpoint and them
                self._cond.notify_all()

    def _may_forward(self, generation: int) -> bool:
        """Whether the forwarder thread, serving ``generation``, may still send."""
        with self._cond:
            return (
                generation == self._generation
                and self._checkpoints is not None
                and not self._paused
                and not self._stop.is_set()
            )
