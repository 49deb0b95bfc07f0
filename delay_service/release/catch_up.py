"""A throttled topic's catch-up: its budget spent from the floor in every round of a pass.

A rate-limited topic (``smoothing.py``) whose backlog is larger than what one round may send
is passed over for the rest of the sweep's pass once its budget for the round is spent
(``sweep.py``: a target passed over stays passed over until the pass ends, so a later entry of
its partition never overtakes an earlier one). A pass over a backlog many scans long
(``scan_skip_limit`` entries passed over per round) therefore released the topic only in its
first round: with 1M due, about one round in ten, a tenth of its rate.

The catch-up runs in the rounds of a pass that resumed past the floor: for each rate-limited
topic the pass passed over that has a batch of budget (:data:`smoothing.BATCH_S` worth) now, a
second, small scan from the floor admits only that topic's entries, in key order, up to its
budget, passing over every other topic's and every held target's (``due_scan.Holds``). What it
returns is the topic's earliest pending entries: everything of that topic below them was
released, and its later ones stay passed over by the main scan until the pass ends. So
per-partition order holds, and the other topics' releases are not touched: the main scan runs
as before. It stops once it found the topics' whole budget, or after passing over ``limit``
entries (``scan_batch``): a topic whose head lies behind more than that many entries of others
(or of its own held partitions) waits for the next pass, as before.

The round's claim is unchanged: a resumed scan already counts the floor as passed over
(``round.claim_ms``). Threads: the forwarder thread's, like the sweep and the smoothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Protocol

from kdelay.delay_service.release.smoothing import RoundQuota, Smoothing
from kdelay.delay_service.release.sweep import Sweep
from kdelay.delay_service.store.due_scan import DueScan, Target


class _Scans(Protocol):
    def due_skipping(
        self,
        now_ms: int,
        limit: int,
        skip: Collection[Target],
        max_skipped: int,
        known: dict[bytes, Target] | None = None,
        *,
        start: bytes | None = None,
    ) -> DueScan: ...


class _OnlyTopics(Collection[Target]):
    """Passes over every target but those of ``topics``, and those ``quota`` holds (held, or
    out of budget: asking it uses the topic's budget, as in the main scan)."""

    def __init__(self, topics: frozenset[str], quota: RoundQuota) -> None:
        self._topics = topics
        self._quota = quota

    def __contains__(self, target: object) -> bool:
        if not isinstance(target, tuple) or target[0] not in self._topics:
            return True
        return target in self._quota

    def __iter__(self) -> Iterator[Target]:
        return iter(self._quota)

    def __len__(self) -> int:
        return len(self._quota)


def behind(sweep: Sweep, smoothing: Smoothing, now: float) -> frozenset[str]:
    """The rate-limited topics this pass passed over that may send a batch now: those a
    catch-up serves. None while the pass is at its first scan (it starts at the floor)."""
    if sweep.start is None or not smoothing.enabled:
        return frozenset()
    topics = set()
    for topic in sweep.passed_topics():
        bucket = smoothing.bucket(topic, now)
        if bucket is not None and bucket.ready_in_s(now) == 0:
            topics.add(topic)
    return frozenset(topics)


def catch_up(
    store: _Scans,
    smoothing: Smoothing,
    *,
    topics: frozenset[str],
    held: Collection[Target],
    now_ms: int,
    now: float,
    limit: int,
) -> tuple[DueScan, RoundQuota]:
    """The catch-up scan from the floor for ``topics`` (:func:`behind`), passing over
    ``held`` targets (``now``: the monotonic clock's, for the budgets); with the quota it
    charged (its ``denied`` and ``met`` count for the round, as the main scan's)."""
    quota = RoundQuota(held, smoothing, now)
    budget = 0
    for topic in topics:
        bucket = smoothing.bucket(topic, now)
        budget += 0 if bucket is None else bucket.available(now)
    # It stops once it returned the topics' whole budget, or passed over ``limit`` entries.
    scan = store.due_skipping(now_ms, max(1, budget), _OnlyTopics(topics, quota), limit)
    return scan, quota


def merged(caught: DueScan, main: DueScan) -> DueScan:
    """The round's scan: ``caught``'s entries (below the pass's resume point, so first in key
    order) before ``main``'s; everything else is the main scan's, which began past the floor
    and so already counts the floor as passed over (the claim stays below it)."""
    if not caught.entries:
        return main
    return DueScan(
        [*caught.entries, *main.entries],
        main.skipped,
        main.first_skipped_ms,
        main.last_ms,
        main.truncated,
        main.passed,
        main.stopped_at,
    )
