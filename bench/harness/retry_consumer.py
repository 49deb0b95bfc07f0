"""What the retry helper's benches share (``bench.retry_helper``, ``bench.retry_latency``).

Each case reads a fresh topic of :data:`PARTITIONS` partitions in a new consumer group, so no
case starts from another's offsets: :func:`conf` is that group's consumer configuration, the
same for the plain confluent-kafka loop and for :class:`kdelay.retry.RetryingConsumer`
(offsets committed by the loop, from the earliest record on).
"""

from __future__ import annotations

import uuid

#: Partitions of each case's topic.
PARTITIONS = 3


def conf(bootstrap: str) -> dict[str, str | int | bool]:
    """A consumer in a group of its own, from the earliest offset, committing by hand."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:10]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
