"""A follower's checkpoints: each applied once it has settled, in order, never twice."""

from __future__ import annotations

import functools
from typing import cast

from kdelay.checkpoint import Checkpoint
from kdelay.delay_service.release.follower_checkpoints import FollowerCheckpoints
from kdelay.delay_service.release.forwarder_control import ForwarderControl
from kdelay.delay_service.replica import apply_settled
from kdelay.delay_service.store.store import Store
from tests.support.fakes import FakeClock


def cp(time_ms: int) -> Checkpoint:
    return Checkpoint(time_ms, {0: time_ms})


def test_a_checkpoint_is_handed_out_once_it_has_settled_and_only_once() -> None:
    clock = FakeClock()
    s = FollowerCheckpoints(1.0, clock.monotonic)
    s.seen(1, cp(10))
    assert s.settled() == []
    clock.advance(0.5)
    s.seen(2, cp(20))
    assert s.settled() == []
    clock.advance(0.5)  # the first is 1 s old, the second 0.5 s
    assert s.settled() == [(1, cp(10))]
    assert s.settled() == []
    clock.advance(0.5)
    assert s.settled() == [(2, cp(20))]
    assert len(s) == 0


def test_all_settled_checkpoints_come_out_oldest_first() -> None:
    clock = FakeClock()
    s = FollowerCheckpoints(1.0, clock.monotonic)
    for version in range(1, 6):
        s.seen(version, cp(version))
        clock.advance(0.1)
    clock.advance(1.0)
    assert s.settled() == [(v, cp(v)) for v in range(1, 6)]


def test_a_version_seen_before_or_older_is_ignored() -> None:
    clock = FakeClock()
    s = FollowerCheckpoints(1.0, clock.monotonic)
    s.seen(3, cp(30))
    s.seen(3, cp(30))  # a watch can fire twice for one version
    s.seen(2, cp(20))
    clock.advance(1.0)
    assert s.settled() == [(3, cp(30))]
    s.seen(3, cp(30))  # handed out already
    clock.advance(1.0)
    assert s.settled() == []


def test_clear_forgets_what_has_not_settled() -> None:
    clock = FakeClock()
    s = FollowerCheckpoints(1.0, clock.monotonic)
    s.seen(1, cp(10))
    s.clear()  # this replica became master
    clock.advance(2.0)
    assert s.settled() == []
    s.seen(2, cp(20))  # newer versions still count
    clock.advance(1.0)
    assert s.settled() == [(2, cp(20))]


class FakeStore:
    def __init__(self) -> None:
        self.applied: list[Checkpoint] = []

    def apply_checkpoint(self, checkpoint: Checkpoint) -> int:
        self.applied.append(checkpoint)
        return 0


class FakeForwarder:
    engaged = False


def test_a_replica_applies_settled_checkpoints_only_while_not_engaged_as_master() -> None:
    """From the moment the control thread activates the forwarder, the forwarder applies the
    newest checkpoint itself; an older one applied after it would have the store keep, and
    the master release again, what the newer one covers. So none is applied once engaged,
    and what had not settled by then is forgotten."""
    clock = FakeClock()
    settling = FollowerCheckpoints(1.0, clock.monotonic)
    store, forwarder = FakeStore(), FakeForwarder()
    apply = functools.partial(
        apply_settled, settling, cast("Store", store), cast("ForwarderControl", forwarder)
    )
    settling.seen(1, cp(10))
    clock.advance(1.0)
    settling.seen(2, cp(20))
    apply()
    assert store.applied == [cp(10)]  # settled; the second not yet
    forwarder.engaged = True  # won the election: activated, not forwarding yet
    clock.advance(1.0)
    apply()
    assert store.applied == [cp(10)]
    forwarder.engaged = False  # stepped down: a follower again
    settling.seen(3, cp(30))
    clock.advance(1.0)
    apply()
    assert store.applied == [cp(10), cp(30)]  # the one from before the takeover is gone
