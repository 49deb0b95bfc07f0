"""Planning a round around held targets: the store's skipping scan, the claim over what it
passed over or never reached, and when the next round runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay.buffer import Scheduled
from kdelay.delay_service.release.round import claim_ms, next_wake_ms, plan_scan
from kdelay.delay_service.store.due_scan import DueScan
from kdelay.delay_service.store.entry import Entry, entry_key
from kdelay.delay_service.store.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def scheduled(i: int, at: int, topic: str, partition: int = 0) -> Scheduled:
    return Scheduled(f"m{i}", topic, partition, None, b"v", at)


def test_the_scan_passes_over_more_held_entries_than_its_limit(store: Store) -> None:
    held = [(0, i, scheduled(i, 100 + i, "x")) for i in range(50)]
    other = [(1, i, scheduled(1000 + i, 200 + i, "y")) for i in range(3)]
    store.apply([*held, *other], {0: 50, 1: 3})
    scan = store.due_skipping(1_000, 10, {("x", 0)}, max_skipped=1_000)
    assert [e.message.id for e in scan.entries] == ["m1000", "m1001", "m1002"]
    assert (scan.skipped, scan.first_skipped_ms, scan.last_ms, scan.truncated) == (
        50,
        100,
        202,
        False,
    )
    # Without skipping, the limit is filled by the held target alone.
    assert {e.message.topic for e in store.due(1_000, 10)} == {"x"}
    # Another partition of the same topic is another target.
    store.apply([(2, 0, scheduled(2000, 150, "x", partition=1))], {2: 1})
    scan = store.due_skipping(1_000, 10, {("x", 0)}, max_skipped=1_000)
    assert [e.message.id for e in scan.entries] == ["m2000", "m1000", "m1001", "m1002"]


def test_the_scan_remembers_the_targets_of_what_it_passed_over(store: Store) -> None:
    store.apply([(0, i, scheduled(i, 100 + i, "x")) for i in range(3)], {0: 3})
    store.apply([(1, 0, scheduled(9, 150, "y"))], {1: 1})
    known: dict[bytes, tuple[str, int]] = {}
    first = store.due_skipping(1_000, 10, {("x", 0)}, 100, known)
    assert set(known.values()) == {("x", 0)}
    assert len(known) == 3
    again = store.due_skipping(1_000, 10, {("x", 0)}, 100, known)
    assert (again.entries, again.skipped) == (first.entries, 3)
    # Once the target is no longer held, its entries come back whatever the cache says.
    assert len(store.due_skipping(1_000, 10, set(), 100, known).entries) == 4


def test_the_scan_stops_at_either_bound(store: Store) -> None:
    store.apply([(0, i, scheduled(i, 100 + i, "x" if i % 2 else "y")) for i in range(20)], {0: 20})
    by_limit = store.due_skipping(1_000, 3, {("x", 0)}, max_skipped=100)
    assert [e.message.id for e in by_limit.entries] == ["m0", "m2", "m4"]
    assert (by_limit.truncated, by_limit.last_ms, by_limit.skipped) == (True, 104, 2)
    by_skips = store.due_skipping(1_000, 100, {("x", 0)}, max_skipped=4)
    assert [e.message.id for e in by_skips.entries] == ["m0", "m2", "m4", "m6"]
    assert (by_skips.truncated, by_skips.last_ms) == (True, 107)
    # Only what is due by now is examined.
    assert store.due_skipping(104, 100, set(), max_skipped=1).last_ms == 104


def entry(i: int, at: int, topic: str = "t", partition: int = 0) -> Entry:
    return Entry(entry_key(at, 0, i), scheduled(i, at, topic, partition), 0, i)


@pytest.mark.parametrize(
    ("scan", "removed", "expected"),
    [
        (DueScan([entry(0, 10)], 0, None, 10, truncated=False), {0}, 1000),
        (DueScan([entry(0, 10)], 0, None, 10, truncated=False), set(), 9),
        # A held target's entry (due 5) was passed over: the claim stays below it.
        (DueScan([entry(0, 10)], 4, 5, 12, truncated=False), {0}, 4),
        # Cut after passing over entries up to due 30: more may be due at 30.
        (DueScan([entry(0, 10)], 4, 20, 30, truncated=True), {0}, 19),
        (DueScan([entry(0, 10)], 4, 25, 30, truncated=True), {0}, 24),
        (DueScan([entry(0, 40)], 9, 50, 60, truncated=True), {0}, 49),
        (DueScan([], 9, 50, 60, truncated=True), set(), 49),
    ],
)
def test_the_claim_stays_below_what_the_scan_did_not_settle(
    scan: DueScan, removed: set[int], expected: int
) -> None:
    plan = plan_scan(scan, waiting=lambda _key: False)
    assert claim_ms(plan, 1000, {e.key for e in scan.entries if e.offset in removed}) == expected


def test_planning_a_scan_keeps_what_it_passed_over() -> None:
    entries = [entry(0, 10), entry(1, 11, topic="u"), entry(2, 12)]
    plan = plan_scan(
        DueScan(entries, 7, 3, 12, truncated=False), waiting=lambda k: k == entries[0].key
    )
    assert plan.sendable == [entries[1]]
    assert (plan.skipped, plan.first_skipped_ms, plan.truncated) == (7, 3, False)


def wake(**kw: object) -> int:
    args: dict[str, object] = {
        "rescan": False,
        "next_due_ms": None,
        "retry_in_ms": None,
        "since_checkpoint_ms": 0,
        "interval_ms": 100,
        "unwritten": False,
    }
    args.update(kw)
    return next_wake_ms(1_000, **args)  # type: ignore[arg-type]


def test_next_wake() -> None:
    assert wake(rescan=True, next_due_ms=5_000) == 1_000
    assert wake() == 2_000  # idle: refresh the claim every 10 intervals
    assert wake(unwritten=True, since_checkpoint_ms=30) == 1_070
    assert wake(unwritten=True, since_checkpoint_ms=300) == 1_000
    assert wake(next_due_ms=1_050) == 1_050
    assert wake(retry_in_ms=10) == 1_011


def test_an_entry_behind_a_retry_waits_if_it_may_share_its_partition() -> None:
    """Placed by key (-1) and explicit partitions of one topic block each other in a round;
    other topics and, with no key involved, other partitions do not."""
    entries = [
        entry(0, 10, partition=-1),
        entry(1, 11, partition=2),
        entry(2, 12, topic="u"),
        entry(3, 13, topic="u", partition=1),
    ]
    plan = plan_scan(
        DueScan(entries, 0, None, 13, truncated=False),
        waiting=lambda k: k in {entries[0].key, entries[2].key},
    )
    assert plan.sendable == [entries[3]]
