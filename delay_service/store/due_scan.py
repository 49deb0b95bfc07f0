"""What the store's due scan returns (``Store.due_skipping``), and a release target.

Defined with the store, which fills them; the forwarder's round (``release/round.py``) plans
from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdelay.delay_service.store.entry import Entry

#: A release target: topic and partition (-1: the partitioner picks from the key).
Target = tuple[str, int]


def target_of(entry: Entry) -> Target:
    """The (topic, partition) ``entry`` is released to."""
    return entry.message.topic, entry.message.partition


@dataclass(frozen=True, slots=True)
class DueScan:
    """What ``Store.due_skipping`` found: the due entries of targets not held, in key order,
    and what the claim needs to know about those it passed over or never reached.

    A scan that resumed a pass (``sweep.py``) starts past the floor: the entries below its start
    count as passed over (``first_skipped_ms`` is the due time of the first of them), though
    ``skipped`` counts only those this scan stepped over."""

    entries: list[Entry]
    skipped: int  # entries this scan passed over because their target was held
    first_skipped_ms: int | None  # due time of the first one passed over
    last_ms: int | None  # due time of the last entry examined (returned or passed over)
    truncated: bool  # stopped at a bound: more entries due by now may follow
    passed: frozenset[Target] = frozenset()  # the targets of the entries this scan passed over
    stopped_at: bytes | None = None  # a truncated scan's last key examined: a pass resumes after
