"""Kafka and ZooKeeper in the development cluster, for the chart
(dev/k8s/manifests/kafka-zookeeper.yaml).

One KRaft broker and one ZooKeeper from the project's images, in namespace ``kdelay-infra``,
on the node's network and bound to the node's address only: the chart's pods and clients on
the host reach the same stable address whatever restarts.
"""

from __future__ import annotations

from dev.containers.images import catalogue
from dev.k8s import kube
from dev.k8s.components import render
from dev.k8s.settings import NODE_IP, Layout

NAMESPACE = "kdelay-infra"
KAFKA_PORT = 19092
ZOOKEEPER_PORT = 12181
BOOTSTRAP = f"{NODE_IP}:{KAFKA_PORT}"
ZK_CONNECT = f"{NODE_IP}:{ZOOKEEPER_PORT}"


def manifest(layout: Layout) -> str:
    return render(
        layout.deploy / "kafka-zookeeper.yaml",
        NODE_IP=NODE_IP,
        KAFKA_PORT=str(KAFKA_PORT),
        KAFKA_CONTROLLER_PORT=str(KAFKA_PORT + 1),
        ZOOKEEPER_PORT=str(ZOOKEEPER_PORT),
        KAFKA_IMAGE=catalogue()["kafka"].name,
        ZOOKEEPER_IMAGE=catalogue()["zookeeper"].name,
    )


def apply(layout: Layout) -> None:
    """Create (or update) both and wait until they are Ready."""
    kube.kubectl(layout, "apply", "-f", "-", stdin=manifest(layout))
    for name in ("zookeeper", "kafka"):
        kube.kubectl(
            layout, "-n", NAMESPACE, "rollout", "status", f"deployment/{name}", "--timeout=300s",
            timeout=320,
        )  # fmt: skip


def delete(layout: Layout) -> None:
    kube.kubectl(layout, "delete", "namespace", NAMESPACE, "--ignore-not-found", timeout=300)
