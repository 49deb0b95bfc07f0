"""ZooKeeper coordination: election, membership registry and the fenced checkpoint store.

It knows nothing of Kafka: offsets are plain ``{partition: offset}`` maps.
"""

from __future__ import annotations

from zk.checkpoint import Checkpoint, CheckpointStore, read_checkpoint
from zk.connection import CONNECTED, LOST, SUSPENDED, Session
from zk.election import Election, current_leader
from zk.errors import CoordinationError, FencedError
from zk.paths import DEFAULT_ROOT, Paths
from zk.registry import Registry, cluster_status, members

__all__ = [
    "CONNECTED",
    "DEFAULT_ROOT",
    "LOST",
    "SUSPENDED",
    "Checkpoint",
    "CheckpointStore",
    "CoordinationError",
    "Election",
    "FencedError",
    "Paths",
    "Registry",
    "Session",
    "cluster_status",
    "current_leader",
    "members",
    "read_checkpoint",
]
