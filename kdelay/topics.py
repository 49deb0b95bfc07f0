"""The internal topics kdelay owns, created with the right settings before first use.

Both the proxy (which writes the buffer topic) and the replicas (which read it) call
:func:`ensure_internal_topics`, so a broker's auto-create can never make a non-compacted buffer.

Durability is safe by default: unless told otherwise, an internal topic is created with
replication factor min(3, live brokers) and ``min.insync.replicas`` min(2, replication), so
with three brokers one may fail without stalling or losing an acknowledged record (acks=all).
An internal topic that already exists with less than that is left alone (changing replication
is an operator's reassignment) but logged as ``topics.weaker_than_configured``, naming the
topic, what it has and the setting to change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # not re-exported in the stubs
from confluent_kafka.admin._metadata import ClusterMetadata  # not re-exported in the stubs
from confluent_kafka.cimpl import NewTopic

from kdelay import logs
from kdelay.buffer import BUFFER_TOPIC, CANCEL_WINDOW_MS, DEAD_LETTER_TOPIC
from kdelay.errors import BrokerClockError, ConfigError, InfrastructureError

log = logs.get(__name__)

#: The settings (the same name in the proxy and the replica) behind replication and min ISR.
REPLICATION_SETTING = "buffer_replication"
MIN_INSYNC_SETTING = "buffer_min_insync_replicas"
#: Auto replication: min(AUTO_REPLICATION, live brokers); auto min ISR: min(AUTO_MIN_INSYNC, RF).
AUTO_REPLICATION = 3
AUTO_MIN_INSYNC = 2
MIN_INSYNC = "min.insync.replicas"

#: The buffer topic's ``min.compaction.lag.ms``: the cancel window and a minute (6 min).
MIN_COMPACTION_LAG_MS = CANCEL_WINDOW_MS + 60_000

BUFFER_TOPIC_CONFIG = {
    # Delivered and cancelled ids get tombstones: compaction keeps about the pending set.
    "cleanup.policy": "compact",
    # The broker's clock stamps each record: a delay counts from it (kdelay/buffer/).
    "message.timestamp.type": "LogAppendTime",
    # Pending messages must never age out, however long their delay.
    "retention.ms": "-1",
    # A cancel stays open for CANCEL_WINDOW_MS to cancel a schedule appended after it: until
    # then the cleaner must not remove it (a rebuilt store would miss it), so a minute more.
    "min.compaction.lag.ms": str(MIN_COMPACTION_LAG_MS),
    "delete.retention.ms": "86400000",
}

#: Exactly-once release: each delay set's checkpoint, committed in the transaction of the
#: releases it covers (delay_service/release/exactly_once.py); keyed by the set, so compaction keeps
#: the last one.
CHECKPOINT_TOPIC = "__kdelay_checkpoint"
CHECKPOINT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "segment.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
}


@dataclass(frozen=True)
class Durability:
    """Replication factor and ``min.insync.replicas`` of an internal topic."""

    replication: int
    min_insync: int


@dataclass(frozen=True)
class WeakTopic:
    """An existing internal topic with less durability than configured (or auto) asks for."""

    topic: str
    replication: int
    min_insync: int | None  # None: the topic's config could not be read
    wanted: Durability


def check_durability(replication: int | None, min_insync: int | None) -> None:
    """Reject settings that can never hold (ConfigError naming the setting); None is auto."""
    if replication is not None and replication < 1:
        raise ConfigError(f"{REPLICATION_SETTING}={replication}: must be at least 1 (or unset)")
    if min_insync is not None and min_insync < 1:
        raise ConfigError(f"{MIN_INSYNC_SETTING}={min_insync}: must be at least 1 (or unset)")
    if replication is not None and min_insync is not None and min_insync > replication:
        raise ConfigError(
            f"{MIN_INSYNC_SETTING}={min_insync} exceeds {REPLICATION_SETTING}={replication}: no "
            "write could ever be acknowledged; lower it or leave it unset (auto: min(2, RF))"
        )


def resolve_durability(brokers: int, replication: int | None, min_insync: int | None) -> Durability:
    """Replication min(3, brokers) and min ISR min(2, replication) where a setting is None.

    What can be created is checked when creating (:func:`_create`): an existing topic needs no
    more brokers than are up now.
    """
    check_durability(replication, min_insync)
    rf = replication if replication is not None else min(AUTO_REPLICATION, max(1, brokers))
    isr = min_insync if min_insync is not None else min(AUTO_MIN_INSYNC, rf)
    return Durability(rf, isr)


def _metadata(admin: AdminClient, bootstrap: str, timeout: float) -> ClusterMetadata:
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise InfrastructureError(f"Kafka at {bootstrap} is unreachable: {exc}") from None


def _create(
    admin: AdminClient,
    bootstrap: str,
    missing: list[tuple[str, int, dict[str, str]]],
    *,
    wanted: Durability,
    brokers: int,
    timeout: float,
) -> None:
    rf, isr = wanted.replication, wanted.min_insync
    names = ", ".join(name for name, _, _ in missing)
    if rf > brokers:
        raise ConfigError(
            f"{REPLICATION_SETTING}={rf}: Kafka at {bootstrap} has {brokers} live broker(s), "
            f"too few to create {names}; lower it or leave it unset (auto: min(3, brokers))"
        )
    if isr > rf:
        raise ConfigError(
            f"{MIN_INSYNC_SETTING}={isr} exceeds the replication factor {rf} of {names} "
            f"(auto: min(3, {brokers} live brokers)): no write could be acknowledged; lower "
            f"{MIN_INSYNC_SETTING} or leave it unset (auto: min(2, RF))"
        )
    new = [
        NewTopic(name, partitions, rf, config={**config, MIN_INSYNC: str(isr)})
        for name, partitions, config in missing
    ]
    deadline = time.monotonic() + timeout
    for name, future in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            future.result(timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise InfrastructureError(
                    f"cannot create topic {name} on {bootstrap}: {exc}"
                ) from None
            continue
        log.info("topics.created", topic=name, replication=rf, min_insync=isr)


def _min_insync(admin: AdminClient, topics: list[str], timeout: float) -> dict[str, int]:
    """Each topic's effective ``min.insync.replicas``; topics whose config is unreadable (ACLs,
    an old broker) are left out."""
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    out: dict[str, int] = {}
    if not resources:
        return out
    for resource, future in admin.describe_configs(resources).items():
        try:
            entry = future.result(timeout=timeout).get(MIN_INSYNC)
        except (KafkaException, TimeoutError) as exc:
            log.debug("topics.config_unreadable", topic=resource.name, error=str(exc))
            continue
        if entry is not None and entry.value is not None and str(entry.value).isdigit():
            out[str(resource.name)] = int(entry.value)
    return out


def _weak_topics(
    admin: AdminClient, meta: ClusterMetadata, names: list[str], wanted: Durability, timeout: float
) -> list[WeakTopic]:
    isr = _min_insync(admin, names, timeout)
    weak = []
    for name in names:
        partitions = meta.topics[name].partitions.values()
        rf = min((len(p.replicas) for p in partitions), default=0)
        min_isr = isr.get(name)
        if rf < wanted.replication or (min_isr is not None and min_isr < wanted.min_insync):
            weak.append(WeakTopic(name, rf, min_isr, wanted))
    return weak


def _warn(weak: WeakTopic, bootstrap: str) -> None:
    log.warning(
        "topics.weaker_than_configured",
        topic=weak.topic,
        replication=weak.replication,
        min_insync=weak.min_insync,
        wanted_replication=weak.wanted.replication,
        wanted_min_insync=weak.wanted.min_insync,
        settings=f"{REPLICATION_SETTING}, {MIN_INSYNC_SETTING}",
        fix=(
            f"raise the topic's replication (kafka-reassign-partitions.sh) and "
            f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
            f"--entity-name {weak.topic} --add-config {MIN_INSYNC}={weak.wanted.min_insync}; "
            f"or, to accept it, set {REPLICATION_SETTING}={weak.replication}"
            + (f" and {MIN_INSYNC_SETTING}={weak.min_insync}" if weak.min_insync else "")
        ),
    )


def _ensure(
    bootstrap: str,
    topics: list[tuple[str, int, dict[str, str]]],
    *,
    replication: int | None,
    min_insync: int | None,
    timeout: float,
    client_config: dict[str, str] | None,
) -> list[WeakTopic]:
    """Create the missing ``(name, partitions, config)`` topics; report the weak existing ones."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    meta = _metadata(admin, bootstrap, timeout)
    brokers = len(meta.brokers)
    wanted = resolve_durability(brokers, replication, min_insync)
    missing = [t for t in topics if t[0] not in meta.topics]
    if missing:
        _create(admin, bootstrap, missing, wanted=wanted, brokers=brokers, timeout=timeout)
    existing = [name for name, _, _ in topics if name in meta.topics]
    weak = _weak_topics(admin, meta, existing, wanted, timeout) if existing else []
    for topic in weak:
        _warn(topic, bootstrap)
    return weak


