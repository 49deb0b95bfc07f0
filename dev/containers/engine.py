"""The container engine: Debian's podman configured by the project, or a Docker Engine that answers.

Development only (``make containers``, the testcontainers test backend, ``make demo-compose``);
no runtime component imports it.

podman is configured by files of the project's own, never by anything under /etc:
``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF`` point it at ``.dev/containers/``
(containers.conf, storage.conf, the run root, events, networks) and the image storage lives in
``.cache/containers/storage``. What this machine needs of the configuration: no default ulimits
(podman's defaults exceed the hard limits here: ``setrlimit RLIMIT_NOFILE: Operation not
permitted``), runc (crun refuses the hybrid cgroup layout), cgroupfs and file events (no
systemd), netavark with aardvark-dns (containers find each other by name on a network).

The Docker API (for the docker CLI and testcontainers) is ``podman system service`` on a unix
socket under ``.dev/containers/``:

- ``start_service`` / ``stop_service``: the one ``make containers`` leaves running for the user
  (pid file beside it) and ``make containers-down`` stops;
- ``api`` (a context manager): the socket a test session uses: the running one, or one it starts
  itself, on a socket of its own, carrying ``kdelay.managed=<owner pid>`` (so ``make
  check-leftovers`` sees it if it outlives its owner), dying with its owner
  (``PR_SET_PDEATHSIG``) and stopped when the block ends.

Containers the tests start carry the label ``kdelay.managed=<owner pid>``;
:func:`remove_orphans` removes those whose owner is gone and ``make containers-down`` removes
them all. Where a real Docker Engine answers (``DOCKER_HOST`` or /var/run/docker.sock, and it
is not podman), it is used instead and none of the above is needed.

Thread-safety: none needed; the functions are called from one thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dev import ROOT
from dev.stack.process import MARKER, ManagedProcess, wait_until
from kdelay.errors import InfrastructureError

#: The label on every container and network the tests create: ``kdelay.managed=<owner pid>``.
LABEL = MARKER
#: Debian packages of the engine (``make containers`` installs what is missing).
PACKAGES = (
    "podman",
    "runc",
    "catatonit",
    "netavark",
    "aardvark-dns",
    # netavark's firewall rules; apt installs it only with containernetworking-plugins, which
    # netavark stands in for: "netavark: No such file or directory (os error 2)" without it.
    "iptables",
    "podman-compose",
    "debootstrap",
)
#: The commands that tell whether each package is there.
_COMMANDS = {
    "podman": "podman",
    "runc": "runc",
    "catatonit": "/usr/libexec/podman/catatonit",
    "netavark": "/usr/lib/podman/netavark",
    "aardvark-dns": "/usr/lib/podman/aardvark-dns",
    "iptables": "iptables",
    "podman-compose": "podman-compose",
    "debootstrap": "debootstrap",
}
_SOCKET_MAX = 100  # sun_path holds 108 bytes


def state_dir() -> Path:
    """``.dev/containers``: configuration, sockets, pid file, logs, podman's run root."""
    return ROOT / ".kdelay" / "containers"


def cache_dir() -> Path:
    """``.cache/containers``: image storage, debootstrap's packages, staged build contexts."""
    return ROOT / ".cache" / "containers"


def _short(path: Path) -> Path:
    """``path`` if a unix socket may live there, else a short one in /tmp keyed by it."""
    if len(str(path)) <= _SOCKET_MAX:
        return path
    key = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path("/tmp") / f"kdelay-containers-{key}" / path.name  # noqa: S108 - a fallback


def service_socket() -> Path:
    """The socket of the service ``make containers`` starts."""
    return _short(state_dir() / "podman.sock")


def _session_socket() -> Path:
    return _short(state_dir() / f"podman-{os.getpid()}.sock")


def _pid_file() -> Path:
    return state_dir() / "service.pid"


