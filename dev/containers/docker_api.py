"""The Docker API of podman (for the docker CLI and testcontainers): ``podman system service``
on a unix socket under ``.kdelay/containers/``.

- :func:`start_service` / :func:`stop_service`: the one ``make containers`` leaves running for
  the user (pid file beside it) and ``make containers-down`` stops;
- :func:`api` (a context manager): the socket a test session uses: the running one, or one it
  starts itself, on a socket of its own, carrying ``kdelay.managed=<owner pid>`` (so ``make
  check-leftovers`` sees it if it outlives its owner), dying with its owner
  (``PR_SET_PDEATHSIG``) and stopped when the block ends;
- :func:`remove_stale_sockets`: the sockets of session services whose owner is gone.

Thread-safety: none needed; the functions are called from one thread.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from dev.containers.engine import Engine, pid_alive, service_socket, short_socket, state_dir
from dev.containers.podman_setup import check_podman
from dev.stack.process import MARKER, ManagedProcess, wait_until
from kdelay.errors import InfrastructureError


def _session_socket() -> Path:
    return short_socket(state_dir() / f"podman-{os.getpid()}.sock")


def _pid_file() -> Path:
    return state_dir() / "service.pid"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


def api_answers(path: Path, timeout: float = 5.0) -> bool:
    """Whether a Docker API answers ``GET /_ping`` on the unix socket ``path``."""
    if not path.exists():
        return False
    conn = _UnixConnection(path, timeout)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _service_argv(sock: Path, argv0: str) -> list[str]:
    # exec -a names the process: a session's service carries the leftovers marker in its
    # command line although podman takes no argument for it.
    return [
        "bash",
        "-c",
        'exec -a "$0" podman system service --time=0 "$1"',
        argv0,
        f"unix://{sock}",
    ]


def start_service() -> str:
    """Start the API service ``make containers`` leaves running (pid file, log beside it);
    returns what happened. It is the user's until ``make containers-down`` stops it."""
    sock = service_socket()
    if api_answers(sock):
        return f"already serving on {sock}"
    sock.parent.mkdir(parents=True, exist_ok=True)
    sock.unlink(missing_ok=True)
    log = state_dir() / "service.log"
    engine = Engine("podman", f"unix://{sock}")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            _service_argv(sock, "podman"),
            env=engine.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives `make containers`, by design
        )
    _pid_file().write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while not api_answers(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise InfrastructureError(f"podman system service did not answer on {sock}:\n{tail}")
        time.sleep(0.1)
    proc.returncode = 0  # it is not ours to wait for: no ResourceWarning at exit
    return f"serving on {sock} (pid {proc.pid})"


def stop_service() -> str:
    """Stop the service :func:`start_service` started; returns what happened."""
    sock, pid_file = service_socket(), _pid_file()
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    if pid is not None and "system service" in _cmdline(pid) and str(sock) in _cmdline(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _cmdline(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        said = f"stopped the service (pid {pid})"
    else:
        said = "no service was running"
    pid_file.unlink(missing_ok=True)
    sock.unlink(missing_ok=True)
    return said


@contextlib.contextmanager
def api(engine: Engine) -> Iterator[Engine]:
    """The engine with a Docker API that answers for the block: Docker's, the service
    ``make containers`` left running, or one started here for the block and stopped after it."""
    if engine.kind == "docker" or api_answers(service_socket()):
        yield engine
        return
    check_podman()
    remove_stale_sockets()
    sock = _session_socket()
    sock.parent.mkdir(parents=True, exist_ok=True)
    sock.unlink(missing_ok=True)
    owned = Engine("podman", f"unix://{sock}")
    proc = ManagedProcess(
        "podman-service",
        _service_argv(sock, f"podman {MARKER}={os.getpid()}"),
        state_dir() / "service-sessions.log",
        env=owned.env(),
    )
    proc.start()
    try:
        wait_until(
            lambda: api_answers(sock),
            timeout=30,
            what=f"podman system service on {sock}",
            proc=proc,
        )
        yield owned
    finally:
        proc.stop(grace=10)
        sock.unlink(missing_ok=True)


def remove_stale_sockets() -> list[Path]:
    """Remove the sockets of session services whose owner is gone (it was SIGKILLed: the
    service died with it, its socket file stayed)."""
    stale = []
    for sock in sorted(service_socket().parent.glob("podman-*.sock")):
        pid = sock.stem.removeprefix("podman-")
        if pid.isdigit() and not pid_alive(int(pid)):
            sock.unlink(missing_ok=True)
            stale.append(sock)
    return stale
