"""A replica whose clock is off gives the mastership to one whose clock is right.

A master whose wall clock is further than ``--max-clock-skew-ms`` from the broker's releases
nothing (:class:`~delay_service.release.broker_clock.SkewHold`). Left there, it would keep the
mastership, and the followers with good clocks would never take over: one bad clock would stall
its shard. :class:`SkewCandidacy` decides, for the replica's control loop, when such a replica
leaves the election and when it stands again ("skewed": ``|skew| > max_skew_ms``):

- **step down**: the leader, skewed without a break for ``step_down_after_ms``
  (``--skew-step-down-ms``) while leading, leaves the election when another candidate stands;
  the next candidate takes over. Its forwarder stops first.
- **stand aside**: a candidate that does not lead leaves the election as soon as it is skewed,
  when another candidate stands: had it won, it would only hold.
- **stand again**: a replica out of the election joins it once its clock has been within the
  limit for :data:`RECOVER_S` in a row (a clock hovering at the limit does not make it come and
  go); until then, only when no candidate stands at all.

So a skewed replica does not win an election in the first place while one with a good clock
stands. When *every* replica is skewed (the broker's clock stepped, or the probe partition moved
to a broker whose clock is off), one of them still holds the mastership, as before this module:
the others stand aside, so the master sees no other candidate and keeps it. A master that holds
loses nothing a shard without master would keep: it ingests, checkpoints and writes tombstones,
and releases the moment its clock is within the limit again, with no election in between.

``max_skew_ms`` 0 (no limit) or ``step_down_after_ms`` 0 turns all this off: a skewed replica
stands and keeps the mastership, holding (the behaviour before).

The number of other candidates is asked lazily (``rivals``, a ZooKeeper read), and only when a
rule would act on it. Unknown (``None``: ZooKeeper unreachable) counts as "somebody stands" for
joining and "nobody stands" for leaving: both keep what is.

Threads: the replica's control thread only; not thread-safe. Time comes in as an argument
(monotonic seconds), so the unit tests drive it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from kdelay import logs

log = logs.get(__name__)

#: How long a clock must stay within the limit before its replica stands again; 10 probes.
RECOVER_S = 10.0

Rivals = Callable[[], int | None]


class Leave(StrEnum):
    """Why a candidate leaves the election because of its clock."""

    STEP_DOWN = "step_down"  # the leader
    STAND_ASIDE = "stand_aside"  # a candidate that does not lead


class SkewCandidacy:
    """The skew rules of one replica's candidacy (module docstring); control thread only."""

    def __init__(
        self,
        max_skew_ms: int,
        step_down_after_ms: int,
        *,
        recover_s: float = RECOVER_S,
        metrics: Any = None,
    ) -> None:
        self._max = max_skew_ms
        self._after_s = step_down_after_ms / 1000
        self._recover_s = recover_s
        self._metrics = metrics  # delay_service.metrics.Metrics: step_downs
        self._skew: float | None = None
        self._last_skewed: float | None = None  # monotonic: the latest skewed reading
        self._held_since: float | None = None  # monotonic: leading and skewed since then
        self._withheld = False  # kept out of the election by the last may_stand

    @property
    def enabled(self) -> bool:
        return self._max > 0 and self._after_s > 0

    @property
    def skewed(self) -> bool:
        """The last observed skew is past the limit."""
        return self._max > 0 and self._skew is not None and abs(self._skew) > self._max

    def observe(self, now: float, skew_ms: float | None, *, leading: bool) -> None:
        """The clock's skew (local minus broker, ms; None: not known yet) at ``now``, and
        whether this replica leads the election; every control-loop iteration."""
        self._skew = skew_ms
        if self.skewed:
            self._last_skewed = now
        if leading and self.skewed:
            if self._held_since is None:
                self._held_since = now
        else:
            self._held_since = None

    def held_s(self, now: float) -> float:
        """How long this replica has led with its clock past the limit (0: it does not)."""
        return 0.0 if self._held_since is None else now - self._held_since

    def leave(self, now: float, *, leading: bool, rivals: Rivals) -> Leave | None:
        """Whether a candidate leaves the election now (logged, and counted when it steps down
        as master); the caller stops its forwarder first on :attr:`Leave.STEP_DOWN`."""
        if not self.enabled or not self.skewed:
            return None
        if leading:
            held = self.held_s(now)
            if held < self._after_s:
                return None
            others = rivals()
            if not others:
                return None  # nobody else stands: hold the mastership rather than leave none
            log.warning(
                "replica.stepping_down",
                why="clock skew",
                skew_ms=round(self._skew or 0.0),
                held_s=round(held, 1),
                max_clock_skew_ms=self._max,
                skew_step_down_ms=round(self._after_s * 1000),
                candidates=others,
            )
            if self._metrics is not None:
                self._metrics.step_downs.labels("clock_skew").inc()
            self._held_since = None
            return Leave.STEP_DOWN
        others = rivals()
        if not others:
            return None  # it may become the only candidate soon: stay
        log.warning(
            "replica.election_left",
            why="clock skew",
            skew_ms=round(self._skew or 0.0),
            max_clock_skew_ms=self._max,
            candidates=others,
        )
        return Leave.STAND_ASIDE

    def may_stand(self, now: float, rivals: Rivals) -> bool:
        """Whether a replica out of the election may join it now (logs each change)."""
        clean = not self.skewed and (
            self._last_skewed is None or now - self._last_skewed >= self._recover_s
        )
        if not self.enabled or clean:
            allowed, why = True, None
        elif rivals() == 0:
            allowed, why = True, "no other candidate stands"
        else:
            allowed, why = False, None
        if allowed == self._withheld:  # a change
            if allowed:
                log.info(
                    "replica.election_standing_again",
                    skew_ms=None if self._skew is None else round(self._skew),
                    why=why or f"clock within --max-clock-skew-ms for {self._recover_s:g} s",
                )
            else:
                log.warning(
                    "replica.election_withheld",
                    why="clock skew",
                    skew_ms=None if self._skew is None else round(self._skew),
                    max_clock_skew_ms=self._max,
                    then=f"stands again once within the limit for {self._recover_s:g} s, or "
                    "when no other candidate stands",
                )
        self._withheld = not allowed
        return allowed
