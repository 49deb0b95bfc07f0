"""The broker facade: what the proxy answers to each Kafka API it implements.

Each handler runs in two stages so that a connection's requests reach upstream in the order the
client sent them (KIP-98 sequences need it) while their acknowledgements are awaited
concurrently: ``handle`` (stage 1) is awaited by the connection's reader, one request at a time;
it validates, checks sequences and hands records to librdkafka, then returns an awaitable
(stage 2) that yields the reply once upstream acknowledged. Everything here runs on the asyncio
loop thread; blocking metadata lookups go to worker threads.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import kafka.errors as kerr
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from kdelay import buffer, logs
from kdelay.errors import InvalidHeaderError
from kdelay.headers import DelayPolicy
from proxy import protocol as p
from proxy import records as rec
from proxy.decompress import DecompressError, TooLargeError, decompress
from proxy.idempotence import NO_PRODUCER_ID, PartitionResult, ProducerRegistry, Verdict
from proxy.metrics import ProxyMetrics
from proxy.routing import Incoming, Kind, Outgoing, has_control_header, route_record
from proxy.upstream import TopicInfo, UpstreamError

log = logs.get(__name__)

_ZERO_UUID = uuid.UUID(int=0)
_PartitionResponse = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
_RecordError = _PartitionResponse.BatchIndexAndErrorMessage
_MetaTopic = MetadataResponse.MetadataResponseTopic
_MetaPartition = _MetaTopic.MetadataResponsePartition


class UpstreamPort(Protocol):
    """What the broker needs from upstream Kafka (a fake in unit tests)."""

    cluster_id: str | None

    async def submit(self, records: list[Outgoing]) -> Awaitable[int]: ...

    def topic(self, name: str, *, create: bool) -> TopicInfo: ...

    def all_topics(self) -> dict[str, TopicInfo]: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's outcome: the response to encode (None: send nothing, as for acks=0) or a
    ready-made frame, and the labels for the request metrics."""

    response: Any = None
    result: str = "ok"
    path: str | None = None
    frame: bytes | None = None


def _done(reply: Reply) -> Awaitable[Reply]:
    future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    future.set_result(reply)
    return future


@dataclass(frozen=True, slots=True)
class Advertised:
    """How clients reach this proxy: the only broker in every Metadata response."""

    node_id: int
    host: str
    port: int


