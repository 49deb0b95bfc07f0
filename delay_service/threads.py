"""Supervision of a replica's long-running threads: never a live process doing nothing.

Each component (``ingest``, ``forwarder``) runs its loop in a thread of its own under
:class:`SupervisedThreads`. When the loop raises, it logs ``supervisor.component_failed`` with
the traceback, counts ``kdelay_component_failures_total{component}``, calls the component's
``on_failure`` (the replica uses it to make a failed master step down), waits out an
exponential backoff and runs the loop again. ``max_failures`` consecutive failures (a run
shorter than ``backoff.reset_after_s`` does not reset the count) call ``on_fatal`` instead: the
replica then shuts down and the process exits non-zero, so the orchestrator restarts it. The
policy and the counting are kdelay/supervision.py's, shared with the proxy and ``kdelay up``;
this module only runs and watches the threads.

A loop that *returns* has stopped on purpose (shutdown) and is not run again.

Threads: :meth:`SupervisedThreads.start`, :meth:`stop` and :meth:`join` are called by the owner (the
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
from kdelay.delay_service.metrics import Metrics
from kdelay.supervision import RestartPolicy, Supervisor

log = logs.get(__name__)


@dataclass(slots=True)
class _Component:
    name: str
    target: Callable[[], None]
    on_failure: Callable[[BaseException], None]
    thread: threading.Thread | None = None
    retry_at: float | None = None  # monotonic: backing off until then
    gave_up: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class SupervisedThreads:
    """Runs components' loops in threads and restarts the ones that fail."""

    def __init__(
        self,
        metrics: Metrics,
        policy: RestartPolicy,
        on_fatal: Callable[[str], None],
    ) -> None:
        self._metrics = metrics
        self._restarts = Supervisor(policy)
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
        self._restarts.recovered(name)  # a fresh start has no failures in a row
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
        failure = self._restarts.failed(comp.name, ran_s=ran_s)
        self._metrics.component_failures.labels(comp.name).inc()
        log.error(
            "supervisor.component_failed",
            component=comp.name,
            error=f"{type(exc).__name__}: {exc}",
            consecutive=failure.consecutive,
            restart_in_s=None if failure.gave_up else failure.delay_s,
            exc_info=exc,
        )
        with self._lock:
            comp.retry_at = time.monotonic() + failure.delay_s
        try:
            comp.on_failure(exc)
        except Exception:  # a failing hook must not stop supervision
            log.exception("supervisor.on_failure_failed", component=comp.name)
        if failure.gave_up:
            log.critical(
                "supervisor.component_given_up", component=comp.name, failures=failure.consecutive
            )
            with self._lock:
                comp.gave_up = True
                comp.retry_at = None
            self._on_fatal(comp.name)
            return False
        self._stop.wait(failure.delay_s)
        with self._lock:
            comp.retry_at = None
        return not self._stop.is_set()
