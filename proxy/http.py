"""The proxy's HTTP API (CONTRACT.md): produce delayed, cancel, health, readiness, metrics.

Runs on the same asyncio loop as the Kafka listener (uvicorn). A posted message is routed like a
produced record (proxy/routing.py), so both reject the same values with the same reason, and its
topic is looked up in the listener's topic cache (proxy/topics.py). Every error is JSON
``{"error": ...}`` naming the field or setting at fault, with the statuses of
proxy/http_errors.py: 400 for a body that is not a JSON object or a field's bad value, 413 for
a size over a limit (the proxy's, proxy/limits.py, or upstream's), 503 only while upstream Kafka
is unavailable. A record is acknowledged (202) only once upstream Kafka has it.

A posted message with an ``id`` gets a buffer key derived from its content (README "HTTP API"):
the same POST sent again (a client retrying after a timeout) writes the same buffer record again,
which the replicas keep once, while a different message with the same id is a new message.

``GET /v1/messages/{id}`` (a message's status) and ``GET /v1/pending`` (the pending timeline) are
answered by a delay-service replica, found through ZooKeeper and asked over HTTP by
``zk/replica_api.py`` on a worker thread (at most :data:`REPLICA_QUESTIONS` at once); the
replica's document, freshness included, is passed on as it is (docs/status.md). 404: no replica
knows the id; 503 with ``Retry-After``: no replica answered in ``replica_timeout_ms`` /
``pending_timeout_ms``; 503 without it: ``zk_connect`` is not set, so the proxy cannot find them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from confluent_kafka import KafkaException
from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from kdelay import buffer, logs
from kdelay import headers as h
from kdelay.durations import duration_ms
from kdelay.errors import InvalidHeaderError
from kdelay.headers import DelayPolicy
from proxy import http_errors, internal_topics
from proxy.availability import UpstreamAvailability
from proxy.budget import RequestBudget
from proxy.http_errors import (
    ApiError,
    BadRequestError,
    BodyLimit,
    ForbiddenTopicError,
    OverLimitError,
    Problem,
    UnavailableError,
    upstream_refusal,
)
from proxy.internal_topics import RefusedTopicError
from proxy.limits import RecordLimits
from proxy.metrics import ProxyMetrics
from proxy.routing import (
    DEFAULT_LIMITS,
    Incoming,
    Kind,
    Origin,
    Outgoing,
    RejectedRecordError,
    cancel,
    route,
    wall_clock_ms,
)
from proxy.topics import Topics
from proxy.upstream import Upstream, UpstreamError
from zk.replica_api import NoReplicaError, ReplicaAnswer, ReplicaApi

log = logs.get(__name__)

_FIELD_OF_HEADER = {
    h.DELAY_MS: "delay_ms",
    h.DELIVER_AT: "deliver_at",
    h.DELAY_LEVEL: "delay_level",
    h.ID: "id",
    h.REPEAT: "repeat",
    h.CANCEL: "id",
}
TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"


class MessageIn(BaseModel):
    """A message to deliver later. Exactly one of delay_ms, deliver_at, delay_level."""

    model_config = ConfigDict(extra="forbid")

    topic: Annotated[str, Field(pattern=TOPIC_PATTERN, description="target topic")]
    partition: Annotated[
        int | None, Field(ge=0, le=2**31 - 1, description="target partition; absent: by key")
    ] = None
    key: str | None = Field(default=None, description="UTF-8 key; absent: null key")
    value: str | None = Field(default=None, description="UTF-8 value")
    value_b64: str | None = Field(default=None, description="base64 value (binary)")
    headers: dict[str, str] | None = Field(default=None, description="record headers")
    delay_ms: Annotated[int | None, Field(ge=0)] = None
    deliver_at: int | str | None = Field(
        default=None, description="epoch milliseconds or an RFC 3339 timestamp"
    )
    delay_level: Annotated[int | None, Field(ge=1)] = None
    id: str | None = Field(default=None, description="message id, 1-255 bytes")
    repeat: str | None = Field(
        default=None,
        description=(
            "a recurring message (the kdelay-repeat header): R5/PT1S, R/PT1H/<end>, "
            "exp:1s,2,1m,8 or cron:CRON_TZ=Europe/Berlin 0 9 * * 1-5; the timing field is "
            "then the first occurrence's (optional: at once)"
        ),
    )


class Accepted(BaseModel):
    """The message is durable in the buffer topic."""

    id: str
    deliver_at: int


class CancelAccepted(BaseModel):
    """The cancel is durable in the buffer topic."""

    id: str


class Status(BaseModel):
    """Health or readiness."""

    status: str


#: Replica questions (status, timeline) in flight at once; more wait their turn.
REPLICA_QUESTIONS = 8
DURATION = "a duration: 500ms, 30s, 1m, 2h, 1d (a bare number is milliseconds)"
#: kdelay/durations.py's grammar.
DURATION_PATTERN = r"^\s*[0-9]+\s*([mM][sS]|[sSmMhHdD])?\s*$"


class Freshness(BaseModel):
    """How current a replica's answer is (docs/status.md)."""

    model_config = ConfigDict(extra="allow")

    answered_by: str = Field(description="the replica that answered")
    role: str = Field(description="its role: master, follower, catching-up or starting")
    as_of_ms: int = Field(description="its clock (the broker's, estimated) when it answered")
    ingest_lag: int | None = Field(
        description="buffer records not yet in its store (measured every second); null: unknown"
    )
    ingested_offsets: dict[str, int] = Field(
        description="per buffer partition, the offset below which every record is in the answer"
    )


