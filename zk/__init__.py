"""ZooKeeper coordination: election, membership registry and the fenced checkpoint store.

It knows nothing of Kafka or of delivery: the checkpoint is opaque bytes it keeps fenced, and
status documents are JSON it passes on without reading.
"""

from __future__ import annotations

from kdelay.zk.checkpoint import CheckpointStore, read_checkpoint
from kdelay.zk.connection import CONNECTED, LOST, SUSPENDED, Session
from kdelay.zk.election import Election, current_leader
from kdelay.zk.errors import CoordinationError, FencedError
from kdelay.zk.paths import DEFAULT_ROOT, Paths
from kdelay.zk.registry import Registry, cluster_status, members

__all__ = [
    "CONNECTED",
    "DEFAULT_ROOT",
    "LOST",
    "SUSPENDED",
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
