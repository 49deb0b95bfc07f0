"""The master loop: release due entries to their targets, then checkpoint (DESIGN.md).

One round, per the delivery invariant:

1. note the ingested offsets O (everything below O is in the store);
2. scan the store for entries due by now = T, in key order (due time, then arrival), and
   produce each to its exact topic and partition (-1: the partitioner picks from the key)
   through an idempotent producer (acks=all), with the record timestamp = release time;
3. when every record is acknowledged, delete the entries, write the checkpoint (T, O) -- at
   most every ``checkpoint_interval_ms`` -- and write tombstones for delivered and cancelled
   ids to the buffer topic.

Between rounds the thread sleeps until the next due time, the next retry, or the next pending
checkpoint write, unless ingest signals an earlier new entry: no busy loop, no fixed tick.

Failures: an entry that fails is held with exponential backoff, and every later entry for the
same target waits behind it, so per-target order is kept. A permanent error (unknown topic or
partition, authorisation, record too large, invalid record) is retried too; after
``dead_letter_after`` attempts the entry goes to ``__kdelay_dead_letter`` with a
``kdelay-error`` header and its target is unblocked. Held entries hold the checkpoint time below
their due time; a claim never moves backwards. Within one round a transient failure cannot be
recalled from the records already sent after it; librdkafka's idempotent producer fails the
rest of that partition's queue with it, which keeps the order in practice.

A checkpoint write rejected by ZooKeeper (a newer epoch exists) deactivates the forwarder at
once and calls ``on_fenced``.

Threads: :meth:`Forwarder.run` is the forwarder thread's body; it alone uses the producer and
the checkpoint store while active. The control thread calls :meth:`activate`,
:meth:`deactivate`, :meth:`pause`, :meth:`resume`, :meth:`shutdown`; the ingest thread calls
:meth:`notify_new` and :meth:`add_tombstones`. All of those only flip state under one
Condition and never block on I/O.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from delay_service.config import ReplicaConfig
from delay_service.metrics import Metrics
from delay_service.store import Entry, Store
from kdelay import logs
from kdelay.buffer import DEAD_LETTER_TOPIC, Tombstone, encode
from zk.errors import CoordinationError, FencedError

log = logs.get(__name__)

ERROR_HEADER = "kdelay-error"
TARGET_HEADER = "kdelay-target"

#: Errors retrying cannot fix: after ``dead_letter_after`` attempts the record is dead-lettered.
PERMANENT_ERRORS = frozenset(
    {
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._INVALID_ARG,
    }
)


class ProducerLike(Protocol):
    """The part of confluent_kafka.Producer the forwarder uses (tests pass a fake)."""

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[[KafkaError | None, Message], None] | None = None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None: ...

    def poll(self, timeout: float = -1) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...


class CheckpointWriter(Protocol):
    """The part of zk.CheckpointStore the forwarder uses (tests pass a fake)."""

    epoch: int | None

    def claim_epoch(self) -> int: ...

    def load(self) -> CheckpointLike | None: ...

    def write(self, time_ms: int, offsets: Mapping[int, int]) -> object: ...


class CheckpointLike(Protocol):
    @property
    def time_ms(self) -> int: ...

    @property
    def offsets(self) -> Mapping[int, int]: ...


class IngestLike(Protocol):
    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool: ...


@dataclass(slots=True)
class _Retry:
    attempts: int
    next_at: float  # monotonic seconds
    error: KafkaError


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did (for tests and logs)."""

    delivered: int
    dead_lettered: int
    held: int
    claim_ms: int


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def make_producer(cfg: ReplicaConfig) -> Producer:
    """An idempotent, acks=all producer for targets, dead letters and tombstones."""
    return Producer(
        {
            "bootstrap.servers": cfg.bootstrap_servers,
            "client.id": f"kdelay-replica-{cfg.name}",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": cfg.produce_timeout_ms,
            # Java clients' default, so partition -1 lands where a Java producer would put it.
            "partitioner": "murmur2_random",
        }
    )


def _error_name(err: KafkaError) -> str:
    return str(err.name())


