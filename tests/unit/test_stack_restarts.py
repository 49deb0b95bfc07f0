"""The supervisor's restart policy (CrashLoopBackOff), driven by an injected clock."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from dev.stack.restarts import (
    Component,
    ComponentLostError,
    SupervisedProcesses,
    describe_exit,
)
from kdelay.backoff import Backoff


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeChild:
    """A child whose life the test decides; ``restart`` launches a new 'process'."""

    name: str
    running: bool = True
    code: int | None = None
    pid: int = 100
    restarts: list[float] = field(default_factory=list)
    clock: Clock | None = None
    fail_restart: bool = False

    def die(self, code: int) -> None:
        self.running, self.code = False, code

    def restart(self) -> None:
        if self.fail_restart:
            raise OSError("no such file")
        assert self.clock is not None
        self.restarts.append(self.clock.now)
        self.running, self.code, self.pid = True, None, self.pid + 1

    def component(self, *, essential: bool = False) -> Component:
        return Component(
            name=self.name,
            alive=lambda: self.running,
            returncode=lambda: self.code,
            restart=self.restart,
            pid=lambda: self.pid,
            log=f"/logs/{self.name}.log",
            essential=essential,
        )


def _supervisor(
    clock: Clock, *children: tuple[FakeChild, bool], lines: list[str], restarted: list[str]
) -> SupervisedProcesses:
    for child, _ in children:
        child.clock = clock
    return SupervisedProcesses(
        [child.component(essential=essential) for child, essential in children],
        log=lines.append,
        on_restart=lambda c: restarted.append(c.name),
        clock=clock,
    )


def test_backoff_doubles_from_one_second_up_to_the_cap() -> None:
    policy = Backoff()
    assert [policy.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_exit_statuses_are_named_like_a_shell_would() -> None:
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None) == "still running"


def test_a_dead_replica_is_restarted_after_a_growing_backoff_and_logged() -> None:
    clock = Clock()
    child = FakeChild("replica-2")
    lines: list[str] = []
    restarted: list[str] = []
    sup = _supervisor(clock, (child, False), lines=lines, restarted=restarted)
    sup.tick()
    assert lines == []

    start = clock.now
    for n, delay in enumerate([1, 2, 4, 8], start=1):
        child.die(-signal.SIGKILL)
        sup.tick()  # noticed: scheduled, not yet restarted
        assert lines[-1] == (
            f"kdelay: replica-2 exited (signal SIGKILL); restarting in {delay} s (restart {n})"
        )
        clock.now += delay - 0.5
        sup.tick()
        assert len(child.restarts) == n - 1, "restarted before its back-off elapsed"
        clock.now += 0.5
        sup.tick()
        assert child.restarts[-1] == clock.now
        assert lines[-1] == f"kdelay: replica-2 restarted (pid {child.pid})"
        assert restarted == ["replica-2"] * n
    assert sup.restarts("replica-2") == 4
    assert clock.now - start == 1 + 2 + 4 + 8


def test_the_backoff_starts_over_once_the_child_stayed_up() -> None:
    clock = Clock()
    child = FakeChild("proxy")
    lines: list[str] = []
    sup = _supervisor(clock, (child, False), lines=lines, restarted=[])
    for _ in range(3):  # three quick crashes: the next delay would be 8 s
        child.die(1)
        sup.tick()
        clock.now += 30
        sup.tick()
    clock.now += 60  # up for a minute
    sup.tick()
    child.die(1)
    sup.tick()
    assert lines[-1] == "kdelay: proxy exited (exit code 1); restarting in 1 s (restart 4)"


def test_an_essential_server_that_keeps_exiting_is_given_up_on_naming_it() -> None:
    clock = Clock()
    kafka = FakeChild("Kafka")
    replica = FakeChild("replica-1")
    lines: list[str] = []
    sup = _supervisor(clock, (kafka, True), (replica, False), lines=lines, restarted=[])
    for _ in range(sup.max_essential_restarts):
        kafka.die(1)
        sup.tick()
        clock.now += 30
        sup.tick()
    assert len(kafka.restarts) == sup.max_essential_restarts
    kafka.die(1)
    with pytest.raises(ComponentLostError) as lost:
        sup.tick()
    message = str(lost.value)
    assert message.startswith("Kafka could not be kept running: it exited (exit code 1)")
    assert "/logs/Kafka.log" in message


def test_a_replica_is_never_given_up_on() -> None:
    clock = Clock()
    child = FakeChild("replica-3")
    sup = _supervisor(clock, (child, False), lines=[], restarted=[])
    for _ in range(20):
        child.die(1)
        sup.tick()
        clock.now += 30
        sup.tick()
    assert len(child.restarts) == 20


def test_a_failed_launch_is_logged_and_retried_with_more_backoff() -> None:
    clock = Clock()
    child = FakeChild("proxy", fail_restart=True)
    lines: list[str] = []
    sup = _supervisor(clock, (child, False), lines=lines, restarted=[])
    child.die(1)
    sup.tick()
    clock.now += 1
    sup.tick()
    assert lines[-1] == "kdelay: proxy could not be restarted: no such file"
    sup.tick()
    assert lines[-1] == "kdelay: proxy exited (exit code 1); restarting in 2 s (restart 2)"
