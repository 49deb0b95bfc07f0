"""What a :class:`kdelay.retry.RetryingConsumer` needs before its first poll: its consumer and
producer settings checked (a message naming the bad setting), its retry and dead-letter topics,
and its metrics.

Functions of their arguments, except :func:`metrics_for` (a lock guards its cache) and
:func:`ensure_topics` (it creates topics); safe from any thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from prometheus_client import CollectorRegistry, Counter

from kdelay import logs
from kdelay.errors import ConfigError, InfrastructureError

log = logs.get(__name__)

#: Consumer settings the AdminClient that creates topics shares: where and how to connect.
_CONNECTION = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.id", "socket.")
_TRUE = ("true", "1", "yes", "on")
#: A produce not acknowledged within this long fails: well under ``max.poll.interval.ms``
#: (5 min), so the consumer reports it before the group gives up on it.
DEFAULT_MESSAGE_TIMEOUT_MS = 30_000


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in _TRUE


def consumer_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``config`` with ``enable.auto.commit`` false, and its ``group.id``."""
    conf = dict(config)
    group = str(conf.get("group.id") or "")
    if not group:
        raise ConfigError("consumer_config: 'group.id' is required")
    if _truthy(conf.get("enable.auto.commit", False)):
        raise ConfigError(
            "consumer_config: 'enable.auto.commit' must be false: the retry helper commits "
            "an offset only once the message's retry or dead letter is acknowledged"
        )
    conf["enable.auto.commit"] = False
    return conf, group


def cooperative(config: Mapping[str, Any]) -> bool:
    """Whether the group assigns partitions incrementally (``incremental_assign``)."""
    strategy = str(config.get("partition.assignment.strategy", ""))
    return "cooperative" in strategy or str(config.get("group.protocol", "")).lower() == "consumer"


def producer_config(proxy_bootstrap: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The proxy producer's settings: idempotent, acks=all; ``extra`` may not weaken them."""
    if "bootstrap.servers" in extra:
        raise ConfigError("producer_config: 'bootstrap.servers' is proxy_bootstrap, not set here")
    if "transactional.id" in extra:
        raise ConfigError("producer_config: 'transactional.id': the proxy refuses transactions")
    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": int(extra.get("delivery.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS)),
        **extra,
        "bootstrap.servers": proxy_bootstrap,
    }
    conf.pop("delivery.timeout.ms", None)  # librdkafka's alias of message.timeout.ms
    if not _truthy(conf["enable.idempotence"]):
        raise ConfigError("producer_config: 'enable.idempotence' must stay true")
    if str(conf["acks"]).lower() not in ("all", "-1"):
        raise ConfigError("producer_config: 'acks' must stay 'all'")
    return conf


def check_topics(topics: Sequence[str], retry_topic: str, dead_letter_topic: str) -> None:
    """The consumer's topics, retry topic and dead-letter topic are distinct."""
    if not topics:
        raise ConfigError("topics: name at least one topic to consume")
    for name, topic in (("retry_topic", retry_topic), ("dead_letter_topic", dead_letter_topic)):
        if topic in topics:
            raise ConfigError(f"{name}: {topic!r} is one of the consumed topics")
    if retry_topic == dead_letter_topic:
        raise ConfigError(f"retry_topic and dead_letter_topic are both {retry_topic!r}")


def ensure_topics(
    config: Mapping[str, Any], topics: Sequence[str], wanted: Sequence[str], timeout: float = 30
) -> None:
    """Create the topics of ``wanted`` that are missing, with as many partitions as the largest
    of ``topics`` and the broker's default replication, and wait until they show."""
    admin = AdminClient({k: v for k, v in config.items() if k.startswith(_CONNECTION)})
    meta = admin.list_topics(timeout=timeout).topics
    missing = [t for t in wanted if t not in meta]
    if not missing:
        return
    partitions = max((len(meta[t].partitions) for t in topics if t in meta), default=1)
    futures = admin.create_topics([NewTopic(t, partitions, -1) for t in missing])
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        log.info("retry.topic_created", topic=topic, partitions=partitions)
    deadline = time.monotonic() + timeout
    while any(t not in admin.list_topics(timeout=timeout).topics for t in missing):
        if time.monotonic() > deadline:
            raise InfrastructureError(f"topics {missing} did not show within {timeout:.0f} s")
        time.sleep(0.1)


class RetryMetrics:
    """``kdelay_retry_*`` (docs/retry.md), labelled by consumer group."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.handled = Counter(
            "kdelay_retry_handled",
            "deliveries handled, by outcome: ok, retried, dead_lettered",
            ["group", "outcome"],
            registry=r,
        )
        self.retried = Counter(
            "kdelay_retry_retried", "retries acknowledged through the proxy", ["group"], registry=r
        )
        self.dead_lettered = Counter(
            "kdelay_retry_dead_lettered", "dead letters acknowledged", ["group"], registry=r
        )
        self.produce_errors = Counter(
            "kdelay_retry_produce_errors",
            "retries or dead letters not acknowledged (their offsets left uncommitted)",
            ["group"],
            registry=r,
        )


_metrics: weakref.WeakKeyDictionary[CollectorRegistry, RetryMetrics] = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def metrics_for(registry: CollectorRegistry) -> RetryMetrics:
    """The helper's metrics on ``registry``, registered once however many consumers share it."""
    with _metrics_lock:
        found = _metrics.get(registry)
        if found is None:
            found = _metrics[registry] = RetryMetrics(registry)
        return found
