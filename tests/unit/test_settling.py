"""A follower's checkpoints: each applied once it has settled, in order, never twice."""

from __future__ import annotations

from delay_service.settling import SettlingCheckpoints
from kdelay.checkpoint import Checkpoint


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cp(time_ms: int) -> Checkpoint:
    return Checkpoint(time_ms, {0: time_ms})


def test_a_checkpoint_is_handed_out_once_it_has_settled_and_only_once() -> None:
    clock = FakeClock()
    s = SettlingCheckpoints(1.0, clock)
    s.seen(1, cp(10))
    assert s.settled() == []
    clock.now += 0.5
    s.seen(2, cp(20))
    assert s.settled() == []
    clock.now += 0.5  # the first is 1 s old, the second 0.5 s
    assert s.settled() == [(1, cp(10))]
    assert s.settled() == []
    clock.now += 0.5
    assert s.settled() == [(2, cp(20))]
    assert len(s) == 0


def test_all_settled_checkpoints_come_out_oldest_first() -> None:
    clock = FakeClock()
    s = SettlingCheckpoints(1.0, clock)
    for version in range(1, 6):
        s.seen(version, cp(version))
        clock.now += 0.1
    clock.now += 1.0
    assert s.settled() == [(v, cp(v)) for v in range(1, 6)]


def test_a_version_seen_before_or_older_is_ignored() -> None:
    clock = FakeClock()
    s = SettlingCheckpoints(1.0, clock)
    s.seen(3, cp(30))
    s.seen(3, cp(30))  # a watch can fire twice for one version
    s.seen(2, cp(20))
    clock.now += 1.0
    assert s.settled() == [(3, cp(30))]
    s.seen(3, cp(30))  # handed out already
    clock.now += 1.0
    assert s.settled() == []


def test_clear_forgets_what_has_not_settled() -> None:
    clock = FakeClock()
    s = SettlingCheckpoints(1.0, clock)
    s.seen(1, cp(10))
    s.clear()  # this replica became master
    clock.now += 2.0
    assert s.settled() == []
    s.seen(2, cp(20))  # newer versions still count
    clock.now += 1.0
    assert s.settled() == [(2, cp(20))]
