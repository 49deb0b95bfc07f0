"""The embedded local stack: process supervision, Kafka and ZooKeeper launchers, a replica's
command line, and the small Kafka helpers tests and benchmarks share.

``kdelay up``, the test fixtures and the benchmarks use the same launchers. The pinned jars
they run are resolved by :mod:`kdelay.jars` (runtime code, which the verifier uses too).
"""

from __future__ import annotations

from dev.stack.kafka import KafkaSettings, LocalKafka
from dev.stack.kafka_security import KafkaSecurity
from dev.stack.process import KDELAY, ManagedProcess, free_port, wait_until
from dev.stack.zookeeper import LocalZooKeeper

__all__ = [
    "KDELAY",
    "KafkaSecurity",
    "KafkaSettings",
    "LocalKafka",
    "LocalZooKeeper",
    "ManagedProcess",
    "free_port",
    "wait_until",
]
