"""Child processes that never outlive their owner.

Every process is started in its own process group with the marker ``kdelay.managed`` in its
command line (``-Dkdelay.managed=<owner pid>`` for JVMs, an environment variable and argument
otherwise), so ``make check-leftovers`` can prove nothing survived. Stopping signals the whole
group: TERM, then KILL after a grace period. A registry kills what is still running at
interpreter exit and on SIGTERM/SIGHUP, so an interrupted test run leaves no JVM behind.

No hook runs when the owner is SIGKILLed, so on Linux each child also asks the kernel to
SIGKILL it when its parent dies (:func:`kdelay.children.die_with_parent`; only for children
started from the main thread: ``kdelay up``, the fixtures and the benchmarks start theirs there;
a child started from another thread relies on the hooks above). It covers the child itself: a
grandchild is its child's to watch. What survives anyway (an older kdelay, another platform) is
what :mod:`dev.stack.leftovers` finds.

Thread-safety: the registry is guarded by a lock; one ManagedProcess is driven by one owner.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType

from kdelay.children import die_with_parent
from kdelay.errors import InfrastructureError
from kdelay.jars import java_executable

MARKER = "kdelay.managed"

_registry: set[ManagedProcess] = set()
_lock = threading.Lock()
_installed = False


def _kill_all() -> None:
    with _lock:
        procs = list(_registry)
    for proc in procs:
        proc.stop(grace=2.0)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _kill_all()
    # Restore the default and re-raise so the exit status still says "killed by signal".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _installed  # noqa: PLW0603 - one-time process-wide hook installation
    if _installed:
        return
    _installed = True
    atexit.register(_kill_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)


class ManagedProcess:
    """One child process in its own group, logging to ``log_path``.

    ``die_with_owner`` (the default) SIGKILLs the child when its owner dies (see the module
    docstring); tests that need a leftover turn it off.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        die_with_owner: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.die_with_owner = die_with_owner
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise InfrastructureError(f"{self.name} is not started")
        return self._popen.pid

    def start(self) -> None:
        _install_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env["KDELAY_MANAGED"] = str(os.getpid())
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                # Safe here despite threads: it only calls prctl, getppid and _exit.
                preexec_fn=die_with_parent() if self.die_with_owner else None,  # noqa: PLW1509
            )
        with _lock:
            _registry.add(self)

    def restart(self) -> None:
        """Run the same command line again after the process exited (a supervisor's restart).

        What is left of the old process group is killed first; the log is appended to, after a
        line marking the restart, so the crash and the restart read in order.
        """
        if self.alive():
            raise InfrastructureError(f"{self.name} is still running (pid {self.pid})")
        self.stop(grace=0)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log.write(f"--- {stamp} {self.name} exited with {self.returncode()}; restarting\n")
        self.start()

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def returncode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group."""
        if self._popen is not None and self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group at once and reap it (a crash, for failure tests)."""
        self.signal(signal.SIGKILL)
        if self._popen is not None:
            self._popen.wait()
        with _lock:
            _registry.discard(self)

    def stop(self, grace: float = 15.0) -> None:
        """TERM the group; KILL it if it has not exited after ``grace`` seconds."""
        if self._popen is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self._popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self._popen.wait()
        # Children that left the group's leader behind still belong to the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        with _lock:
            _registry.discard(self)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def log_tails(procs: Iterable[ManagedProcess], lines: int = 60) -> str:
    """The last ``lines`` of each process's log, each under a ``--- name (path)`` line."""
    return "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail(lines)}" for p in procs)


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    proc: ManagedProcess | None = None,
) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (and the log tail of ``proc``)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if proc is not None and not proc.alive():
            raise InfrastructureError(
                f"{proc.name} exited with code {proc.returncode()} while waiting for {what}; "
                f"log {proc.log_path}:\n{proc.log_tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"; log {proc.log_path}:\n{proc.log_tail()}" if proc else ""
            raise InfrastructureError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: The ``kdelay`` command of this interpreter's environment (``.venv/bin/kdelay``): the tests and
#: benchmarks start components with it, as a user does.
KDELAY = str(Path(sys.executable).with_name("kdelay"))


def python_argv(*args: str) -> list[str]:
    """``python -m kdelay ARGS`` in this interpreter, marked as managed (``-X`` is inert)."""
    return [sys.executable, "-X", f"{MARKER}={os.getpid()}", "-m", "kdelay", *args]


#: HotSpot's quick-start JIT: C1 only, no C2. A fresh JVM otherwise spends seconds of CPU in
#: C2's compiler threads in its first minutes: a local Kafka broker 6.9 CPU-s from its start
#: through ``make demo``'s burst and release (C1 only: 1.0 s), on 2 cores beside the proxy and
#: the replicas. C1's code runs slower (the broker's other threads 4.5 against 3.5 CPU-s there),
#: a cost that grows with the JVM's uptime under load: the benchmarks keep the full JIT, as a
#: long-running broker has (``KafkaSettings.quick_jit``; docs/benchmarks.md has both).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: Extra flags for every local JVM, placed after kdelay's own (HotSpot: the later flag wins, so
#: ``KDELAY_JVM_OPTS=-XX:TieredStopAtLevel=4`` restores the full JIT).
JVM_OPTS_ENV = "KDELAY_JVM_OPTS"


def java_argv(
    component_cp: str, main_class: str, heap_mb: int, *args: str, quick_jit: bool = True
) -> list[str]:
    """A small-footprint JVM command line for a 2-core machine, marked as managed."""
    return [
        java_executable(),
        f"-D{MARKER}={os.getpid()}",
        f"-Xms{min(heap_mb, 128)}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        *([QUICK_JIT] if quick_jit else []),
        *shlex.split(os.environ.get(JVM_OPTS_ENV, "")),
        "-Djava.awt.headless=true",
        "-cp",
        component_cp,
        main_class,
        *args,
    ]
