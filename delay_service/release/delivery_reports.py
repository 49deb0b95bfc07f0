"""Settling the records that completed: what the forwarder does with each delivery report.

- a release acknowledged: the entry was delivered; it leaves the store, its id gets a tombstone;
- a release failed: the release backoff decides (``release/backoff.py``): back off, holding the
  entry's target, or — a permanent error on the ``dead_letter_after``-th attempt — dead-letter
  it;
- a dead letter acknowledged: the entry leaves the store like a delivered one;
- a dead letter failed: the entry and its target back off too, and the dead letter is written
  again only after that (a failing dead-letter topic is not written to every round).

Logs: one ``forwarder.target_held`` event per target and round whose releases failed (topic,
partition, error, failed records, attempt, backoff), and one ``forwarder.forward_failed`` per
entry whose error is permanent (it heads for the dead-letter topic).

Threads: a Settler belongs to the forwarder thread, like the sender and release backoff it uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from kdelay import logs
from kdelay.buffer import DEAD_LETTER_TOPIC, Fate, accepted_ms
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.backoff import ReleaseBackoff, Verdict
from kdelay.delay_service.release.in_flight import Completion
from kdelay.delay_service.release.owner_acls import count_released
from kdelay.delay_service.release.producer import error_name, is_permanent
from kdelay.delay_service.release.sender import ERROR_HEADER, Sender, dead_letter_error
from kdelay.delay_service.store.due_scan import Target, target_of
from kdelay.delay_service.store.entry import Entry, entry_seq
from kdelay.delay_service.store.outcomes import DEAD_LETTERED, DELIVERED
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.tombstones import Retired, TombstoneQueue

log = logs.get(__name__)


@dataclass(slots=True)
class Settled:
    """What settling some completions did."""

    delivered: list[Entry] = field(default_factory=list)
    dead_lettered: list[Entry] = field(default_factory=list)
    dead_letters_sent: list[bytes] = field(default_factory=list)  # keys now in flight again

    def merged(self, other: Settled) -> Settled:
        """This settlement and a later one of the same round, as one."""
        return Settled(
            [*self.delivered, *other.delivered],
            [*self.dead_lettered, *other.dead_lettered],
            [*self.dead_letters_sent, *other.dead_letters_sent],
        )

    @property
    def removed(self) -> set[bytes]:
        """Keys of the entries that left the store."""
        return {e.key for e in (*self.delivered, *self.dead_lettered)}


@dataclass(slots=True)
class _Failed:
    first: Completion
    records: int = 0
    attempt: int = 0


def attempt_failed(
    entry: Entry, err: KafkaError, retries: ReleaseBackoff, metrics: Metrics
) -> Verdict:
    """Count one failed release of ``entry`` (both delivery modes): the error metric, the release
    backoff's verdict, and a ``forwarder.forward_failed`` log when a permanent error is to be
    retried (on the ``dead_letter_after``-th attempt the entry heads for the dead letters)."""
    metrics.forward_errors.labels(error_name(err)).inc()
    permanent = is_permanent(err)
    verdict = retries.failed(entry.key, permanent=permanent, target=target_of(entry))
    if permanent and not verdict.dead_letter:
        log.warning(
            "forwarder.forward_failed",
            id=entry.message.id,
            topic=entry.message.topic,
            partition=entry.message.partition,
            attempt=verdict.attempts,
            error=str(err),
            permanent=True,
        )
    return verdict


class Settler:
    """Applies delivery reports to the store, the release backoff, the metrics and tombstones."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        retries: ReleaseBackoff,
        sender: Sender,
        tombstones: TombstoneQueue,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._retries = retries
        self._sender = sender
        self._tombstones = tombstones

    def settle(self, completions: Sequence[Completion], *, may_send: bool) -> Settled:
        """Settle ``completions``; dead letters are sent only when ``may_send`` (still master)."""
        out = Settled()
        fates = {c.entry.key: fate_of(c) for c in completions if c.error is None}
        to_dead_letter: list[tuple[Entry, KafkaError]] = []
        failed: dict[Target, _Failed] = {}
        lateness: list[float] = []  # seconds, of each delivered release
        for done in completions:
            entry, err = done.entry, done.error
            if done.dead_letter:
                self._settle_dead_letter(done, out)
            elif err is None:
                out.delivered.append(entry)
                lateness.append(max(0, done.timestamp_ms - entry.message.deliver_at_ms) / 1000)
            else:
                verdict = attempt_failed(entry, err, self._retries, self._metrics)
                if verdict.dead_letter:
                    to_dead_letter.append((entry, err))
                    continue
                seen = failed.setdefault(target_of(entry), _Failed(done))
                seen.records += 1
                seen.attempt = max(seen.attempt, verdict.attempts)
        for target, seen in failed.items():
            err = seen.first.error
            log.warning(
                "forwarder.target_held",
                topic=target[0],
                partition=target[1],
                error=str(err),
                permanent=err is not None and is_permanent(err),
                records=seen.records,
                attempt=seen.attempt,
                backoff_ms=self._retries.backoff_ms(seen.attempt),
            )
        if to_dead_letter and may_send:
            self._sender.submit_dead_letters(to_dead_letter)
            out.dead_letters_sent = [e.key for e, _ in to_dead_letter]
        self._remove([*out.delivered, *out.dead_lettered], fates)
        count_released(self._metrics, out.delivered)
        self._metrics.lateness.observe_all(lateness)
        return out

    def _settle_dead_letter(self, done: Completion, out: Settled) -> None:
        entry, err = done.entry, done.error
        reason = error_name(done.cause) if done.cause is not None else "unknown"
        if err is None:
            out.dead_lettered.append(entry)
            self._metrics.dead_lettered.labels(reason).inc()
            return
        self._metrics.dead_letter_errors.labels(error_name(err)).inc()
        backoff_ms = self._retries.dead_letter_failed(entry.key, target=target_of(entry))
        log.error(
            "sender.dead_letter_failed",
            id=entry.message.id,
            topic=entry.message.topic,
            partition=entry.message.partition,
            error=str(err),
            backoff_ms=backoff_ms,
        )

    def _remove(self, done: list[Entry], fates: dict[bytes, Fate]) -> None:
        if not done:
            return
        self._retries.forget(e.key for e in done)
        self._store.remove(done, fates)
        self._metrics.pending.set(self._store.pending)
        self._tombstones.add(retired(done, fates))


