"""The master loop: release due entries to their targets, then checkpoint (DESIGN.md).

One round (:meth:`Forwarder.forward_once`), per the delivery invariant:

1. *plan*: note the ingested offsets O (everything below is in the store), scan the entries due
   by now = T in key order (due time, then arrival), hold those behind a retry (``round.py``);
2. *send* the rest to their exact topic and partition and wait for every acknowledgement
   (``sender.py``: one idempotent acks=all producer, record timestamp = release time);
3. *settle*: delete acknowledged entries and queue tombstones for their ids; a failed entry
   waits out a backoff and later entries for its target wait behind it; a permanent error on
   the ``dead_letter_after``-th attempt dead-letters it instead (``retry.py``);
4. *checkpoint*: claim (T, O) with T below the due time of every entry still pending, never
   moving backwards; write it at most every ``checkpoint_interval_ms``, apply it to the store,
   then produce the queued tombstones.

Between rounds the thread sleeps until the next due time, retry or checkpoint write, unless
ingest signals an earlier entry: no busy loop, no fixed tick. A checkpoint write rejected by
ZooKeeper (a newer epoch exists) deactivates the forwarder at once and calls ``on_fenced``.

Threads: :meth:`Forwarder.run` is the forwarder thread's body; it alone uses the sender, the
retry policy and the checkpoint store while active. The control thread calls :meth:`activate`,
:meth:`deactivate`, :meth:`pause`, :meth:`resume`, :meth:`shutdown`; the ingest thread calls
:meth:`notify_new` and :meth:`add_tombstones`. All of those only flip state under one
Condition and never block on I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from confluent_kafka import KafkaError

from delay_service.clock import SYSTEM_CLOCK, Clock
from delay_service.config import ReplicaConfig
from delay_service.entry import Entry
from delay_service.metrics import Metrics
from delay_service.retry import RetryPolicy
from delay_service.round import RoundResult, claim_ms, plan_round
from delay_service.sender import Outcome, Sender, error_name, is_permanent
from delay_service.store import Store
from kdelay import logs
from kdelay.checkpoint import NOTHING, Checkpoint, CheckpointFormatError, CheckpointRecord
from zk.errors import CoordinationError, FencedError

log = logs.get(__name__)


class CheckpointWriter(Protocol):
    """The part of zk.CheckpointStore the forwarder uses (tests pass a fake)."""

    def claim_epoch(self) -> int: ...

    def load(self) -> bytes | None: ...

    def write(self, data: bytes) -> object: ...


class IngestLike(Protocol):
    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool: ...


class Forwarder:
    """Releases due entries while this replica is the active master."""

    def __init__(
        self,
        cfg: ReplicaConfig,
        store: Store,
        ingest: IngestLike,
        metrics: Metrics,
        *,
        sender: Sender,
        on_fenced: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._ingest = ingest
        self._metrics = metrics
        self._sender = sender
        self._on_fenced = on_fenced
        self._clock = clock
        self._cond = threading.Condition()
        self._stop = threading.Event()
        # State flipped by other threads, guarded by _cond.
        self._checkpoints: CheckpointWriter | None = None
        self._generation = 0  # bumped by every activate/deactivate
        self._paused = False
        self._fenced = False
        self._wake_at_ms: int | None = None
        self._tombstones: deque[tuple[str, int, int]] = deque(maxlen=1_000_000)
        # Forwarder-thread state.
        self._retries = RetryPolicy.for_replica(cfg, clock)
        self._epoch = -1
        self._claim = NOTHING
        self._unwritten = False
        self._last_cp_mono = 0.0
        self._truncated = False
        self.last_checkpoint_ms = 0
        self.active = threading.Event()  # set while forwarding as master

    # -- control API (any thread, never blocks) --------------------------------------------

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
        """
        with self._cond:
            self._checkpoints = checkpoints
            self._generation += 1
            self._paused = False
            self._cond.notify_all()
            return self._generation

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
        """Make :meth:`run` return after the current round and a last checkpoint."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()

    def notify_new(self, deliver_at_ms: int) -> None:
        """Ingest stored an entry due at ``deliver_at_ms``: wake up if it is earlier."""
        with self._cond:
            if self._wake_at_ms is None or deliver_at_ms < self._wake_at_ms:
                self._wake_at_ms = deliver_at_ms
                self._cond.notify_all()

    def add_tombstones(self, retired: Iterable[tuple[str, int, int]]) -> None:
        """Cancelled ids (id, buffer partition, offset) whose tombstones the master writes."""
        with self._cond:
            if self._checkpoints is not None:
                self._tombstones.extend(retired)

    # -- the forwarder thread --------------------------------------------------------------

    def _may_forward(self, generation: int) -> bool:
        with self._cond:
            return (
                generation == self._generation
                and self._checkpoints is not None
                and not self._paused
                and not self._stop.is_set()
            )

    def run(self) -> None:
        """The forwarder thread: idle until activated, then loop until deactivated."""
        while not self._stop.is_set():
            with self._cond:
                while self._checkpoints is None and not self._stop.is_set():
                    self._tombstones.clear()  # a follower's cancels are the master's business
                    self._cond.wait()
                checkpoints = self._checkpoints
                generation = self._generation
            if checkpoints is None:
                break
            try:
                self._serve(checkpoints, generation)
            except FencedError as exc:
                self._metrics.checkpoint_rejected.inc()
                log.warning("forwarder.checkpoint_rejected", error=str(exc))
                self._fence("fenced", str(exc))
            except (CoordinationError, CheckpointFormatError) as exc:
                log.warning("forwarder.cannot_become_master", error=str(exc))
                self._fence("coordination error", str(exc))
        self._sender.close()

    def _fence(self, reason: str, why: str) -> None:
        with self._cond:
            self._fenced = True  # stays engaged until the owner rejoined the election
        self.deactivate(reason)
        self._on_fenced(why)

    def _serve(self, checkpoints: CheckpointWriter, generation: int) -> None:
        self._epoch = checkpoints.claim_epoch()
        data = checkpoints.load()
        if data is not None:
            cp = CheckpointRecord.decode(data).checkpoint
            dropped = self._store.apply_checkpoint(cp)
            self._claim = cp
            log.info(
                "forwarder.checkpoint_loaded",
                time_ms=cp.time_ms,
                offsets=cp.offsets,
                dropped=dropped,
            )
            while not self._ingest.wait_ingested(cp.offsets, 1.0, self._stop):
                with self._cond:
                    if generation != self._generation or self._stop.is_set():
                        return
        else:
            self._claim = NOTHING
        self._retries.clear()
        checkpoints.write(self._record())  # confirms the epoch before the first record leaves
        self._last_cp_mono = self._clock.monotonic()
        self._unwritten = False
        self._metrics.is_master.set(1)
        self._metrics.checkpoint_age.set(0)
        self.active.set()
        log.info("forwarder.started", epoch=self._epoch)
        self._sender.start()
        while True:
            with self._cond:
                if generation != self._generation or self._stop.is_set():
                    break
                paused = self._paused
            if not paused:
                self.forward_once(checkpoints, generation)
            if not self._sleep(generation):
                break
        # Leaving: a final claim for what was delivered; rejected if a newer master exists.
        if self._unwritten:
            self._write_checkpoint(checkpoints)

    def _sleep(self, generation: int) -> bool:
        """Wait for the next reason to run a round; False when deactivated or stopping."""
        with self._cond:
            wake = self._next_wake_ms()
            # An entry ingest announced during the round is already in _wake_at_ms.
            self._wake_at_ms = wake if self._wake_at_ms is None else min(wake, self._wake_at_ms)
            while True:
                if generation != self._generation or self._stop.is_set():
                    return False
                target = self._wake_at_ms
                now = self._clock.wall_ms()
                if not self._paused and target is not None and target <= now:
                    return True
                timeout = None if target is None or self._paused else (target - now) / 1000
                self._cond.wait(timeout if timeout is None else max(timeout, 0.0005))

    def _next_wake_ms(self) -> int:
        now_wall = self._clock.wall_ms()
        if self._truncated:
            return now_wall
        # Everything due by now was handled (or is held for a retry): look past now.
        candidates: list[int] = []
        nxt = self._store.next_due_ms(after_ms=now_wall)
        if nxt is not None:
            candidates.append(nxt)
        retry_in = self._retries.next_retry_in_ms()
        if retry_in is not None:
            candidates.append(now_wall + retry_in + 1)
        interval = self._cfg.checkpoint_interval_ms
        since = int((self._clock.monotonic() - self._last_cp_mono) * 1000)
        if self._unwritten:
            candidates.append(now_wall + max(0, interval - since))
        else:
            # Idle: refresh the claim now and then, so its age tells operators we are alive.
            candidates.append(now_wall + max(0, 10 * interval - since))
        return min(candidates)

    # -- one round -------------------------------------------------------------------------

    def forward_once(self, checkpoints: CheckpointWriter, generation: int) -> RoundResult:
        """One round: plan what is due, send it, settle the outcomes, advance the checkpoint.

        ``generation`` is the one :meth:`activate` returned: nothing is sent once it is stale.
        """
        with self._cond:
            self._wake_at_ms = None  # consumed: later announcements wake the next sleep
        # 1. plan
        offsets = self._store.offsets()  # noted before the scan: all below is in the store
        now = self._clock.wall_ms()
        due = self._store.due(now, self._cfg.scan_batch)
        plan = plan_round(due, limit=self._cfg.scan_batch, waiting=self._retries.waiting)
        self._truncated = plan.truncated
        if not plan.truncated:
            # A retried entry is due, so a full scan sees it unless it was removed (cancelled).
            self._retries.retain({e.key for e in plan.entries})
        # 2. send
        sent = plan.sendable if self._may_forward(generation) else []
        outcomes = self._sender.send(sent)
        # 3. settle
        delivered, dead_lettered = self._settle(sent, outcomes)
        removed = {e.key for e in (*delivered, *dead_lettered)}
        # 4. checkpoint
        claim = claim_ms(plan, now, removed)
        self._checkpoint(checkpoints, Checkpoint(claim, offsets))
        held = len(plan.entries) - len(removed)
        return RoundResult(len(delivered), len(dead_lettered), held, claim)

    def _settle(
        self, sent: Sequence[Entry], outcomes: Sequence[Outcome]
    ) -> tuple[list[Entry], list[Entry]]:
        """Delete what was delivered or dead-lettered (returned), schedule retries for the rest."""
        delivered: list[Entry] = []
        dead: list[tuple[Entry, KafkaError]] = []
        for entry, outcome in zip(sent, outcomes, strict=True):
            err = outcome.error
            if err is None:
                delivered.append(entry)
                lateness_ms = max(0, outcome.timestamp_ms - entry.message.deliver_at_ms)
                self._metrics.lateness.observe(lateness_ms / 1000)
                continue
            self._metrics.forward_errors.labels(error_name(err)).inc()
            permanent = is_permanent(err)
            verdict = self._retries.failed(entry.key, permanent=permanent)
            if verdict.dead_letter:
                dead.append((entry, err))
                continue
            log.warning(
                "forwarder.forward_failed",
                id=entry.message.id,
                topic=entry.message.topic,
                partition=entry.message.partition,
                attempt=verdict.attempts,
                error=str(err),
                permanent=permanent,
            )
        dead_lettered: list[Entry] = []
        for (entry, err), acked in zip(dead, self._sender.dead_letter(dead), strict=True):
            if acked:  # else it stays, and is tried (and dead-lettered) again next round
                dead_lettered.append(entry)
                self._metrics.dead_lettered.labels(error_name(err)).inc()
        done = [*delivered, *dead_lettered]
        self._retries.forget(e.key for e in done)
        if done:
            self._store.remove(done)
            self._metrics.forwarded.inc(len(delivered))
            self._metrics.pending.set(self._store.pending)
            with self._cond:
                self._tombstones.extend((e.message.id, e.partition, e.offset) for e in done)
        return delivered, dead_lettered

    def _checkpoint(self, checkpoints: CheckpointWriter, claim: Checkpoint) -> None:
        """Take the round's claim unless it is older, and write it once the interval passed."""
        if claim.time_ms >= self._claim.time_ms:
            self._claim = claim
        self._unwritten = True
        elapsed_s = self._clock.monotonic() - self._last_cp_mono
        if elapsed_s >= self._cfg.checkpoint_interval_ms / 1000:
            self._write_checkpoint(checkpoints)

    def _record(self) -> bytes:
        """The current claim as this master's checkpoint document."""
        cp = self._claim
        writer, written_at = self._cfg.name, self._clock.wall_ms()
        return CheckpointRecord(cp.time_ms, cp.offsets, self._epoch, writer, written_at).encode()

    def _write_checkpoint(self, checkpoints: CheckpointWriter) -> None:
        try:
            checkpoints.write(self._record())
        except FencedError:
            raise  # a newer master exists: stop at once
        except CoordinationError as exc:
            # The claim cannot be confirmed: stop as if deposed; the election sorts it out.
            raise FencedError(f"checkpoint write unconfirmed: {exc}") from None
        self._last_cp_mono = self._clock.monotonic()
        self.last_checkpoint_ms = self._clock.wall_ms()
        self._unwritten = False
        self._metrics.checkpoint_age.set(0)
        self._store.apply_checkpoint(self._claim)
        with self._cond:
            retired = list(self._tombstones)
            self._tombstones.clear()
        if retired:
            self._sender.tombstones(retired)
