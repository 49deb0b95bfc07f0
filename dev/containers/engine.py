"""The container engine: Debian's podman configured by the project, or a Docker Engine that answers.

Development only (``make containers``, the testcontainers test backend, ``make demo-compose``);
no runtime component imports it.

:func:`detect` chooses the engine; :class:`Engine` runs its CLI and names its Docker API. Where
a real Docker Engine answers (``DOCKER_HOST`` or /var/run/docker.sock, and it is not podman), it
is used and nothing else is needed. Otherwise podman, configured by files of the project's own
(dev/containers/podman_setup.py: its Debian packages, containers.conf and storage.conf under
``.kdelay/containers/``, :func:`podman_env` pointing it at them), with its Docker API served on a
unix socket (dev/containers/docker_api.py).

Containers and networks the tests start carry the label ``kdelay.managed=<owner pid>``
(:data:`LABEL`); :func:`remove_orphans` removes those whose owner is gone and ``make
containers-down`` removes them all.

Thread-safety: none needed; the functions are called from one thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dev import ROOT
from dev.stack.process import MARKER
from kdelay.errors import InfrastructureError

#: The label on every container and network the tests create: ``kdelay.managed=<owner pid>``.
LABEL = MARKER
_SOCKET_MAX = 100  # sun_path holds 108 bytes


def state_dir() -> Path:
    """``.kdelay/containers``: configuration, sockets, pid file, logs, podman's run root."""
    return ROOT / ".kdelay" / "containers"


def cache_dir() -> Path:
    """``.cache/containers``: image storage, debootstrap's packages, staged build contexts."""
    return ROOT / ".cache" / "containers"


def short_socket(path: Path) -> Path:
    """``path`` if a unix socket may live there, else a short one in /tmp keyed by it."""
    if len(str(path)) <= _SOCKET_MAX:
        return path
    key = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path("/tmp") / f"kdelay-containers-{key}" / path.name  # noqa: S108 - a fallback


def service_socket() -> Path:
    """The socket of the service ``make containers`` starts."""
    return short_socket(state_dir() / "podman.sock")


def podman_env() -> dict[str, str]:
    """The variables that point podman at the project's configuration."""
    return {
        "CONTAINERS_CONF": str(state_dir() / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(state_dir() / "storage.conf"),
    }


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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (owned by anyone)."""
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
            if everything or owner is None or not pid_alive(owner)
        ]
        if doomed:
            # -v: their anonymous volumes too (an image's VOLUME, e.g. ZooKeeper's /data).
            engine.run(*(["rm", "-f", "-v"] if kind == "container" else ["network", "rm"]), *doomed)
            removed += doomed
    return removed
