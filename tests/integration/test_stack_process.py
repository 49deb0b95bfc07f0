"""Supervised processes (real child processes, hence integration): stop kills the whole group;
an interrupted owner leaves nothing; the local JVMs' flags, checked by a real JVM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dev.stack.process import (
    JVM_OPTS_ENV,
    QUICK_JIT,
    ManagedProcess,
    java_argv,
    wait_until,
)
from kdelay.children import die_with_parent


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
        from dev.stack.process import ManagedProcess
        p = ManagedProcess("sleeper", ["sleep", "300"], Path({str(tmp_path / "log")!r}))
        p.start()
        Path({str(pidfile)!r}).write_text(str(p.pid))
        # sleep: the owner lives until the test kills it
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


def _owner_code(tmp_path: Path, pidfile: Path) -> str:
    """An owner that starts a managed sleeper, writes its pid and waits to be killed."""
    return textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from dev.stack.process import ManagedProcess
        p = ManagedProcess("sleeper", ["sleep", "300"], Path({str(tmp_path / "log")!r}))
        p.start()
        Path({str(pidfile)!r}).write_text(str(p.pid))
        # sleep: the owner lives until the test kills it
        time.sleep(300)
        """
    )


def test_sigkill_of_the_owner_kills_its_children(tmp_path: Path) -> None:
    # No hook runs on SIGKILL: the parent-death signal set at fork does the work.
    pidfile = tmp_path / "child.pid"
    owner = subprocess.Popen([sys.executable, "-c", _owner_code(tmp_path, pidfile)])
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text() != "", timeout=30, what="pid")
        child = int(pidfile.read_text())
        assert _alive(child)
        owner.kill()
        owner.wait(timeout=30)
        wait_until(lambda: not _alive(child), timeout=10, what="the child to die with its owner")
    finally:
        owner.kill()
        owner.wait()


def test_no_parent_death_signal_from_a_worker_thread() -> None:
    # PR_SET_PDEATHSIG fires when the forking *thread* exits; a worker thread may end while the
    # owner runs on, so its children are left to the exit hooks (and the leftover check).
    assert die_with_parent() is not None
    seen: list[object] = []
    worker = threading.Thread(target=lambda: seen.append(die_with_parent()))
    worker.start()
    worker.join()
    assert seen == [None]


def _tiered_stop_at_level(argv: list[str]) -> int:
    """The TieredStopAtLevel a JVM started with ``argv``'s flags runs with (a real JVM)."""
    flags = argv[: argv.index("-cp")]
    out = subprocess.run(
        [*flags, "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    line = next(line for line in out.splitlines() if " TieredStopAtLevel " in line)
    return int(line.split("=")[1].split()[0])


def test_local_jvms_run_the_quick_jit_unless_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JVM_OPTS_ENV, raising=False)
    quick = java_argv("lib/*", "Main", 256, "conf")
    assert quick[-4:] == ["-cp", "lib/*", "Main", "conf"]
    assert QUICK_JIT in quick
    assert _tiered_stop_at_level(quick) == 1
    full = java_argv("lib/*", "Main", 256, "conf", quick_jit=False)
    assert QUICK_JIT not in full
    assert _tiered_stop_at_level(full) == 4


def test_kdelay_jvm_opts_come_after_kdelays_own_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JVM_OPTS_ENV, "-XX:TieredStopAtLevel=4 '-Dkdelay.note=two words'")
    argv = java_argv("lib/*", "Main", 256)
    assert argv.index("-XX:TieredStopAtLevel=4") > argv.index(QUICK_JIT)
    assert "-Dkdelay.note=two words" in argv
    assert _tiered_stop_at_level(argv) == 4  # the later flag wins
