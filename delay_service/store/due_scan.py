"""What the store's due scan returns (``Store.due_skipping``), and a release target.

Defined with the store, which fills them; the forwarder's round (``release/round.py``) plans
from them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kdelay.delay_service.store.entry import Entry

#: A release target: topic and partition (-1: the partitioner picks from the key).
Target = tuple[str, int]


def target_of(entry: Entry) -> Target:
    """The (topic, partition) ``entry`` is released to."""
    return entry.message.topic, entry.message.partition


class Holds:
    """Which targets a set of held ones holds. A release without a partition (-1) lands on the
    partition its key picks, which only the producer knows at send time: so a held (t, -1)
    holds every (t, p), and a held (t, p) holds (t, -1); otherwise a later-due release could
    overtake a held one in the partition they share. Topics released only one way are held
    target by target, as before.

    ``held`` may be a collection whose membership test has effects (``smoothing.RoundQuota``
    charges a topic's budget): it is asked only when the topic rule does not already hold the
    target, once per question, as a plain ``in`` would be."""

    __slots__ = ("_held", "_keyed", "_topics")

    def __init__(self, held: Collection[Target] = ()) -> None:
        self._held = held
        self._topics: set[str] = set()  # topics with any target held
        self._keyed: set[str] = set()  # topics with (t, -1) held
        for target in held:
            self._note(target)

    def _note(self, target: Target) -> None:
        self._topics.add(target[0])
        if target[1] == -1:
            self._keyed.add(target[0])

    def holds(self, target: Target) -> bool:
        """Whether ``target`` is held: by itself, or as a possible same partition."""
        topic, partition = target
        if topic in (self._topics if partition == -1 else self._keyed):
            return True
        return target in self._held

    def add(self, target: Target) -> None:
        """Hold ``target`` too (``held`` must then be a set)."""
        assert isinstance(self._held, set)
        self._held.add(target)
        self._note(target)


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
