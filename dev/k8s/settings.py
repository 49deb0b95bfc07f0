"""Versions, addresses and paths of the development cluster: one place for each.

The node's address is the project's own bridge (``kdelay0``, 10.87.0.1/24), which is also the
pods' gateway: the kubelet refuses loopback for its status, and the machine's own interface is
never used. Services get 10.97.0.0/16; neither range is Podman's (10.88/16, 10.89+).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dev import ROOT

KUBERNETES_VERSION = "v1.31.4"
ETCD_VERSION = "v3.5.16"
COREDNS_VERSION = "v1.11.3"

NODE_NAME = "kdelay-node"
BRIDGE = "kdelay0"
NODE_IP = "10.87.0.1"
POD_CIDR = "10.87.0.0/24"
SERVICE_CIDR = "10.97.0.0/16"
API_SERVICE_IP = "10.97.0.1"
DNS_IP = NODE_IP
API_PORT = 6443
ETCD_CLIENT_PORT = 12379
ETCD_PEER_PORT = 12380
PAUSE_IMAGE = "kdelay.local/pause:1"

# The Debian packages the cluster needs: {package: a file it installs}.
PACKAGES = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
    "conntrack": "/usr/sbin/conntrack",
    "busybox-static": "/bin/busybox",
    "openssl": "/usr/bin/openssl",
    "iproute2": "/usr/sbin/ip",
}


def _root() -> Path:
    return ROOT


@dataclass(frozen=True)
class Layout:
    """Where everything lives: the binaries (cache, kept by ``make k8s-down``) and the state."""

    root: Path

    @property
    def deploy(self) -> Path:
        return self.root / "dev" / "k8s" / "manifests"

    @property
    def cache(self) -> Path:
        return self.root / ".cache" / "k8s"

    def bin(self, name: str) -> Path:
        version = {"etcd": ETCD_VERSION, "coredns": COREDNS_VERSION}.get(name, KUBERNETES_VERSION)
        return self.cache / version / "bin" / name

    @property
    def state(self) -> Path:
        return self.root / ".kdelay" / "k8s"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    @property
    def status_file(self) -> Path:
        return self.state / "status.json"

    @property
    def pid_file(self) -> Path:
        return self.state / "supervisor.pid"

    @property
    def volumes(self) -> Path:
        return self.state / "volumes"

    @property
    def helm(self) -> Path:
        return self.root / ".cache" / "tools" / "bin" / "helm"


def layout() -> Layout:
    """The layout of this checkout ."""
    return Layout(_root())
