"""A process whose wall clock is off, for the clock cases of ``bench.reliability``.

``faketime`` shifts the whole process (C libraries included); libfaketime 0.9.10 (Debian's)
has two bugs with FAKETIME_DONT_FAKE_MONOTONIC that a shifted *process* would not have:
Python 3.11's time.sleep (clock_nanosleep on CLOCK_MONOTONIC, TIMER_ABSTIME) fails with EINVAL
(wolfcw/libfaketime#426), which :data:`SHIM` avoids, and a timed wait on a CLOCK_MONOTONIC
condition variable (librdkafka's) lasts the skew longer when the clock is ahead (fixed upstream
by wolfcw/libfaketime#503), which nothing here avoids. The ``python`` way shifts only what
Python reads (time.time, time.time_ns), which is where kdelay reads the wall clock.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from dev.stack.process import MARKER

FAKETIME = "/usr/bin/faketime"

#: Runs ``kdelay`` ARGS (after ``-c``) with time.sleep waiting on an Event, and with time.time
#: and time.time_ns shifted by $KDELAY_BENCH_SKEW_S seconds when it is set.
SHIM = """import os, runpy, threading, time
_wake = threading.Event()
def _sleep(s):
    if s < 0:
        raise ValueError("sleep length must be non-negative")
    _wake.wait(s)
time.sleep = _sleep
_skew = float(os.environ.get("KDELAY_BENCH_SKEW_S") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
runpy.run_module("kdelay", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Skew:
    """A wall clock ``seconds`` off: by ``faketime`` (the whole process, C libraries included)
    or by ``python`` (the shim above: only what Python reads, which is all kdelay reads)."""

    seconds: float
    how: str = "faketime"

    def argv(self, args: list[str]) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that run ``kdelay ARGS`` with this clock."""
        shim = [sys.executable, "-X", f"{MARKER}={os.getpid()}", "-c", SHIM, *args]
        if self.how == "python":
            return shim, {**os.environ, "KDELAY_BENCH_SKEW_S": str(self.seconds)}
        # Only the wall clock moves: timeouts and backoffs (monotonic) stay true.
        env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        return [FAKETIME, "-f", f"{self.seconds:+g}s", *shim], env
