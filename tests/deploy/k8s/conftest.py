"""tests/deploy/k8s: the Helm chart on a real single-node Kubernetes (``make test-k8s``).

They run only when ``KDELAY_TEST_K8S=1`` (what ``make test-k8s`` sets, after ``make k8s-up``):
any other run deselects them, so ``make test`` reports them as deselected and starts nothing.
Marker ``k8s``. Kafka and ZooKeeper run in the cluster from the project's images
(dev/k8s/manifests/kafka-zookeeper.yaml), on the node's network and address, so the chart's pods and
the tests on the host reach them at the same stable address (10.87.0.1).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.k8s import cluster, infra, kube
from dev.k8s.settings import Layout, layout
from tests.support.suites import mark_or_deselect

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "k8s: the Helm chart on a real Kubernetes (make test-k8s)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_or_deselect(
        config, items, HERE, pytest.mark.k8s, asked=os.environ.get("KDELAY_TEST_K8S") == "1"
    )


@pytest.fixture(scope="session")
def k8s() -> Layout:
    """The development cluster, brought up when it is not running."""
    lay = layout()
    if cluster.supervisor_pid(lay) is None:
        cluster.up(lay)
    assert kube.node_ready(lay), "the node is not Ready: make k8s-up"
    kube.ensure_storage(lay)  # volumes an earlier run released are offered again
    return lay


@pytest.fixture(scope="session")
def kafka_zookeeper(k8s: Layout) -> Iterator[tuple[str, str]]:
    """Kafka and ZooKeeper in namespace kdelay-infra: (bootstrap servers, connect string)."""
    began = time.monotonic()
    infra.apply(k8s)
    print(f"kafka and zookeeper ready in {time.monotonic() - began:.1f} s")
    yield infra.BOOTSTRAP, infra.ZK_CONNECT
    infra.delete(k8s)
