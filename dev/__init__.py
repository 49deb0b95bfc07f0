"""The development harness: never shipped in the wheel, only run from a checkout.

- :mod:`dev.stack`: the embedded stack behind ``kdelay up`` (Kafka, ZooKeeper, the proxy and the
  replicas as supervised local processes);
- :mod:`dev.containers`: podman and the images built on this machine (``make containers``);
- :mod:`dev.k8s`: a single-node Kubernetes built from source (``make k8s-up``);
- :mod:`dev.demo` (``make demo``), :mod:`dev.up` (``kdelay up``);
- :mod:`dev.kafka_tools`: Kafka helpers that tests and benches share;
- ``dev/tools``: the pinned deployment tools (helm, kubeconform, promtool, ...) and chart checks;
- ``dev/images``: the Dockerfiles of the locally built Kafka, ZooKeeper, Prometheus and base images.

Runtime components (``kdelay``, ``proxy``, ``delay_service``, ``zk``, ``verifier``) never import it
(import-linter checks that in ``make lint``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout this harness lives in: its ``.cache`` and ``.kdelay`` hold builds and state."""
