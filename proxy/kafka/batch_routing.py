"""A Produce request's partition, read and routed: its topic admitted (no internal one, it and
the partition exist upstream), its batch framed, checked and decompressed (proxy/wire/records.py),
its records routed (proxy/routing/route.py) with the proxy's policy, limits and acceptance order.
Every refusal is a :class:`proxy.wire.records.BatchError` carrying the Kafka error for the client.

Runs on the proxy's event loop (proxy/kafka/broker.py calls it in a Produce request's stage 1).
"""

from __future__ import annotations

from collections.abc import Callable

import kafka.errors as kerr
from confluent_kafka import KafkaException

from kdelay.buffer import BUFFER_TOPIC
from kdelay.headers import DelayPolicy
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.routing import internal_topics
from kdelay.proxy.routing.buffer_keys import AcceptanceOrder, BrokerTimeUnknownError, Origin
from kdelay.proxy.routing.route import (
    BufferUnavailableError,
    Kind,
    Outgoing,
    RejectedRecordError,
    route,
)
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.wire import records as rec


class BatchRouter:
    """One proxy's way of admitting and routing a partition's batch."""

    def __init__(
        self,
        topics: Topics,
        policy: DelayPolicy,
        limits: RecordLimits,
        max_decompressed_bytes: int,
        clock_ms: Callable[[], int],
        *,
        order: AcceptanceOrder,
    ) -> None:
        self.topics = topics
        self.policy = policy
        self.limits = limits
        self.max_decompressed_bytes = max_decompressed_bytes
        self.clock_ms = clock_ms
        self.order = order

    async def admit(
        self, topic: str, partition: int, raw: bytes | None
    ) -> tuple[rec.BatchHeader, tuple[bytes | memoryview, ...]]:
        """The partition's batch header and the parts of the same batch uncompressed, when the
        topic is no internal one and exists and the batch is well-formed; raises BatchError."""
        data = bytes(raw) if raw else b""
        try:
            internal_topics.check(topic)
        except internal_topics.RefusedTopicError as exc:
            raise refused(exc, rec.count(data)) from None
        info = await self.topics.info(topic)
        if info.error_code or not 0 <= partition < info.partitions:
            raise rec.BatchError(
                kerr.UnknownTopicOrPartitionError.errno,
                f"{topic}-{partition} does not exist upstream",
            )
        batch = rec.read_batch(data)
        if batch.is_transactional:
            raise rec.BatchError(
                kerr.TransactionalIdAuthorizationFailedError.errno,
                "transactional batches are not supported by the kdelay proxy",
                batch.last_offset_delta + 1,
            )
        return batch, rec.uncompressed(data, batch, self.max_decompressed_bytes)

    async def route(
        self,
        topic: str,
        partition: int,
        parts: tuple[bytes | memoryview, ...],
        origin: Origin | None,
        owner: str | None = None,
    ) -> tuple[list[Outgoing], dict[Kind, int]]:
        """The batch's records parsed and routed, delayed ones and cancels stamped with
        ``owner`` (the connection's principal; None without SASL); raises BatchError. The
        buffer topic's partition count comes from the topic cache, and from upstream only when
        a record needs it and the cache has none."""
        records = rec.read_records(parts)
        try:
            return self._routed(
                topic,
                partition,
                records,
                origin,
                self.topics.partitions_cached(BUFFER_TOPIC),
                owner=owner,
            )
        except BufferUnavailableError as exc:
            unavailable = str(exc)
        except BrokerTimeUnknownError as exc:
            raise rec.BatchError(
                kerr.LeaderNotAvailableError.errno, str(exc), reason="buffer_unavailable"
            ) from None
        try:
            info = await self.topics.info(BUFFER_TOPIC)
        except KafkaException as lookup:
            raise rec.BatchError(
                kerr.LeaderNotAvailableError.errno,
                f"{BUFFER_TOPIC}: upstream Kafka unreachable: {lookup}",
                reason="buffer_unavailable",
            ) from None
        if info.error_code or info.partitions <= 0:
            raise rec.BatchError(
                kerr.LeaderNotAvailableError.errno, unavailable, reason="buffer_unavailable"
            )
        return self._routed(topic, partition, records, origin, info.partitions, owner=owner)

    def _routed(
        self,
        topic: str,
        partition: int,
        records: list[rec.Record],
        origin: Origin | None,
        buffer_partitions: int,
        *,
        owner: str | None,
    ) -> tuple[list[Outgoing], dict[Kind, int]]:
        """``route`` with the proxy's policy and limits; RejectedRecordError as BatchError."""
        try:
            return route(
                topic,
                partition,
                records,
                self.clock_ms(),
                self.policy,
                limits=self.limits,
                buffer_partitions=buffer_partitions,
                origin=origin,
                order=self.order,
                owner=owner,
            )
        except RejectedRecordError as exc:
            raise rec.BatchError(
                kerr.InvalidRecordError.errno, str(exc), index=exc.index, reason=exc.reason
            ) from None
        except internal_topics.RefusedTopicError as exc:
            raise refused(exc) from None


def refused(exc: internal_topics.RefusedTopicError, records: int = 0) -> rec.BatchError:
    """A refused internal topic as the partition's TOPIC_AUTHORIZATION_FAILED."""
    return rec.BatchError(
        kerr.TopicAuthorizationFailedError.errno,
        str(exc),
        records,
        index=exc.index,
        reason="internal_topic",
    )
