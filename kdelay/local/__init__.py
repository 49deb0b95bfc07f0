"""The embedded local stack: pinned jars, process supervision, Kafka and ZooKeeper launchers.

``kdelay up`` and the test fixtures use the same launchers.
"""

from __future__ import annotations

from kdelay.local.kafka import KafkaSettings, LocalKafka
from kdelay.local.process import ManagedProcess, free_port, wait_until
from kdelay.local.zookeeper import LocalZooKeeper

__all__ = [
    "KafkaSettings",
    "LocalKafka",
    "LocalZooKeeper",
    "ManagedProcess",
    "free_port",
    "wait_until",
]
