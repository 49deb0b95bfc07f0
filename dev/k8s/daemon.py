"""The cluster's daemon: one detached process that starts, watches and restarts its components.

``make k8s-up`` starts it (``python -m dev.k8s supervise``) in its own session and returns
once the node is Ready; it outlives that command and stops only on SIGTERM (``make k8s-down``).
It starts the components in order (:mod:`dev.k8s.components`), each once the one before it
is healthy, and restarts one that exits after a back-off of 1, 2, 4 … 30 s, like a kubelet's
CrashLoopBackOff (the one restart policy, kdelay/supervision.py). A component that exits three
times before it ever became healthy fails the start: everything is stopped and the status file
names it with the end of its log.

Children are :class:`dev.stack.process.ManagedProcess` (``kdelay.managed=<supervisor pid>``,
killed with the supervisor). The status (``.kdelay/k8s/status.json``) is rewritten atomically
after every change; ``up`` and ``status`` read it. Single-threaded: the main loop does all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from dev.k8s.components import Component, components
from dev.k8s.settings import Layout, layout
from dev.stack.process import ManagedProcess
from kdelay.backoff import Backoff
from kdelay.supervision import RestartPolicy, Supervisor

_stop = False
_BACKOFF_MAX = 30.0
_START_ATTEMPTS = 3


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    global _stop  # noqa: PLW0603 - the signal handler's one flag
    _stop = True


@dataclass
class _Running:
    component: Component
    proc: ManagedProcess
    healthy: bool = False
    restarts: int = 0
    backoff_until: float | None = None
    started: float = field(default_factory=time.monotonic)


def _write_status(lay: Layout, phase: str, running: list[_Running], error: str | None) -> None:
    status = {
        "pid": os.getpid(),
        "phase": phase,
        "error": error,
        "updated": time.time(),
        "components": [
            {
                "name": r.component.name,
                "pid": r.proc.pid if r.proc.alive() else None,
                "healthy": r.healthy,
                "restarts": r.restarts,
                "log": str(r.proc.log_path),
            }
            for r in running
        ],
    }
    tmp = lay.status_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=1))
    tmp.replace(lay.status_file)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _stop_all(lay: Layout, running: list[_Running]) -> None:
    for r in reversed(running):
        if r.component.name == "containerd":
            _remove_pods(lay)
        r.proc.stop(grace=10.0)
        _write_status(lay, "stopping", running, None)


def _remove_pods(lay: Layout) -> None:
    """With the kubelet stopped and containerd still up: kill and delete every pod container,
    so no shim, rootfs mount or container record survives into the next start."""
    ctr = ["ctr", "--address", str(lay.socket), "-n", "k8s.io"]

    def run(*args: str) -> str:
        result = subprocess.run(
            [*ctr, *args], capture_output=True, text=True, check=False, timeout=60
        )
        return result.stdout

    tasks = [line.split()[0] for line in run("tasks", "ls").splitlines()[1:] if line.strip()]
    for task in tasks:
        run("tasks", "kill", "-s", "SIGKILL", task)
    for task in tasks:
        for _ in range(20):
            if "not found" in run("tasks", "delete", "-f", task) or task not in run("tasks", "ls"):
                break
            time.sleep(0.25)
    containers = run("containers", "ls", "-q").split()
    for container in containers:
        run("containers", "delete", container)
    # No CNI DEL ran for these sandboxes: drop libcni's cached results for them (bridge and
    # loopback entries, "<network>-<sandbox id>-<interface>").
    for cached in Path("/var/lib/cni/results").glob("*"):
        if any(f"-{c}-" in cached.name for c in containers):
            cached.unlink(missing_ok=True)


def _start(
    lay: Layout, component: Component, env: dict[str, str], running: list[_Running]
) -> str | None:
    """Start ``component`` and wait until it is healthy; the error that stops the start."""
    proc = ManagedProcess(
        component.name, component.argv, lay.logs / f"{component.name}.log", env=env
    )
    proc.start()
    r = _Running(component, proc)
    running.append(r)
    attempts = 1
    deadline = time.monotonic() + component.start_timeout
    while not _stop and not r.healthy:
        _write_status(lay, "starting", running, None)
        if component.healthy():
            r.healthy = True
        elif not proc.alive():
            if attempts >= _START_ATTEMPTS:
                return (
                    f"{component.name} exited with code {proc.returncode()} {attempts} times "
                    f"while starting; log {proc.log_path}:\n{_tail(proc.log_path)}"
                )
            attempts += 1
            r.restarts += 1
            time.sleep(1.0)
            proc.restart()
        elif time.monotonic() > deadline:
            return (
                f"{component.name} not healthy after {component.start_timeout:.0f} s; "
                f"log {proc.log_path}:\n{_tail(proc.log_path)}"
            )
        else:
            time.sleep(0.2)
    return None


def _watch(lay: Layout, running: list[_Running]) -> None:
    """Restart what exits, with a back-off, until SIGTERM."""
    _write_status(lay, "running", running, None)
    # Never gives up; a component that stayed up a minute starts its back-off over.
    restarts = Supervisor(RestartPolicy(Backoff(cap_s=_BACKOFF_MAX), max_failures=None))
    while not _stop:
        now = time.monotonic()
        for r in running:
            if r.proc.alive():
                restarts.running(r.component.name, now - r.started)
                continue
            if r.backoff_until is None:
                r.backoff_until = now + restarts.failed(r.component.name).delay_s
                r.healthy = False
            elif now >= r.backoff_until:
                r.restarts += 1
                r.proc.restart()
                r.started, r.backoff_until, r.healthy = now, None, True
            _write_status(lay, "running", running, None)
        time.sleep(0.5)


def main() -> int:
    """Run the cluster until SIGTERM; 1 when a component could not be started."""
    lay = layout()
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    lay.pid_file.write_text(f"{os.getpid()}\n")
    running: list[_Running] = []
    error: str | None = None
    env = _env()
    try:
        for component in components(lay):
            if _stop:
                break
            error = _start(lay, component, env, running)
            if error:
                break
        if error is None and not _stop:
            _watch(lay, running)
    finally:
        _stop_all(lay, running)
        _write_status(lay, "failed" if error else "stopped", running, error)
        lay.pid_file.unlink(missing_ok=True)
    return 1 if error else 0
