"""Planning one forwarder round, as pure functions of the due entries.

Two decisions, both for the delivery invariant (DESIGN.md):

- which due entries may be sent now: not one still waiting out a retry backoff, and not one
  behind such an entry for the same target (topic, partition), so per-target order is kept;
- which checkpoint time the round may claim: ``now``, but below the due time of every scanned
  entry that is still pending afterwards (held, failed, or not sent), and below the last scanned
  entry when the scan was cut at its limit (more entries due by ``now`` may follow).

No I/O and no shared state: the forwarder thread calls these between its own steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from delay_service.entry import Entry


@dataclass(frozen=True, slots=True)
class Plan:
    """The due entries of one round and those of them that may be sent now."""

    entries: Sequence[Entry]  # everything due, in key order
    sendable: list[Entry]  # in key order; the rest are held behind a retry
    truncated: bool  # the scan stopped at its limit: more entries may be due


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did (for tests and logs)."""

    delivered: int
    dead_lettered: int
    held: int  # scanned but still pending: behind a retry, failed, or not sent
    claim_ms: int


def plan_round(entries: Sequence[Entry], *, limit: int, waiting: Callable[[bytes], bool]) -> Plan:
    """Split ``entries`` (a key-ordered scan of at most ``limit``) into sendable and held."""
    blocked: set[tuple[str, int]] = set()
    sendable: list[Entry] = []
    for entry in entries:
        target = (entry.message.topic, entry.message.partition)
        if target in blocked or waiting(entry.key):
            blocked.add(target)
        else:
            sendable.append(entry)
    return Plan(entries, sendable, truncated=len(entries) >= limit)


def claim_ms(plan: Plan, now_ms: int, removed: Collection[bytes]) -> int:
    """The checkpoint time after the round, given the keys of the entries it ``removed``."""
    claim = now_ms
    for entry in plan.entries:
        if entry.key not in removed:
            claim = min(claim, entry.message.deliver_at_ms - 1)
    if plan.truncated:
        claim = min(claim, plan.entries[-1].message.deliver_at_ms - 1)
    return claim
