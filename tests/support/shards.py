"""A sharded delay set for tests: one ReplicaSet per shard under one ZooKeeper root."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.replicas import ReplicaSet


@contextlib.contextmanager
def sharded(
    base: Path,
    bootstrap: str,
    zk_connect: str,
    *,
    shards: int,
    root: str,
    buffer_topic: str,
    per_shard: int = 1,
    partitions: int = 6,
) -> Iterator[list[ReplicaSet]]:
    """One ReplicaSet per shard of the delay set under ``root``, started, each with a master."""
    sets = [
        ReplicaSet(
            base / f"shard-{i}",  # the same directories whatever the layout
            bootstrap,
            zk_connect,
            count=per_shard,
            partitions=partitions,
            root=root,
            buffer_topic=buffer_topic,
            shards=shards,
            shard=i,
        )
        for i in range(shards)
    ]
    try:
        for rs in sets:
            rs.start_all()
        for rs in sets:
            rs.wait_master(timeout=120)
        yield sets
    finally:
        for rs in sets:
            rs.close()
