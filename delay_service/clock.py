"""The forwarder's clocks: :mod:`kdelay.clock`'s (shared with the broker clock and the proxy),
named here for the replica's modules."""

from __future__ import annotations

from kdelay.clock import SYSTEM_CLOCK, Clock, SystemClock, now_ms

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "now_ms"]
