"""The internal topics kdelay owns, created with the right settings before first use.

Both the proxy (which writes the buffer topic) and the replicas (which read it) call
:func:`ensure_internal_topics`, so a broker's auto-create can never make a non-compacted buffer.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdelay.buffer import BUFFER_TOPIC, DEAD_LETTER_TOPIC
from kdelay.errors import InfrastructureError

BUFFER_TOPIC_CONFIG = {
    # Delivered and cancelled ids get tombstones: compaction keeps about the pending set.
    "cleanup.policy": "compact",
    # Pending messages must never age out, however long their delay.
    "retention.ms": "-1",
    "min.compaction.lag.ms": "60000",
    "delete.retention.ms": "86400000",
}


def ensure_internal_topics(
    bootstrap: str,
    *,
    partitions: int = 12,
    replication: int = 1,
    min_insync: int | None = None,
    timeout: float = 30.0,
    client_config: dict[str, str] | None = None,
) -> None:
    """Create the buffer and dead-letter topics when missing; existing ones are left alone."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    extra = {"min.insync.replicas": str(min_insync)} if min_insync else {}
    wanted = [
        NewTopic(BUFFER_TOPIC, partitions, replication, config={**BUFFER_TOPIC_CONFIG, **extra}),
        NewTopic(DEAD_LETTER_TOPIC, 1, replication, config=extra),
    ]
    deadline = time.monotonic() + timeout
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise InfrastructureError(f"Kafka at {bootstrap} is unreachable: {exc}") from None
    missing = [t for t in wanted if t.topic not in existing]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result(timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfrastructureError(
                    f"cannot create topic {name} on {bootstrap}: {exc}"
                ) from None
