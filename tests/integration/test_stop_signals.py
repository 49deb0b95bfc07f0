"""A stop signal always stops a process that waits on an Event in its main thread.

Setting the Event from a Python signal handler deadlocks when the signal lands while the main
thread holds that Event's lock (about one SIGTERM in 150 against the loop below; `kdelay proxy
--workers 2` once hung so under `make test`). kdelay.stop_signals runs the stop on a thread.

One child process runs every trial of a signal, each with a new Event: the race is the
signal's landing inside the loop, not the process's start, whose 150 interpreters cost 40 s a
signal (now about 3 s). A deadlocked trial leaves the child silent, and the test fails on it:
with the Event set from a plain `signal.signal` handler instead, three runs of this file all
failed, both signals, within the first four trials.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest

TRIALS = 150  # per signal

CHILD = f"""
import threading
from kdelay.stop_signals import on_stop_signals

current = threading.Event()

def stop(signum):
    current.set()

on_stop_signals(stop)
for _ in range({TRIALS}):
    current = threading.Event()
    print("ready", flush=True)
    while not current.wait(0):  # holds the Event's lock for most of each turn
        pass
    print("stopped", flush=True)
"""


class _Lines:
    """The child's output, a line at a time, each with a deadline."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""

    def next(self, timeout: float) -> str | None:
        """The next line, or None if the child writes none within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode() + "\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_stop_signal_stops_a_loop_waiting_on_its_event(sig: signal.Signals) -> None:
    rng = random.Random(7)
    with subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        lines = _Lines(p.stdout.fileno())
        try:
            for trial in range(TRIALS):
                assert lines.next(30) == "ready\n", f"trial {trial + 1}: the child did not start"
                # sleep: a random instant is the thing tested: the signal lands anywhere in the loop
                time.sleep(rng.random() * 0.005)
                p.send_signal(sig)
                if lines.next(10) != "stopped\n":
                    pytest.fail(f"a process ignored {sig.name} (trial {trial + 1})")
            assert p.wait(10) == 0
        finally:
            if p.poll() is None:
                p.kill()
