"""Whether upstream Kafka is available, as the proxy sees it: a state with a history.

Before, a broker outage showed as one ``upstream_error`` log line during a 70 s stall. Now the
outage is a state: ``kdelay_proxy_upstream_available`` is 0 while it lasts, ``/readyz`` answers
503 naming upstream, and each transition is logged once: ``proxy.upstream_down`` (the reason)
and ``proxy.upstream_back`` (``down_s``: how long it lasted). Every error librdkafka reports
(``_ALL_BROKERS_DOWN``, ``_TRANSPORT``, ...) and every failed produce is still counted in
``kdelay_proxy_upstream_errors_total{error}``.

Who decides (proxy/upstream/producer.py):
- *Down* when a metadata request to upstream fails: the probe the poll side runs when
  librdkafka reports all brokers down or a batch failed (``suspect``), and ``/readyz``'s own
  request. A report alone is not enough: a broker closing an idle connection also makes
  librdkafka report all brokers down for a moment, which is not an outage.
- *Back* when a metadata request succeeds (the probe repeats every
  ``upstream_probe_interval_s`` while down) or a batch is acknowledged.

Thread safety: called from the poll and probe threads, worker threads and the loop; ``_lock``
guards the state. Logging and the gauge happen outside the lock, once per transition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kdelay import logs
from kdelay.proxy.metrics import ProxyMetrics

log = logs.get(__name__)


class UpstreamAvailability:
    """Upstream Kafka's availability (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        metrics: ProxyMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap = bootstrap
        self.metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        #: When it went down (clock seconds), None while available.
        self._down_since: float | None = None
        self._reason = ""
        #: Set when a report suggests an outage: the probe should look now.
        self.suspect = threading.Event()
        metrics.upstream_available.set(1)

    @property
    def available(self) -> bool:
        """Whether upstream is available as far as the proxy knows."""
        return self._down_since is None

    def down(self, reason: str) -> None:
        """Upstream did not answer (``reason`` says how); logged on the transition only."""
        with self._lock:
            if self._down_since is not None:
                self._reason = reason
                return
            self._down_since = self._clock()
            self._reason = reason
        self.metrics.upstream_available.set(0)
        log.warning("proxy.upstream_down", upstream=self.bootstrap, reason=reason)

    def up(self, how: str) -> None:
        """Upstream answered (``how``: what showed it); logged on the transition only."""
        if self._down_since is None:  # the common case, without the lock: a batch acked
            return
        with self._lock:
            since = self._down_since
            if since is None:
                return
            self._down_since = None
            reason = self._reason
        self.suspect.clear()
        self.metrics.upstream_available.set(1)
        log.info(
            "proxy.upstream_back",
            upstream=self.bootstrap,
            down_s=round(self._clock() - since, 3),
            reason=reason,
            seen_by=how,
        )

    def problem(self) -> str | None:
        """Why upstream is unavailable, for ``/readyz`` and 503 answers; None while it is."""
        with self._lock:
            since, reason = self._down_since, self._reason
        if since is None:
            return None
        down_s = self._clock() - since
        return f"upstream Kafka at {self.bootstrap} is unavailable (for {down_s:.0f} s): {reason}"