def containers_conf() -> str:
    """The project's containers.conf (see the module docstring for why each line)."""
    state = state_dir()
    return (
        "# Written by dev/containers/engine.py (make containers); CONTAINERS_CONF names it.\n"
        "[containers]\n"
        "# podman's default ulimits exceed this machine's hard limits (setrlimit RLIMIT_NOFILE).\n"
        "default_ulimits = []\n"
        'log_driver = "k8s-file"\n'
        "[network]\n"
        'network_backend = "netavark"\n'
        f'network_config_dir = "{state / "networks"}"\n'
        "[engine]\n"
        "# crun: 'cgroups in hybrid mode not supported' here.\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{state / "events.log"}"\n'
        f'tmp_dir = "{state / "tmp"}"\n'
        f'static_dir = "{cache_dir() / "storage" / "libpod"}"\n'
        f'volume_path = "{cache_dir() / "storage" / "volumes"}"\n'
    )


def storage_conf() -> str:
    """The project's storage.conf: overlay storage under ``.cache/containers/storage``."""
    return (
        "# Written by dev/containers/engine.py; CONTAINERS_STORAGE_CONF names it.\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{cache_dir() / "storage"}"\n'
        f'runroot = "{state_dir() / "run"}"\n'
    )


def write_config() -> None:
    """Write containers.conf and storage.conf (only when they changed)."""
    state = state_dir()
    for sub in ("networks", "tmp", "run"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (cache_dir() / "storage").mkdir(parents=True, exist_ok=True)
    for name, text in (("containers.conf", containers_conf()), ("storage.conf", storage_conf())):
        path = state / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def podman_env() -> dict[str, str]:
    """The variables that point podman at the project's configuration."""
    return {
        "CONTAINERS_CONF": str(state_dir() / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(state_dir() / "storage.conf"),
    }


def missing_packages() -> list[str]:
    """The Debian packages of :data:`PACKAGES` that are not installed."""
    return [
        p
        for p in PACKAGES
        if not (Path(_COMMANDS[p]).exists() if "/" in _COMMANDS[p] else shutil.which(_COMMANDS[p]))
    ]


def install_packages(packages: Sequence[str]) -> None:
    """``apt-get install`` ``packages`` (root only), like the Makefile's faketime target."""
    if not packages:
        return
    if os.geteuid() != 0:
        raise InfrastructureError(
            f"missing {' '.join(packages)}: apt-get install --no-install-recommends "
            f"{' '.join(packages)} (needs root)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, check=False, timeout=1800
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise InfrastructureError(f"{' '.join(argv)} failed:\n{tail}")


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


@dataclass(frozen=True)
class Engine:
    """Which engine, how to run its CLI and where its Docker API is."""

    kind: str  # "podman" | "docker"
    #: The Docker API address (``unix://...``) for clients; the podman one once served.
    docker_host: str

    @property
    def cli(self) -> list[str]:
        return [self.kind]

    def env(self) -> dict[str, str]:
        """The environment the engine's CLI (and podman-compose) runs with."""
        env = dict(os.environ)
        if self.kind == "podman":
            env.update(podman_env())
        return env

    def client_env(self) -> dict[str, str]:
        """What a Docker API client (docker CLI, testcontainers) needs to reach the engine."""
        env = {"DOCKER_HOST": self.docker_host}
        if self.kind == "podman":
            # Ryuk's image cannot be pulled here; the tests remove their containers themselves
            # (and remove_orphans those of a run that died). Without docker_host, testcontainers
            # fails in network_name with KeyError: 'HostConfig' on podman.
            env["TESTCONTAINERS_RYUK_DISABLED"] = "true"
            env["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
            env.update(podman_env())
        return env

    def run(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """The engine's CLI with ``args``; raises with its stderr when ``check`` and it fails."""
        result = subprocess.run(
            [*self.cli, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise InfrastructureError(
                f"{' '.join([*self.cli, *args])} failed ({result.returncode}): "
                f"{result.stderr.strip()[-2000:]}"
            )
        return result

    def image_label(self, image: str, label: str) -> str | None:
        """The value of ``label`` on ``image``; None when the image is not there."""
        result = self.run(
            "image",
            "inspect",
            "--format",
            f'{{{{index .Config.Labels "{label}"}}}}',
            image,
            check=False,
        )
        if result.returncode != 0:
            return None
        value = result.stdout.strip()
        return "" if value == "<no value>" else value

    def image_exists(self, image: str) -> bool:
        found = self.run("image", "inspect", "--format", "{{.Id}}", image, check=False)
        return found.returncode == 0

    def kill(self, container: str) -> None:
        """SIGKILL a container's processes (``podman kill``): a crash, for failure tests."""
        self.run("kill", container)


def _docker_engine() -> str | None:
    """The address of a real Docker Engine that answers, or None (podman's API is not one)."""
    docker = shutil.which("docker")
    host = os.environ.get("DOCKER_HOST", "")
    if docker is None or (not host and not Path("/var/run/docker.sock").exists()):
        return None
    try:
        result = subprocess.run(
            [docker, "version", "--format", "{{json .Server}}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0 or "podman" in result.stdout.lower():
        return None
    return host or "unix:///var/run/docker.sock"


def detect() -> Engine:
    """The engine to use: ``KDELAY_CONTAINER_ENGINE`` (podman|docker) when set; otherwise a real
    Docker Engine when one answers; otherwise podman with the project's configuration."""
    forced = os.environ.get("KDELAY_CONTAINER_ENGINE", "")
    if forced not in ("", "podman", "docker"):
        raise InfrastructureError(f"KDELAY_CONTAINER_ENGINE={forced!r}: use podman or docker")
    if forced != "podman":
        docker = _docker_engine()
        if docker is not None:
            return Engine("docker", docker)
        if forced == "docker":
            raise InfrastructureError("KDELAY_CONTAINER_ENGINE=docker but no Docker Engine answers")
    return Engine("podman", f"unix://{service_socket()}")


def check_podman() -> None:
    """Fail naming what is missing when podman cannot run here."""
    missing = missing_packages()
    if missing:
        raise InfrastructureError(
            f"the container engine is not installed ({', '.join(missing)} missing): "
            f"run `make containers` (apt-get install, needs root)"
        )
    if not (state_dir() / "containers.conf").exists():
        raise InfrastructureError("podman is not configured for kdelay: run `make containers`")


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _labelled(engine: Engine, kind: str) -> list[tuple[str, int | None]]:
    """(id, owner pid) of every ``kind`` (container|network) labelled :data:`LABEL`."""
    ids = engine.run(
        *([kind, "ls"] if kind == "network" else ["ps", "-a"]),
        "-q",
        "--filter",
        f"label={LABEL}",
        check=False,
    ).stdout.split()
    if not ids:
        return []
    template = "{{json .Labels}}" if kind == "network" else "{{json .Config.Labels}}"
    out = engine.run(kind, "inspect", "--format", template, *ids, check=False).stdout
    found: list[tuple[str, int | None]] = []
    for ident, line in zip(ids, out.splitlines(), strict=False):
        owner = (json.loads(line) or {}).get(LABEL, "")
        found.append((ident, int(owner) if str(owner).isdigit() else None))
    return found


def remove_orphans(engine: Engine, *, everything: bool = False) -> list[str]:
    """Remove the labelled containers (then networks) whose owner is gone (all of them with
    ``everything``); returns their ids."""
    removed: list[str] = []
    for kind in ("container", "network"):
        doomed = [
            i
            for i, owner in _labelled(engine, kind)
            if everything or owner is None or not _alive(owner)
        ]
        if doomed:
            # -v: their anonymous volumes too (an image's VOLUME, e.g. ZooKeeper's /data).
            engine.run(*(["rm", "-f", "-v"] if kind == "container" else ["network", "rm"]), *doomed)
            removed += doomed
    return removed


def remove_stale_sockets() -> list[Path]:
    """Remove the sockets of session services whose owner is gone (it was SIGKILLed: the
    service died with it, its socket file stayed)."""
    stale = []
    for sock in sorted(service_socket().parent.glob("podman-*.sock")):
        pid = sock.stem.removeprefix("podman-")
        if pid.isdigit() and not _alive(int(pid)):
            sock.unlink(missing_ok=True)
            stale.append(sock)
    return stale
