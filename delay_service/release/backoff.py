"""The master's release backoff and dead-letter policy, per entry and per target: pure
bookkeeping, time from an injected clock.

An entry whose forward failed waits out an exponential backoff (``backoff_ms * 2**(n-1)`` after
the n-th failed attempt, at most ``backoff_max_ms``); meanwhile the forwarder holds its target
(:meth:`ReleaseBackoff.held_targets`): that entry and every other one for the same target wait,
so per-target order is kept, while other targets flow. A *permanent* error on the
``dead_letter_after``-th attempt (or later) sends the entry to the dead-letter topic instead;
transient errors are retried for ever. Attempts are counted per entry key. A dead-letter write
that fails backs off too (:meth:`ReleaseBackoff.dead_letter_failed`, the same doubling), so a
failing dead-letter topic is not written to every round.

Threads: a ReleaseBackoff belongs to the forwarder thread; it is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from kdelay.clock import Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.store.due_scan import Holds, Target


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do after a failed attempt."""

    attempts: int  # failed attempts so far, this one included
    dead_letter: bool  # True: dead-letter now; False: retry after the backoff


@dataclass(slots=True)
class _Retry:
    attempts: int
    next_at: float  # monotonic seconds
    target: Target | None = None
    dead_letter_failures: int = 0


class ReleaseBackoff:
    """Failed attempts and backoff deadlines of the entries that failed."""

    def __init__(
        self, *, backoff_ms: int, backoff_max_ms: int, dead_letter_after: int, clock: Clock
    ) -> None:
        self._backoff_ms = backoff_ms
        self._backoff_max_ms = backoff_max_ms
        self._dead_letter_after = dead_letter_after
        self._clock = clock
        self._retries: dict[bytes, _Retry] = {}

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig, clock: Clock) -> ReleaseBackoff:
        """The policy ``cfg``'s retry and dead-letter settings ask for."""
        return cls(
            backoff_ms=cfg.retry_backoff_ms,
            backoff_max_ms=cfg.retry_backoff_max_ms,
            dead_letter_after=cfg.dead_letter_after,
            clock=clock,
        )

    @property
    def idle(self) -> bool:
        """No entry has a failed attempt remembered: none is waiting, every one has 0 attempts
        (the rounds skip asking per entry)."""
        return not self._retries

    def waiting(self, key: bytes) -> bool:
        """The entry failed and its backoff has not passed yet."""
        retry = self._retries.get(key)
        return retry is not None and retry.next_at > self._clock.monotonic()

    def attempts(self, key: bytes) -> int:
        """Failed attempts recorded for the entry (0: none)."""
        retry = self._retries.get(key)
        return 0 if retry is None else retry.attempts

    def failed(self, key: bytes, *, permanent: bool, target: Target | None = None) -> Verdict:
        """Record a failed attempt for the entry released to ``target``; a dead-letter verdict
        leaves the record as it was (see :meth:`dead_letter_failed` if that write fails)."""
        previous = self._retries.get(key)
        attempts = previous.attempts + 1 if previous is not None else 1
        if permanent and attempts >= self._dead_letter_after:
            return Verdict(attempts, dead_letter=True)
        dl_failures = previous.dead_letter_failures if previous is not None else 0
        self._retries[key] = _Retry(attempts, self._deadline(attempts), target, dl_failures)
        return Verdict(attempts, dead_letter=False)

    def dead_letter_failed(self, key: bytes, *, target: Target | None = None) -> int:
        """The entry's dead-letter write failed: hold it (and its target) for a backoff that
        doubles with each such failure; its attempts stay, so once the backoff is over its next
        permanent failure dead-letters it again. Returns the backoff in milliseconds."""
        previous = self._retries.get(key)
        attempts = previous.attempts if previous is not None else self._dead_letter_after - 1
        failures = (previous.dead_letter_failures if previous is not None else 0) + 1
        self._retries[key] = _Retry(attempts, self._deadline(failures), target, failures)
        return self.backoff_ms(failures)

    def backoff_ms(self, failures: int) -> int:
        """The backoff after the ``failures``-th failure in a row."""
        return int(min(self._backoff_ms * 2 ** (failures - 1), self._backoff_max_ms))

    def _deadline(self, failures: int) -> float:
        return self._clock.monotonic() + self.backoff_ms(failures) / 1000

    def held_targets(self) -> set[Target]:
        """Targets with an entry still waiting out its backoff: nothing is sent to them."""
        now = self._clock.monotonic()
        return {
            r.target for r in self._retries.values() if r.target is not None and r.next_at > now
        }

    def forget(self, keys: Iterable[bytes]) -> None:
        """The entries left the store (delivered or dead-lettered)."""
        for key in keys:
            self._retries.pop(key, None)

    def retain(self, keys: Collection[bytes], passed_over: Collection[Target] = ()) -> None:
        """Forget every entry not in ``keys``: those were removed meanwhile (cancelled); except
        entries for a target in ``passed_over``, whose entries the scan did not return."""
        kept = Holds(passed_over).holds  # passed over as a possible same partition, too
        gone = [
            k
            for k, r in self._retries.items()
            if k not in keys and (r.target is None or not kept(r.target))
        ]
        for key in gone:
            del self._retries[key]

    def clear(self) -> None:
        """Forget everything (a new term as master starts afresh)."""
        self._retries.clear()

    def next_retry_in_ms(self) -> int | None:
        """Milliseconds until the soonest backoff ends (0: already over), None: no retries."""
        if not self._retries:
            return None
        soonest = min(r.next_at for r in self._retries.values())
        return max(0, int((soonest - self._clock.monotonic()) * 1000))
