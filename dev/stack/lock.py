"""One ``kdelay up`` per data directory (and per state file): an exclusive ``flock``.

A second ``kdelay up`` on the same data directory used to start a second ZooKeeper and Kafka on
the first one's files and, failing on the RocksDB lock, delete the running stack's state file on
its way out. :class:`StackLock` is taken before anything else: ``<data dir>/up.lock`` and
``<state file>.lock`` (two stacks must not share a state file either), each holding the owner's
pid, data directory and state file. The kernel drops a ``flock`` when its holder dies, however it
dies, so a SIGKILLed ``kdelay up`` never leaves a stale lock; the files themselves stay (removing
a lock file races with the next run opening it).

Python opens files close-on-exec, so the children ``kdelay up`` starts never hold the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from kdelay.errors import InfrastructureError


class StackRunningError(InfrastructureError):
    """Another ``kdelay up`` holds the data directory or the state file."""


def _holder(fh: IO[str]) -> dict[str, object]:
    fh.seek(0)
    try:
        doc = json.loads(fh.read() or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


class StackLock:
    """Exclusive locks on a stack's data directory and state file; :meth:`release` (or process
    death) frees them."""

    def __init__(self, data_dir: Path, state_file: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.state_file = state_file.resolve()
        self.paths = [
            self.data_dir / "up.lock",
            self.state_file.with_name(self.state_file.name + ".lock"),
        ]
        self._held: list[IO[str]] = []

    @property
    def held(self) -> bool:
        return bool(self._held)

    def acquire(self) -> None:
        """Take every lock or none; :class:`StackRunningError` names the running stack."""
        me = {
            "pid": os.getpid(),
            "data_dir": str(self.data_dir),
            "state_file": str(self.state_file),
        }
        try:
            for path in self.paths:
                path.parent.mkdir(parents=True, exist_ok=True)
                fh = path.open("a+")
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    other = _holder(fh)
                    fh.close()
                    raise self._running(path, other) from None
                self._held.append(fh)
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(me) + "\n")
                fh.flush()
        except BaseException:
            self.release()
            raise

    def _running(self, path: Path, other: dict[str, object]) -> StackRunningError:
        pid = other.get("pid", "unknown")
        what = "data directory" if path.parent == self.data_dir else "state file"
        return StackRunningError(
            f"another kdelay up (pid {pid}) is running with {what} "
            f"{self.data_dir if what == 'data directory' else self.state_file} "
            f"(its data directory: {other.get('data_dir', 'unknown')}, state file: "
            f"{other.get('state_file', 'unknown')}); stop it first (kill -TERM {pid}), or give "
            "this one its own --data-dir and --state-file. Its files were left alone."
        )

    def release(self) -> None:
        held, self._held = self._held, []
        for fh in held:
            with contextlib.suppress(OSError):
                fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()
