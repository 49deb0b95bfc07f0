"""Stopping a process on SIGINT and SIGTERM without running its stop in a signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock the handler then needs: a loop ``while not stop.wait(interval)`` holds
``stop``'s own (non-reentrant) lock for a few bytecodes of every wait, so a handler calling
``stop.set()`` there deadlocks the process, which then ignores every later signal (about one
SIGTERM in 150 against such a loop on this machine). :func:`on_stop_signals` installs a handler
that does nothing in Python; the interpreter's C handler writes the signal's number to a
wakeup socket (``signal.set_wakeup_fd``), and a thread of its own reads it and calls ``stop``,
where taking locks is safe.

Call it once, from the main thread, before the loop that ``stop`` ends. Not for a process that
runs an asyncio loop in its main thread (asyncio owns the wakeup fd there): use
``loop.add_signal_handler``.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterable
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: its presence makes the C handler write the wakeup fd."""


def on_stop_signals(
    stop: Callable[[int], None], signals: Iterable[signal.Signals] = STOP_SIGNALS
) -> None:
    """Call ``stop(signum)`` on a thread of its own each time one of ``signals`` arrives."""
    wanted = {int(s) for s in signals}
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for sig in wanted:
        signal.signal(sig, _nothing)

    def watch() -> None:
        with reader, writer:
            while data := reader.recv(64):
                for signum in data:
                    if signum in wanted:
                        stop(signum)

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()
