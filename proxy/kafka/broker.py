"""The broker facade: what the proxy answers to each Kafka API it implements.

Producers get ApiVersions, Metadata, InitProducerId and Produce; a consumer pointed at the proxy
gets an authorization error naming where to read instead (proxy/kafka/refusals.py).

Concurrency and ordering contract: each handler runs in two stages so that a connection's
requests reach upstream in the order the client sent them (KIP-98 sequences need it) while their
acknowledgements are awaited concurrently. ``handle`` (stage 1) is awaited by the connection's
reader, one request at a time; it validates, checks sequences and hands records to librdkafka,
then returns an awaitable (stage 2) that yields the reply once upstream acknowledged.
Everything here runs on the asyncio loop thread; blocking metadata lookups go to worker threads
(proxy/routing/topics.py).

A Produce request's partitions go through, in this order (the reading and routing steps are
proxy/kafka/batch_routing.py's): the topic must not be an internal one
(proxy/routing/internal_topics.py), and it and the partition must exist upstream
(proxy/routing/topics.py); the batch is framed and decompressed (proxy/wire/records.py); its
sequence is checked for idempotent producers (proxy/kafka/idempotence.py); its records are parsed
(proxy/wire/records.py), held to the record limits and routed (proxy/routing/route.py,
proxy/limits.py); upstream gets them (proxy/upstream/producer.py). A request's cancels reach
upstream after every other record of the request, in the order the request lists them: so a message
sent in the same request as its cancel always precedes it in the buffer topic and is cancelled
whatever the clocks (README "Cancelling a message"). Behind SASL, delayed records and cancels carry
the connection's principal, and a cancel or replace of another principal's message is refused
(proxy/auth/owners.py, README "Message owners").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kafka.errors as kerr
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from kdelay import clock, logs
from kdelay.headers import DelayPolicy
from kdelay.proxy.auth.authorization import TopicAccess, unauthorized
from kdelay.proxy.auth.owners import Owners
from kdelay.proxy.kafka.batch_routing import BatchRouter
from kdelay.proxy.kafka.idempotence import (
    NO_PRODUCER_ID,
    PartitionResult,
    ProducerRegistry,
    Verdict,
)
from kdelay.proxy.kafka.refusals import APIS as CONSUMER_APIS
from kdelay.proxy.kafka.refusals import (
    TRANSACTIONAL_DENIED,
    TRANSACTIONAL_MESSAGE,
    ConsumerRefusals,
    refuse_transactional,
)
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.buffer_keys import ACCEPTANCE_ORDER, AcceptanceOrder, Origin
from kdelay.proxy.routing.cancel_acks import (
    CancelAcks,
    Cancels,
    after_cancels,
    submit_cancels,
)
from kdelay.proxy.routing.route import (
    DEFAULT_LIMITS,
    Kind,
    UpstreamPort,
)
from kdelay.proxy.routing.topics import Advertised, Topics, answer_metadata
from kdelay.proxy.upstream.producer import UpstreamError
from kdelay.proxy.wire import protocol as p
from kdelay.proxy.wire import records as rec

log = logs.get(__name__)

_PartitionResponse = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
_RecordError = _PartitionResponse.BatchIndexAndErrorMessage
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's outcome: the response to encode (None: send nothing, as for acks=0) or a
    ready-made frame, and the labels for the request metrics."""

    response: Any = None
    result: str = "ok"
    path: str | None = None
    frame: bytes | None = None


