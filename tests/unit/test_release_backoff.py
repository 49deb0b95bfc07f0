"""The retry and dead-letter policy, driven by a fake clock; and the round planning around it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kdelay.buffer import Scheduled
from kdelay.delay_service.release.backoff import ReleaseBackoff, Verdict
from kdelay.delay_service.release.round import claim_ms, plan_round
from kdelay.delay_service.store.entry import Entry, entry_key


@dataclass
class Monotonic:
    mono: float = 8.0  # binary fractions below keep the float arithmetic exact

    def wall_ms(self) -> int:
        return int(self.mono * 1000)

    def monotonic(self) -> float:
        return self.mono


def policy(clock: Monotonic, dead_letter_after: int = 3) -> ReleaseBackoff:
    return ReleaseBackoff(
        backoff_ms=125, backoff_max_ms=500, dead_letter_after=dead_letter_after, clock=clock
    )


def test_backoff_doubles_up_to_the_maximum() -> None:
    clock = Monotonic()
    p = policy(clock)
    waits = []
    for attempt in range(1, 5):
        assert p.failed(b"k", permanent=False) == Verdict(attempt, dead_letter=False)
        waits.append(p.next_retry_in_ms())
        assert p.waiting(b"k")
        clock.mono += 0.5  # the longest backoff
        assert not p.waiting(b"k")
    assert waits == [125, 250, 500, 500]
    assert p.attempts(b"k") == 4


def test_waiting_ends_exactly_at_the_backoff() -> None:
    clock = Monotonic()
    p = policy(clock)
    p.failed(b"k", permanent=False)
    clock.mono += 0.124
    assert p.waiting(b"k")
    clock.mono = 8.125
    assert not p.waiting(b"k")
    assert p.next_retry_in_ms() == 0


def test_permanent_errors_dead_letter_on_the_nth_attempt_and_transient_never() -> None:
    p = policy(Monotonic(), dead_letter_after=3)
    assert [p.failed(b"bad", permanent=True).dead_letter for _ in range(2)] == [False, False]
    assert p.failed(b"bad", permanent=True) == Verdict(3, dead_letter=True)
    # The verdict records nothing: a failed dead-letter write gets the same verdict next time.
    assert p.attempts(b"bad") == 2
    assert not any(p.failed(b"slow", permanent=False).dead_letter for _ in range(10))


def test_forget_and_retain_drop_entries_that_left_the_store() -> None:
    p = policy(Monotonic())
    for key in (b"a", b"b", b"c"):
        p.failed(key, permanent=False)
    p.forget([b"a"])
    p.retain({b"b", b"x"})  # c was removed meanwhile (cancelled)
    assert [p.attempts(k) for k in (b"a", b"b", b"c")] == [0, 1, 0]
    p.clear()
    assert p.next_retry_in_ms() is None


def entry(i: int, at: int, topic: str = "t", partition: int = 0) -> Entry:
    msg = Scheduled(f"m{i}", topic, partition, None, b"v", at)
    return Entry(entry_key(at, 0, i), msg, 0, i)


def test_plan_holds_entries_behind_a_waiting_one_of_the_same_target() -> None:
    entries = [entry(0, 10), entry(1, 11, partition=1), entry(2, 12), entry(3, 13, topic="u")]
    plan = plan_round(entries, limit=10, waiting=lambda key: key == entries[0].key)
    assert plan.sendable == [entries[1], entries[3]]
    assert not plan.truncated


@pytest.mark.parametrize(
    ("removed", "limit", "expected"),
    [
        ({0, 1, 2}, 10, 1000),  # all delivered: claim now
        ({0, 2}, 10, 10),  # entry 1 (due 11) still pending
        (set(), 10, 9),
        ({0, 1, 2}, 3, 11),  # the scan was cut at entry 2 (due 12): more may be due at 12
    ],
)
def test_claim_stays_below_every_pending_due_time(
    removed: set[int], limit: int, expected: int
) -> None:
    entries = [entry(0, 10), entry(1, 11), entry(2, 12)]
    plan = plan_round(entries, limit=limit, waiting=lambda _key: False)
    assert claim_ms(plan, 1000, {entries[i].key for i in removed}) == expected


@pytest.mark.parametrize("limit", [3, 4])
def test_with_no_failure_remembered_every_entry_is_sendable_and_the_cut_is_kept(
    limit: int,
) -> None:
    """The rounds pass ``waiting=None`` while the retry policy is idle (no call per entry)."""
    entries = [entry(0, 10), entry(1, 11), entry(2, 12)]
    idle = plan_round(entries, limit=limit, waiting=None)
    asked = plan_round(entries, limit=limit, waiting=lambda _key: False)
    assert idle == asked
    assert idle.sendable == entries
    assert idle.truncated == (limit == 3)
    p = policy(Monotonic())
    assert p.idle
    p.failed(b"a", permanent=False)
    assert not p.idle


def test_a_failed_target_is_held_until_its_backoff_is_over() -> None:
    clock = Monotonic()
    p = policy(clock)
    p.failed(b"a", permanent=False, target=("x", 0))
    p.failed(b"b", permanent=False)  # no target known: holds nothing but itself
    assert p.held_targets() == {("x", 0)}
    clock.mono += 0.125
    assert p.held_targets() == set()
    assert p.attempts(b"a") == 1  # over, not forgotten: the next failure backs off longer


def test_a_failed_dead_letter_backs_off_doubling_and_dead_letters_again() -> None:
    clock = Monotonic()
    p = policy(clock, dead_letter_after=2)
    assert not p.failed(b"k", permanent=True, target=("x", 0)).dead_letter
    clock.mono += 1
    assert p.failed(b"k", permanent=True, target=("x", 0)).dead_letter
    waits = []
    for _ in range(4):
        waits.append(p.dead_letter_failed(b"k", target=("x", 0)))
        assert p.waiting(b"k")
        assert p.held_targets() == {("x", 0)}
        clock.mono += 0.5
        assert not p.waiting(b"k")
        # Once the backoff is over, the next permanent failure dead-letters it again.
        assert p.failed(b"k", permanent=True, target=("x", 0)) == Verdict(2, dead_letter=True)
    assert waits == [125, 250, 500, 500]


def test_retain_keeps_entries_of_targets_the_scan_passed_over() -> None:
    p = policy(Monotonic())
    p.failed(b"held", permanent=False, target=("x", 0))
    p.failed(b"gone", permanent=False, target=("y", 0))
    p.retain(set(), passed_over={("x", 0)})
    assert (p.attempts(b"held"), p.attempts(b"gone")) == (1, 0)
