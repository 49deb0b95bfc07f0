"""Shards: how a delay set divides its buffer partitions (DESIGN.md "Shards").

Shard ``i`` of ``n`` owns every buffer partition ``p`` with ``p % n == i``; its replicas ingest
only those, and it is a replica set of its own (election, checkpoint, transactional id) under
its own ZooKeeper root (``zk/layout.py``). Partitions added to the buffer topic go round the
shards the same way. One shard (the default) is the whole topic under the delay set's root
itself, as before shards existed, so an unsharded set needs no migration.
"""

from __future__ import annotations

from collections.abc import Iterable


def owns(partition: int, shard: int, shards: int) -> bool:
    """Whether shard ``shard`` of ``shards`` owns buffer partition ``partition``."""
    return partition % shards == shard


def owned(partitions: Iterable[int], shard: int, shards: int) -> list[int]:
    """The partitions of ``partitions`` that shard ``shard`` of ``shards`` owns, in order."""
    return sorted(p for p in partitions if owns(p, shard, shards))


def shard_of(partition: int, shards: int) -> int:
    """The shard that owns ``partition``."""
    return partition % shards


def check(shard: int, shards: int) -> None:
    """Raise ValueError unless ``shard`` names one of ``shards`` shards."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be in 0..{shards - 1} for {shards} shard(s), not {shard}")