class MessageStatus(Freshness):
    """A message's status, from a delay-service replica's store (docs/status.md)."""

    id: str
    state: Literal["pending", "delivered", "cancelled", "dead_lettered"]
    deliver_at: int | None = Field(description="due time, epoch milliseconds")
    topic: str | None = Field(description="target topic")
    partition: int | None = Field(description="target partition; null: chosen by key at release")
    offset: int | None = Field(
        default=None, description="delivered: its offset in the target partition (if known)"
    )
    released_at: int | None = Field(
        default=None, description="delivered or dead_lettered: when, epoch milliseconds"
    )
    cancelled_at: int | None = Field(default=None, description="cancelled: when")
    source: str | None = Field(
        default=None, description="how the replica knows of the outcome (master, tombstone, ...)"
    )
    repeat: str | None = Field(default=None, description="a recurring message's kdelay-repeat")
    occurrence: int | None = Field(default=None, description="which occurrence of a series")
    buffer: dict[str, Any] | None = Field(
        default=None, description="pending: its buffer record (partition, offset, key)"
    )
    last_outcome: dict[str, Any] | None = Field(
        default=None,
        description="pending: what became of an earlier message or occurrence with this id",
    )


class PendingBucket(BaseModel):
    """Pending messages due in ``[start, start + bucket_ms)``."""

    start: int
    count: int
    topics: dict[str, int]


class PendingTimeline(Freshness):
    """Pending messages per due-time bucket and per target topic (docs/status.md)."""

    now_ms: int
    until_ms: int = Field(description="counted: entries due before this (now + horizon)")
    bucket_ms: int
    horizon_ms: int
    buckets: list[PendingBucket] = Field(description="the non-empty buckets, earliest first")
    topics: dict[str, int] = Field(description="counted entries per target topic")
    counted: int
    overdue: int = Field(description="counted entries already due (awaiting release)")
    pending: int = Field(description="every pending entry of the replica, due whenever")
    truncated: bool = Field(description="the scan stopped at scan_limit entries")
    scan_limit: int
    scanned_until: int | None = Field(description="the counts are exact for due times before it")


class MessageNotFoundError(ApiError):
    """No replica knows the id (404)."""

    status = 404


class ReplicasNotConfiguredError(ApiError):
    """The proxy was not told where the replicas are (503, no Retry-After: retrying is futile
    until ``zk_connect`` is set)."""

    status = 503


