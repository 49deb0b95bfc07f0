"""The node's network and what a stopped node leaves in the kernel.

Set-up: the bridge ``kdelay0`` with the node's address (the pods' gateway too; the CNI bridge
plugin adopts it), IP forwarding and bridged traffic through iptables (Services between pods on
the bridge need both). Tear-down, after every process is gone: the mounts under the state
directory (pod volumes, overlay snapshots, the network namespaces containerd keeps there), the
pods' cgroups, the iptables chains the kubelet, kube-proxy and the CNI plugins made (``KUBE-*``,
``CNI-*``: only those, and only the rules that jump to them), and the bridge. Nothing of the
machine's own interfaces, routes or other chains is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

from dev.k8s.settings import BRIDGE, NODE_IP, POD_CIDR
from kdelay.errors import InfrastructureError

_SYSCTLS = {
    "/proc/sys/net/ipv4/ip_forward": "1",
    "/proc/sys/net/bridge/bridge-nf-call-iptables": "1",
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise InfrastructureError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def bridge_up() -> None:
    """Create ``kdelay0`` with the node address (idempotent) and the sysctls Services need."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    prefix = POD_CIDR.split("/")[1]
    if f"{NODE_IP}/" not in _ip("-o", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", f"{NODE_IP}/{prefix}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for path, value in _SYSCTLS.items():
        p = Path(path)
        if not p.exists():
            raise InfrastructureError(
                f"{path} is missing: the kernel needs br_netfilter (modprobe br_netfilter)"
            )
        if p.read_text().strip() != value:
            p.write_text(value)


def bridge_down() -> None:
    """Delete the bridge (its veths are gone with the pods' network namespaces)."""
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        _ip("link", "del", BRIDGE)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under ``path``, deepest first."""
    prefix = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_all(path: Path) -> list[str]:
    """Unmount everything under ``path`` (lazily when busy); what could not be."""
    failed = []
    for _ in range(3):
        points = mounts_under(path)
        if not points:
            return []
        for point in points:
            subprocess.run(["umount", point], capture_output=True, check=False)
    for point in mounts_under(path):
        result = subprocess.run(
            ["umount", "-l", point], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            failed.append(f"{point}: {result.stderr.strip()}")
    return failed


def _cgroup_dirs() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    found = []
    # cgroup v1: one tree per controller; v2: the unified tree itself.
    for controller in [base, *base.iterdir()] if base.exists() else []:
        found += [d for d in controller.glob("kubepods*") if d.is_dir()]
    return found


def cgroup_pids() -> list[int]:
    """Every process in the pods' cgroups (what runs in the pods)."""
    pids: set[int] = set()
    for top in _cgroup_dirs():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def remove_cgroups() -> None:
    """Remove the kubelet's ``kubepods`` cgroups, innermost first (empty by now)."""
    for top in _cgroup_dirs():
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()


_OURS = re.compile(r"^(KUBE|CNI)-")


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", *args], capture_output=True, text=True, check=False)


def clean_iptables() -> None:
    """Remove the ``KUBE-*`` and ``CNI-*`` chains and every rule that jumps to one."""
    for table in ("filter", "nat", "mangle"):
        rules = _iptables("-t", table, "-S").stdout.splitlines()
        chains = [r.split()[1] for r in rules if r.startswith("-N ") and _OURS.match(r.split()[1])]
        for rule in rules:
            parts = shlex.split(rule)
            if parts[:1] != ["-A"]:
                continue
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if _OURS.match(target) and not _OURS.match(parts[1]):
                _iptables("-t", table, "-D", *parts[1:])
        for chain in chains:
            _iptables("-t", table, "-F", chain)
        for chain in chains:
            _iptables("-t", table, "-X", chain)


def netns_files(containerd_state: Path) -> list[Path]:
    """The network namespaces containerd keeps under its state directory."""
    netns = containerd_state / "netns"
    return sorted(netns.iterdir()) if netns.is_dir() else []


def is_root() -> bool:
    return os.geteuid() == 0


# The kubelet sets these when they differ (protectKernelDefaults: false, which this node needs:
# with true it refuses to start). They are saved before its first start and put back by `down`.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def save_kernel_tunables(record: Path) -> None:
    """Record the kernel settings the kubelet changes, unless a record exists already."""
    if record.exists():
        return
    values = {k: Path("/proc/sys", k).read_text().strip() for k in KERNEL_TUNABLES}
    record.write_text(json.dumps(values, indent=1) + "\n")


def restore_kernel_tunables(record: Path) -> list[str]:
    """Put back what :func:`save_kernel_tunables` recorded; what was changed back."""
    if not record.exists():
        return []
    changed = []
    for key, value in json.loads(record.read_text()).items():
        path = Path("/proc/sys", key)
        if path.read_text().strip() != value:
            path.write_text(value)
            changed.append(f"{key.replace('/', '.')}={value}")
    record.unlink()
    return changed