class Broker:
    """Implements ApiVersions, Metadata, InitProducerId and Produce over an upstream Kafka."""

    def __init__(
        self,
        upstream: UpstreamPort,
        metrics: ProxyMetrics,
        advertised: Advertised,
        *,
        policy: DelayPolicy | None = None,
        producers: ProducerRegistry | None = None,
        metadata_ttl_s: float = 5.0,
        max_decompressed_bytes: int = 100 * 1024 * 1024,
        clock_ms: Any = None,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.advertised = advertised
        self.policy = policy or DelayPolicy()
        self.producers = producers or ProducerRegistry()
        self.metadata_ttl_s = metadata_ttl_s
        self.max_decompressed_bytes = max_decompressed_bytes
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._topics: dict[str, tuple[TopicInfo, float]] = {}

    async def handle(self, req: p.Request) -> Awaitable[Reply]:
        """Stage 1 of ``req``; the returned awaitable is stage 2 (see the module docstring)."""
        if req.api_key == p.PRODUCE:
            return await self._produce(req)
        if req.api_key == p.METADATA:
            return _done(await self._metadata(req))
        if req.api_key == p.API_VERSIONS:
            return _done(Reply(p.api_versions_response(req.api_version)))
        if req.api_key == p.INIT_PRODUCER_ID:
            return _done(self._init_producer_id(req))
        raise p.UnsupportedApiError(req.api_key, req.api_version, req.correlation_id)

    # -- metadata -------------------------------------------------------------------------

    async def topic_info(self, name: str, *, create: bool = False) -> TopicInfo:
        """Upstream's view of ``name``, cached for ``metadata_ttl_s`` when it exists."""
        now = time.monotonic()
        cached = self._topics.get(name)
        if cached is not None and cached[1] > now:
            return cached[0]
        info = await asyncio.to_thread(self.upstream.topic, name, create=create)
        if info.error_code == 0 and info.partitions > 0:
            self._topics[name] = (info, now + self.metadata_ttl_s)
        return info

    async def _metadata(self, req: p.Request) -> Reply:
        body = req.body
        # Before v4 a Metadata request always allowed auto-creation (KIP-204).
        allow = bool(body.allow_auto_topic_creation) if req.api_version >= 4 else True
        requested = body.topics
        if requested is None or (req.api_version == 0 and not requested):
            infos = await asyncio.to_thread(self.upstream.all_topics)
        else:
            infos = {}
            for t in requested:
                if t.name is None:
                    continue
                infos[t.name] = await self.topic_info(t.name, create=allow)
        a = self.advertised
        topics = [self._meta_topic(name, info) for name, info in infos.items()]
        response = MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                MetadataResponse.MetadataResponseBroker(
                    node_id=a.node_id, host=a.host, port=a.port, rack=None
                )
            ],
            cluster_id=self.upstream.cluster_id,
            controller_id=a.node_id,
            topics=topics,
            error_code=0,
            version=req.api_version,
        )
        errors = {i.error_code for i in infos.values()} - {0}
        return Reply(response, p.error_name(min(errors)) if errors else "ok")

    def _meta_topic(self, name: str, info: TopicInfo) -> Any:
        node = self.advertised.node_id
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

    # -- init producer id -----------------------------------------------------------------

    def _init_producer_id(self, req: p.Request) -> Reply:
        body = req.body
        if body.transactional_id is not None:
            log.warning(
                "transactional_producer_refused",
                client_id=req.client_id,
                transactional_id=body.transactional_id,
                reason="the kdelay proxy supports idempotent, not transactional, producers",
            )
            code = kerr.TransactionalIdAuthorizationFailedError.errno
            return Reply(
                InitProducerIdResponse(
                    throttle_time_ms=0,
                    error_code=code,
                    producer_id=-1,
                    producer_epoch=-1,
                    version=req.api_version,
                ),
                p.error_name(code),
            )
        pid_in = body.producer_id if req.api_version >= 3 else NO_PRODUCER_ID
        epoch_in = body.producer_epoch if req.api_version >= 3 else -1
        pid, epoch = self.producers.init_producer(pid_in, epoch_in)
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

    async def _produce(self, req: p.Request) -> Awaitable[Reply]:
        body = req.body
        started = time.perf_counter()
        reject: tuple[int, str] | None = None
        if body.transactional_id is not None:
            reject = (
                kerr.TransactionalIdAuthorizationFailedError.errno,
                "transactional producers are not supported by the kdelay proxy",
            )
        elif body.acks not in (-1, 0, 1):
            reject = (kerr.InvalidRequiredAcksError.errno, f"acks={body.acks} is not -1, 0 or 1")
        parts: list[tuple[str, int, Awaitable[PartitionResult]]] = []
        kinds: set[Kind] = set()
        for td in body.topic_data:
            for pd in td.partition_data:
                if reject is not None:
                    done = asyncio.get_running_loop().create_future()
                    done.set_result(PartitionResult(reject[0], error_message=reject[1]))
                    parts.append((td.name, pd.index, done))
                    continue
                fut = await self._produce_partition(td.name, pd.index, pd.records, kinds)
                parts.append((td.name, pd.index, fut))
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

    async def _admit(
        self, topic: str, partition: int, raw: bytes | None
    ) -> tuple[Any, tuple[bytes | memoryview, ...]]:
        """The partition's batch header (kafka-python's) and the parts of the same batch
        uncompressed, when the topic exists and the batch is well-formed."""
        info = await self.topic_info(topic)
        if info.error_code or not 0 <= partition < info.partitions:
            raise _BatchError(
                kerr.UnknownTopicOrPartitionError.errno,
                f"{topic}-{partition} does not exist upstream",
            )
        data = bytes(raw) if raw else b""
        batch = _single_batch(data)
        if batch.is_transactional:
            raise _BatchError(
                kerr.TransactionalIdAuthorizationFailedError.errno,
                "transactional batches are not supported by the kdelay proxy",
                batch.last_offset_delta + 1,
            )
        return batch, _uncompressed(data, batch, self.max_decompressed_bytes)

    async def _produce_partition(
        self, topic: str, partition: int, raw: bytes | None, kinds: set[Kind]
    ) -> Awaitable[PartitionResult]:
        loop = asyncio.get_running_loop()
        try:
            batch, parts = await self._admit(topic, partition, raw)
        except _BatchError as exc:
            self.metrics.records.labels("rejected").inc(exc.records)
            log.info("batch_rejected", topic=topic, partition=partition, error=str(exc))
            return _ready(PartitionResult(exc.code, -1, str(exc)))
        count = batch.last_offset_delta + 1
        entry = None
        pid: int = batch.producer_id
        if pid is not None and pid != NO_PRODUCER_ID:
            check = self.producers.check(
                pid,
                batch.producer_epoch,
                topic,
                partition,
                base_seq=batch.base_sequence,
                last_seq=batch.last_sequence,
                loop=loop,
            )
            if check.verdict is Verdict.REJECT:
                assert check.error is not None
                self.metrics.records.labels("rejected").inc(count)
                return _ready(check.error)
            assert check.entry is not None
            if check.verdict is Verdict.DUPLICATE:
                log.info("duplicate_batch", topic=topic, partition=partition, producer_id=pid)
                return asyncio.shield(check.entry.result)
            entry = check.entry

        def settle(result: PartitionResult) -> Awaitable[PartitionResult]:
            if entry is None:
                return _ready(result)
            self.producers.complete(pid, topic, partition, entry, result)
            return entry.result

        try:
            routed, counts = _route(topic, partition, _records(parts), self.clock_ms(), self.policy)
        except _BatchError as exc:
            self.metrics.records.labels("rejected").inc(count)
            log.info("batch_rejected", topic=topic, partition=partition, error=str(exc))
            return settle(PartitionResult(exc.code, -1, str(exc), exc.record_errors))
        kinds.update(k for k, n in counts.items() if n)
        acked = await self.upstream.submit(routed)
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


