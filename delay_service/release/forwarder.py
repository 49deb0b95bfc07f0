"""The master loop: release due entries to their targets, then checkpoint (DESIGN.md).

One round (:meth:`Forwarder.forward_once`), per the delivery invariant:

1. *plan*: settle the delivery reports that arrived since the last round; note the ingested
   offsets O (everything below is in the store); scan the entries due by now = T in key order
   (due time, then arrival), passing over those of *held* targets: a target (topic, partition)
   with records in flight or waiting out a retry backoff (``round.py``, ``Store.due_skipping``),
   so one failing target can neither fill the scan nor delay the others. A scan stops after
   ``scan_skip_limit`` entries passed over, and the next round's goes on from there
   (``sweep.py``), so however many entries a held target has, the others wait a bounded
   number of rounds. A target topic with a release rate limit whose budget for the round is
   spent is passed over the same way (``smoothing.py``), so its burst holds no other topic back;
2. *send* the rest to their exact topic and partition without waiting (``sender.py``: one
   idempotent acks=all producer, record timestamp = release time). A target gets nothing new
   while it has records in flight, so its records leave in key order;
3. *settle*: wait at most ``round_ack_wait_ms`` for this round's acknowledgements, then delete
   what was delivered and queue its tombstones; a failed entry backs off, holding its target; a
   permanent error on the ``dead_letter_after``-th attempt dead-letters it (``delivery_reports.py``,
   ``release/backoff.py``). Records still unacknowledged stay in flight: a later round settles them;
4. *checkpoint*: claim (T, O) with T below the due time of every entry still pending (in flight,
   held, failed, or beyond a cut scan), never moving backwards; write it at most every
   ``checkpoint_interval_ms``, apply it to the store, then produce the queued tombstones
   (``tombstones.py``: never dropped; a full queue forces an early write).

Between rounds the thread sleeps until the next due time, retry or checkpoint write, unless
ingest signals an earlier entry or a record in flight is acknowledged (with records in flight it
serves delivery reports every few milliseconds): no busy loop, no fixed tick. A checkpoint write
rejected by ZooKeeper (a newer epoch exists) deactivates the forwarder at once and calls
``on_fenced``. Records in flight when a term ends are abandoned: their entries stay in the store
for the next master (a duplicate at worst).

``exactly_once.py`` makes each round one Kafka transaction (``--delivery exactly-once``).

Threads: :meth:`Forwarder.run` is the forwarder thread's body; it alone uses the sender, the
release backoff and the checkpoint store. Other threads talk to the forwarder's ``control``
(``forwarder_control.py``): the control thread calls ``activate``, ``deactivate``, ``pause``,
``resume``, ``shutdown``; the ingest thread ``notify_new`` and ``add_tombstones``: they only
flip state under one Condition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from kdelay import logs
from kdelay.checkpoint import NOTHING, Checkpoint, CheckpointFormatError, CheckpointRecord
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.backoff import ReleaseBackoff
from kdelay.delay_service.release.delivery_reports import Settled, Settler
from kdelay.delay_service.release.forwarder_control import CheckpointWriter, ForwarderControl
from kdelay.delay_service.release.owner_acls import OwnerAcls
from kdelay.delay_service.release.producer import is_permanent
from kdelay.delay_service.release.round import RoundResult, claim_ms, next_wake_ms, plan_scan
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.smoothing import Smoothing
from kdelay.delay_service.release.sweep import Sweep
from kdelay.delay_service.store.due_scan import DueScan, Target
from kdelay.delay_service.store.entry import Entry
from kdelay.delay_service.store.store import Store
from kdelay.zk.errors import CoordinationError, FencedError

log = logs.get(__name__)

#: With records in flight, how often the sleeping forwarder serves their delivery reports.
IN_FLIGHT_POLL_S = 0.005


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
        hold: Callable[[], str | None] = lambda: None,
        sweep: Sweep | None = None,
    ) -> None:
        self.control = ForwarderControl(metrics, store.owed_tombstones)
        self.active = self.control.active  # set while forwarding as master
        self._tombstones = self.control.tombstones
        self._metrics = metrics
        self._cfg = cfg
        self._store = store
        self._ingest = ingest
        self._sender = sender
        # What is produced is claimed first: a cancel read since the scan keeps it back, and
        # a cancel read after waits for the release's outcome (in_round.py).
        sender.claim_with(store.claim_release)
        self._on_fenced = on_fenced
        self._clock = clock
        self._hold = hold  # a reason to release nothing this round (clock skew), or None
        # Forwarder-thread state.
        self._retries = ReleaseBackoff.for_replica(cfg, clock)
        self._settler = Settler(store, metrics, self._retries, sender, self._tombstones)
        self._epoch = -1
        self._claim = NOTHING
        self._unwritten = False
        self._last_cp_mono = 0.0
        self._rescan = False  # the last scan was cut with entries sent: scan again at once
        #: When the last round looked for due entries: what fell due after that is still owed.
        self._planned_ms: int | None = None
        self._sweep = sweep or Sweep()  # where the scans of this term stand (sweep.py)
        self._smoothing = Smoothing(
            cfg.release_rate_limit, cfg.release_rate_limits, clock, metrics
        )  # release rate limits per target topic (smoothing.py)
        self._owners = OwnerAcls.for_replica(cfg, metrics, clock)  # owners' WRITE, by Kafka
        self.last_checkpoint_ms = 0

    @property
    def claim(self) -> Checkpoint:
        """The checkpoint this term claims so far (written at most every interval)."""
        return self._claim

    # -- the forwarder thread --------------------------------------------------------------

    def run(self) -> None:
        """The forwarder thread: idle until activated, then loop until deactivated."""
        while not self.control.stopping.is_set():
            term = self.control.wait_term()
            if term is None:
                break
            checkpoints, generation = term
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
        self.control.fence(reason)  # stays engaged until the owner rejoined the election
        self._on_fenced(why)

    def _serve(self, checkpoints: CheckpointWriter, generation: int) -> None:
        self._epoch = checkpoints.claim_epoch()
        self._sender.start()  # exactly-once: fences every earlier master at the broker
        data = self.load_checkpoint(checkpoints)
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
            while not self._ingest.wait_ingested(cp.offsets, 1.0, self.control.stopping):
                if self.control.serving(generation) is None:
                    return
        else:
            self._claim = NOTHING
        self._retries.clear()
        self._sweep.restart()
        self._smoothing.restart()
        checkpoints.write(self._record())  # confirms the epoch before the first record leaves
        self._last_cp_mono = self._clock.monotonic()
        self._unwritten = False
        self._metrics.is_master.set(1)
        self._metrics.checkpoint_age.set(0)
        self.active.set()
        log.info("forwarder.started", epoch=self._epoch)
        try:
            while True:
                paused = self.control.serving(generation)
                if paused is None:
                    break
                if not paused:
                    self.forward_once(checkpoints, generation)
                if not self._sleep(generation):
                    break
            # Leaving: a final claim for what was delivered (refused if a newer master exists);
            # on a graceful stop it covers what was in flight too, settled with a bounded wait.
            if self.control.stopping.is_set() and self._sender.in_flight:
                self._sender.wait_all(self._clock.monotonic() + self._cfg.produce_timeout_ms / 1000)
                self.forward_once(checkpoints, generation)  # settles; sends nothing (stopping)
            if self._unwritten:
                self._write_checkpoint(checkpoints)
        finally:
            self.end_term()

    def end_term(self) -> None:
        """A term as master ended (deactivated, fenced, stopping, or a round that raised).
        Records in flight are abandoned: their entries stay in the store, the claim never
        covered them. A cancel that waited on a release applies in this store, as it did in
        the followers' (``in_round.py``): ``active`` is cleared first, so no proxy takes this
        replica's answer for the master's meanwhile (the next master's decides)."""
        self.active.clear()
        self._sender.abandon()
        self._metrics.targets_held.set(0)
        self._metrics.in_flight.set(0)
        self._tombstones.add(self._store.end_releases())
        self._produce_tombstones()  # acknowledged or cancelled entries: due whoever leads

    def load_checkpoint(self, checkpoints: CheckpointWriter) -> bytes | None:
        """The checkpoint document a new term starts from, or None."""
        return checkpoints.load()  # at-least-once: ZooKeeper's (exactly_once.py: Kafka's too)

    def _sleep(self, generation: int) -> bool:
        """Wait for the next reason to run a round; False when deactivated or stopping."""
        self.control.wake_by(self.next_wake_ms())
        while True:
            poll_s = IN_FLIGHT_POLL_S if self._sender.in_flight else None
            woke = self.control.wait_wake(generation, self._clock.wall_ms, poll_s)
            if woke is not None:
                return woke
            if self._sender.in_flight:
                self._sender.pump(0)  # reports arrive on this thread only
                if self._sender.has_completed and not self.control.paused:
                    return True  # settle them, and send their targets what waits

    def next_wake_ms(self) -> int:
        """When the forwarder thread wakes up next, at the latest (wall-clock ms)."""
        now_wall = self._clock.wall_ms()
        # Everything due when the last round planned was handled (or is held): look past that
        # time, not past now. What fell due while the round ran is owed at once; looking past
        # now left it for the next wake-up (up to 10 checkpoint intervals: ~1 s late).
        looked = now_wall if self._planned_ms is None else min(now_wall, self._planned_ms)
        return next_wake_ms(
            now_wall,
            rescan=self._rescan,
            next_due_ms=None if self._rescan else self._store.next_due_ms(after_ms=looked),
            retry_in_ms=_soonest(self._retries.next_retry_in_ms(), self._smoothing.ready_in_ms()),
            since_checkpoint_ms=int((self._clock.monotonic() - self._last_cp_mono) * 1000),
            interval_ms=self._cfg.checkpoint_interval_ms,
            unwritten=self._unwritten,
        )

    # -- one round -------------------------------------------------------------------------

    def forward_once(self, checkpoints: CheckpointWriter, generation: int) -> RoundResult:
        """One round: plan what is due, send it, settle the outcomes, advance the checkpoint.

        ``generation`` is the one :meth:`activate` returned: nothing is sent once it is stale.
        """
        self.control.take_wake()  # consumed: later announcements wake the next sleep
        may_send = self.control.may_forward(generation) and self._hold() is None
        # 1. plan: first what completed since the last round, so its targets are free again
        self._sender.pump(0)
        settled = self._settle_reports(may_send)
        offsets = self._store.offsets()  # noted before the scan: all below is in the store
        now = self._planned_ms = self._clock.wall_ms()
        held = self._sender.in_flight_targets() | self._retries.held_targets()
        scan, skip = self._scan(now, held)
        plan = plan_scan(scan, waiting=None if self._retries.idle else self._retries.waiting)
        if not plan.truncated:
            # A retried entry is due, so the pass sees it unless it was removed (cancelled).
            self._retries.retain({e.key for e in plan.entries}, passed_over=skip)
        # 2. send
        sent = plan.sendable if may_send else []
        self._sender.submit(sent)
        self._released(sent, now)
        self._rescan = plan.truncated and bool(sent)
        # 3. settle what this round sent, waiting a bounded time: a slow target stays in flight
        deadline = self._clock.monotonic() + self._cfg.round_ack_wait_ms / 1000
        waiting_for = [*(e.key for e in sent), *settled.dead_letters_sent]
        while waiting_for:
            self._sender.wait(waiting_for, deadline)
            more = self._settle_reports(may_send)
            settled = settled.merged(more)
            waiting_for = more.dead_letters_sent
        # 4. checkpoint
        removed = settled.removed
        self._sweep.advance(scan, (e.key for e in plan.entries if e.key not in removed))
        claim = claim_ms(plan, now, removed)
        self._checkpoint(checkpoints, Checkpoint(claim, offsets))
        in_flight_targets = self._sender.in_flight_targets()
        self._metrics.targets_held.set(len(in_flight_targets | self._retries.held_targets()))
        self._metrics.in_flight.set(self._sender.in_flight)
        held_count = plan.skipped + sum(1 for e in plan.entries if e.key not in removed)
        return RoundResult(len(settled.delivered), len(settled.dead_lettered), held_count, claim)

    def _settle_reports(self, may_send: bool) -> Settled:
        """Settle the delivery reports that arrived (``delivery_reports.py``). A release the
        broker or the client refused (a permanent error: surely not written) first leaves the
        release: a cancel that waited on it applies now (``in_round.py``), and that entry is
        settled no further (no retry, no dead letter). A release that may have been written (a
        timeout) stays in release and is retried, as at-least-once retries it anyway: a cancel
        waiting on it then learns it was delivered or dead-lettered."""
        done = self._sender.take_completed()
        refused = [c.entry.key for c in done if c.error is not None and is_permanent(c.error)]
        if refused:
            gone = self._store.not_released(refused)
            if gone:
                self._tombstones.add(gone)
                cancelled = {(r.partition, r.offset) for r in gone}
                done = [c for c in done if (c.entry.partition, c.entry.offset) not in cancelled]
        return self._settler.settle(done, may_send=may_send)

    def _scan(self, now: int, held: set[Target]) -> tuple[DueScan, set[Target]]:
        """This round's scan of the pass (``sweep.py``), passing over ``held`` targets, those
        the pass passed over before and those of topics out of release budget
        (``smoothing.py``); returns it with the targets passed over before it ran."""
        limited = self._smoothing.limited_topics
        skip = self._sweep.skip(held, limited, 2 * self._cfg.scan_skip_limit)
        quota = self._smoothing.skip(skip)
        scan = self._store.due_skipping(
            now,
            self._cfg.scan_batch,
            quota,
            self._cfg.scan_skip_limit,
            self._smoothing.known_view(self._sweep.known),
            start=self._sweep.start,
        )
        # A revoked owner's message goes to the dead letters; one Kafka was not asked about waits.
        scan = self._owners.screen(scan)
        if self._smoothing.planned(now, skip):
            skip |= scan.passed  # a retried entry passed over for its topic's rate is kept
        return scan, skip

    def _released(self, sent: list[Entry], now_ms: int) -> None:
        """``sent`` leave at ``now_ms``: charge their topics' rate limits (``smoothing.py``)."""
        self._smoothing.released(sent, now_ms)
        if self._smoothing.enabled and sent:
            self._sweep.forget(e.key for e in sent)  # cached while their topic was throttled

    def _checkpoint(self, checkpoints: CheckpointWriter, claim: Checkpoint) -> None:
        """Take the round's claim unless it is older, and write it once the interval passed."""
        if claim.time_ms >= self._claim.time_ms:
            self._claim = claim
        self._unwritten = True
        elapsed_s = self._clock.monotonic() - self._last_cp_mono
        if elapsed_s >= self._cfg.checkpoint_interval_ms / 1000 or self._tombstones.full:
            self._write_checkpoint(checkpoints)

    def _record(self) -> bytes:
        """The current claim as this master's checkpoint document."""
        cp = self._claim
        writer, written_at = self._cfg.name, self._clock.wall_ms()
        return CheckpointRecord(cp.time_ms, cp.offsets, self._epoch, writer, written_at).encode()

    def _write_checkpoint(self, checkpoints: CheckpointWriter) -> None:
        self._write_zookeeper(checkpoints)
        self._store.apply_checkpoint(self._claim)
        self._produce_tombstones()

    def _write_zookeeper(self, checkpoints: CheckpointWriter) -> None:
        """Write the claim to ZooKeeper, fenced by this master's epoch."""
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

    def _produce_tombstones(self) -> None:
        retired = self._tombstones.take()
        if retired:
            self._sender.tombstones(retired)


def _soonest(*delays_ms: int | None) -> int | None:
    """The smallest of the delays that are set, or None."""
    known = [d for d in delays_ms if d is not None]
    return min(known) if known else None
