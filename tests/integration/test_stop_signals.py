"""A stop signal always stops a process that waits on an Event in its main thread.

Setting the Event from a Python signal handler deadlocks when the signal lands while the main
thread holds that Event's lock (about one SIGTERM in 150 against the loop below; `kdelay proxy
--workers 2` once hung so under `make test`). kdelay.stop_signals runs the stop on a thread.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest

CHILD = """
import threading
from kdelay.stop_signals import on_stop_signals
stop = threading.Event()
on_stop_signals(lambda signum: stop.set())
print("ready", flush=True)
while not stop.wait(0):  # holds the Event's lock for most of each turn
    pass
print("stopped", flush=True)
"""
TRIALS = 150  # per signal


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_stop_signal_stops_a_loop_waiting_on_its_event(sig: signal.Signals) -> None:
    rng = random.Random(7)
    for trial in range(TRIALS):
        with subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True
        ) as p:
            assert p.stdout is not None
            assert p.stdout.readline() == "ready\n"
            time.sleep(rng.random() * 0.005)  # land the signal anywhere in the loop
            p.send_signal(sig)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                pytest.fail(f"a process ignored {sig.name} (trial {trial + 1})")
            assert p.stdout.read() == "stopped\n"
            assert p.returncode == 0
