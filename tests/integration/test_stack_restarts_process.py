"""A managed process of the development stack restarts with the same command and appends to its
log (a real child process, hence integration)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from dev.stack.process import ManagedProcess, wait_until
from kdelay.errors import InfrastructureError


def test_a_managed_process_restarts_with_the_same_command_and_appends_its_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "child.log"
    proc = ManagedProcess(
        "child",
        # sleep: a child that lives until the test kills it
        [sys.executable, "-c", "import time; print('hello', flush=True); time.sleep(300)"],
        log,
    )
    proc.start()
    first = proc.pid
    wait_until(lambda: "hello" in log.read_text(), timeout=30, what="the first greeting")
    with pytest.raises(InfrastructureError, match="still running"):
        proc.restart()
    proc.signal(signal.SIGKILL)
    wait_until(lambda: not proc.alive(), timeout=30, what="the child to die")
    assert proc.returncode() == -signal.SIGKILL
    proc.restart()
    try:
        assert proc.pid != first
        wait_until(
            lambda: log.read_text().count("hello") == 2, timeout=30, what="the second greeting"
        )
        assert "child exited with -9; restarting" in log.read_text()
    finally:
        proc.stop(grace=5)