def _utf8(field: str, text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(f"{field}: not valid UTF-8 text") from None


def _value(msg: MessageIn) -> bytes | None:
    if msg.value is not None and msg.value_b64 is not None:
        raise BadRequestError("value_b64: give value or value_b64, not both")
    if msg.value_b64 is not None:
        try:
            return base64.b64decode(msg.value_b64, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequestError("value_b64: not valid base64") from None
    return _utf8("value", msg.value)


def _control_headers(msg: MessageIn) -> list[tuple[str, bytes | None]]:
    timing: list[tuple[str, bytes | None]] = []
    if msg.delay_ms is not None:
        timing.append((h.DELAY_MS, str(msg.delay_ms).encode()))
    if msg.deliver_at is not None:
        at = msg.deliver_at
        timing.append((h.DELIVER_AT, _utf8("deliver_at", str(at))))
    if msg.delay_level is not None:
        timing.append((h.DELAY_LEVEL, str(msg.delay_level).encode()))
    if len(timing) > 1 or (not timing and msg.repeat is None):
        raise BadRequestError(
            f"delay_ms: give exactly one of delay_ms, deliver_at, delay_level ({len(timing)} given)"
        )
    if msg.repeat is not None:
        timing.append((h.REPEAT, _utf8("repeat", msg.repeat)))
    if msg.id is not None:
        timing.append((h.ID, _utf8("id", msg.id)))
    return timing


#: No Kafka producer has a negative epoch: buffer keys derived from a posted message's content
#: (:func:`_content_origin`) never equal those derived from an idempotent producer's batch.
_CONTENT_EPOCH = -1


def _content_origin(
    msg: MessageIn, key: bytes | None, value: bytes | None, own: list[tuple[str, bytes | None]]
) -> Origin:
    """Where the buffer key of a posted message with an id derives from: its content (the id,
    the target, key, value, headers and timing fields as posted), so the same POST sent twice
    writes the same buffer key (the replicas keep one record per id and buffer key), and any
    other message with that id gets a key of its own. ``routing.buffer_key`` hashes the
    origin's fields (uuid5); the digest stands in for an idempotent producer's id."""
    digest = hashlib.sha256()
    scalars = [msg.id, msg.topic, msg.partition, msg.delay_ms, msg.deliver_at, msg.delay_level]
    parts: list[bytes | None] = [json.dumps(scalars).encode(), key, value]
    for name, header_value in own:
        parts += [name.encode("utf-8", "surrogatepass"), header_value]
    for part in parts:
        # Length-prefixed, None apart from b"": no two contents hash the same input.
        digest.update(b"\xff" * 8 if part is None else len(part).to_bytes(8, "big"))
        digest.update(part or b"")
    return Origin(int.from_bytes(digest.digest(), "big"), _CONTENT_EPOCH, 0)


def _route_message(
    msg: MessageIn,
    now_ms: int,
    policy: DelayPolicy,
    limits: RecordLimits = DEFAULT_LIMITS,
    buffer_partitions: int = 1,
) -> Outgoing:
    """The buffer record for a posted message; BadRequestError names the bad field,
    OverLimitError the limit it is over, ForbiddenTopicError refuses an internal topic."""
    value = _value(msg)
    key = _utf8("key", msg.key)
    own = [(k, _utf8(f"headers.{k}", v)) for k, v in (msg.headers or {}).items()]
    for name, _ in own:
        if name in h.CONTROL_HEADERS:
            raise BadRequestError(f"headers.{name}: use the JSON field, not the header")
    control = _control_headers(msg)
    origin = None if msg.id is None else _content_origin(msg, key, value, own)
    try:
        (routed,), _ = route(
            msg.topic,
            -1 if msg.partition is None else msg.partition,
            [Incoming(key, value, [*own, *control])],
            now_ms,
            policy,
            limits=limits,
            buffer_partitions=buffer_partitions,
            origin=origin,
        )
    except RejectedRecordError as exc:
        if exc.limit is not None:
            raise OverLimitError(exc.limit) from None
        bad = exc.header_error
        # A posted message always carries a timing header: only a header can be at fault.
        assert bad is not None
        if isinstance(bad, h.UnknownHeaderError):  # a look-alike in "headers"
            raise BadRequestError(f"headers.{bad.header}: {bad.problem}") from None
        field = _FIELD_OF_HEADER.get(bad.header, bad.header)
        raise BadRequestError(f"{field}: {bad.problem}") from None
    except RefusedTopicError as exc:
        # The rule alone: a posted message is never the cancel the buffer topic may carry.
        rule = internal_topics.refusal(exc.topic) or exc.rule
        raise ForbiddenTopicError(f"topic: {rule}", field="topic") from None
    return routed


async def _buffer_partitions(topics: Topics) -> int:
    """The buffer topic's partition count (cached), or UnavailableError (503)."""
    try:
        info = await topics.info(buffer.BUFFER_TOPIC)
    except KafkaException as exc:
        raise UnavailableError(f"upstream Kafka unreachable: {exc}") from None
    if info.error_code != 0 or info.partitions <= 0:
        raise UnavailableError(f"{buffer.BUFFER_TOPIC} is not available upstream")
    return info.partitions


#: The error answers an operation documents (proxy/http_errors.py).
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem} for code in (400, 403, 413, 422, 502, 503)
}


