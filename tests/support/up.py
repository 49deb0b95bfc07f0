"""`kdelay up` as a subprocess, the way a user runs it: start, wait for `kdelay ready`, SIGTERM."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdelay.local.process import ManagedProcess, python_argv, wait_until


@dataclass
class UpProcess:
    """A running `kdelay up`: its process, work dir and state file (CONTRACT.md)."""

    process: ManagedProcess
    workdir: Path
    state_file: Path
    state: dict[str, Any] = field(default_factory=dict)
    #: Set when the context exits: the exit status after SIGTERM.
    exit_code: int | None = None

    @property
    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


@contextmanager
def kdelay_up(workdir: Path, *args: str, timeout: float = 300) -> Iterator[UpProcess]:
    """Run ``kdelay up ARGS`` with its data and state under ``workdir`` until the block ends;
    then SIGTERM it and record its exit status in ``exit_code``."""
    state_file = workdir / "up.json"
    proc = ManagedProcess(
        "kdelay-up",
        python_argv(
            "up", "--data-dir", str(workdir / "data"), "--state-file", str(state_file), *args
        ),
        workdir / "up.log",
    )
    up = UpProcess(proc, workdir, state_file)
    proc.start()
    try:
        wait_until(
            lambda: state_file.exists() and "kdelay ready" in up.log,
            timeout=timeout,
            what="`kdelay up` to print 'kdelay ready'",
            proc=proc,
            interval=0.2,
        )
        up.state = json.loads(state_file.read_text())
        yield up
    finally:
        proc.signal(signal.SIGTERM)
        wait_until(lambda: not proc.alive(), timeout=120, what="`kdelay up` to exit on SIGTERM")
        up.exit_code = proc.returncode()
        proc.stop()
