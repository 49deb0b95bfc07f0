"""Exactly-once release (``--delivery exactly-once``): one Kafka transaction per round.

A round of :class:`ExactlyOnceForwarder` is the at-least-once round (``forwarder.py``) made
atomic:

1. *plan* as there: the due entries of targets not held, by the broker's clock;
2. *send* inside a transaction (``txn_sender.py``): the releases (each with a recurring
   message's next occurrence, for the buffer topic) and the dead letters owed (an entry whose
   last attempt failed permanently);
3. *wait* at most ``txn_ack_wait_ms`` for every record's acknowledgement. If one failed or did
   not answer, the transaction is *aborted* — read_committed consumers never see any of it —
   and only the targets that failed are held (backoff, and dead letters after
   ``dead_letter_after`` permanent failures, as in ``release/backoff.py``); the others go again
   in the next round's transaction, at once. Otherwise the tombstones of everything the round
   retires (with where each was written, for its status) and those queued by cancels join
   the transaction;
4. *commit* with the checkpoint ``(T, offsets)`` that covers the round in the same
   transaction (``__kdelay_checkpoint``, keyed by the delay set): a release and the checkpoint
   that drops it are visible together or not at all. Only then does the store delete the
   entries; ZooKeeper gets a copy of the checkpoint (for ``kdelay status`` and the followers'
   stores) at most every ``checkpoint_interval_ms``.

Which store is authoritative: the Kafka checkpoint, since only it is atomic with the releases.
A new master claims a ZooKeeper epoch, calls ``init_transactions()`` (which fences the old
master at the broker and resolves its open transaction), then reads both checkpoints and
starts from the one with the higher epoch — Kafka's on a tie, as ZooKeeper's copy is written
after the commit and may lag. ZooKeeper stays authoritative for who is master. Before its first
round it also ingests its buffer partitions to their ends as of the fence (``takeover.py``):
what the old masters released past their checkpoint's time is retired by tombstones beyond
the checkpoint's offsets.

A failing target costs the others at most one ``txn_ack_wait_ms`` per attempt of the failing
target (its backoff doubles up to ``retry_backoff_max_ms``), unlike at-least-once, where
rounds never wait on it: a transaction commits all of its partitions or none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import KafkaError

from kdelay import logs
from kdelay.buffer import Fate
from kdelay.checkpoint import Checkpoint, CheckpointRecord
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import EXACTLY_ONCE, ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.delivery_reports import attempt_failed, fate_of, retired
from kdelay.delay_service.release.forwarder import Forwarder, IngestLike
from kdelay.delay_service.release.forwarder_control import CheckpointWriter
from kdelay.delay_service.release.in_flight import Completion
from kdelay.delay_service.release.owner_acls import count_released
from kdelay.delay_service.release.producer import error_name, is_permanent
from kdelay.delay_service.release.round import RoundResult, claim_ms, plan_scan
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.takeover import buffer_ends, catch_up
from kdelay.delay_service.release.txn_sender import TxnSender, load_checkpoint
from kdelay.delay_service.store.due_scan import Holds, Target, target_of
from kdelay.delay_service.store.entry import Entry
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.tombstones import Retired
from kdelay.zk.errors import FencedError

log = logs.get(__name__)

_TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)


class ExactlyOnceForwarder(Forwarder):
    """A forwarder whose rounds are Kafka transactions; its sender must be a TxnSender."""

    def __init__(
        self,
        cfg: ReplicaConfig,
        store: Store,
        ingest: IngestLike,
        metrics: Metrics,
        *,
        sender: TxnSender,
        on_fenced: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
        hold: Callable[[], str | None] = lambda: None,
        ends: Callable[[], Mapping[int, int]] = dict,
    ) -> None:
        super().__init__(
            cfg, store, ingest, metrics, sender=sender, on_fenced=on_fenced, clock=clock, hold=hold
        )
        self._txn = sender
        self._ends = ends  # the shard's buffer ends, for a takeover (make_forwarder's: Kafka's)
        self._doomed: dict[bytes, KafkaError] = {}  # entries owed a dead letter
        self._committed_mono = 0.0  # when the last transaction committed
        self._silent_aborts = 0  # rounds in a row aborted without any acknowledgement

    # -- a new term ------------------------------------------------------------------------

    def load_checkpoint(self, checkpoints: CheckpointWriter) -> bytes | None:
        """The newer of Kafka's and ZooKeeper's checkpoint documents (Kafka's on a tie), after
        ingesting the shard's buffer partitions to their ends as of the fence (takeover.py)."""
        self._doomed.clear()
        kafka = load_checkpoint(self._cfg)
        ends = self._ends()  # noted after init_transactions(): no older release can commit
        control = self.control
        generation = control.generation
        catch_up(self._ingest, ends, control.stopping, lambda: control.generation == generation)
        zk = checkpoints.load()
        if kafka is None or zk is None:
            return kafka if zk is None else zk
        in_kafka, in_zk = CheckpointRecord.decode(kafka), CheckpointRecord.decode(zk)
        source = "kafka" if in_kafka.epoch >= in_zk.epoch else "zookeeper"
        log.info("forwarder.checkpoint_source", source=source, kafka=in_kafka.epoch, zk=in_zk.epoch)
        return kafka if source == "kafka" else zk

    # -- one round -------------------------------------------------------------------------

    def forward_once(self, checkpoints: CheckpointWriter, generation: int) -> RoundResult:
        """One transaction: plan, send, wait, then commit with the checkpoint, or abort."""
        self.control.take_wake()
        may_send = self.control.may_forward(generation) and self._hold() is None
        offsets = self._store.offsets()  # noted before the scan: all below is in the store
        now = self._planned_ms = self._clock.wall_ms()
        scan, skip = self._scan(now, self._retries.held_targets())
        plan = plan_scan(scan, waiting=None if self._retries.idle else self._retries.waiting)
        if not plan.truncated:
            scanned = {e.key for e in plan.entries}
            self._retries.retain(scanned, passed_over=skip)
            # an entry owed a dead letter and gone from the store was cancelled meanwhile
            self._doomed = {
                k: v
                for k, v in self._doomed.items()
                if k in scanned or self._retries.attempts(k) > 0
            }
        held_count = plan.skipped + len(plan.entries) - len(plan.sendable)
        sent = self._probed(plan.sendable) if may_send else []
        self._released(sent, now)  # rate limits charged even if the transaction aborts
        held_count += len(plan.sendable) - len(sent) if may_send else 0
        # Never back in time, and never an older time with newer offsets: an entry already
        # due at that time when it arrived (a delay of 0, a deliver-at in the past) has an
        # offset past the old claim's, and (old time, new offsets) would cover it unreleased.
        # The old claim stays, whole, until the time can move past what is still pending.
        claimed = claim_ms(plan, now, {e.key for e in sent})
        claim = Checkpoint(claimed, offsets) if claimed >= self._claim.time_ms else self._claim
        owed = self._tombstones.take() if may_send else []
        since_commit_s = self._clock.monotonic() - self._committed_mono
        refresh = (
            may_send
            and claim != self._claim
            and since_commit_s >= self._cfg.checkpoint_interval_ms / 1000
        )
        result = RoundResult(0, 0, held_count + len(sent), self._claim.time_ms)
        removed: set[bytes] = set()
        if sent or owed or refresh:
            self._rescan = plan.truncated and bool(sent)
            releases = [e for e in sent if e.key not in self._doomed]
            dead = [(e, self._doomed[e.key]) for e in sent if e.key in self._doomed]
            fates = self._transaction(releases, dead, owed, claim)
            if fates is not None:
                self._settle(releases, [e for e, _ in dead], claim, fates)
                removed = {e.key for e in sent}
                result = RoundResult(len(releases), len(dead), held_count, claim.time_ms)
            else:
                self._tombstones.add(owed)  # still owed: the next transaction writes them
        self._sweep.advance(scan, (e.key for e in plan.entries if e.key not in removed))
        if self._unwritten and (
            self._clock.monotonic() - self._last_cp_mono >= self._cfg.checkpoint_interval_ms / 1000
        ):
            self._write_zookeeper(checkpoints)
        self._metrics.targets_held.set(len(self._retries.held_targets()))
        return result

    def _probed(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` minus those of a target that failed before and has no leader now: a
        metadata request, not a transaction, finds out, so it stalls no one (it stays held,
        and a permanent error such as a deleted topic counts towards its dead letter)."""
        if self._retries.idle:
            return entries  # no target failed before
        suspects = {target_of(e) for e in entries if self._retries.attempts(e.key) > 0}
        down = {t: err for t in suspects if (err := self._txn.reachable(*t)) is not None}
        if not down:
            return entries
        kept: list[Entry] = []
        behind = Holds(set[Target]())  # may share a partition with one left out: waits too
        for e in entries:
            target = target_of(e)
            err = down.get(target)
            if err is None:
                if not behind.holds(target):
                    kept.append(e)
                else:
                    behind.add(target)  # left out in turn: what may share its partition waits
            elif e.key not in self._doomed:  # a dead letter does not need its target
                self._attempt_failed(e, err)
                behind.add(target)
            else:
                kept.append(e)
        for (topic, partition), err in down.items():
            log.info(
                "forwarder.target_unreachable", topic=topic, partition=partition, error=str(err)
            )
        return kept

    def _transaction(
        self,
        releases: list[Entry],
        dead: list[tuple[Entry, KafkaError]],
        owed: list[Retired],
        claim: Checkpoint,
    ) -> dict[bytes, Fate] | None:
        """Produce the round in one transaction and commit it: what became of each entry, or
        None if it was aborted."""
        txn, clock, phase = self._txn, self._clock, self._metrics.round_phase
        began = clock.monotonic()
        txn.begin()
        txn.submit(releases)
        txn.submit_dead_letters(dead)
        keys = [e.key for e in releases] + [e.key for e, _ in dead]
        sent = clock.monotonic()
        phase.labels("send").observe(sent - began)
        txn.wait(keys, sent + self._patience_s())
        acked = clock.monotonic()
        phase.labels("acks").observe(acked - sent)
        done = txn.take_completed()
        failures = [c for c in done if c.error is not None]
        unanswered = [k for k in keys if txn.is_in_flight(k)]
        silent = bool(keys) and not done and len(unanswered) == len(keys)
        self._silent_aborts = self._silent_aborts + 1 if silent else 0
        if failures or unanswered:
            txn.abort()
            self._not_released(keys)
            self._metrics.transactions.labels("aborted").inc()
            self._failed(failures, unanswered, releases, dead)
            return None
        fates = {c.entry.key: fate_of(c) for c in done}
        txn.tombstones([*owed, *retired([*releases, *(e for e, _ in dead)], fates)])
        previous, self._claim = self._claim, claim
        txn.checkpoint(self._record())
        failed = txn.commit()
        phase.labels("commit").observe(clock.monotonic() - acked)
        if failed is not None:
            self._claim = previous
            self._not_released(keys)
            self._metrics.transactions.labels("aborted").inc()
            return None
        self._committed_mono = self._clock.monotonic()
        self._metrics.transactions.labels("committed").inc()
        self._metrics.lateness.observe_all(
            max(0, c.timestamp_ms - c.entry.message.deliver_at_ms) / 1000
            for c in done
            if not c.dead_letter
        )
        return fates

    def _not_released(self, keys: list[bytes]) -> None:
        """The transaction was aborted: none of its releases became visible. A cancel that
        waited on one applies now (``in_round.py``); its tombstones join the next one."""
        self._tombstones.add(self._store.not_released(keys))

    def _patience_s(self) -> float:
        """How long this round waits for its acknowledgements: ``txn_ack_wait_ms``, doubled for
        each round in a row that was aborted with *no* acknowledgement at all (a broker slow
        for everyone), at most ``produce_timeout_ms``: such a broker still gets rounds
        committed (no livelock of aborts), while a target that fails beside healthy ones (they
        answer) costs them only ``txn_ack_wait_ms``."""
        wait_ms: int = self._cfg.txn_ack_wait_ms * 2 ** min(self._silent_aborts, 16)
        return min(wait_ms, self._cfg.produce_timeout_ms) / 1000

    def _failed(
        self,
        failures: Sequence[Completion],
        unanswered: list[bytes],
        releases: list[Entry],
        dead: list[tuple[Entry, KafkaError]],
    ) -> None:
        """Hold the targets that failed the aborted transaction; the others go again."""
        for c in failures:
            if c.error is not None and c.error.fatal():
                raise FencedError(f"release fenced: {c.error.str()}")
        by_key = {e.key: e for e in releases} | {e.key: e for e, _ in dead}
        errors = [(c.entry, c.error or _TIMED_OUT, c.dead_letter) for c in failures]
        errors += [(by_key[k], _TIMED_OUT, k in self._doomed) for k in unanswered]
        for entry, err, dead_letter in errors:
            target = target_of(entry)
            if dead_letter:
                self._metrics.dead_letter_errors.labels(error_name(err)).inc()
                backoff = self._retries.dead_letter_failed(entry.key, target=target)
            else:
                backoff = self._retries.backoff_ms(self._attempt_failed(entry, err))
            log.warning(
                "forwarder.target_held",
                topic=target[0],
                partition=target[1],
                id=entry.message.id,
                error=str(err),
                permanent=is_permanent(err),
                dead_letter=dead_letter,
                backoff_ms=backoff,
                aborted=True,
            )

    def _attempt_failed(self, entry: Entry, err: KafkaError) -> int:
        """Count a failed attempt (held, or owed a dead letter); returns the attempts so far."""
        verdict = attempt_failed(entry, err, self._retries, self._metrics)
        if verdict.dead_letter:
            self._doomed[entry.key] = err
        return verdict.attempts

    def _settle(
        self,
        delivered: list[Entry],
        dead_lettered: list[Entry],
        claim: Checkpoint,
        fates: dict[bytes, Fate],
    ) -> None:
        """The transaction committed: its entries leave the store, the claim applies."""
        done = [*delivered, *dead_lettered]
        if done:
            self._retries.forget(e.key for e in done)
            for e in dead_lettered:
                reason = self._doomed.pop(e.key, None)
                label = error_name(reason) if reason is not None else "unknown"
                self._metrics.dead_lettered.labels(label).inc()
            self._store.remove(done, fates)
            self._metrics.pending.set(self._store.pending)
            count_released(self._metrics, delivered)
        self._store.apply_checkpoint(claim)
        self._unwritten = True  # ZooKeeper's copy is behind

    def _write_checkpoint(self, checkpoints: CheckpointWriter) -> None:
        """Only ZooKeeper's copy: the claim itself was committed with its releases."""
        self._write_zookeeper(checkpoints)

    def _produce_tombstones(self) -> None:
        """Tombstones leave only inside a transaction: they stay queued for the next one. A
        term that ends first loses the queue, not the debt: every replica's store keeps what
        cancels owe (``owed_tombstones.py``) and the next master writes it."""


def make_forwarder(
    cfg: ReplicaConfig,
    store: Store,
    ingest: IngestLike,
    metrics: Metrics,
    *,
    on_fenced: Callable[[str], None],
    clock: Clock,
    hold: Callable[[], str | None],
) -> Forwarder:
    """The forwarder of ``cfg.delivery``: exactly-once (transactions) or at-least-once."""
    if cfg.delivery == EXACTLY_ONCE:
        return ExactlyOnceForwarder(
            cfg,
            store,
            ingest,
            metrics,
            sender=TxnSender.for_replica(cfg, clock),
            on_fenced=on_fenced,
            clock=clock,
            hold=hold,
            ends=lambda: buffer_ends(cfg),
        )
    sender = Sender.for_replica(cfg, clock)
    return Forwarder(
        cfg, store, ingest, metrics, sender=sender, on_fenced=on_fenced, clock=clock, hold=hold
    )
