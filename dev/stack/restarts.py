"""Keep ``kdelay up``'s children running, the way Kubernetes does with ``restartPolicy: Always``.

A component that exits is restarted with the same command line (same ports, same data
directory) after a back-off of 1 s, 2 s, 4 s ... capped at 30 s; the back-off starts over once
the component stayed up for a minute (Kubernetes' CrashLoopBackOff). Replicas and the proxy are
restarted for as long as ``kdelay up`` runs. An *essential* component (the local Kafka or
ZooKeeper, without which nothing else can work) is given up on after ``max_essential_restarts``
restarts in a row that did not stay up: :meth:`SupervisedProcesses.tick` raises
:class:`ComponentLostError` naming it, and ``kdelay up`` stops everything. The policy and the
counting are kdelay/supervision.py's, shared with the proxy and a replica's threads; this module
only watches the processes and launches them again.

Restarting never blocks: a restart only launches the process again; whether it works shows in
whether it stays up. So a SIGTERM to ``kdelay up`` is answered within a tick.

Concurrency: one thread (``kdelay up``'s main thread) calls :meth:`SupervisedProcesses.tick`;
time comes
from the injected ``clock`` so the policy is testable without waiting.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from kdelay.backoff import Backoff
from kdelay.errors import InfrastructureError
from kdelay.supervision import RestartPolicy, Supervisor


class ComponentLostError(InfrastructureError):
    """An essential component could not be kept running."""


@dataclass
class Component:
    """One supervised child, seen through callables so the stack can swap its process."""

    name: str
    alive: Callable[[], bool]
    #: The last exit status, ``None`` while running (``subprocess`` convention: -N is signal N).
    returncode: Callable[[], int | None]
    #: Launch it again (same command line); must not block on readiness.
    restart: Callable[[], None]
    pid: Callable[[], int]
    #: Where its output goes, for the give-up message.
    log: str = ""
    #: Kafka or ZooKeeper: give up (and stop ``kdelay up``) when it keeps exiting.
    essential: bool = False


@dataclass
class _Track:
    started_at: float
    total: int = 0
    due: float | None = None
    last_exit: str = ""


def describe_exit(returncode: int | None) -> str:
    """``signal SIGKILL`` or ``exit code 1``: how a process ended, for a log line."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class SupervisedProcesses:
    """Call :meth:`tick` about once a second; it restarts what exited and reports each step."""

    def __init__(
        self,
        components: list[Component],
        *,
        log: Callable[[str], None],
        on_restart: Callable[[Component], None] = lambda _c: None,
        backoff: Backoff | None = None,
        max_essential_restarts: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.components = components
        self.backoff = backoff or Backoff()
        self.max_essential_restarts = max_essential_restarts
        # The exit after max_essential_restarts restarts in a row gives up; others never do.
        self._essential = Supervisor(RestartPolicy(self.backoff, max_essential_restarts + 1))
        self._others = Supervisor(RestartPolicy(self.backoff, max_failures=None))
        self._log = log
        self._on_restart = on_restart
        self._clock = clock
        now = clock()
        self._tracks = {c.name: _Track(started_at=now) for c in components}

    def restarts(self, name: str) -> int:
        """How often ``name`` was restarted so far (Kubernetes' restartCount)."""
        return self._tracks[name].total

    def tick(self) -> None:
        """Schedule a restart for each component that exited; run the restarts now due.

        Raises :class:`ComponentLostError` when an essential component exited once more after
        ``max_essential_restarts`` restarts in a row.
        """
        now = self._clock()
        for component in self.components:
            track = self._tracks[component.name]
            if track.due is None:
                self._check(component, track, now)
            elif now >= track.due:
                self._restart(component, track, now)

    def _check(self, component: Component, track: _Track, now: float) -> None:
        restarts = self._essential if component.essential else self._others
        if component.alive():
            restarts.running(component.name, now - track.started_at)
            return
        track.last_exit = describe_exit(component.returncode())
        failure = restarts.failed(component.name)
        if failure.gave_up:
            raise ComponentLostError(
                f"{component.name} could not be kept running: it exited ({track.last_exit}) "
                f"after {failure.consecutive - 1} restarts in a row; "
                f"see {component.log or 'its log'}"
            )
        track.total += 1
        delay = failure.delay_s
        track.due = now + delay
        self._log(
            f"kdelay: {component.name} exited ({track.last_exit}); "
            f"restarting in {delay:g} s (restart {track.total})"
        )

    def _restart(self, component: Component, track: _Track, now: float) -> None:
        track.due = None
        track.started_at = now
        try:
            component.restart()
        except (OSError, InfrastructureError) as exc:
            # Not started: the next tick sees it dead and backs off further.
            self._log(f"kdelay: {component.name} could not be restarted: {exc}")
            return
        self._log(f"kdelay: {component.name} restarted (pid {component.pid()})")
        self._on_restart(component)