async def _write(
    upstream: Upstream, availability: UpstreamAvailability | None, records: list[Any]
) -> None:
    """Write ``records`` upstream; an error answer says why upstream did not take them. While
    upstream is known to be down, answer 503 at once rather than after the upstream timeout."""
    down = None if availability is None else availability.problem()
    if down is not None:
        raise UnavailableError(down)
    try:
        await upstream.send(records)
    except UpstreamError as exc:
        raise upstream_refusal(exc.code, str(exc)) from None


def _install_common(
    app: FastAPI, metrics: ProxyMetrics, max_body_bytes: int, budget: RequestBudget | None
) -> None:
    """The body limits, request counting, and the one error shape (proxy/http_errors.py)."""
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, budget=budget)
    http_errors.install(app, metrics)

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.http_requests.labels(request.method, path, str(response.status_code)).inc()
        return response


def _install_replica_queries(
    app: FastAPI, replicas: ReplicaApi | None, pending_timeout_s: float
) -> None:
    """``GET /v1/messages/{id}`` and ``GET /v1/pending``, answered by a replica (module
    docstring)."""
    questions = asyncio.Semaphore(REPLICA_QUESTIONS)

    async def ask(question: Callable[[ReplicaApi], ReplicaAnswer]) -> ReplicaAnswer:
        if replicas is None:
            raise ReplicasNotConfiguredError(
                "zk_connect: this proxy does not know where the delay-service replicas are; "
                "set zk_connect (--zk-connect, KDELAY_PROXY_ZK_CONNECT) and zk_root to theirs"
            )
        async with questions:
            try:
                answer = await asyncio.to_thread(question, replicas)
            except NoReplicaError as exc:
                raise UnavailableError(str(exc)) from None
        if answer.status == 400:
            raise BadRequestError(str(answer.body.get("error", "bad request")))
        return answer

    lookups: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (400, 404, 503)}
    timelines: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (400, 503)}

    @app.get("/v1/messages/{message_id}", response_model=MessageStatus, responses=lookups)
    async def get_message(message_id: str) -> Response:
        """The status of a message: pending (due time, target), delivered (offset, release
        time), cancelled or dead_lettered, as a delay-service replica knows it (the master
        when it answers), with the answer's freshness. 404: no replica knows the id."""
        try:
            msg_id = h.validate_id("id", _utf8("id", message_id))
        except InvalidHeaderError as exc:
            raise BadRequestError(f"id: {exc.problem}") from None
        answer = await ask(lambda api: api.message(msg_id))
        if answer.status == 404:
            error = answer.body.get("error") or f"id: no message {msg_id!r} is known"
            raise MessageNotFoundError(str(error), field="id")
        return JSONResponse(answer.body)

    @app.get("/v1/pending", response_model=PendingTimeline, responses=timelines)
    async def get_pending(
        bucket: Annotated[
            str, Query(description=f"bucket width, {DURATION}", pattern=DURATION_PATTERN)
        ] = "1m",
        horizon: Annotated[
            str, Query(description=f"how far ahead, {DURATION}", pattern=DURATION_PATTERN)
        ] = "24h",
    ) -> Response:
        """Pending messages per due-time bucket (aligned to multiples of ``bucket``) and per
        target topic, due before now + ``horizon`` (overdue ones included), from a
        delay-service replica's store, with the answer's freshness."""
        for name, text in (("bucket", bucket), ("horizon", horizon)):
            try:
                if duration_ms(text) <= 0:
                    raise BadRequestError(f"{name}: must be more than 0")
            except ValueError as exc:
                raise BadRequestError(f"{name}: {exc}") from None
        answer = await ask(lambda api: api.pending(bucket, horizon, pending_timeout_s))
        return JSONResponse(answer.body)


