"""The skew rules of a replica's candidacy (delay_service/release/skew_step_down.py), on a fake
clock: when a skewed master steps down, when a skewed replica stands aside or stands again, and,
with a small in-process election, that a shard keeps exactly one master whoever is skewed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.skew_step_down import RECOVER_S, Leave, SkewCandidacy
from tests.support.fakes import FakeClock

LIMIT_MS = 10_000
AFTER_MS = 30_000
SKEWED = 15_000.0  # ms: past the limit
GOOD = 40.0


def never() -> int:
    raise AssertionError("the rule asked ZooKeeper for the other candidates when it needs not")


def rivals(n: int | None) -> Callable[[], int | None]:
    return lambda: n


def step_downs(metrics: Metrics, reason: str = "clock_skew") -> float:
    value = metrics.registry.get_sample_value("kdelay_replica_step_downs_total", {"reason": reason})
    assert value is not None
    return value


def candidacy(
    metrics: Metrics | None = None, *, limit: int = LIMIT_MS, after: int = AFTER_MS
) -> SkewCandidacy:
    return SkewCandidacy(limit, after, metrics=metrics)


# -- the master -------------------------------------------------------------------------------


@pytest.mark.parametrize("skew", [SKEWED, -SKEWED], ids=["ahead", "behind"])
def test_a_skewed_master_steps_down_once_it_held_for_the_bound(skew: float) -> None:
    clock, metrics = FakeClock(), Metrics()
    rules = candidacy(metrics)
    rules.observe(clock.monotonic(), skew, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None
    clock.advance(AFTER_MS / 1000 - 0.5)
    rules.observe(clock.monotonic(), skew, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None
    clock.advance(0.5)
    rules.observe(clock.monotonic(), skew, leading=True)
    with capture_logs() as logs:
        assert rules.leave(clock.monotonic(), leading=True, rivals=rivals(2)) is Leave.STEP_DOWN
    [event] = logs
    assert event["event"] == "replica.stepping_down"
    assert event["why"] == "clock skew"
    assert event["skew_ms"] == round(skew)
    assert event["held_s"] == AFTER_MS / 1000
    assert event["candidates"] == 2
    assert step_downs(metrics) == 1
    assert step_downs(metrics, "forwarder_failed") == 0


@pytest.mark.parametrize("others", [0, None], ids=["nobody-else-stands", "zookeeper-silent"])
def test_a_skewed_master_keeps_the_mastership_when_nobody_could_take_it(
    others: int | None,
) -> None:
    clock, metrics = FakeClock(), Metrics()
    rules = candidacy(metrics)
    for _ in range(100):
        rules.observe(clock.monotonic(), SKEWED, leading=True)
        assert rules.leave(clock.monotonic(), leading=True, rivals=rivals(others)) is None
        clock.advance(1.0)
    assert rules.held_s(clock.monotonic()) > AFTER_MS / 1000
    # A good replica stands at last: the master, held long enough, steps down at once.
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=rivals(1)) is Leave.STEP_DOWN
    assert step_downs(metrics) == 1


def test_the_hold_is_timed_from_the_last_reading_within_the_limit() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    clock.advance(AFTER_MS / 1000 - 1)
    rules.observe(clock.monotonic(), GOOD, leading=True)  # back within the limit: released
    assert rules.held_s(clock.monotonic()) == 0
    clock.advance(1)
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    clock.advance(AFTER_MS / 1000 - 1)
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None
    clock.advance(1)
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=rivals(1)) is Leave.STEP_DOWN


def test_the_hold_is_timed_from_when_the_replica_leads() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), SKEWED, leading=False)
    clock.advance(AFTER_MS)  # long skewed as a follower: no hold counted
    rules.observe(clock.monotonic(), SKEWED, leading=True)
    assert rules.held_s(clock.monotonic()) == 0
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None


def test_a_good_clock_never_leaves_nor_asks() -> None:
    clock = FakeClock()
    rules = candidacy()
    for leading in (True, False):
        for _ in range(100):
            rules.observe(clock.monotonic(), GOOD, leading=leading)
            assert rules.leave(clock.monotonic(), leading=leading, rivals=never) is None
            clock.advance(1.0)
    rules.observe(clock.monotonic(), -LIMIT_MS + 1.0, leading=True)  # at the limit is within
    clock.advance(AFTER_MS)
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None


# -- a follower -------------------------------------------------------------------------------


def test_a_skewed_candidate_that_does_not_lead_stands_aside_when_another_stands() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), SKEWED, leading=False)
    with capture_logs() as logs:
        assert rules.leave(clock.monotonic(), leading=False, rivals=rivals(1)) is Leave.STAND_ASIDE
    assert [e["event"] for e in logs] == ["replica.election_left"]
    # Alone (it just joined an empty election, and its watch has not said it leads yet), or
    # ZooKeeper silent: it stays.
    assert rules.leave(clock.monotonic(), leading=False, rivals=rivals(0)) is None
    assert rules.leave(clock.monotonic(), leading=False, rivals=rivals(None)) is None


# -- standing for election --------------------------------------------------------------------


def test_a_good_clock_stands_at_once_without_asking() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), GOOD, leading=False)
    with capture_logs() as logs:
        assert rules.may_stand(clock.monotonic(), never)
    assert logs == []


def test_a_skewed_replica_stands_only_when_nobody_else_does() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), -SKEWED, leading=False)
    with capture_logs() as logs:
        assert not rules.may_stand(clock.monotonic(), rivals(1))
        assert not rules.may_stand(clock.monotonic(), rivals(None))  # unknown: stay out
        assert not rules.may_stand(clock.monotonic(), rivals(3))
        assert rules.may_stand(clock.monotonic(), rivals(0))
    assert [e["event"] for e in logs] == [
        "replica.election_withheld",  # once, not at every control-loop iteration
        "replica.election_standing_again",
    ]
    assert logs[1]["why"] == "no other candidate stands"


def test_a_replica_stands_again_once_its_clock_was_good_for_a_while() -> None:
    clock = FakeClock()
    rules = candidacy()
    rules.observe(clock.monotonic(), SKEWED, leading=False)
    assert not rules.may_stand(clock.monotonic(), rivals(1))
    clock.advance(1)
    rules.observe(clock.monotonic(), GOOD, leading=False)
    clock.advance(RECOVER_S - 1.5)
    rules.observe(clock.monotonic(), GOOD, leading=False)
    assert not rules.may_stand(clock.monotonic(), rivals(1))  # not yet: RECOVER_S in a row
    clock.advance(0.5)
    rules.observe(clock.monotonic(), GOOD, leading=False)
    with capture_logs() as logs:
        assert rules.may_stand(clock.monotonic(), never)
    assert [e["event"] for e in logs] == ["replica.election_standing_again"]


@pytest.mark.parametrize(
    ("limit", "after"), [(0, AFTER_MS), (LIMIT_MS, 0)], ids=["no-limit", "no-step-down"]
)
def test_zero_keeps_the_former_behaviour(limit: int, after: int) -> None:
    clock = FakeClock()
    rules = candidacy(limit=limit, after=after)
    rules.observe(clock.monotonic(), SKEWED * 100, leading=True)
    clock.advance(AFTER_MS)
    rules.observe(clock.monotonic(), SKEWED * 100, leading=True)
    assert rules.leave(clock.monotonic(), leading=True, rivals=never) is None
    assert rules.leave(clock.monotonic(), leading=False, rivals=never) is None
    assert rules.may_stand(clock.monotonic(), never)


# -- a shard: replicas, their clocks and an election, in process ------------------------------


class Shard:
    """Replicas running the rules as the control loop does, on one in-process election
    (candidates in joining order; the first leads), one tick a second."""

    def __init__(self, skews: dict[str, float], leader_first: str) -> None:
        self.clock = FakeClock()
        self.skews = dict(skews)
        self.metrics = {name: Metrics() for name in skews}
        self.rules = {n: candidacy(self.metrics[n]) for n in skews}
        others = [n for n in skews if n != leader_first]
        self.candidates = [leader_first, *others]  # all joined while their clocks were good

    def leader(self) -> str | None:
        return self.candidates[0] if self.candidates else None

    def tick(self) -> None:
        for name, rules in self.rules.items():
            now = self.clock.monotonic()
            leading = self.leader() == name
            rules.observe(now, self.skews[name], leading=leading)

            def others(name: str = name) -> int:
                return len([c for c in self.candidates if c != name])

            if name in self.candidates:
                if rules.leave(now, leading=leading, rivals=others) is not None:
                    self.candidates.remove(name)
            elif rules.may_stand(now, others):
                self.candidates.append(name)
        self.clock.advance(1.0)

    def step_downs(self) -> int:
        return round(sum(step_downs(m) for m in self.metrics.values()))


def test_a_shard_moves_its_mastership_to_a_good_clock_and_back_when_it_is_fixed() -> None:
    shard = Shard({"a": SKEWED, "b": GOOD, "c": GOOD}, leader_first="a")
    leaders = []
    for _ in range(60):
        shard.tick()
        leaders.append(shard.leader())
    assert leaders[0] == "a"
    assert leaders[-1] == "b"
    assert leaders.index("b") == AFTER_MS // 1000  # held for the bound, then stepped down
    assert shard.candidates == ["b", "c"]  # a stays out while its clock is off
    assert shard.step_downs() == 1
    shard.skews["a"] = GOOD
    for _ in range(round(RECOVER_S) + 2):
        shard.tick()
    assert shard.candidates == ["b", "c", "a"]  # back as a candidate, b still leads


def test_a_shard_whose_replicas_are_all_skewed_keeps_one_master_and_moves_it_nowhere() -> None:
    shard = Shard({"a": GOOD, "b": GOOD, "c": GOOD}, leader_first="a")
    shard.tick()
    shard.skews = {"a": SKEWED, "b": -SKEWED, "c": SKEWED}  # e.g. the broker's clock stepped
    for _ in range(300):
        shard.tick()
        assert shard.leader() == "a"
    assert shard.candidates == ["a"]  # the others stood aside at once
    assert shard.step_downs() == 0


def test_a_skewed_shard_whose_master_dies_gets_a_skewed_master_rather_than_none() -> None:
    shard = Shard({"a": GOOD, "b": SKEWED, "c": SKEWED}, leader_first="a")
    for _ in range(5):
        shard.tick()
    assert shard.candidates == ["a"]
    del shard.rules["a"]  # killed: its node goes with its session
    shard.candidates.remove("a")
    for _ in range(5):
        shard.tick()
    assert shard.leader() in {"b", "c"}
    assert len(shard.candidates) == 1  # the other one stays out: somebody stands
