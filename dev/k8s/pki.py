"""The cluster's certificates and keys (openssl), written once under ``.kdelay/k8s/pki``.

One CA signs the API server's serving certificate and the clients' certificates: ``admin``
(``system:masters``: kubectl, Helm, the controller manager, the scheduler, kube-proxy, CoreDNS,
and the API server towards the kubelet) and the kubelet's node identity (``system:nodes``). The
service-account key pair signs and checks pod tokens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dev.k8s.settings import API_SERVICE_IP, NODE_IP, NODE_NAME
from kdelay.errors import InfrastructureError

_DAYS = "3650"


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise InfrastructureError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _cert(pki: Path, name: str, subject: str, extensions: str) -> None:
    if (pki / f"{name}.crt").exists():
        return
    (pki / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-subj", subject, "-out", f"{name}.csr", cwd=pki,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", _DAYS, "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip


def ensure(pki: Path) -> None:
    """Create whatever of the CA, the certificates and the service-account keys is missing."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    if not (pki / "ca.crt").exists():
        _openssl(
            "req", "-x509", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-subj", "/CN=kdelay-k8s-ca", "-days", _DAYS, "-out", "ca.crt", cwd=pki,
        )  # fmt: skip
    client = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
    sans = ",".join(
        [
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
            "DNS:localhost",
            f"IP:{NODE_IP}",
            f"IP:{API_SERVICE_IP}",
            "IP:127.0.0.1",
        ]
    )
    _cert(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        client + f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
    )
    _cert(
        pki, "admin", "/O=system:masters/CN=kdelay-admin", client + "extendedKeyUsage=clientAuth\n"
    )
    _cert(
        pki,
        "kubelet",
        f"/O=system:nodes/CN=system:node:{NODE_NAME}",
        client + "extendedKeyUsage=clientAuth\n",
    )
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig(pki: Path, user: str, server: str) -> str:
    """A kubeconfig for ``user``'s certificate (``admin`` or ``kubelet``) against ``server``."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: kdelay
  cluster:
    server: {server}
    certificate-authority: {pki / "ca.crt"}
users:
- name: {user}
  user:
    client-certificate: {pki / f"{user}.crt"}
    client-key: {pki / f"{user}.key"}
contexts:
- name: kdelay
  context:
    cluster: kdelay
    user: {user}
current-context: kdelay
"""