def fate_of(done: Completion) -> Fate:
    """What became of an acknowledged release or dead letter, for the message's status."""
    msg = done.entry.message
    dead = done.dead_letter or msg.topic == DEAD_LETTER_TOPIC  # poison goes there directly
    return Fate(
        DEAD_LETTERED if dead else DELIVERED,
        msg.topic,
        (msg.partition if msg.partition >= 0 else None) if dead else done.partition,
        None if dead else done.offset,
        done.timestamp_ms,
        msg.deliver_at_ms,
        msg.occurrence if msg.repeat is not None else None,
        dead_letter_reason(done) if dead else None,
        accepted_ms(entry_seq(done.entry.key)),
        msg.owner,
    )


def dead_letter_reason(done: Completion) -> str:
    """Why ``done``'s message was dead-lettered: the ``kdelay-error`` its dead letter carries
    (the target's error, or the poison record's problem, ``poison.py``)."""
    if done.cause is not None:
        return dead_letter_error(done.cause)
    for name, value in done.entry.message.headers:
        if name == ERROR_HEADER and value is not None:
            return value.decode("utf-8", "replace")
    return "unknown"


def retired(done: Sequence[Entry], fates: Mapping[bytes, Fate]) -> list[Retired]:
    """The tombstones owed for entries that left the store, with what became of them."""
    return [
        Retired(e.message.id, e.message.uid, e.partition, e.offset, fates.get(e.key)) for e in done
    ]
