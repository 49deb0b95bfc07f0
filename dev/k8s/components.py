"""The cluster's processes: their command lines, configuration files and health checks.

In start order; each is started only once the one before it answers its health check, and
stopped in the reverse order. Ports: the API server on the node address (pods reach it through
the ``kubernetes`` Service), everything else on loopback except the kubelet's API (the API
server's ``kubectl logs``/``exec`` go there) and CoreDNS (the pods' resolver): the node address.
"""

from __future__ import annotations

import http.client
import ssl
import string
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dev.k8s import pki
from dev.k8s.settings import (
    API_PORT,
    BRIDGE,
    DNS_IP,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    SERVICE_CIDR,
    Layout,
)


@dataclass(frozen=True)
class Component:
    """One supervised process: ``healthy`` answers whether it serves yet."""

    name: str
    argv: list[str]
    healthy: Callable[[], bool]
    start_timeout: float = 120.0


def _get(scheme: str, port: int, path: str, host: str = "127.0.0.1", **tls: Path) -> int:
    try:
        conn: http.client.HTTPConnection
        if scheme == "https":
            ctx = ssl.create_default_context(cafile=str(tls["ca"])) if "ca" in tls else None
            if ctx is None:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if "cert" in tls:
                ctx.load_cert_chain(str(tls["cert"]), str(tls["key"]))
            conn = http.client.HTTPSConnection(host, port, timeout=3, context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=3)
        conn.request("GET", path)
        status = conn.getresponse().status
        conn.close()
    except (OSError, http.client.HTTPException):
        return 0
    return status


def render(template: Path, **values: str) -> str:
    """A dev/k8s/manifests template with its ``${NAME}`` placeholders filled."""
    return string.Template(template.read_text()).substitute(values)


def write_configs(layout: Layout) -> None:
    """Render dev/k8s/manifests's templates and the kubeconfigs into the state directory."""
    st = layout.state
    values = {
        "STATE": str(st),
        "SOCKET": str(layout.socket),
        "PAUSE_IMAGE": PAUSE_IMAGE,
        "BRIDGE": BRIDGE,
        "POD_CIDR": POD_CIDR,
        "NODE_IP": NODE_IP,
        "NODE_NAME": NODE_NAME,
        "DNS_IP": DNS_IP,
        "PKI": str(layout.pki),
        "KUBECONFIG": str(layout.kubeconfig),
    }
    files = {
        st / "containerd" / "config.toml": "containerd.toml",
        st / "cni" / "net.d" / "10-kdelay.conflist": "cni.conflist",
        st / "kubelet.yaml": "kubelet.yaml",
        st / "kube-proxy.yaml": "kube-proxy.yaml",
        st / "Corefile": "Corefile",
    }
    for target, template in files.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(layout.deploy / template, **values))
    server = f"https://{NODE_IP}:{API_PORT}"
    layout.kubeconfig.write_text(pki.kubeconfig(layout.pki, "admin", server))
    (st / "kubelet.kubeconfig").write_text(pki.kubeconfig(layout.pki, "kubelet", server))
    # The pods' resolv.conf for dnsPolicy Default: the cluster DNS, never the machine's.
    (st / "resolv.conf").write_text(f"nameserver {DNS_IP}\n")
    (st / "pod-logs").mkdir(exist_ok=True)


def _ctr_answers(layout: Layout) -> bool:
    if not layout.socket.exists():
        return False
    result = subprocess.run(
        ["ctr", "--address", str(layout.socket), "version"],
        capture_output=True,
        check=False,
        timeout=10,
    )
    return result.returncode == 0


def components(layout: Layout) -> list[Component]:
    """Every process of the cluster, in start order."""
    st, p = layout.state, layout.pki
    admin = str(layout.kubeconfig)
    b = layout.bin
    tls = {"ca": p / "ca.crt", "cert": p / "admin.crt", "key": p / "admin.key"}
    return [
        Component(
            "etcd",
            [
                str(b("etcd")),
                "--name=kdelay",
                f"--data-dir={st / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                f"--initial-cluster=kdelay=http://127.0.0.1:{ETCD_PEER_PORT}",
                "--listen-metrics-urls=http://127.0.0.1:12381",
                # A throwaway development store: durability is not worth the fsyncs here.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=2147483648",
            ],
            lambda: _get("http", 12381, "/health") == 200,
        ),
        Component(
            "kube-apiserver",
            [
                str(b("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--kubelet-client-certificate={p / 'admin.crt'}",
                f"--kubelet-client-key={p / 'admin.key'}",
                # The node's name resolves nowhere: logs and exec go to its address.
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={st / 'apiserver'}",
            ],
            lambda: _get("https", API_PORT, "/readyz", NODE_IP, **tls) == 200,
            start_timeout=180.0,
        ),
        Component(
            "kube-controller-manager",
            [
                str(b("kube-controller-manager")),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--use-service-account-credentials=true",
                f"--cert-dir={st / 'controller-manager'}",
            ],
            lambda: _get("https", 10257, "/healthz") == 200,
        ),
        Component(
            "kube-scheduler",
            [
                str(b("kube-scheduler")),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                f"--cert-dir={st / 'scheduler'}",
            ],
            lambda: _get("https", 10259, "/healthz") == 200,
        ),
        Component(
            "containerd",
            [
                "containerd",
                f"--config={st / 'containerd' / 'config.toml'}",
            ],
            lambda: _ctr_answers(layout),
        ),
        Component(
            "kubelet",
            [
                str(b("kubelet")),
                f"--config={st / 'kubelet.yaml'}",
                f"--kubeconfig={st / 'kubelet.kubeconfig'}",
                f"--root-dir={st / 'kubelet' / 'root'}",
                f"--cert-dir={st / 'kubelet' / 'pki'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={NODE_NAME}",
            ],
            lambda: _get("http", 10248, "/healthz") == 200,
        ),
        Component(
            "kube-proxy",
            [str(b("kube-proxy")), f"--config={st / 'kube-proxy.yaml'}"],
            lambda: _get("http", 10256, "/livez") == 200,
        ),
        Component(
            "coredns",
            [str(b("coredns")), "-conf", str(st / "Corefile")],
            lambda: _get("http", 18554, "/ready") == 200,
        ),
    ]
