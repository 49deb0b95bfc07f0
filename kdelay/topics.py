"""The internal topics kdelay owns, created with the right settings before first use.

Both the proxy (which writes the buffer topic) and the replicas (which read it) call
:func:`ensure_internal_topics`, so a broker's auto-create can never make a non-compacted buffer.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # not re-exported in the stubs
from confluent_kafka.cimpl import NewTopic

from kdelay import logs
from kdelay.buffer import BUFFER_TOPIC, DEAD_LETTER_TOPIC
from kdelay.errors import BrokerClockError, InfrastructureError

log = logs.get(__name__)

BUFFER_TOPIC_CONFIG = {
    # Delivered and cancelled ids get tombstones: compaction keeps about the pending set.
    "cleanup.policy": "compact",
    # The broker's clock stamps each record: a delay counts from it (kdelay/buffer.py).
    "message.timestamp.type": "LogAppendTime",
    # Pending messages must never age out, however long their delay.
    "retention.ms": "-1",
    "min.compaction.lag.ms": "60000",
    "delete.retention.ms": "86400000",
}

#: Exactly-once release: each delay set's checkpoint, committed in the transaction of the
#: releases it covers (delay_service/exactly_once.py); keyed by the set, so compaction keeps
#: the last one.
CHECKPOINT_TOPIC = "__kdelay_checkpoint"
CHECKPOINT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "segment.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
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
    """Create the buffer, dead-letter and checkpoint topics when missing; existing ones are left
    alone."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    extra = {"min.insync.replicas": str(min_insync)} if min_insync else {}
    wanted = [
        NewTopic(BUFFER_TOPIC, partitions, replication, config={**BUFFER_TOPIC_CONFIG, **extra}),
        NewTopic(DEAD_LETTER_TOPIC, 1, replication, config=extra),
        NewTopic(CHECKPOINT_TOPIC, 1, replication, config={**CHECKPOINT_TOPIC_CONFIG, **extra}),
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


def ensure_buffer_topic(
    bootstrap: str, topic: str, *, partitions: int, replication: int, timeout: float = 30.0
) -> None:
    """Create a shard's own buffer topic (the settings of ``__kdelay_buffer``) when missing."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        if topic in admin.list_topics(timeout=timeout).topics:
            return
        new = NewTopic(topic, partitions, replication, config=BUFFER_TOPIC_CONFIG)
        admin.create_topics([new])[topic].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise InfrastructureError(f"cannot create {topic} on {bootstrap}: {exc}") from None


CLOCK_TOPIC = "__kdelay_clock"
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
CLOCK_TOPIC_CONFIG = {
    TIMESTAMP_TYPE: LOG_APPEND_TIME,  # the broker stamps each probe with its own clock
    "cleanup.policy": "delete",
    "retention.ms": "3600000",  # probes are worthless once acknowledged: keep little
    "segment.bytes": "1048576",
    "segment.ms": "600000",
}


def ensure_clock_topic(admin: AdminClient, topic: str = CLOCK_TOPIC, timeout: float = 30.0) -> bool:
    """Create the probe topic when missing (1 partition, replication min(3, brokers)); True if
    created here. :class:`BrokerClockError` if it exists without LogAppendTime (if its config is
    unreadable, each probe's timestamp type is checked instead); InfrastructureError."""
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise InfrastructureError(f"Kafka is unreachable for {topic}: {exc}") from None
    if topic not in meta.topics:
        replication = min(3, max(1, len(meta.brokers)))
        new = NewTopic(topic, 1, replication, config=CLOCK_TOPIC_CONFIG)
        try:
            admin.create_topics([new], operation_timeout=timeout)[topic].result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfrastructureError(f"cannot create {topic}: {exc}") from None
        else:
            log.info("clock.topic_created", topic=topic, replication=replication)
            return True
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout=timeout)
    except (KafkaException, TimeoutError) as exc:
        log.debug("clock.topic_config_unreadable", topic=topic, error=str(exc))
        return False
    entry = entries.get(TIMESTAMP_TYPE)
    if entry is not None and entry.value != LOG_APPEND_TIME:
        raise BrokerClockError(topic, str(entry.value))
    return False
