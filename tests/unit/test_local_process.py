"""Supervised processes: stop kills the whole group; an interrupted owner leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from kdelay.local.process import ManagedProcess, wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_stop_kills_grandchildren_in_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    proc = ManagedProcess("shell", ["bash", "-c", script], tmp_path / "log")
    proc.start()
    wait_until(
        lambda: pidfile.exists() and pidfile.read_text().strip() != "", timeout=10, what="pid"
    )
    grandchild = int(pidfile.read_text())
    assert _alive(grandchild)
    proc.stop(grace=5)
    wait_until(lambda: not _alive(grandchild), timeout=10, what="the grandchild to die")


def test_sigterm_to_the_owner_kills_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    owner_code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from kdelay.local.process import ManagedProcess
        p = ManagedProcess("sleeper", ["sleep", "300"], Path({str(tmp_path / "log")!r}))
        p.start()
        Path({str(pidfile)!r}).write_text(str(p.pid))
        time.sleep(300)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code])
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text() != "", timeout=30, what="pid")
        child = int(pidfile.read_text())
        assert _alive(child)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=30) == -signal.SIGTERM
        wait_until(lambda: not _alive(child), timeout=10, what="the child to die")
    finally:
        owner.kill()
        owner.wait()