def ensure_internal_topics(
    bootstrap: str,
    *,
    partitions: int = 12,
    replication: int | None = None,
    min_insync: int | None = None,
    timeout: float = 30.0,
    client_config: dict[str, str] | None = None,
    buffer_topic: str = BUFFER_TOPIC,
) -> list[WeakTopic]:
    """Create the buffer (``buffer_topic``: a shard's own, or ``__kdelay_buffer``),
    dead-letter and checkpoint topics when missing (replication and min ISR: None is auto,
    see the module docstring); existing ones are left alone, and those weaker than asked are
    logged and returned. ConfigError names an impossible setting. ``client_config``:
    librdkafka settings of the admin client (the component's login,
    kdelay/kafka_security.py)."""
    return _ensure(
        bootstrap,
        [
            (buffer_topic, partitions, BUFFER_TOPIC_CONFIG),
            (DEAD_LETTER_TOPIC, 1, {}),
            (CHECKPOINT_TOPIC, 1, CHECKPOINT_TOPIC_CONFIG),
        ],
        replication=replication,
        min_insync=min_insync,
        timeout=timeout,
        client_config=client_config,
    )


def ensure_buffer_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    replication: int | None = None,
    min_insync: int | None = None,
    timeout: float = 30.0,
    client_config: dict[str, str] | None = None,
) -> list[WeakTopic]:
    """Create a shard's own buffer topic (the settings of ``__kdelay_buffer``) when missing;
    like :func:`ensure_internal_topics` otherwise."""
    return _ensure(
        bootstrap,
        [(topic, partitions, BUFFER_TOPIC_CONFIG)],
        replication=replication,
        min_insync=min_insync,
        timeout=timeout,
        client_config=client_config,
    )


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
