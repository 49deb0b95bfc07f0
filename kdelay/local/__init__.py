"""The embedded local stack: process supervision, Kafka and ZooKeeper launchers, a replica's
command line, and the small Kafka helpers tests and benchmarks share.

``kdelay up``, the test fixtures and the benchmarks use the same launchers. The pinned jars
they run are resolved by :mod:`kdelay.jars` (runtime code, which the verifier uses too).
"""

from __future__ import annotations

from kdelay.local.kafka import KafkaSettings, LocalKafka
from kdelay.local.process import KDELAY, ManagedProcess, free_port, wait_until
from kdelay.local.zookeeper import LocalZooKeeper

__all__ = [
    "KDELAY",
    "KafkaSettings",
    "LocalKafka",
    "LocalZooKeeper",
    "ManagedProcess",
    "free_port",
    "wait_until",
]
