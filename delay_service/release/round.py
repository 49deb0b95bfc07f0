"""Planning one forwarder round, as pure functions of the due entries.

Three decisions, all for the delivery invariant (DESIGN.md):

- which due entries may be sent now: not one still waiting out a retry backoff, and not one
  behind such an entry for the same target (topic, partition), so per-target order is kept.
  Targets that are *held* (records in flight, or a backoff running) never reach the plan: the
  store's scan passes over their entries (``Store.due_skipping``), so they cannot fill the scan;
- which checkpoint time the round may claim: ``now``, but below the due time of every entry
  still pending afterwards: scanned but not removed (failed, not sent), passed over because its
  target is held (the first one passed over is the earliest; a scan that resumed a pass,
  ``sweep.py``, counts the store's earliest entry as passed over), and below the last examined
  entry when the scan stopped at a bound (more entries due by ``now`` may follow);
- when the next round should run (:func:`next_wake_ms`).

No I/O and no shared state: the forwarder thread calls these between its own steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from kdelay.delay_service.store.due_scan import DueScan, Holds, Target, target_of
from kdelay.delay_service.store.entry import Entry


@dataclass(frozen=True, slots=True)
class Plan:
    """The due entries of one round and those of them that may be sent now."""

    entries: Sequence[Entry]  # the scan's entries (of targets not held), in key order
    sendable: list[Entry]  # in key order; the rest are held behind a retry
    truncated: bool  # the scan stopped at a bound: more entries may be due
    skipped: int = 0  # entries the scan passed over: their target was held
    first_skipped_ms: int | None = None  # due time of the first of those
    last_ms: int | None = None  # due time of the last entry the scan examined


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did (for tests and logs)."""

    delivered: int
    dead_lettered: int
    held: int  # due but still pending: held target, behind a retry, failed, in flight
    claim_ms: int


def plan_round(
    entries: Sequence[Entry],
    *,
    limit: int,
    waiting: Callable[[bytes], bool] | None,
    skipped: int = 0,
    first_skipped_ms: int | None = None,
    last_ms: int | None = None,
    truncated: bool | None = None,
) -> Plan:
    """Split ``entries`` (a key-ordered scan of at most ``limit``) into sendable and held.

    The keyword arguments after ``waiting`` describe what the scan passed over (see
    ``Store.due_skipping``); ``truncated`` defaults to "``limit`` entries were returned".
    ``waiting`` None: no entry is waiting out a backoff (the retry policy is idle).
    """
    cut = len(entries) >= limit if truncated is None else truncated
    if waiting is None:  # no entry failed: all are sendable
        return Plan(entries, list(entries), cut, skipped, first_skipped_ms, last_ms)
    blocked = Holds(set[Target]())  # a placed-by-key target and its topic's others block each other
    sendable: list[Entry] = []
    for entry in entries:
        target = target_of(entry)
        if blocked.holds(target) or waiting(entry.key):
            blocked.add(target)
        else:
            sendable.append(entry)
    return Plan(entries, sendable, cut, skipped, first_skipped_ms, last_ms)


def claim_ms(plan: Plan, now_ms: int, removed: Collection[bytes]) -> int:
    """The checkpoint time after the round, given the keys of the entries it ``removed``."""
    claim = now_ms
    for entry in plan.entries:
        if entry.key not in removed:
            claim = min(claim, entry.message.deliver_at_ms - 1)
    if plan.first_skipped_ms is not None:
        claim = min(claim, plan.first_skipped_ms - 1)
    if plan.truncated:
        last = plan.last_ms
        if last is None and plan.entries:
            last = plan.entries[-1].message.deliver_at_ms
        if last is not None:
            claim = min(claim, last - 1)
    return claim


def next_wake_ms(
    now_ms: int,
    *,
    rescan: bool,
    next_due_ms: int | None,
    retry_in_ms: int | None,
    since_checkpoint_ms: int,
    interval_ms: int,
    unwritten: bool,
) -> int:
    """When the next round should run: at once when the scan was cut with sendable entries
    left (``rescan``), else at the earliest of the next due time, the soonest backoff's end
    and the next checkpoint write (an idle master refreshes its claim every 10 intervals, so
    its age tells operators it is alive). Acknowledgements of records in flight wake the
    forwarder separately."""
    if rescan:
        return now_ms
    candidates: list[int] = []
    if next_due_ms is not None:
        candidates.append(next_due_ms)
    if retry_in_ms is not None:
        candidates.append(now_ms + retry_in_ms + 1)
    every = interval_ms if unwritten else 10 * interval_ms
    candidates.append(now_ms + max(0, every - since_checkpoint_ms))
    return min(candidates)


def plan_scan(scan: DueScan, *, waiting: Callable[[bytes], bool] | None) -> Plan:
    """:func:`plan_round` for what ``Store.due_skipping`` returned."""
    return plan_round(
        scan.entries,
        limit=len(scan.entries) + 1,  # unused: the scan says whether it was cut
        waiting=waiting,
        skipped=scan.skipped,
        first_skipped_ms=scan.first_skipped_ms,
        last_ms=scan.last_ms,
        truncated=scan.truncated,
    )
