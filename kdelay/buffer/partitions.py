"""The buffer partition of a message id: every record about one id (its schedules, cancels and
tombstones) goes to one partition, so they stay in production order.

Functions of their arguments (:func:`target_pin` caches); safe from any thread.
"""

from __future__ import annotations

import functools
import re

from kdelay import partitioner

_PINNED = re.compile(r"b(\d{1,9})\.[0-9a-f]{32}\Z")


def partition_for(msg_id: str, partitions: int) -> int:
    """The buffer partition of every record about ``msg_id``: Kafka's own murmur2 key hash
    (what the Java client's default partitioner does with the id as key), except for an id of
    the form ``b<n>.<32 hex digits>`` (:func:`pinned_id`), which names partition ``n``."""
    pinned = _PINNED.match(msg_id)
    if pinned:
        return int(pinned[1]) % partitions
    return partitioner.partition(msg_id.encode(), partitions)


def pinned_id(uid: str, topic: str, partition: int, partitions: int) -> str:
    """The id the proxy gives a message sent without ``kdelay-id``: its buffer key, pinned to
    the buffer partition of its target partition. So a producer's records for one target
    partition share a buffer partition, are appended together and tie on their due times in
    production order (the order field breaks the tie), and a cancel by this id finds them."""
    return f"b{target_pin(topic, partition, partitions)}.{uid}"


@functools.lru_cache(maxsize=65536)
def target_pin(topic: str, partition: int, partitions: int) -> int:
    """The buffer partition of a target partition's records without an id (computed once per
    target partition, not once per record)."""
    return partition_for(f"{topic}/{partition}", partitions)