def create_app(
    topics: Topics,
    upstream: Upstream,
    metrics: ProxyMetrics,
    policy: DelayPolicy,
    *,
    now_ms: Callable[[], int] = wall_clock_ms,
    limits: RecordLimits = DEFAULT_LIMITS,
    not_ready: Callable[[], str | None] = lambda: None,
    max_body_bytes: int = 100 * 1024 * 1024,
    budget: RequestBudget | None = None,
    availability: UpstreamAvailability | None = None,
    replicas: ReplicaApi | None = None,
    pending_timeout_s: float = 60.0,
) -> FastAPI:
    """The FastAPI application of one proxy: it looks topics up in ``topics`` (the Kafka
    listener's cache) and writes through ``upstream``; ``not_ready`` says why the proxy is not
    ready (a supervised component is down), or None. A body over ``max_body_bytes`` is refused;
    ``budget`` is the process-wide request budget the Kafka listener also draws on;
    ``availability`` (``upstream.availability``) whether upstream is down, for ``/readyz`` and
    for answering writes 503 at once meanwhile; ``replicas`` answers the status and timeline
    questions (None: they answer 503 naming ``zk_connect``), a timeline within
    ``pending_timeout_s``."""
    app = FastAPI(
        title="kdelay proxy",
        version="1",
        description="Delayed and scheduled messages for Apache Kafka: the proxy's HTTP API.",
    )

    _install_common(app, metrics, max_body_bytes, budget)

    async def check_target(topic: str, partition: int | None) -> None:
        # Internal topics never get here: route() refused them (ForbiddenTopicError, 403).
        try:
            info = await topics.info(topic)
        except KafkaException as exc:
            raise UnavailableError(f"upstream Kafka unreachable: {exc}") from None
        if info.error_code or info.partitions == 0:
            raise BadRequestError(f"topic: {topic!r} does not exist upstream")
        if partition is not None and partition >= info.partitions:
            raise BadRequestError(
                f"partition: {topic!r} has {info.partitions} partitions, no {partition}"
            )

    async def write(records: list[Any]) -> None:
        await _write(upstream, availability, records)

    errors = _ERRORS

    @app.post("/v1/messages", status_code=202, response_model=Accepted, responses=errors)
    async def post_message(msg: MessageIn) -> Accepted:
        """Schedule one message for delivery at a later time. ``deliver_at`` in the answer is
        exact for ``deliver_at``; for a delay it is the proxy's estimate (the due time counts
        from the buffer record's append time; the delivered ``kdelay-deliver-at`` is exact)."""
        routed = _route_message(msg, now_ms(), policy, limits, await _buffer_partitions(topics))
        assert routed.kind is Kind.DELAYED
        assert routed.id is not None
        assert routed.deliver_at_ms is not None
        await check_target(msg.topic, msg.partition)
        await write([routed])
        metrics.records.labels(Kind.DELAYED.value).inc()
        return Accepted(id=routed.id, deliver_at=routed.deliver_at_ms)

    @app.delete(
        "/v1/messages/{message_id}",
        status_code=202,
        response_model=CancelAccepted,
        responses=errors,
    )
    async def delete_message(message_id: str) -> CancelAccepted:
        """Cancel a pending message; answered once the cancel is durable."""
        try:
            msg_id = h.validate_id("id", _utf8("id", message_id))
        except InvalidHeaderError as exc:
            raise BadRequestError(f"id: {exc.problem}") from None
        await write(
            [cancel(msg_id, uid=h.new_id(), buffer_partitions=await _buffer_partitions(topics))]
        )
        metrics.records.labels(Kind.CANCEL.value).inc()
        return CancelAccepted(id=msg_id)

    _install_replica_queries(app, replicas, pending_timeout_s)

    @app.get("/healthz", response_model=Status)
    async def healthz() -> Status:
        """The process is up."""
        return Status(status="ok")

    @app.get("/readyz", response_model=Status, responses={503: {"model": Problem}})
    async def readyz() -> Status:
        """Every component runs and upstream Kafka answers; 503 names what is not ready."""
        why = not_ready()
        if why is not None:
            raise UnavailableError(why)
        down = None if availability is None else availability.problem()
        if down is None and not await asyncio.to_thread(upstream.reachable):
            # reachable() marked upstream down: the reason every other answer gives.
            down = None if availability is None else availability.problem()
            down = down or f"upstream Kafka at {upstream.bootstrap} is unreachable"
        if down is not None:
            raise UnavailableError(down)
        return Status(status="ready")

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