def resolved(value: _T) -> Awaitable[_T]:
    """An awaitable that is done already: stage 2 of a request answered in stage 1."""
    future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class Broker:
    """Implements ApiVersions, Metadata, InitProducerId and Produce over an upstream Kafka, and
    refuses consumers (Fetch, ListOffsets, FindCoordinator) naming ``consume_from``.

    Built once the Kafka listener is bound, so ``advertised`` is where clients reach it."""

    def __init__(
        self,
        upstream: UpstreamPort,
        topics: Topics,
        metrics: ProxyMetrics,
        advertised: Advertised,
        *,
        policy: DelayPolicy | None = None,
        producers: ProducerRegistry | None = None,
        limits: RecordLimits = DEFAULT_LIMITS,
        max_decompressed_bytes: int = 100 * 1024 * 1024,
        clock_ms: Callable[[], int] = clock.now_ms,
        consume_from: str = "the upstream Kafka cluster's bootstrap servers",
        order: AcceptanceOrder = ACCEPTANCE_ORDER,
        cancel_acks: CancelAcks | None = None,
        sasl: bool = False,
        owners: Owners | None = None,
    ) -> None:
        self.upstream = upstream
        self.topics = topics
        self.metrics = metrics
        self.advertised = advertised
        self.policy = policy or DelayPolicy()
        self.producers = producers or ProducerRegistry()
        self.consumers = ConsumerRefusals(consume_from)
        self.batches = BatchRouter(
            topics, self.policy, limits, max_decompressed_bytes, clock_ms, order=order
        )
        self.cancel_acks = cancel_acks
        #: The listener speaks SASL (proxy/kafka/auth_session.py): ApiVersions lists its APIs.
        self.sasl = sasl
        #: Who owns a message, asked of the replicas (None: owners are never asked).
        self.owners = owners or Owners(lambda: None)

    async def handle(self, req: p.Request, access: TopicAccess | None = None) -> Awaitable[Reply]:
        """Stage 1 of ``req``; the returned awaitable is stage 2 (see the module docstring).
        ``access`` is what the connection's SASL principal may do (proxy/auth/authorization.py);
        None on a listener without SASL."""
        if req.api_key == p.PRODUCE:
            return await self._produce(req, access)
        if req.api_key == p.METADATA:
            if access is not None:
                response, error = await access.answer_metadata(self.advertised, req)
            else:
                response, error = await answer_metadata(self.topics, self.advertised, req)
            return resolved(Reply(response, p.error_name(error) if error else "ok"))
        if req.api_key == p.API_VERSIONS:
            return resolved(Reply(p.api_versions_response(req.api_version, sasl=self.sasl)))
        if req.api_key == p.INIT_PRODUCER_ID:
            return resolved(self._init_producer_id(req, access))
        if req.api_key in CONSUMER_APIS:
            response, code = self.consumers.answer(req)
            return resolved(Reply(response, p.error_name(code)))
        raise p.UnsupportedApiError(req.api_key, req.api_version, req.correlation_id)

    # -- init producer id -----------------------------------------------------------------

    def _init_producer_id(self, req: p.Request, access: TopicAccess | None = None) -> Reply:
        body = req.body
        if body.transactional_id is not None:
            return Reply(refuse_transactional(req), p.error_name(TRANSACTIONAL_DENIED))
        pid_in = body.producer_id if req.api_version >= 3 else NO_PRODUCER_ID
        epoch_in = body.producer_epoch if req.api_version >= 3 else -1
        owner = None if access is None else str(access.principal)  # one principal per id
        pid, epoch = self.producers.init_producer(pid_in, epoch_in, owner=owner)
        return Reply(
            InitProducerIdResponse(
                throttle_time_ms=0,
                error_code=0,
                producer_id=pid,
                producer_epoch=epoch,
                version=req.api_version,
            )
        )

    # -- produce --------------------------------------------------------------------------

    async def _produce(self, req: p.Request, access: TopicAccess | None = None) -> Awaitable[Reply]:
        body = req.body
        started = time.perf_counter()
        reject: tuple[int, str] | None = None
        if body.transactional_id is not None:
            reject = (TRANSACTIONAL_DENIED, TRANSACTIONAL_MESSAGE)
        elif body.acks not in (-1, 0, 1):
            reject = (kerr.InvalidRequiredAcksError.errno, f"acks={body.acks} is not -1, 0 or 1")
        # Kafka's ACLs: a topic the principal may not WRITE is refused, all its records alike.
        denied = {}
        if access is not None and reject is None:
            denied = await access.unwritable(td.name for td in body.topic_data)
        parts: list[tuple[str, int, Awaitable[PartitionResult]]] = []
        kinds: set[Kind] = set()
        cancels: list[Cancels] = []
        try:
            for td in body.topic_data:
                for pd in td.partition_data:
                    if reject is not None:
                        refused = PartitionResult(reject[0], error_message=reject[1])
                        parts.append((td.name, pd.index, resolved(refused)))
                        continue
                    if td.name in denied:
                        exc = unauthorized(denied[td.name], pd.records)
                        result = self._rejected(exc, td.name, pd.index, exc.records)
                        parts.append((td.name, pd.index, resolved(result)))
                        continue
                    fut = await self._produce_partition(
                        td.name, pd.index, pd.records, kinds, cancels, access=access
                    )
                    parts.append((td.name, pd.index, fut))
        finally:
            await submit_cancels(self.upstream, cancels)
        path = "delayed" if kinds & {Kind.DELAYED, Kind.CANCEL} else "immediate"
        return self._produce_reply(req, parts, started, path)

    async def _produce_reply(
        self,
        req: p.Request,
        parts: list[tuple[str, int, Awaitable[PartitionResult]]],
        started: float,
        path: str,
    ) -> Reply:
        results = [(t, i, await f) for t, i, f in parts]
        self.metrics.produce_latency.labels(path).observe(time.perf_counter() - started)
        by_topic: dict[str, list[Any]] = {}
        for topic, index, r in results:
            by_topic.setdefault(topic, []).append(
                _PartitionResponse(
                    index=index,
                    error_code=r.error_code,
                    base_offset=r.base_offset,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                    record_errors=[
                        _RecordError(batch_index=bi, batch_index_error_message=m)
                        for bi, m in r.record_errors
                    ],
                    error_message=r.error_message,
                )
            )
        errors = [r.error_code for _, _, r in results if r.error_code]
        result = p.error_name(errors[0]) if errors else "ok"
        if req.body.acks == 0:
            return Reply(None, result, path)
        response = ProduceResponse(
            responses=[
                ProduceResponse.TopicProduceResponse(name=t, partition_responses=prs)
                for t, prs in by_topic.items()
            ],
            throttle_time_ms=0,
            version=req.api_version,
        )
        return Reply(response, result, path)

    def _rejected(
        self, exc: rec.BatchError, topic: str, partition: int, records: int
    ) -> PartitionResult:
        """Count and log a rejected batch of ``records``; the partition's answer."""
        self.metrics.rejected(exc.reason, records)
        log.info(
            "proxy.batch_rejected",
            topic=topic,
            partition=partition,
            error=str(exc),
            reason=exc.reason,
        )
        return PartitionResult(exc.code, -1, str(exc), exc.record_errors)

    async def _produce_partition(
        self,
        topic: str,
        partition: int,
        raw: bytes | None,
        kinds: set[Kind],
        cancels: list[Cancels],
        *,
        access: TopicAccess | None = None,
    ) -> Awaitable[PartitionResult]:
        """Stage 1 of one partition; its cancels are put on ``cancels`` (``_produce`` submits
        them after the request's other records). ``access``: the SASL principal's, whose
        cancels and replaces are held to the messages' owners (proxy/auth/owners.py)."""
        loop = asyncio.get_running_loop()
        try:
            batch, parts = await self.batches.admit(topic, partition, raw)
        except rec.BatchError as exc:
            return resolved(self._rejected(exc, topic, partition, exc.records))
        count = batch.last_offset_delta + 1
        entry = None
        pid = batch.producer_id
        if pid is not None and pid != NO_PRODUCER_ID:
            check = self.producers.check(
                pid,
                batch.producer_epoch,
                topic,
                partition,
                base_seq=batch.base_sequence,
                last_seq=batch.last_sequence,
                loop=loop,
                owner=None if access is None else str(access.principal),
            )
            if check.verdict is Verdict.REJECT:
                assert check.error is not None
                self.metrics.rejected("producer_state", count)
                return resolved(check.error)
            assert check.entry is not None
            if check.verdict is Verdict.DUPLICATE:
                log.info("proxy.duplicate_batch", topic=topic, partition=partition, producer_id=pid)
                return asyncio.shield(check.entry.result)
            entry = check.entry

        def settle(result: PartitionResult) -> Awaitable[PartitionResult]:
            if entry is None:
                return resolved(result)
            self.producers.complete(pid, topic, partition, entry, result)
            return entry.result

        origin = None
        if pid is not None and pid != NO_PRODUCER_ID:
            origin = Origin(pid, batch.producer_epoch, batch.base_sequence)
        owner = None if access is None else str(access.principal)
        try:
            routed, counts = await self.batches.route(topic, partition, parts, origin, owner)
            # A cancel, or a replace (a delayed record: immediate-only batches never look).
            cancelling = counts[Kind.CANCEL] or (
                counts[Kind.DELAYED] and any(r.replace for r in routed)
            )
            if access is not None and cancelling:
                routed = await self.owners.check_batch(routed, access)
        except rec.BatchError as exc:
            return settle(self._rejected(exc, topic, partition, count))
        kinds.update(k for k, n in counts.items() if n)
        if not counts[Kind.CANCEL]:
            acked: Awaitable[int] = await self.upstream.submit(routed)
        else:
            slot: asyncio.Future[Awaitable[int]] = loop.create_future()
            cancels.append(([r for r in routed if r.kind is Kind.CANCEL], slot))
            first = await self.upstream.submit([r for r in routed if r.kind is not Kind.CANCEL])
            acked = after_cancels(first, slot)
        if self.cancel_acks is not None and cancelling:
            acked = self.cancel_acks.held(acked)
        return loop.create_task(self._finish(counts, acked, settle))

    async def _finish(
        self,
        counts: dict[Kind, int],
        acked: Awaitable[int],
        settle: Callable[[PartitionResult], Awaitable[PartitionResult]],
    ) -> PartitionResult:
        try:
            # The offset of the first record written to its own partition: the first
            # immediate one (delayed records and cancels go to the buffer topic, partition -1).
            base = await acked
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(p.error_name(exc.code)).inc()
            result = PartitionResult(exc.code, -1, str(exc))
        else:
            for kind, n in counts.items():
                if n:
                    self.metrics.records_by_kind[kind].inc(n)
            result = PartitionResult(0, base)
        return await settle(result)
