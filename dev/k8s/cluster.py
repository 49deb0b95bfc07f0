"""``up``, ``down`` and ``status`` of the development cluster (``make k8s-up`` / ``k8s-down``).

``up`` is idempotent: binaries are built once per version, a running cluster is left running
(its storage and images are brought up to date). ``down`` stops the supervisor (which stops the
components in reverse order and deletes the pods' containers first), then removes whatever a
crash could have left: pod processes, containerd shims, mounts under ``.kdelay/k8s``, the
network namespaces, the pods' cgroups, the ``KUBE-*``/``CNI-*`` iptables chains and the bridge,
and checks that none is left. It keeps the binaries, the certificates and containerd's image
store (so the next ``up`` is warm); the cluster's data (etcd, volumes) goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dev.containers.podman_setup import install_packages
from dev.containers.progress import Steps, say
from dev.k8s import build, images, kube, node, pki
from dev.k8s.components import write_configs
from dev.k8s.settings import PACKAGES, Layout
from kdelay.errors import InfrastructureError

# Removed by ``down``: the cluster's data. Kept: pki, containerd/root (images), logs.
_EPHEMERAL = (
    "etcd",
    "kubelet",
    "cni/ipam",
    "pod-logs",
    "containerd/state",
    "containerd/opt",
    "apiserver",
    "controller-manager",
    "scheduler",
    "volumes",
    "status.json",
)


def _tunables(layout: Layout) -> Path:
    """The kernel settings as they were before the kubelet first ran (kept until ``down``)."""
    return layout.state / "kernel-tunables.json"


def _missing_packages() -> list[str]:
    return [pkg for pkg, path in PACKAGES.items() if not Path(path).exists()]


def read_status(layout: Layout) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads(layout.status_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return status


def supervisor_pid(layout: Layout) -> int | None:
    """The running supervisor's pid, or None."""
    try:
        pid = int(layout.pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid if b"dev.k8s" in cmdline and b"supervise" in cmdline else None


def _start_supervisor(layout: Layout) -> int:
    for sub in _EPHEMERAL:
        path = layout.state / sub
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if layout.logs.exists():
        for old in layout.logs.glob("*.log"):
            if not old.name.startswith("build-"):
                old.unlink()
    layout.logs.mkdir(parents=True, exist_ok=True)
    with (layout.logs / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dev.k8s", "supervise"],
            cwd=layout.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def _follow_start(layout: Layout, pid: int, timeout: float = 600) -> None:
    """Print each component as it becomes healthy; fail with the supervisor's error."""
    shown: set[str] = set()
    began = time.monotonic()
    while True:
        status = read_status(layout)
        if status and status.get("pid") == pid:
            for comp in status["components"]:
                if comp["healthy"] and comp["name"] not in shown:
                    shown.add(comp["name"])
                    say(f"    {comp['name']} healthy at {time.monotonic() - began:.1f} s")
            if status["phase"] == "running":
                return
            if status["phase"] in ("failed", "stopped"):
                raise InfrastructureError(f"the cluster did not start: {status['error']}")
        if not Path(f"/proc/{pid}").exists():
            tail = (layout.logs / "supervisor.log").read_text(errors="replace")[-3000:]
            raise InfrastructureError(f"the cluster supervisor exited:\n{tail}")
        if time.monotonic() - began > timeout:
            raise InfrastructureError(f"the cluster was not up after {timeout:.0f} s")
        time.sleep(0.3)


def up(layout: Layout) -> None:
    """Build, configure and start the cluster, or bring a running one up to date."""
    if not node.is_root():
        raise InfrastructureError("make k8s-up needs root (containerd, the kubelet, iptables)")
    steps = Steps("k8s-up")
    try:
        with steps.step("Debian packages (containerd, runc, CNI plugins, iptables)") as s:
            missing = _missing_packages()
            install_packages(missing)
            s.outcome = f"installed {' '.join(missing)}" if missing else "present"
        with steps.step("helm (dev/tools/install.sh)") as s:
            if layout.helm.exists():
                s.outcome = "present"
            else:
                subprocess.run(["bash", str(layout.root / "dev/tools/install.sh")], check=True)
                s.outcome = "installed"
        for group in build.GROUPS:
            with steps.step(f"binaries: {group.module} {group.version}") as s:
                s.outcome = build.build_group(layout, group)
        pid = supervisor_pid(layout)
        if pid is None and leftovers(layout):
            with steps.step("clearing what a cluster that did not stop cleanly left") as s:
                s.outcome = _clear_kernel_state(layout)
                _clear_network(layout)
        if pid is None:
            with steps.step("certificates and configuration") as s:
                pki.ensure(layout.pki)
                write_configs(layout)
            with steps.step("node network (bridge kdelay0, 10.87.0.1/24)") as s:
                node.bridge_up()
                node.save_kernel_tunables(_tunables(layout))
            with steps.step("etcd, control plane, containerd, kubelet, kube-proxy, CoreDNS") as s:
                pid = _start_supervisor(layout)
                _follow_start(layout, pid)
                s.outcome = f"supervisor pid {pid}"
        else:
            say(f"==> the cluster is running (supervisor pid {pid})")
        with steps.step("node Ready") as s:
            kube.wait(lambda: kube.node_ready(layout), "the node to be Ready", 180)
        with steps.step("storage (default class, hostPath volumes)") as s:
            s.outcome = kube.ensure_storage(layout)
        with steps.step("images into containerd") as s:
            s.outcome = "; ".join(images.load(layout))
    finally:
        steps.save(layout.state / "timings.jsonl")
    say(steps.summary())
    say(f"kubeconfig: {layout.kubeconfig}")
    say(f"  export KUBECONFIG={layout.kubeconfig} PATH={layout.bin('kubectl').parent}:$PATH")


def _ours(layout: Layout, argv: list[bytes]) -> bool:
    """The cluster's binaries, its containerd, that containerd's shims, its supervisor; never
    a process that merely names a path of ours (a ``tail -f`` of a log)."""
    if not argv:
        return False
    socket, cache = str(layout.socket).encode(), str(layout.cache).encode()
    exe = argv[0]
    if exe.startswith(cache + b"/"):
        return True
    if exe.endswith((b"containerd", b"containerd-shim-runc-v2")) and (
        socket in argv or any(a.startswith(str(layout.state).encode()) for a in argv)
        or any(a.endswith(b"/containerd/config.toml") and str(layout.state).encode() in a
               for a in argv)
    ):  # fmt: skip
        return True
    return b"dev.k8s" in argv and b"supervise" in argv


def _our_processes(layout: Layout) -> list[tuple[int, str]]:
    """Processes of the cluster still running (see :func:`_ours`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if _ours(layout, argv):
            found.append((int(entry.name), b" ".join(argv).decode(errors="replace").strip()))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def leftovers(layout: Layout) -> list[str]:
    """What of the cluster is still there: processes, mounts, network namespaces, the bridge."""
    left = [f"process {pid}: {cmd[:160]}" for pid, cmd in _our_processes(layout)]
    left += [f"pod process {pid}" for pid in node.cgroup_pids()]
    left += [f"mount {m}" for m in node.mounts_under(layout.state)]
    left += [f"netns {n}" for n in node.netns_files(layout.state / "containerd" / "state")]
    bridge = subprocess.run(["ip", "link", "show", "kdelay0"], capture_output=True, check=False)
    if bridge.returncode == 0:
        left.append("bridge kdelay0")
    return left


def _stop_supervisor(layout: Layout) -> str:
    pid = supervisor_pid(layout)
    if pid is None:
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
        return f"supervisor {pid} killed after 120 s"
    return f"supervisor {pid} stopped"


def _clear_kernel_state(layout: Layout) -> str:
    """Kill what runs in the pods and the shims, unmount, drop the netns and the cgroups."""
    for _ in range(20):
        pids = node.cgroup_pids() + [p for p, _ in _our_processes(layout)]
        if not pids:
            break
        _kill(pids)
        time.sleep(0.25)
    failed = node.unmount_all(layout.state)
    for netns in node.netns_files(layout.state / "containerd" / "state"):
        netns.unlink(missing_ok=True)
    node.remove_cgroups()
    return "clean" if not failed else f"could not unmount {failed}"


def _clear_network(layout: Layout) -> None:
    node.clean_iptables()
    node.bridge_down()
    for link in Path("/var/log/containers").glob("*.log"):
        with contextlib.suppress(OSError):
            if str(layout.state) in str(link.readlink()):
                link.unlink()
    # libcni's result cache: the bridge's entries are named after our network ("kdelay-<id>-
    # eth0"), the loopback plugin's after its own ("cni-loopback-<id>-lo"), same sandbox ids.
    results = Path("/var/lib/cni/results")
    sandboxes = {f.name.split("-")[1] for f in results.glob("kdelay-*-*")}
    for cached in results.glob("*"):
        if cached.name.startswith("kdelay-") or any(f"-{s}-" in cached.name for s in sandboxes):
            cached.unlink(missing_ok=True)


def down(layout: Layout) -> None:
    """Stop the cluster and remove what it left in the kernel; fail if anything remains."""
    if not node.is_root():
        raise InfrastructureError("make k8s-down needs root")
    steps = Steps("k8s-down")
    with steps.step("stopping the supervisor and the components") as s:
        s.outcome = _stop_supervisor(layout)
    with steps.step("pod processes, shims, mounts, network namespaces") as s:
        s.outcome = _clear_kernel_state(layout)
    with steps.step("iptables chains KUBE-*, CNI-*; bridge kdelay0; kernel settings") as s:
        _clear_network(layout)
        restored = node.restore_kernel_tunables(_tunables(layout))
        s.outcome = f"restored {' '.join(restored)}" if restored else "done"
    with steps.step("cluster data"):
        for sub in _EPHEMERAL:
            path = layout.state / sub
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    left = leftovers(layout)
    steps.save(layout.state / "timings.jsonl")
    say(steps.summary())
    if left:
        raise InfrastructureError("k8s-down left:\n  " + "\n  ".join(left))
    say("k8s-down: no process, mount, network namespace or bridge of the cluster is left")


def status(layout: Layout) -> int:
    """Print the components and the node; 0 when the cluster runs."""
    pid = supervisor_pid(layout)
    st = read_status(layout)
    if pid is None or st is None:
        say("the cluster is not running (make k8s-up)")
        return 1
    say(f"supervisor pid {pid}: {st['phase']}")
    for comp in st["components"]:
        state = "healthy" if comp["healthy"] else "NOT healthy"
        say(f"  {comp['name']:<24} pid {comp['pid']}  {state}  restarts {comp['restarts']}")
    result = kube.kubectl(layout, "get", "nodes", "-o", "wide", check=False)
    say(result.stdout or result.stderr)
    return 0 if st["phase"] == "running" else 1
