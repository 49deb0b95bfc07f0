"""The leftover check: a managed process is reported once its owner is gone, not before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from kdelay.local import leftovers
from kdelay.local.process import MARKER, ManagedProcess, wait_until


def test_a_process_outliving_its_owner_is_reported(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The owner starts a managed child, then dies without running its exit hooks (os._exit),
    # like a SIGKILLed test run: the child is orphaned.
    owner_code = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from kdelay.local.process import ManagedProcess, MARKER
        argv = ["bash", "-c", "sleep 300; true", f"{{MARKER}}={{os.getpid()}}"]
        p = ManagedProcess("sleeper", argv, Path({str(tmp_path / "log")!r}))
        p.start()
        Path({str(pidfile)!r}).write_text(str(p.pid))
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", owner_code], check=True, timeout=60)
    child = int(pidfile.read_text())
    try:
        assert child in {m.pid for m in leftovers.orphans()}
        assert leftovers.main() == 1
    finally:
        os.killpg(child, signal.SIGKILL)
    wait_until(lambda: child not in {m.pid for m in leftovers.managed()}, timeout=10, what="kill")


def test_a_process_with_a_live_owner_is_not_a_leftover(tmp_path: Path) -> None:
    # bash -c 'CMD' ARG0: the marker stays in bash's command line ("; true" stops bash from
    # exec-ing sleep in its place; sleep itself would reject the extra argument).
    argv = ["bash", "-c", "sleep 300; true", f"{MARKER}={os.getpid()}"]
    proc = ManagedProcess("sleeper", argv, tmp_path / "log")
    proc.start()
    try:
        # Until the child has exec'd, its command line is still Python's.
        wait_until(
            lambda: proc.pid in {m.pid for m in leftovers.managed()}, timeout=10, what="exec"
        )
        mine = {m.pid: m for m in leftovers.managed()}
        assert mine[proc.pid].owner == os.getpid()
        assert proc.pid not in {m.pid for m in leftovers.orphans()}
    finally:
        proc.stop(grace=5)
