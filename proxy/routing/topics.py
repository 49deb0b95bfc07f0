"""Upstream topics as the proxy shows them, to the Kafka listener and the HTTP API alike.

``Topics`` looks topics up upstream and keeps what it found for a short while: a Produce checks
its target partition, a Metadata request lists topics, the HTTP API checks a posted message's
topic, and all three see the same cached answer. ``metadata_response`` builds the Metadata
response that names this proxy as the only broker, leader of every partition;
``answer_metadata`` answers a Metadata request with it, internal topics refused
(proxy/routing/internal_topics.py).

Concurrency: ``Topics`` is used from the asyncio loop thread only, so its cache needs no lock;
the upstream lookups block and run in worker threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import kafka.errors as kerr
from kafka.protocol.metadata import MetadataResponse

from kdelay.proxy.routing import internal_topics

_ZERO_UUID = uuid.UUID(int=0)
_MetaTopic = MetadataResponse.MetadataResponseTopic
_MetaPartition = _MetaTopic.MetadataResponsePartition


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as upstream describes it: error code (0 when fine) and partition count."""

    error_code: int
    partitions: int


class TopicSource(Protocol):
    """Where topics are looked up (proxy/upstream/producer.py; a fake in unit tests). Blocking."""

    cluster_id: str | None

    def topic(self, name: str, *, create: bool) -> TopicInfo: ...

    def all_topics(self) -> dict[str, TopicInfo]: ...


@dataclass(frozen=True, slots=True)
class Advertised:
    """How clients reach this proxy: the only broker in every Metadata response."""

    node_id: int
    host: str
    port: int


class Topics:
    """Upstream's topics, each cached for ``ttl_s`` once it exists (see the module docstring)."""

    def __init__(self, source: TopicSource, *, ttl_s: float = 5.0) -> None:
        self.source = source
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[TopicInfo, float]] = {}

    @property
    def cluster_id(self) -> str | None:
        """Upstream's cluster id, as of the last lookup."""
        return self.source.cluster_id

    async def info(self, name: str, *, create: bool = False) -> TopicInfo:
        """Upstream's view of ``name``; ``create`` lets upstream auto-create it when its
        configuration allows, as a client's Metadata request may. A missing or failing topic is
        not cached: the next lookup asks again."""
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and cached[1] > now:
            return cached[0]
        info = await asyncio.to_thread(self.source.topic, name, create=create)
        if info.error_code == 0 and info.partitions > 0:
            self._cache[name] = (info, now + self.ttl_s)
        return info

    def partitions_cached(self, name: str) -> int:
        """``name``'s partition count as cached (0 when not cached or expired); never waits."""
        cached = self._cache.get(name)
        if cached is None or cached[1] <= time.monotonic():
            return 0
        return cached[0].partitions

    async def lookup(
        self, names: Iterable[str | None] | None, *, create: bool
    ) -> dict[str, TopicInfo]:
        """The topics a Metadata request names (unnamed entries skipped, each as ``info``
        sees it), or for ``None`` every topic upstream, asked now rather than cached."""
        if names is None:
            return await asyncio.to_thread(self.source.all_topics)
        found: dict[str, TopicInfo] = {}
        for name in names:
            if name is not None:
                found[name] = await self.info(name, create=create)
        return found


async def answer_metadata(topics: Topics, advertised: Advertised, req: Any) -> tuple[Any, int]:
    """The Metadata response to ``req`` (a decoded request: ``api_version`` and ``body``) and its
    lowest error code (0: none). An internal topic asked for by name is answered
    TOPIC_AUTHORIZATION_FAILED without asking upstream, so none is auto-created through the
    proxy; a listing of every topic leaves them out (the cancel carrier excepted)."""
    body, version = req.body, req.api_version
    # Before v4 a Metadata request always allowed auto-creation (KIP-204).
    allow = bool(body.allow_auto_topic_creation) if version >= 4 else True
    requested = body.topics
    if requested is None or (version == 0 and not requested):
        listed = await topics.lookup(None, create=allow)
        infos = {name: info for name, info in listed.items() if internal_topics.visible(name)}
    else:
        names = [t.name for t in requested if t.name is not None]
        refused = {n for n in names if not internal_topics.visible(n)}
        found = await topics.lookup([n for n in names if n not in refused], create=allow)
        denied = TopicInfo(kerr.TopicAuthorizationFailedError.errno, 0)
        infos = {n: denied if n in refused else found[n] for n in names}
    errors = {i.error_code for i in infos.values()} - {0}
    response = metadata_response(version, advertised, topics.cluster_id, infos)
    return response, min(errors) if errors else 0


def metadata_response(
    version: int, advertised: Advertised, cluster_id: str | None, topics: dict[str, TopicInfo]
) -> Any:
    """The Metadata response for ``topics``: this proxy is the only broker, the controller and
    the leader (and only replica) of every partition, so clients send every Produce here."""
    node = advertised.node_id
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponse.MetadataResponseBroker(
                node_id=node, host=advertised.host, port=advertised.port, rack=None
            )
        ],
        cluster_id=cluster_id,
        controller_id=node,
        topics=[_topic(name, info, node) for name, info in topics.items()],
        error_code=0,
        version=version,
    )


def _topic(name: str, info: TopicInfo, node: int) -> Any:
    partitions = [
        _MetaPartition(
            error_code=0,
            partition_index=i,
            leader_id=node,
            leader_epoch=0,
            replica_nodes=[node],
            isr_nodes=[node],
            offline_replicas=[],
        )
        for i in range(info.partitions if info.error_code == 0 else 0)
    ]
    return _MetaTopic(
        error_code=info.error_code,
        name=name,
        topic_id=_ZERO_UUID,
        is_internal=name.startswith("__"),
        partitions=partitions,
    )
