"""What a new exactly-once master ingests before its first release: its shard's buffer
partitions to their ends as of the fence, past every tombstone the earlier masters committed.

Why the checkpoint's offsets are not enough: a master's checkpoint ``(T, O)`` covers only what
was due by ``T`` below ``O``, and ``T`` stays below every entry still pending (``round.py``
``claim_ms``: a held target, a scan cut at ``scan_batch``). What it released beyond ``T`` is
retired by its tombstone alone, committed in the same transaction but at an offset past ``O``
(noted before the round's scan). A new master that started as soon as its ingest reached ``O``
found such an entry due, uncovered, and released it again: a duplicate even for read_committed
consumers (tests/integration/test_failover_rerelease.py). So the new master notes the end of
each partition *after* ``init_transactions()`` fenced the old master, when no earlier
transaction can still commit, and waits for its ingest to get there.

The cost: a takeover waits for the new master's ingest lag at the fence (a follower keeps up
within its 50 ms linger; one behind a burst waits until it has read it), not for the checkpoint's
offsets only. The ends are read_committed (the last stable offset): every committed tombstone
is below it, and ingest reads no further.

Functions of their arguments; the forwarder thread calls them during a takeover.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kdelay import logs
from kdelay.delay_service.config import ReplicaConfig
from kdelay.errors import InfrastructureError
from kdelay.shards import owned

log = logs.get(__name__)


class Ingesting(Protocol):
    """The part of the replica's ingest a takeover waits on (``forwarder.IngestLike``)."""

    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool: ...


def buffer_ends(cfg: ReplicaConfig, timeout_s: float = 30.0) -> dict[int, int]:
    """The end offset of each buffer partition of ``cfg``'s shard, as a read_committed
    consumer sees it now."""
    consumer = Consumer(
        {
            **cfg.kafka_connection(cfg.bootstrap_servers),
            "group.id": f"kdelay-replica-{cfg.name}-takeover",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "client.id": f"kdelay-replica-{cfg.name}-takeover",
        }
    )
    try:
        meta = consumer.list_topics(cfg.buffer_topic, timeout=timeout_s)
        topic = meta.topics.get(cfg.buffer_topic)
        if topic is None or topic.error is not None:
            raise InfrastructureError(
                f"no metadata for {cfg.buffer_topic}: {topic and topic.error}"
            )
        ends: dict[int, int] = {}
        for p in owned(topic.partitions, cfg.shard, cfg.shards):
            tp = TopicPartition(cfg.buffer_topic, p)
            _, ends[p] = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
    except KafkaException as exc:
        raise InfrastructureError(f"cannot read the ends of {cfg.buffer_topic}: {exc}") from None
    finally:
        consumer.close()
    return ends


def catch_up(
    ingest: Ingesting,
    ends: Mapping[int, int],
    stop: threading.Event,
    current: Callable[[], bool],
) -> bool:
    """Wait until ``ingest`` has read to ``ends``; False when ``stop`` is set or the term is no
    longer ``current`` first."""
    began = time.monotonic()
    while not ingest.wait_ingested(ends, 1.0, stop):
        if stop.is_set() or not current():
            return False
    log.info(
        "forwarder.caught_up_to_buffer_end", ends=dict(ends), waited_s=time.monotonic() - began
    )
    return True
