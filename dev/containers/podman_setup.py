"""Debian's podman on this machine, configured by the project's own files (``make containers``).

podman is configured by files of the project's own, never by anything under /etc:
``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF`` (dev/containers/engine.py ``podman_env``)
point it at ``.kdelay/containers/`` (containers.conf, storage.conf, the run root, events,
networks) and the image storage lives in ``.cache/containers/storage``. What this machine needs
of the configuration: no default ulimits (podman's defaults exceed the hard limits here:
``setrlimit RLIMIT_NOFILE: Operation not permitted``), runc (crun refuses the hybrid cgroup
layout), cgroupfs and file events (no systemd), netavark with aardvark-dns (containers find
each other by name on a network).

Thread-safety: none needed; the functions are called from one thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dev.containers.engine import cache_dir, state_dir
from kdelay.errors import InfrastructureError

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


def containers_conf() -> str:
    """The project's containers.conf (see the module docstring for why each line)."""
    state = state_dir()
    return (
        "# Written by dev/containers/podman_setup.py (make containers); CONTAINERS_CONF names it.\n"
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
        "# Written by dev/containers/podman_setup.py; CONTAINERS_STORAGE_CONF names it.\n"
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
