"""Kafka's ACLs, enforced at the proxy: what an authenticated principal may do, asked of Kafka.

The proxy keeps no users and no ACLs. For a connection authenticated over SASL
(proxy/kafka/auth_session.py) it asks Kafka, on the connection the client's login authenticated
(proxy/auth/broker_link.py), a Metadata request with ``include_topic_authorized_operations``
(KIP-430): for each topic Kafka answers the principal's allowed operations (a bit field, which
kafka-python decodes to the set of AclOperation codes), or TOPIC_AUTHORIZATION_FAILED when it may
not even DESCRIBE it (Kafka then hides whether it exists).

- Produce: a topic whose WRITE bit is not set is refused with TOPIC_AUTHORIZATION_FAILED for each
  of its partitions (proxy/kafka/broker.py), immediate, delayed and cancel records alike: the
  release later runs under kdelay's own identity, so the proxy is where the check must happen.
- Administrators: a principal Kafka allows ALTER (or ALL) on the buffer topic is a kdelay
  administrator (``admin``): it may cancel, replace and read any principal's messages.
- Metadata: answered from what Kafka answers the principal, the proxy named as the only broker
  (proxy/routing/topics.py's ``metadata_response``): a listing holds only the topics it may
  DESCRIBE, a named topic it may not is TOPIC_AUTHORIZATION_FAILED, and auto-creation happens
  under the principal's identity (its CREATE permission), never the proxy's.

Each answer is cached per (principal, topic) for ``ttl_s`` (``acl_cache_ms``), process-wide: a
revoked ACL takes effect at the proxy within that time plus the time Kafka takes to apply it. A
topic that does not exist is never cached. The cache holds at most ``max_entries`` answers; the
oldest go first.

Concurrency: used from the asyncio loop thread only (no locks). A link failure raises
``proxy.auth.broker_link.LinkError``; the connection is then closed (proxy/kafka/server.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import kafka.errors as kerr
from kafka.protocol.metadata import MetadataRequest

from kdelay.proxy.auth.broker_link import Link
from kdelay.proxy.routing import internal_topics
from kdelay.proxy.routing.topics import Advertised, TopicInfo, metadata_response
from kdelay.proxy.sasl import Principal
from kdelay.proxy.wire import records as rec

#: Kafka's AclOperation codes: ALL, WRITE and ALTER.
ALL: Final = 2
WRITE: Final = 4
ALTER: Final = 7
TOPIC_DENIED: Final = kerr.TopicAuthorizationFailedError.errno
#: The Metadata version links ask (authorized operations from v8; topic names up to v12).
METADATA_VERSION: Final = 12


@dataclass(frozen=True, slots=True)
class Access:
    """Kafka's answer for one topic: an error code (0: described) and the operations."""

    error_code: int
    #: AclOperation codes; None when Kafka did not say (an error, or not asked).
    operations: frozenset[int] | None = None
    partitions: int = 0

    @property
    def writable(self) -> bool:
        return self.error_code == 0 and self.operations is not None and WRITE in self.operations

    @property
    def alterable(self) -> bool:
        """ALTER (or ALL) allowed: on the buffer topic, a kdelay administrator."""
        ops = self.operations
        return self.error_code == 0 and ops is not None and bool(ops & {ALTER, ALL})


def unauthorized(message: str, raw: bytes | None) -> rec.BatchError:
    """A partition's refusal for a topic its principal may not WRITE (``unwritable``'s
    message), counting the records of its batch ``raw``."""
    records = rec.count(bytes(raw) if raw else b"")
    return rec.BatchError(TOPIC_DENIED, message, records, reason="topic_authorization")


