"""Entries in a release whose outcome is not known yet, and the cancels that wait on them.

A confirmed cancel answers 200 only when its message can no longer be released (CONTRACT.md
v4, "A confirmed cancel is final"). The master hands an entry to a producer, and from that
moment a read_committed consumer may see it (at-least-once: once acknowledged, or even
unacknowledged after a timeout; exactly-once: once the round's transaction commits). So:

- :meth:`InRound.claim` marks an entry *in release* just before its record is produced, and
  only if the entry is still pending (``Store.claim_release``, under the store's lock): an
  entry a cancel removed after the round's scan is never produced;
- a cancel (a replace's cancel part, a bulk cancel) that meets an entry in release leaves it
  pending and *waits* (:meth:`InRound.wait`): the message's status stays ``pending`` with
  ``releasing``, which the proxy does not take for an answer;
- the release's outcome decides: delivered or dead-lettered (``Store.remove``) -> the
  cancel lost, its answer is 409; surely not written (``Store.not_released``: an aborted
  transaction, a record the broker or client refused) -> the waiting cancel applies now, 200.
  A release that may have been written (a timeout, at-least-once) stays in release and is
  retried as it would be anyway, until it is delivered or dead-lettered;
- a series' occurrence whose release commits while a cancel waits on it wrote the series'
  next occurrence with it (``release/series.py``), which that cancel stops when the store reads
  it (``cancels.py`` rule 2: it keeps occurrence 1's acceptance time). Until the store has read
  it (:meth:`InRound.await_next`, :meth:`InRound.arrived`) the id stays ``releasing``, so the
  answer is 200 when the series stopped, never a 409 for an occurrence it met in flight;
- a term as master that ends with entries in release (``Store.end_releases``): a waiting
  cancel applies in this store, which so converges with the followers' (they applied the
  cancel when they read it); this replica is no longer master, so no proxy takes its answer.

Held in memory only, by the master's store. Not thread-safe: the store calls it under its
own lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdelay.delay_service.store.outcomes import Canceller


@dataclass(frozen=True, slots=True)
class Waiting:
    """A cancel that met an entry in release: what its outcome records if it applies."""

    at_ms: int | None  # the cancel's append time
    by: Canceller  # who sent it
    state: str  # outcomes.CANCELLED, or outcomes.REPLACED for a replace's cancel part


class InRound:
    """Entry keys in release, each with the cancels waiting on it (oldest first)."""

    def __init__(self) -> None:
        self._keys: dict[bytes, list[Waiting]] = {}
        #: Next occurrences a settled cancel awaits, buffer key -> message id.
        self._next: dict[str, str] = {}

    def claim(self, key: bytes) -> None:
        """Entry ``key`` is about to be produced (again: the cancels waiting stay)."""
        self._keys.setdefault(key, [])

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def wait(self, key: bytes, waiting: Waiting) -> None:
        """A cancel met entry ``key`` in release: it applies only if the release did not."""
        self._keys[key].append(waiting)

    def settle(self, key: bytes) -> list[Waiting]:
        """Entry ``key`` leaves the release: the cancels that waited on it."""
        return self._keys.pop(key, [])

    def settle_all(self) -> list[tuple[bytes, list[Waiting]]]:
        """Every entry leaves the release (the term ended): each with its waiting cancels."""
        items = list(self._keys.items())
        self._keys.clear()
        self._next.clear()
        return items

    def await_next(self, msg_id: str, uid: str) -> None:
        """Series ``msg_id``'s next occurrence, buffer key ``uid``, decides a cancel that
        waited on its last release: ``msg_id`` is in release until the store reads it."""
        self._next[uid] = msg_id

    def arrived(self, uid: str) -> None:
        """The store read the schedule with buffer key ``uid``."""
        if self._next:
            self._next.pop(uid, None)

    def awaits(self, msg_id: str) -> bool:
        """Whether a cancel of ``msg_id`` awaits its series' next occurrence."""
        return msg_id in self._next.values()
