"""Child processes the kernel kills when their parent dies (Linux ``PR_SET_PDEATHSIG``).

No hook of ours runs when a parent is SIGKILLed, so each child asks the kernel to SIGKILL it
then (``prctl(PR_SET_PDEATHSIG)``, set between fork and exec; it survives exec). The kernel
fires it when the *thread* that forked exits, not the process, so it is set only for children
started from the main thread. Used by the development stack (dev/stack/process.py) and by
``kdelay proxy --workers`` (proxy/workers.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), resolved here: the child must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child SIGKILLed when this thread dies, or None where
    that cannot hold (not Linux, or not the main thread; see the module docstring)."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def preexec() -> None:
        # Runs in the child between fork and exec: no imports, no locks.
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(70)

    return preexec
