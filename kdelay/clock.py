"""Time for the forwarder and the broker clock, injected so tests drive it instead of waiting
for it.

Two readings: the wall clock in epoch milliseconds (due times, checkpoint times, record
timestamps) and a monotonic clock in seconds (backoffs, checkpoint intervals, deadlines), which
never jumps when the wall clock is adjusted.

Threads: :data:`SYSTEM_CLOCK` is stateless; any thread may read it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where the forwarder, its release backoff and its sender read the time."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    """The real clocks."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return SYSTEM_CLOCK.wall_ms()
