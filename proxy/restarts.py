"""Restarts of the proxy's long-running parts, with backoff: never a live process doing nothing.

The supervised components and who runs them:

- ``upstream_poll``: the thread serving librdkafka's delivery callbacks
  (proxy/upstream/producer.py). Its loop survives an exception from ``poll`` (a callback that
  raised) and polls again after the backoff.
- ``http``: the uvicorn server task (proxy/app.py), restarted by ``keep_running``.
- ``kafka_listener``: the asyncio server accepting Kafka connections (proxy/app.py watches that
  it is still serving and starts it serving again). Each connection's own tasks need no
  supervision: they catch everything and cost only their connection (proxy/kafka/server.py).

On an unexpected exception a component is logged (``proxy.component_failed``, with the
traceback), counted (``kdelay_component_failures_total{component}``), reported by ``/readyz``
(503 naming it) until it runs again, and restarted after an exponential backoff. After
``max_failures`` consecutive failures without a successful restart in between, the supervisor
gives up (``proxy.component_gave_up``) and calls ``on_give_up``: ``kdelay proxy`` then exits
with status 70 (EX_SOFTWARE) so that Kubernetes, or ``kdelay up``, restarts the process. The
policy and the counting are kdelay/supervision.py's, shared with a replica's threads and
``kdelay up``; this module adds readiness, the give-up once per process and ``keep_running``.

Thread safety: every method may be called from any thread (the poll thread reports its own
failures); ``_lock`` guards the readiness state. ``keep_running`` runs on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable

from kdelay import logs
from kdelay.backoff import Backoff
from kdelay.errors import KdelayError
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.supervision import RestartPolicy, Supervisor

log = logs.get(__name__)

#: The longest wait between two restarts of a component.
MAX_BACKOFF_S = 30.0
#: The exit status of a proxy that gave up on a component (EX_SOFTWARE).
EXIT_GAVE_UP = 70


class ComponentStoppedError(KdelayError):
    """A component's run ended although nobody asked it to stop."""


class SupervisedComponents:
    """Readiness and restarts of the proxy's components, under the one restart policy."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        *,
        backoff_s: float = 0.5,
        max_failures: int = 10,
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        self.metrics = metrics
        # A component's failures in a row start over only when it says it runs (recovered).
        self._restarts = Supervisor(RestartPolicy(Backoff(backoff_s, MAX_BACKOFF_S), max_failures))
        self.on_give_up = on_give_up
        self._lock = threading.Lock()
        self._down: dict[str, str] = {}
        #: The component given up on, if any.
        self.gave_up: str | None = None

    def failed(self, component: str, exc: BaseException) -> float | None:
        """Record that ``component`` failed with ``exc``: the seconds to wait before restarting
        it, or None when the supervisor gave up (the process is to exit)."""
        with self._lock:
            failure = self._restarts.failed(component)
            self._down[component] = f"{type(exc).__name__}: {exc}"
        self.metrics.component_failures.labels(component).inc()
        log.error(
            "proxy.component_failed",
            component=component,
            consecutive=failure.consecutive,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        if failure.gave_up:
            with self._lock:
                first = self.gave_up is None
                self.gave_up = self.gave_up or component
            log.critical(
                "proxy.component_gave_up", component=component, failures=failure.consecutive
            )
            if first and self.on_give_up is not None:
                self.on_give_up(component)
            return None
        return failure.delay_s

    def recovered(self, component: str) -> None:
        """``component`` runs again: ready as far as it is concerned, backoff reset."""
        with self._lock:
            was = self._down.pop(component, None)
            self._restarts.recovered(component)
        if was is not None:
            log.info("proxy.component_restarted", component=component)

    def down(self) -> dict[str, str]:
        """Components not running now, each with the error that stopped it."""
        with self._lock:
            return dict(self._down)

    def not_ready(self) -> str | None:
        """Why the proxy is not ready (for ``/readyz``), or None."""
        down = self.down()
        if self.gave_up is not None:
            return f"gave up on {self.gave_up}; the process is exiting"
        if down:
            return "; ".join(f"{c} is down ({why}), restarting" for c, why in sorted(down.items()))
        return None

    async def keep_running(
        self, component: str, run: Callable[[], Awaitable[None]], stopped: asyncio.Event
    ) -> None:
        """Run ``run()`` until ``stopped`` is set; when it raises or returns before that, count a
        failure and run it again after the backoff (until the supervisor gives up). ``run``
        calls ``recovered`` itself once it is up again."""
        while not stopped.is_set():
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure is supervised
                error: BaseException = exc
            else:
                error = ComponentStoppedError(f"{component} stopped on its own")
            if stopped.is_set():
                return
            backoff = self.failed(component, error)
            if backoff is None:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await stopped.wait()