def _ready(result: PartitionResult) -> Awaitable[PartitionResult]:
    future: asyncio.Future[PartitionResult] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


class _BatchError(Exception):
    """A partition's batch is refused as a whole (nothing of it is written)."""

    def __init__(
        self, code: int, message: str, records: int = 0, *, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.records = records
        self.record_errors: tuple[tuple[int, str | None], ...] = (
            ((index, message),) if index is not None else ()
        )


def _single_batch(raw: bytes) -> Any:
    """The one v2 record batch of a partition (Kafka requires exactly one since Produce v3)."""
    if not raw:
        raise _BatchError(kerr.InvalidRecordError.errno, "no record batch for this partition")
    try:
        records = MemoryRecords(raw)
        batches = []
        while records.has_next():
            batches.append(records.next_batch())
    except p.DECODE_ERRORS as exc:
        raise _BatchError(
            kerr.CorruptRecordError.errno, f"malformed record batch: {exc!r}"
        ) from None
    if len(batches) != 1:
        raise _BatchError(
            kerr.InvalidRecordError.errno,
            f"a produce request must carry one record batch per partition, got {len(batches)}",
        )
    batch = batches[0]
    if batch.magic != 2:
        raise _BatchError(
            kerr.UnsupportedForMessageFormatError.errno,
            f"record batch format v{batch.magic}; the proxy accepts v2 only",
        )
    if not batch.validate_crc():
        raise _BatchError(kerr.CorruptRecordError.errno, "record batch CRC mismatch")
    if batch.is_control_batch:
        raise _BatchError(kerr.InvalidRecordError.errno, "control batches are not accepted")
    return batch


_ATTRIBUTES_LOW_BYTE = DefaultRecordBatch.ATTRIBUTES_OFFSET + 1
_CODEC_MASK = DefaultRecordBatch.CODEC_MASK


def _uncompressed(raw: bytes, batch: Any, limit: int) -> tuple[bytes | memoryview, ...]:
    """``batch`` (the first and only one in ``raw``, CRC already checked) with its records
    decompressed within ``limit`` bytes: the parts of an uncompressed batch, header first, for
    proxy/records.py to parse.

    The record parsers would decompress without any bound (proxy/decompress.py says why not)."""
    codec = batch.compression_type
    if codec == 0:
        return (memoryview(raw)[: batch.size_in_bytes],)
    try:
        records = decompress(codec, memoryview(raw)[rec.HEADER_SIZE : batch.size_in_bytes], limit)
    except TooLargeError as exc:
        raise _BatchError(
            kerr.RecordListTooLargeError.errno, str(exc), batch.last_offset_delta + 1
        ) from None
    except DecompressError as exc:
        raise _BatchError(kerr.CorruptRecordError.errno, str(exc)) from None
    header = bytearray(raw[: rec.HEADER_SIZE])
    header[_ATTRIBUTES_LOW_BYTE] &= ~_CODEC_MASK & 0xFF
    return (bytes(header), records)


def _records(parts: tuple[bytes | memoryview, ...]) -> list[rec.Record]:
    """The records of an uncompressed batch (aiokafka's compiled parser, proxy/records.py)."""
    try:
        return list(rec.parse(*parts))
    except Exception as exc:  # noqa: BLE001 - the parser raises several error types
        raise _BatchError(
            kerr.CorruptRecordError.errno, f"cannot decode the record batch: {exc!r}"
        ) from None


def _route(
    topic: str, partition: int, records: list[rec.Record], now_ms: int, policy: DelayPolicy
) -> tuple[list[Outgoing], dict[Kind, int]]:
    """The records to write upstream, and how many of each kind."""
    out: list[Outgoing] = []
    append = out.append
    immediate = Kind.IMMEDIATE
    counts = dict.fromkeys(Kind, 0)
    to_buffer = topic == buffer.BUFFER_TOPIC
    for i, r in enumerate(records):
        headers = r.headers  # a new list per record: the parser's, not shared
        if not (to_buffer or (headers and has_control_header(headers))):
            # The common case, kept to one tuple per record: no header can be a control one.
            ts = r.timestamp
            append(
                Outgoing(
                    immediate,
                    topic,
                    partition,
                    r.key,
                    r.value,
                    headers,
                    ts if ts is not None and ts >= 0 else None,
                )
            )
            continue
        try:
            ts = r.timestamp
            incoming = Incoming(r.key, r.value, headers, ts if ts is not None and ts >= 0 else None)
            routed = route_record(topic, partition, incoming, now_ms, policy)
        except InvalidHeaderError as exc:
            raise _BatchError(kerr.InvalidRecordError.errno, str(exc), index=i) from None
        if to_buffer and routed.kind is immediate:
            raise _BatchError(
                kerr.InvalidRecordError.errno,
                f"{buffer.BUFFER_TOPIC} is written by the proxy only; send kdelay headers",
                index=i,
            )
        counts[routed.kind] += 1
        append(routed)
    counts[immediate] = len(out) - counts[Kind.DELAYED] - counts[Kind.CANCEL]
    return out, counts
