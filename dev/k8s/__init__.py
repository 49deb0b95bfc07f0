"""A real single-node Kubernetes on this machine, for the Helm chart's tests (``make k8s-up``).

Development tooling, like :mod:`dev.containers`: no runtime component imports it, and the
images leave it out. Run as ``python -m dev.k8s up|down|status|env``; docs/kubernetes.md.

The control plane, the kubelet, kube-proxy, etcd and CoreDNS are built from the Go module proxy
(:mod:`dev.k8s.build`, cached per version under ``.cache/k8s``); containerd, runc and the CNI
plugins come from Debian. Everything runs under ``.kdelay/k8s`` as children of one detached
supervisor (:mod:`dev.k8s.daemon`) and listens on loopback or on the project's own bridge
(``kdelay0``, :mod:`dev.k8s.settings`), never on the machine's own interfaces.
"""

from __future__ import annotations

from dev.k8s.settings import Layout, layout

__all__ = ["Layout", "layout"]
