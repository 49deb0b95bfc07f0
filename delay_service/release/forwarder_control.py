"""What other threads ask of the forwarder: start or stop a term, pause, wake it, stop it.

:class:`ForwarderControl` is held by the :class:`~delay_service.release.forwarder.Forwarder`
(its ``control``): the state other threads flip, all under one Condition, never waiting for the
forwarder thread, and what the forwarder thread asks of that state (the term it serves, whether
it still may send, its wake-up time), each under the same Condition.

- the replica's control thread: :meth:`~ForwarderControl.activate` (a term as master begins,
  with the ZooKeeper checkpoint store of that term), :meth:`~ForwarderControl.deactivate`
  (step-down, lost session, fenced), :meth:`~ForwarderControl.pause` and
  :meth:`~ForwarderControl.resume` (ZooKeeper SUSPENDED and CONNECTED),
  :meth:`~ForwarderControl.clear_fenced`, :meth:`~ForwarderControl.shutdown`;
- the ingest thread: :meth:`~ForwarderControl.notify_new` (an entry due earlier than the next
  wake-up) and :meth:`~ForwarderControl.add_tombstones` (cancelled records, whose tombstones
  the master writes; the store also keeps them owed, ``owed_tombstones.py``).

Every activation and deactivation bumps a *generation*: the forwarder thread serves the
generation it started with, and stops sending the moment it is stale (:meth:`may_forward`).
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
        self.stopping = threading.Event()  # set by shutdown: the forwarder thread returns
        # State flipped by other threads, guarded by _cond.
        self._checkpoints: CheckpointWriter | None = None
        self._generation = 0  # bumped by every activate/deactivate
        self._paused = False
        self._fenced = False
        self._wake_at_ms: int | None = None
        self.tombstones = TombstoneQueue()  # thread-safe on its own
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
        self.tombstones.prepend(self._owed())
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
            self.stopping.set()
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
            if self._checkpoints is not None and self.tombstones.add(retired):
                self._wake_at_ms = 0  # full: the next round writes the checkpoint and them
                self._cond.notify_all()

    # -- what the forwarder thread asks ----------------------------------------------------

    def wait_term(self) -> tuple[CheckpointWriter, int] | None:
        """Wait until activated: the term's checkpoint store and generation; None once
        stopping (a follower's cancels are the master's business: it only waits)."""
        with self._cond:
            while self._checkpoints is None and not self.stopping.is_set():
                self._cond.wait()
            if self._checkpoints is None:
                return None
            return self._checkpoints, self._generation

    @property
    def generation(self) -> int:
        """The generation now: a term's is stale once this moved past it."""
        with self._cond:
            return self._generation

    def serving(self, generation: int) -> bool | None:
        """None once ``generation`` is stale or the forwarder is stopping; else whether
        forwarding is paused."""
        with self._cond:
            if generation != self._generation or self.stopping.is_set():
                return None
            return self._paused

    @property
    def paused(self) -> bool:
        """Forwarding is held (:meth:`pause`)."""
        with self._cond:
            return self._paused

    def fence(self, reason: str) -> None:
        """A newer master exists (or the claim cannot be confirmed): deactivate, and stay
        engaged until the owner rejoined the election (:meth:`clear_fenced`)."""
        with self._cond:
            self._fenced = True
        self.deactivate(reason)

    def may_forward(self, generation: int) -> bool:
        """Whether the forwarder thread, serving ``generation``, may still send."""
        with self._cond:
            return (
                generation == self._generation
                and self._checkpoints is not None
                and not self._paused
                and not self.stopping.is_set()
            )

    def take_wake(self) -> None:
        """A round begins: the wake-up time is consumed; later announcements set the next."""
        with self._cond:
            self._wake_at_ms = None

    def wake_by(self, wake_ms: int) -> None:
        """Wake up at ``wake_ms`` at the latest (an entry ingest announced during the round
        may have set an earlier time already)."""
        with self._cond:
            self._wake_at_ms = (
                wake_ms if self._wake_at_ms is None else min(wake_ms, self._wake_at_ms)
            )

    def wait_wake(
        self, generation: int, now_ms: Callable[[], int], poll_s: float | None
    ) -> bool | None:
        """Wait for the wake-up time: True once it came (and not paused), False when
        ``generation`` is stale or stopping, None after a wake-up by another thread or after
        ``poll_s`` seconds (records in flight: their reports are served in between)."""
        with self._cond:
            if generation != self._generation or self.stopping.is_set():
                return False
            target = self._wake_at_ms
            now = now_ms()
            if not self._paused and target is not None and target <= now:
                return True
            timeout = None if target is None or self._paused else (target - now) / 1000
            if poll_s is not None:
                timeout = poll_s if timeout is None else min(timeout, poll_s)
            self._cond.wait(timeout if timeout is None else max(timeout, 0.0005))
            return None