class AclCache:
    """Kafka's answers per (principal, topic), each for ``ttl_s`` (see the module docstring)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[Access, float]] = OrderedDict()

    def get(self, principal: Principal, topic: str) -> Access | None:
        key = (str(principal), topic)
        found = self._entries.get(key)
        if found is None:
            return None
        if found[1] <= self.clock():
            del self._entries[key]
            return None
        return found[0]

    def put(self, principal: Principal, topic: str, access: Access) -> None:
        if self.ttl_s <= 0:
            return
        key = (str(principal), topic)
        self._entries.pop(key, None)
        self._entries[key] = (access, self.clock() + self.ttl_s)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class TopicAccess:
    """What one connection's principal may do with topics, asked of Kafka on its link."""

    def __init__(self, principal: Principal, link: Link, cache: AclCache) -> None:
        self.principal = principal
        self.link = link
        self.cache = cache
        #: Upstream's cluster id, as the last Metadata on the link said.
        self.cluster_id: str | None = None

    async def unwritable(self, topics: Iterable[str]) -> dict[str, str]:
        """The topics among ``topics`` the principal may not WRITE, each with the message for
        its partitions; cached answers first, one Metadata request for the rest. A topic that
        does not exist (and that it may DESCRIBE) is not refused here: the produce path answers
        UNKNOWN_TOPIC_OR_PARTITION for it."""
        wanted = dict.fromkeys(topics)
        known: dict[str, Access] = {}
        missing = []
        for topic in wanted:
            cached = self.cache.get(self.principal, topic)
            if cached is None:
                missing.append(topic)
            else:
                known[topic] = cached
        if missing:
            known.update(await self.ask(missing, create=False))
        refused = {}
        for topic in wanted:
            access = known.get(topic)
            if access is None or access.error_code == kerr.UnknownTopicOrPartitionError.errno:
                continue
            if not access.writable:
                refused[topic] = (
                    f"Kafka's ACLs do not allow {self.principal} to WRITE topic {topic} "
                    "(through the kdelay proxy as directly)"
                )
        return refused

    async def admin(self, buffer_topic: str) -> bool:
        """Whether the principal is a kdelay administrator: Kafka allows it ALTER (or ALL) on
        ``buffer_topic`` (Kafka's super users thus are). An administrator may cancel, replace
        and read any principal's messages (proxy/auth/owners.py). Cached like WRITE answers."""
        access = self.cache.get(self.principal, buffer_topic)
        if access is None:
            access = (await self.ask([buffer_topic], create=False)).get(buffer_topic)
        return access is not None and access.alterable

    async def ask(self, topics: list[str] | None, *, create: bool) -> dict[str, Access]:
        """Kafka's answer for ``topics`` (None: every topic the principal may DESCRIBE), each
        cached unless it does not exist; ``create`` lets Kafka auto-create a missing topic
        under the principal's identity, as the client's own Metadata request asked."""
        request = MetadataRequest(
            topics=None
            if topics is None
            else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=create,
            include_topic_authorized_operations=True,
            version=METADATA_VERSION,
        )
        response = await self.link.request(request)
        self.cluster_id = response.cluster_id
        found: dict[str, Access] = {}
        for t in response.topics:
            if t.name is None:
                continue
            access = Access(
                int(t.error_code),
                None if t.authorized_operations is None else frozenset(t.authorized_operations),
                len(t.partitions),
            )
            found[t.name] = access
            if access.error_code in (0, TOPIC_DENIED):
                self.cache.put(self.principal, t.name, access)
        return found

    async def answer_metadata(self, advertised: Advertised, req: Any) -> tuple[Any, int]:
        """The Metadata response to a client's ``req`` as Kafka answers its principal (see
        the module docstring), and its lowest error code (0: none). Internal topics are
        refused or left out as for every client (proxy/routing/internal_topics.py)."""
        body, version = req.body, req.api_version
        # Before v4 a Metadata request always allowed auto-creation (KIP-204).
        allow = bool(body.allow_auto_topic_creation) if version >= 4 else True
        requested = body.topics
        infos: dict[str, TopicInfo]
        if requested is None or (version == 0 and not requested):
            seen = await self.ask(None, create=False)
            infos = {
                name: TopicInfo(a.error_code, a.partitions)
                for name, a in seen.items()
                if internal_topics.visible(name) and a.error_code != TOPIC_DENIED
            }
        else:
            names = [t.name for t in requested if t.name is not None]
            asked = [n for n in dict.fromkeys(names) if internal_topics.visible(n)]
            seen = await self.ask(asked, create=allow) if asked else {}
            denied = Access(TOPIC_DENIED)
            infos = {}
            for n in names:
                a = seen.get(n, denied)
                infos[n] = TopicInfo(a.error_code, a.partitions if a.error_code == 0 else 0)
        errors = {i.error_code for i in infos.values()} - {0}
        response = metadata_response(version, advertised, self.cluster_id, infos)
        return response, min(errors) if errors else 0
