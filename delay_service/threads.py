"""Supervision of a replica's long-running threads: never a live process doing nothing.

Each component (``ingest``, ``forwarder``) runs its loop in a thread of its own under a
:class:`Supervisor`. When the loop raises, the supervisor logs ``supervisor.component_failed``
with the traceback, counts ``kdelay_component_failures_total{component}``, calls the
component's ``on_failure`` (the replica uses it to make a failed master step down), waits out
an exponential backoff and runs the loop again. ``max_failures`` consecutive failures (a run
shorter than ``backoff.reset_after_s`` does not reset the count) call ``on_fatal`` instead: the
replica then shuts down and the process exits non-zero, so the orchestrator restarts it.

A loop that *returns* has stopped on purpose (shutdown) and is not run again.

Threads: :meth:`Supervisor.start`, :meth:`stop` and :meth:`join` are called by the owner (the
replica's main thread); :meth:`backing_off` and :meth:`dead` by any thread (the health
endpoints). ``on_failure`` and ``on_fatal`` run on the failed component's thread and must not
block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kdelay import logs
from kdelay.backoff import Backoff
from kdelay.delay_service.metrics import Metrics

log = logs.get(__name__)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When to run a failed component again, and when to give up."""

    backoff: Backoff = field(default_factory=Backoff)  # reset_after_s also resets the count
    max_failures: int = 5  # consecutive failures before on_fatal


@dataclass(slots=True)
class _Component:
    name: str
    target: Callable[[], None]
    on_failure: Callable[[BaseException], None]
    thread: threading.Thread | None = None
    failures: int = 0  # consecutive
    retry_at: float | None = None  # monotonic: backing off until then
    gave_up: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Supervisor:
    """Runs components' loops in threads and restarts the ones that fail."""

    def __init__(
        self,
        metrics: Metrics,
        policy: RestartPolicy,
        on_fatal: Callable[[str], None],
    ) -> None:
        self._metrics = metrics
        self._policy = policy
        self._on_fatal = on_fatal
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._components: dict[str, _Component] = {}

    def start(
        self,
        name: str,
        target: Callable[[], None],
        on_failure: Callable[[BaseException], None] = lambda _exc: None,
    ) -> None:
        """Run ``target`` in a daemon thread called ``name``, supervised."""
        comp = _Component(name, target, on_failure)
        comp.thread = threading.Thread(target=self._run, args=(comp,), name=name, daemon=True)
        with self._lock:
            self._components[name] = comp
        comp.thread.start()

    def stop(self) -> None:
        """No more restarts: a failure from now on (shutting down) just ends its thread."""
        self._stop.set()

    def join(self, name: str, timeout: float) -> bool:
        """Wait for ``name``'s thread to end; False on timeout."""
        with self._lock:
            comp = self._components.get(name)
        return comp is None or comp.done.wait(timeout)

    def backing_off(self) -> list[str]:
        """Components waiting to be run again after a failure."""
        with self._lock:
            return [c.name for c in self._components.values() if c.retry_at is not None]

    def dead(self) -> list[str]:
        """Components whose thread ended although nobody asked them to stop."""
        if self._stop.is_set():
            return []
        with self._lock:
            return [c.name for c in self._components.values() if c.done.is_set()]

    def _run(self, comp: _Component) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    comp.target()
                except Exception as exc:  # supervision: any failure
                    if self._stop.is_set():
                        log.warning(
                            "supervisor.failed_while_stopping", component=comp.name, exc_info=True
                        )
                        return
                    if not self._failed(comp, exc, time.monotonic() - started):
                        return
                else:
                    return  # stopped on purpose
        finally:
            comp.done.set()

    def _failed(self, comp: _Component, exc: Exception, ran_s: float) -> bool:
        """Count, report and back off; False when the component is given up."""
        p = self._policy
        comp.failures = p.backoff.consecutive(comp.failures, ran_s)
        self._metrics.component_failures.labels(comp.name).inc()
        backoff = p.backoff.delay(comp.failures)
        give_up = comp.failures >= p.max_failures
        log.error(
            "supervisor.component_failed",
            component=comp.name,
            error=f"{type(exc).__name__}: {exc}",
            consecutive=comp.failures,
            restart_in_s=None if give_up else backoff,
            exc_info=exc,
        )
        with self._lock:
            comp.retry_at = time.monotonic() + backoff
        try:
            comp.on_failure(exc)
        except Exception:  # a failing hook must not stop supervision
            log.exception("supervisor.on_failure_failed", component=comp.name)
        if give_up:
            log.critical(
                "supervisor.component_given_up", component=comp.name, failures=comp.failures
            )
            with self._lock:
                comp.gave_up = True
                comp.retry_at = None
            self._on_fatal(comp.name)
            return False
        self._stop.wait(backoff)
        with self._lock:
            comp.retry_at = None
        return not self._stop.is_set()