class Forwarder:
    """Releases due entries while this replica is the active master."""

    def __init__(
        self,
        cfg: ReplicaConfig,
        store: Store,
        ingest: IngestLike,
        metrics: Metrics,
        *,
        producer_factory: Callable[[], ProducerLike],
        on_fenced: Callable[[str], None],
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._ingest = ingest
        self._metrics = metrics
        self._producer_factory = producer_factory
        self._producer: ProducerLike | None = None
        self._on_fenced = on_fenced
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
        self._retries: dict[bytes, _Retry] = {}
        self._claim: tuple[int, dict[int, int]] = (-1, {})
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

    def activate(self, checkpoints: CheckpointWriter) -> None:
        """Become master: claim an epoch, load the checkpoint, catch up, then forward."""
        with self._cond:
            self._checkpoints = checkpoints
            self._generation += 1
            self._paused = False
            self._cond.notify_all()

    def deactivate(self, reason: str) -> None:
        """Stop forwarding at once (step-down, lost session, fenced)."""
        with self._cond:
            if self._checkpoints is not None:
                log.info("forwarding stopped", reason=reason)
            self._checkpoints = None
            self._generation += 1
            self.active.clear()
            self._cond.notify_all()
        self._metrics.is_master.set(0)

    def pause(self) -> None:
        """Hold forwarding (ZooKeeper SUSPENDED): leadership is uncertain."""
        with self._cond:
            if not self._paused and self._checkpoints is not None:
                log.info("forwarding paused")
            self._paused = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            if self._paused and self._checkpoints is not None:
                log.info("forwarding resumed")
            self._paused = False
            self._cond.notify_all()

    def shutdown(self) -> None:
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
                log.warning("checkpoint write rejected; stepping down", error=str(exc))
                self._fence("fenced", str(exc))
            except CoordinationError as exc:
                log.warning("cannot become master", error=str(exc))
                self._fence("coordination error", str(exc))
        self._close_producer()

    def _fence(self, reason: str, why: str) -> None:
        with self._cond:
            self._fenced = True  # stays engaged until the owner rejoined the election
        self.deactivate(reason)
        self._on_fenced(why)

    def _close_producer(self) -> None:
        if self._producer is not None:
            remaining = self._producer.flush(10)
            if remaining:
                log.warning("records unacknowledged at shutdown", count=remaining)
            self._producer = None

    def _serve(self, checkpoints: CheckpointWriter, generation: int) -> None:
        epoch = checkpoints.claim_epoch()
        cp = checkpoints.load()
        if cp is not None:
            dropped = self._store.apply_checkpoint(cp.time_ms, cp.offsets)
            self._claim = (cp.time_ms, dict(cp.offsets))
            log.info("checkpoint loaded", time_ms=cp.time_ms, offsets=cp.offsets, dropped=dropped)
            while not self._ingest.wait_ingested(cp.offsets, 1.0, self._stop):
                with self._cond:
                    if generation != self._generation or self._stop.is_set():
                        return
        else:
            self._claim = (-1, {})
        self._retries.clear()
        checkpoints.write(*self._claim)  # confirms the epoch before the first record leaves
        self._last_cp_mono = time.monotonic()
        self._unwritten = False
        self._metrics.is_master.set(1)
        self._metrics.checkpoint_age.set(0)
        self.active.set()
        log.info("master: forwarding", epoch=epoch)
        if self._producer is None:
            self._producer = self._producer_factory()
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
                now = now_ms()
                if not self._paused and target is not None and target <= now:
                    return True
                timeout = None if target is None or self._paused else (target - now) / 1000
                self._cond.wait(timeout if timeout is None else max(timeout, 0.0005))

    def _next_wake_ms(self) -> int:
        now_wall = now_ms()
        if self._truncated:
            return now_wall
        # Everything due by now was handled (or is held for a retry): look past now.
        candidates: list[int] = []
        nxt = self._store.next_due_ms(after_ms=now_wall)
        if nxt is not None:
            candidates.append(nxt)
        if self._retries:
            mono = time.monotonic()
            soonest = min(r.next_at for r in self._retries.values())
            candidates.append(now_wall + max(0, int((soonest - mono) * 1000)) + 1)
        interval = self._cfg.checkpoint_interval_ms
        since = int((time.monotonic() - self._last_cp_mono) * 1000)
        if self._unwritten:
            candidates.append(now_wall + max(0, interval - since))
        else:
            # Idle: refresh the claim now and then, so its age tells operators we are alive.
            candidates.append(now_wall + max(0, 10 * interval - since))
        return min(candidates)

    # -- one round -------------------------------------------------------------------------

    def forward_once(self, checkpoints: CheckpointWriter, generation: int) -> RoundResult:
        """Release everything due now; delete it; checkpoint when the interval has passed."""
        with self._cond:
            self._wake_at_ms = None  # consumed: later announcements wake the next sleep
        offsets = self._store.offsets()
        t_ms = now_ms()
        entries = self._store.due(t_ms, self._cfg.scan_batch)
        truncated = self._truncated = len(entries) >= self._cfg.scan_batch
        mono = time.monotonic()
        blocked: set[tuple[str, int]] = set()
        held_min: int | None = None
        sendable: list[Entry] = []
        for entry in entries:
            target = (entry.message.topic, entry.message.partition)
            retry = self._retries.get(entry.key)
            if target in blocked or (retry is not None and retry.next_at > mono):
                blocked.add(target)
                held_min = _min(held_min, entry.message.deliver_at_ms)
                continue
            sendable.append(entry)
        done: list[Entry] = []
        dead: list[tuple[Entry, KafkaError]] = []
        if sendable and self._may_forward(generation):
            held_min = _min_opt(held_min, self._settle(sendable, done, dead))
        elif sendable:
            held_min = _min(held_min, sendable[0].message.deliver_at_ms)
        dead_done = self._dead_letter(dead) if dead else []
        for entry, _ in dead:
            if entry not in dead_done:
                held_min = _min(held_min, entry.message.deliver_at_ms)
        done.extend(dead_done)
        delivered = len(done) - len(dead_done)
        if done:
            self._store.remove(done)
            self._metrics.forwarded.inc(delivered)
            self._metrics.pending.set(self._store.pending)
            with self._cond:
                self._tombstones.extend((e.message.id, e.partition, e.offset) for e in done)
        claim = t_ms if held_min is None else min(t_ms, held_min - 1)
        if truncated:
            claim = min(claim, entries[-1].message.deliver_at_ms - 1)
        if claim >= self._claim[0]:
            self._claim = (claim, offsets)
        self._unwritten = True
        if time.monotonic() - self._last_cp_mono >= self._cfg.checkpoint_interval_ms / 1000:
            self._write_checkpoint(checkpoints)
        return RoundResult(delivered, len(dead_done), len(entries) - len(done), claim)

    def _settle(
        self, sendable: list[Entry], done: list[Entry], dead: list[tuple[Entry, KafkaError]]
    ) -> int | None:
        """Produce ``sendable``; sort the outcomes into done, dead and held (returned: the
        earliest due time held back for a retry)."""
        held_min: int | None = None
        outcomes = self._produce(sendable)
        mono = time.monotonic()
        for entry, (err, ts) in zip(sendable, outcomes, strict=True):
            if err is None:
                self._retries.pop(entry.key, None)
                done.append(entry)
                self._metrics.lateness.observe(max(0, ts - entry.message.deliver_at_ms) / 1000)
                continue
            self._metrics.forward_errors.labels(_error_name(err)).inc()
            previous = self._retries.get(entry.key)
            attempts = previous.attempts + 1 if previous is not None else 1
            permanent = err.code() in PERMANENT_ERRORS
            if permanent and attempts >= self._cfg.dead_letter_after:
                dead.append((entry, err))
                continue
            backoff = min(
                self._cfg.retry_backoff_ms * 2 ** (attempts - 1), self._cfg.retry_backoff_max_ms
            )
            self._retries[entry.key] = _Retry(attempts, mono + backoff / 1000, err)
            held_min = _min(held_min, entry.message.deliver_at_ms)
            log.warning(
                "forward failed; will retry",
                id=entry.message.id,
                topic=entry.message.topic,
                partition=entry.message.partition,
                attempt=attempts,
                error=str(err),
                permanent=permanent,
            )
        return held_min

    def _write_checkpoint(self, checkpoints: CheckpointWriter) -> None:
        time_ms, offsets = self._claim
        try:
            checkpoints.write(time_ms, offsets)
        except FencedError:
            raise  # a newer master exists: stop at once
        except CoordinationError as exc:
            # The claim cannot be confirmed: stop as if deposed; the election sorts it out.
            raise FencedError(f"checkpoint write unconfirmed: {exc}") from None
        self._last_cp_mono = time.monotonic()
        self.last_checkpoint_ms = now_ms()
        self._unwritten = False
        self._metrics.checkpoint_age.set(0)
        self._store.apply_checkpoint(time_ms, offsets)
        self._write_tombstones()

    def _write_tombstones(self) -> None:
        with self._cond:
            batch = list(self._tombstones)
            self._tombstones.clear()
        if not batch:
            return
        producer = self._producer
        if producer is None:
            producer = self._producer = self._producer_factory()
        for msg_id, partition, offset in batch:
            enc = encode(Tombstone(msg_id, offset))
            self._produce_retrying(
                producer,
                self._cfg.buffer_topic,
                key=enc.key,
                value=enc.value,
                partition=partition,
                headers=list(enc.headers),
                timestamp=0,
                on_delivery=None,
            )
        producer.poll(0)

    def _produce_retrying(
        self,
        producer: ProducerLike,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: list[tuple[str, str | bytes | None]],
        timestamp: int,
        on_delivery: Callable[[KafkaError | None, Message], None] | None,
    ) -> KafkaError | None:
        """produce(), waiting out a full local queue; a synchronous error is returned."""
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    on_delivery=on_delivery,
                    timestamp=timestamp,
                    headers=headers,
                )
            except BufferError:
                producer.poll(0.05)
                continue
            except KafkaException as exc:
                err = exc.args[0]
                return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL)
            return None

    def _produce(self, entries: list[Entry]) -> list[tuple[KafkaError | None, int]]:
        """Produce ``entries`` in order and wait for every acknowledgement."""
        producer = self._producer
        if producer is None:
            producer = self._producer = self._producer_factory()
        results: list[tuple[KafkaError | None, int] | None] = [None] * len(entries)
        waiting = 0
        fatal = False

        def on_delivery_for(i: int, ts: int) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                nonlocal waiting, fatal
                results[i] = (err, ts)
                waiting -= 1
                if err is not None and err.fatal():
                    fatal = True

            return on_delivery

        for i, entry in enumerate(entries):
            msg = entry.message
            ts = now_ms()
            waiting += 1
            err = self._produce_retrying(
                producer,
                msg.topic,
                key=msg.key,
                value=msg.value,
                partition=msg.partition,
                headers=list(msg.delivered_headers()),
                timestamp=ts,
                on_delivery=on_delivery_for(i, ts),
            )
            if err is not None:
                waiting -= 1
                results[i] = (err, ts)
            producer.poll(0)
        deadline = time.monotonic() + self._cfg.produce_timeout_ms / 1000 + 30
        while waiting > 0 and time.monotonic() < deadline:
            producer.poll(0.05)
        if fatal or waiting > 0:
            log.error("producer failed fatally; recreating it", unacknowledged=waiting)
            self._producer = None
        timeout_err = KafkaError(KafkaError._MSG_TIMED_OUT)
        return [r if r is not None else (timeout_err, 0) for r in results]

    def _dead_letter(self, dead: list[tuple[Entry, KafkaError]]) -> list[Entry]:
        """Send permanently failing entries to the dead-letter topic; returns those acked."""
        producer = self._producer or self._producer_factory()
        self._producer = producer
        acked: list[Entry] = []
        pending = 0

        def on_delivery_for(
            entry: Entry, reason: str
        ) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                nonlocal pending
                pending -= 1
                if err is None:
                    acked.append(entry)
                    self._metrics.dead_lettered.labels(reason).inc()
                else:
                    log.error("dead-letter write failed", id=entry.message.id, error=str(err))

            return on_delivery

        for entry, err in dead:
            msg = entry.message
            reason = _error_name(err)
            headers: list[tuple[str, str | bytes | None]] = [
                *msg.delivered_headers(),
                (ERROR_HEADER, f"{reason}: {err.str()}".encode()),
                (TARGET_HEADER, f"{msg.topic}/{msg.partition}".encode()),
            ]
            log.warning(
                "dead-lettering",
                id=msg.id,
                topic=msg.topic,
                partition=msg.partition,
                error=f"{reason}: {err.str()}",
            )
            pending += 1
            sync = self._produce_retrying(
                producer,
                DEAD_LETTER_TOPIC,
                key=msg.key,
                value=msg.value,
                partition=-1,
                headers=headers,
                timestamp=now_ms(),
                on_delivery=on_delivery_for(entry, reason),
            )
            if sync is not None:
                pending -= 1
        deadline = time.monotonic() + self._cfg.produce_timeout_ms / 1000 + 30
        while pending > 0 and time.monotonic() < deadline:
            producer.poll(0.05)
        for entry in acked:
            self._retries.pop(entry.key, None)
        return acked


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _min_opt(a: int | None, b: int | None) -> int | None:
    return a if b is None else _min(a, b)
