"""The outcomes a store remembers: pruned oldest first, to a count and an age, from a floor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay.buffer import Fate, Scheduled
from kdelay.delay_service.store.outcomes import _FIELDS, Outcome, _body
from kdelay.delay_service.store.store import Store


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    s = Store(tmp_path / "db", status_max_entries=5, status_retention_ms=60_000, wall_ms=clock)
    yield s
    s.close()


def deliver(store: Store, clock: Clock, n: int, start: int) -> None:
    """Messages m<start>..m<start+n-1>, each applied then removed as delivered, 1 ms apart."""
    for i in range(start, start + n):
        clock.ms += 1
        store.apply([(0, i, Scheduled(f"m{i}", "t", 0, None, b"v", 1))], {0: i + 1})
        [entry] = store.due(10, 10)
        store.remove([entry], {entry.key: Fate("delivered", "t", 0, i, clock.ms, 1, None)})


def kept(store: Store, upto: int) -> list[str]:
    return [f"m{i}" for i in range(upto) if store.outcome(f"m{i}") is not None]


def test_the_oldest_are_pruned_to_the_count(store: Store, clock: Clock) -> None:
    deliver(store, clock, 20, 0)
    assert store.outcomes == 5
    assert kept(store, 20) == ["m15", "m16", "m17", "m18", "m19"]


def test_a_clock_stepped_back_still_prunes_in_order(store: Store, clock: Clock) -> None:
    deliver(store, clock, 10, 0)  # m5..m9 kept; the floor is at m4's time
    clock.ms -= 1_000  # the wall clock steps back a second
    deliver(store, clock, 3, 10)  # written at the floor's time: the oldest now, not lost
    assert store.outcomes == 5
    assert len(kept(store, 13)) == 5
    assert "m12" in kept(store, 13)
    clock.ms += 10_000  # none of them is left behind below the floor
    deliver(store, clock, 5, 13)
    assert kept(store, 18) == ["m13", "m14", "m15", "m16", "m17"]


def test_outcomes_older_than_the_retention_go(store: Store, clock: Clock) -> None:
    deliver(store, clock, 3, 0)
    clock.ms += 120_000
    deliver(store, clock, 1, 3)
    assert kept(store, 4) == ["m3"]
    assert store.outcomes == 1


def test_an_outcome_learnt_from_a_fate_is_stored_as_the_same_outcome_put_whole() -> None:
    """learn/learn_all build the stored fields from the Fate directly (the master's hot path):
    the same document as put() of the equivalent Outcome, field for field and in order."""
    for fate in (
        Fate("delivered", "t", 3, 42, 1_000, 900, 2),
        Fate("dead_lettered", "t", None, None, 1_000, 900),
        Fate("cancelled"),
        Fate("dead_lettered", "t", 1, None, 1_000, 900, 3, "E: why", 850, "alice"),
    ):
        outcome = Outcome(
            "m",
            fate.state,
            "master",
            fate.deliver_at_ms,
            fate.topic,
            fate.partition,
            fate.offset,
            fate.released_ms,
            fate.occurrence,
            fate.reason,
            fate.accepted_ms,
            fate.owner,
        )
        whole = {f: v for f in _FIELDS if (v := getattr(outcome, f)) is not None}
        assert list(_body(fate, "master").items()) == list(whole.items())
