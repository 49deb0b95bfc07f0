"""The leftover check: a managed process is reported once its owner is gone, not before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dev.stack import leftovers
from dev.stack.process import MARKER, ManagedProcess, wait_until
from dev.stack.stack import LocalStack, StackOptions
from kdelay.errors import InfrastructureError


def test_a_process_outliving_its_owner_is_reported(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The owner starts a managed child, then dies without running its exit hooks (os._exit),
    # like a SIGKILLed test run; without the parent-death signal (an older kdelay, another
    # platform) the child is orphaned.
    owner_code = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from dev.stack.process import ManagedProcess, MARKER
        argv = ["bash", "-c", "sleep 300; true", f"{{MARKER}}={{os.getpid()}}"]
        p = ManagedProcess("sleeper", argv, Path({str(tmp_path / "log")!r}), die_with_owner=False)
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


def test_a_stack_refuses_to_start_beside_leftovers_on_its_data_dir(tmp_path: Path) -> None:
    data = (tmp_path / "data").resolve()
    pidfile = tmp_path / "child.pid"
    # A leftover of an earlier run on this data directory (the owner died without the
    # parent-death signal): its command line names a path under the data directory.
    owner_code = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from dev.stack.process import ManagedProcess, MARKER
        argv = ["bash", "-c", "sleep 300; true", f"{{MARKER}}={{os.getpid()}}",
                "--data-dir", {str(data / "replica-1")!r}]
        p = ManagedProcess("old", argv, Path({str(tmp_path / "log")!r}), die_with_owner=False)
        p.start()
        Path({str(pidfile)!r}).write_text(str(p.pid))
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", owner_code], check=True, timeout=60)
    child = int(pidfile.read_text())
    stack = LocalStack(StackOptions(data_dir=data, state_file=tmp_path / "up.json"))
    try:
        wait_until(
            lambda: child in {m.pid for m in leftovers.using(data, leftovers.orphans())},
            timeout=10,
            what="the leftover to exec",
        )
        with pytest.raises(InfrastructureError, match=rf"kill {child}\b"):
            stack.start()
    finally:
        stack.stop()
        os.killpg(child, signal.SIGKILL)
    assert leftovers.using(tmp_path / "elsewhere", leftovers.managed()) == []
