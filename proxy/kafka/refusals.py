"""The clients the proxy does not serve, consumers and transactional producers, and what it
tells them.

The proxy serves producers only. Rather than close the connection of a client that asks for
anything else (which clients report as something unrelated and retry for ever), it answers the
APIs a consumer starts with, and FindCoordinator, with an *authorization* error, which most
clients treat as permanent and report to the application. What each client shows of it is in the
README, "Consumers and transactional producers": the messages below reach librdkafka-based
clients; others show their generic text for the error code.

- Fetch: ``TOPIC_AUTHORIZATION_FAILED`` for every partition asked for. The response's top-level
  error stays 0 on purpose: it is meant for fetch sessions, and a client that sees one drops
  the response's partitions and fetches again at once (kafka-python and the Java client's
  fetch-session handler would loop); librdkafka reports the partitions' errors either way.
  Fetch carries no error message.
- ListOffsets: ``TOPIC_AUTHORIZATION_FAILED`` for every partition (no message field either).
- FindCoordinator: ``GROUP_AUTHORIZATION_FAILED`` for a consumer or share group,
  ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` for a transactional id, with an error message
  (v1 and up) naming the Kafka bootstrap servers to consume from, or saying that transactions
  are not supported.
- InitProducerId with a transactional id (a Java producer sends it before FindCoordinator):
  ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` (the response has no message field).

The Fetch answer comes at once; librdkafka backs off (``fetch.error.backoff.ms``) before it
fetches again on the same connection, so a consumer costs a request every half second, not a
reconnection. A structured log line (``proxy.consumer_refused``) names the client, at most once
a minute per client and API.

Used from the asyncio loop thread only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import kafka.errors as kerr
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import FindCoordinatorResponse
from kafka.protocol.producer import InitProducerIdResponse

from kdelay import logs
from kdelay.proxy.wire import protocol as p

log = logs.get(__name__)

_ZERO_UUID: Final = uuid.UUID(int=0)
_FetchTopic = FetchResponse.FetchableTopicResponse
_FetchPartition = _FetchTopic.PartitionData
_OffsetsTopic = ListOffsetsResponse.ListOffsetsTopicResponse
_OffsetsPartition = _OffsetsTopic.ListOffsetsPartitionResponse
#: FindCoordinator key types (KIP-98 transactions, KIP-932 share groups).
_TRANSACTION: Final = 1

TOPIC_DENIED: Final = kerr.TopicAuthorizationFailedError.errno
GROUP_DENIED: Final = kerr.GroupAuthorizationFailedError.errno
TRANSACTIONAL_DENIED: Final = kerr.TransactionalIdAuthorizationFailedError.errno

#: The consumer-facing APIs answered here.
APIS: Final = frozenset({p.FETCH, p.LIST_OFFSETS, p.FIND_COORDINATOR})
#: The most log keys remembered before the throttle forgets them all.
_MAX_LOG_KEYS: Final = 1_000


def consumer_message(consume_from: str) -> str:
    """What a consumer is told: where to read instead."""
    return (
        "the kdelay proxy serves producers only and coordinates no consumer group; consume "
        f"from Kafka directly (bootstrap.servers={consume_from})"
    )


TRANSACTIONAL_MESSAGE: Final = (
    "the kdelay proxy supports idempotent, not transactional, producers: "
    "remove transactional.id (keep enable.idempotence)"
)


def refuse_transactional(req: p.Request) -> Any:
    """The InitProducerId answer to a transactional producer (``req`` has a transactional id)."""
    log.warning(
        "proxy.transactional_producer_refused",
        client_id=req.client_id,
        transactional_id=req.body.transactional_id,
        reason=TRANSACTIONAL_MESSAGE,
    )
    return InitProducerIdResponse(
        throttle_time_ms=0,
        error_code=TRANSACTIONAL_DENIED,
        producer_id=-1,
        producer_epoch=-1,
        version=req.api_version,
    )


class ConsumerRefusals:
    """Answers Fetch, ListOffsets and FindCoordinator (see the module docstring).

    ``consume_from`` is what consumers are told to use as ``bootstrap.servers``: the upstream
    Kafka cluster's bootstrap servers."""

    def __init__(
        self,
        consume_from: str,
        *,
        log_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consume_from = consume_from
        self.message = consumer_message(consume_from)
        self.log_every_s = log_every_s
        self.clock = clock
        self._logged: dict[tuple[str | None, int], float] = {}

    def answer(self, req: p.Request) -> tuple[Any, int]:
        """The response to ``req`` (one of :data:`APIS`) and the error code it carries."""
        if req.api_key == p.FETCH:
            response, code = self._fetch(req), TOPIC_DENIED
        elif req.api_key == p.LIST_OFFSETS:
            response, code = self._list_offsets(req), TOPIC_DENIED
        else:
            response, code = self._find_coordinator(req)
        self._log(req, code)
        return response, code

    def _fetch(self, req: p.Request) -> Any:
        return FetchResponse(
            throttle_time_ms=0,
            error_code=0,  # not a session error: see the module docstring
            session_id=0,
            responses=[
                _FetchTopic(
                    topic=t.topic,
                    topic_id=_ZERO_UUID,
                    partitions=[
                        _FetchPartition(
                            partition_index=fp.partition,
                            error_code=TOPIC_DENIED,
                            high_watermark=-1,
                            last_stable_offset=-1,
                            log_start_offset=-1,
                            aborted_transactions=None,
                            preferred_read_replica=-1,
                            records=b"",  # librdkafka refuses a null record set
                        )
                        for fp in t.partitions
                    ],
                )
                for t in req.body.topics
            ],
            node_endpoints=[],
            version=req.api_version,
        )

    def _list_offsets(self, req: p.Request) -> Any:
        return ListOffsetsResponse(
            throttle_time_ms=0,
            topics=[
                _OffsetsTopic(
                    name=t.name,
                    partitions=[
                        _OffsetsPartition(
                            partition_index=lp.partition_index,
                            error_code=TOPIC_DENIED,
                            old_style_offsets=[],
                            timestamp=-1,
                            offset=-1,
                            leader_epoch=-1,
                        )
                        for lp in t.partitions
                    ],
                )
                for t in req.body.topics
            ],
            version=req.api_version,
        )

    def _find_coordinator(self, req: p.Request) -> tuple[Any, int]:
        body = req.body
        transactional = req.api_version >= 1 and body.key_type == _TRANSACTION
        code, message = (
            (TRANSACTIONAL_DENIED, TRANSACTIONAL_MESSAGE)
            if transactional
            else (GROUP_DENIED, self.message)
        )
        keys = list(body.coordinator_keys) if req.api_version >= 4 else []
        response = FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=-1,
            host="",
            port=-1,
            coordinators=[
                FindCoordinatorResponse.Coordinator(
                    key=key, node_id=-1, host="", port=-1, error_code=code, error_message=message
                )
                for key in keys
            ],
            version=req.api_version,
        )
        return response, code

    def _log(self, req: p.Request, code: int) -> None:
        """``proxy.consumer_refused``, at most once per ``log_every_s`` per client and API."""
        now = self.clock()
        key = (req.client_id, req.api_key)
        last = self._logged.get(key)
        if last is not None and now - last < self.log_every_s:
            return
        if len(self._logged) >= _MAX_LOG_KEYS:
            self._logged.clear()
        self._logged[key] = now
        log.warning(
            "proxy.consumer_refused",
            client_id=req.client_id,
            api=p.API_NAMES[req.api_key],
            error=p.error_name(code),
            consume_from=self.consume_from,
            reason="the kdelay proxy serves producers only",
        )
