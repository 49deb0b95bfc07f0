"""The master's hold on a skewed clock (:class:`SkewHold`); the broker clock itself is
:mod:`kdelay.broker_clock`, shared with the proxy.

Called from the forwarder thread only.
"""

from __future__ import annotations

from typing import Any

from kdelay import logs
from kdelay.broker_clock import BrokerClock

log = logs.get(__name__)


class SkewHold:
    """The forwarder's ``hold``: why a master should release nothing now, or None. Broker time
    unknown, or this machine's wall clock more than ``max_skew_ms`` (0: no limit) from the
    broker's. Releases follow broker time either way; the limit stops a master whose clock is
    this wrong, which is worth an operator's look (alert KdelayClockSkew). Logs each change and
    keeps ``kdelay_replica_release_held``; called from the forwarder thread only."""

    def __init__(self, clock: BrokerClock, max_skew_ms: int, metrics: Any = None) -> None:
        self._clock = clock
        self._max = max_skew_ms
        self._metrics = metrics
        self._reason: str | None = None

    def __call__(self) -> str | None:
        reason = None
        skew = self._clock.skew_ms()
        if self._clock.now_ms() is None:
            reason = "broker time not known yet"
        elif self._max and skew is not None and abs(skew) > self._max:
            reason = f"clock skew {skew:.0f} ms is beyond --max-clock-skew-ms {self._max}"
        if reason != self._reason:
            if reason is None:
                log.info("forwarder.release_resumed", held_for=self._reason)
            else:
                log.error("forwarder.release_held", reason=reason, skew_ms=skew)
            self._reason = reason
        if self._metrics is not None:
            self._metrics.release_held.set(reason is not None)
        return reason
