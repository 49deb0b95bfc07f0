"""The cluster's binaries, built once per version from the Go module proxy into ``.cache/k8s``.

Three throwaway modules in dev/k8s/manifests: ``kubernetes`` (k8s.io/kubernetes with each staging
module mapped to its published v0.x release; the version is stamped through ldflags, or the API
server says ``v0.0.0-master`` and Helm refuses the chart's ``kubeVersion``), ``etcd`` (etcd's own
``etcdmain``) and ``coredns`` (CoreDNS with the plugins cluster DNS needs). A group is rebuilt
only when its module files, the Go version or the flags change (a stamp next to the binaries).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dev.containers.progress import say
from dev.k8s.settings import COREDNS_VERSION, ETCD_VERSION, KUBERNETES_VERSION, Layout
from kdelay.errors import InfrastructureError

_MINOR = KUBERNETES_VERSION.split(".")[1]
_K8S_LDFLAGS = (
    f"-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"
    " -X k8s.io/component-base/version.gitMajor=1"
    f" -X k8s.io/component-base/version.gitMinor={_MINOR}"
)


@dataclass(frozen=True)
class Group:
    """Binaries built by one ``go build`` in one module of dev/k8s/manifests."""

    module: str
    version: str
    binaries: tuple[str, ...]
    packages: tuple[str, ...]
    ldflags: str


_K8S_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
)

GROUPS = (
    Group(
        "kubernetes",
        KUBERNETES_VERSION,
        _K8S_BINARIES,
        tuple(f"k8s.io/kubernetes/cmd/{b}" for b in _K8S_BINARIES),
        _K8S_LDFLAGS,
    ),
    Group("etcd", ETCD_VERSION, ("etcd",), (".",), "-s -w"),
    Group("coredns", COREDNS_VERSION, ("coredns",), (".",), "-s -w"),
)


def _go() -> str:
    for candidate in (os.environ.get("GO", ""), "/usr/local/go/bin/go", "/usr/bin/go"):
        if candidate and Path(candidate).exists():
            return candidate
    raise InfrastructureError("no Go toolchain: install Go 1.22+ (https://go.dev/dl) or set GO=")


def _key(layout: Layout, group: Group, go: str) -> str:
    module = layout.deploy / group.module
    digest = hashlib.sha256()
    for path in sorted(module.iterdir()):
        if path.suffix in {".mod", ".go"} or path.name == "go.sum":
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    digest.update(version.encode() + group.ldflags.encode() + " ".join(group.packages).encode())
    return digest.hexdigest()[:16]


def _stamp(layout: Layout, group: Group) -> Path:
    return layout.cache / group.version / f".{group.module}.stamp"


def up_to_date(layout: Layout, group: Group, go: str | None = None) -> bool:
    """True when every binary of ``group`` exists and was built from the current inputs."""
    go = go or _go()
    stamp = _stamp(layout, group)
    return (
        all(layout.bin(b).exists() for b in group.binaries)
        and stamp.exists()
        and stamp.read_text().strip() == _key(layout, group, go)
    )


def build_group(layout: Layout, group: Group) -> str:
    """Build ``group`` unless it is up to date; the outcome for the progress line."""
    go = _go()
    if up_to_date(layout, group, go):
        return "cached"
    out_dir = layout.bin(group.binaries[0]).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = layout.logs / f"build-{group.module}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false"}
    if group.packages == (".",):
        argv = [go, "build", "-v", "-trimpath", "-ldflags", group.ldflags]
        argv += ["-o", str(out_dir / group.binaries[0]), "."]
    else:
        argv = [go, "build", "-v", "-trimpath", "-ldflags", group.ldflags]
        argv += ["-o", f"{out_dir}/", *group.packages]
    began = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv, cwd=layout.deploy / group.module, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        last = began
        while proc.poll() is None:
            time.sleep(1)
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                packages = sum(1 for _ in log_path.open(errors="replace"))
                say(f"    still building {group.module}: {packages} packages, {last - began:.0f} s")
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise InfrastructureError(f"go build of {group.module} failed; log {log_path}:\n{tail}")
    _stamp(layout, group).write_text(_key(layout, group, go) + "\n")
    return f"built {', '.join(group.binaries)}"
