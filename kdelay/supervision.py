"""The one restart policy and failure accounting of everything kdelay keeps running.

Three places restart what failed, each its own kind of unit: a replica's threads
(delay_service/threads.py), the proxy's asyncio components and its poll thread
(proxy/restarts.py), and the development stack's processes (dev/stack/restarts.py). How a unit
is started and watched differs, and stays there; when to run it again and when to give up is
the same everywhere, and lives here, in :class:`Supervisor`:

- a failure counts one more *in a row*. The count starts over when the unit has run
  ``backoff.reset_after_s`` since it last started (the ``ran_s`` of :meth:`Supervisor.failed`,
  or :meth:`Supervisor.running` while it runs), or when its owner knows it is up again
  (:meth:`Supervisor.recovered`);
- the n-th failure in a row waits ``backoff.delay(n)`` before the unit runs again
  (kdelay/backoff.py: doubling, capped);
- the ``max_failures``-th failure in a row gives up on the unit (never when that is None).
  What giving up does is the owner's: the proxy exits 70, a replica exits non-zero, ``kdelay
  up`` stops the stack.

Thread safety: every method may be called from any thread; ``_lock`` guards the counts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kdelay.backoff import Backoff


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When to run a failed unit again, and when to give up on it."""

    backoff: Backoff = field(default_factory=Backoff)
    #: Failures in a row that give up on a unit; None: run it again for ever.
    max_failures: int | None = 5

    def gives_up(self, consecutive: int) -> bool:
        """Whether the ``consecutive``-th failure in a row gives up on the unit."""
        return self.max_failures is not None and consecutive >= self.max_failures


@dataclass(frozen=True, slots=True)
class Failure:
    """What one more failure of a unit means."""

    #: Failures in a row, this one included (1-based).
    consecutive: int
    #: The wait before running the unit again (for the log also when it is given up on).
    delay_s: float
    #: The unit is given up on: it is not to run again.
    gave_up: bool


class Supervisor:
    """Counts each unit's failures in a row under one :class:`RestartPolicy`."""

    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._lock = threading.Lock()
        self._consecutive: dict[str, int] = {}

    def failed(self, unit: str, *, ran_s: float | None = None) -> Failure:
        """Count a failure of ``unit``, which had run ``ran_s`` seconds since it last started
        (None: unknown, the count starts over only by :meth:`recovered` or :meth:`running`)."""
        with self._lock:
            before = self._consecutive.get(unit, 0)
            n = before + 1 if ran_s is None else self.policy.backoff.consecutive(before, ran_s)
            self._consecutive[unit] = n
        return Failure(n, self.policy.backoff.delay(n), self.policy.gives_up(n))

    def running(self, unit: str, ran_s: float) -> None:
        """``unit`` is running and has been for ``ran_s`` seconds: once that is
        ``backoff.reset_after_s``, its failures in a row start over."""
        if ran_s >= self.policy.backoff.reset_after_s:
            self.recovered(unit)

    def recovered(self, unit: str) -> None:
        """``unit`` runs again: its failures in a row start over."""
        with self._lock:
            self._consecutive.pop(unit, None)

    def consecutive(self, unit: str) -> int:
        """``unit``'s failures in a row so far."""
        with self._lock:
            return self._consecutive.get(unit, 0)
