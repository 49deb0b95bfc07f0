"""A sharded delay set for tests: one ReplicaSet per shard under one ZooKeeper root."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from tests.support.replicas import ReplicaSet


def at_least_partitions(bootstrap: str, topic: str, partitions: int) -> None:
    """Grow ``topic`` to ``partitions`` if it exists with fewer. The shared ``__kdelay_buffer``
    of a test worker's Kafka is created by whichever replica starts first with that Kafka, with
    that replica's ``buffer_partitions``: a one-partition set before a two-shard one left shard
    1 no partition. Asks for every topic's metadata, not ``topic``'s: a Metadata request that
    names a missing topic makes a broker with ``auto.create.topics.enable`` create it, with one
    partition, before the replicas create it with ``partitions`` (CI of fa12c91: two tests of
    test_shards.py, shard 1 owned no partition)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(timeout=30).topics.get(topic)
    if found is None or found.error is not None or len(found.partitions) >= partitions:
        return
    for future in admin.create_partitions([NewPartitions(topic, partitions)]).values():
        future.result(timeout=30)


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
    at_least_partitions(bootstrap, buffer_topic, partitions)
    try:
        for rs in sets:
            rs.start_all()
        for rs in sets:
            rs.wait_master(timeout=120)
        yield sets
    finally:
        for rs in sets:
            rs.close()
