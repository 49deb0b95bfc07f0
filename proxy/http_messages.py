"""The HTTP API's message routes (CONTRACT.md): ``POST /v1/messages`` schedules a message,
``PUT /v1/messages/{id}`` replaces one (the cancels: proxy/http_cancels.py, which shares this
module's checks).

A posted message is routed like a produced record (proxy/routing.py), so both reject the same
values with the same reason, and its topic is looked up in the Kafka listener's topic cache
(proxy/topics.py). Errors have the statuses of proxy/http_errors.py: 400 for a field's bad
value, 403 for an internal topic, 413 for a size over a limit (the proxy's, proxy/limits.py, or
upstream's), 503 only while upstream Kafka is unavailable. A record is acknowledged (202) only
once upstream Kafka has it.

Owners (README "Message owners", proxy/owners.py): each route acts for the request's caller
(proxy/http_auth.py). A posted or put message records the caller's principal as its owner; a
topic the caller may not WRITE is 403; ``PUT`` and ``DELETE`` of another principal's message
are 403 unless the caller is a kdelay administrator, whose replaces and cancels then carry
``"a": true``. An open API (``http_auth = "none"``) has no principal: it is refused nothing,
stamps no owner, and the replicas apply its cancels and replaces to messages without an owner
only.

A posted message with an ``id`` gets a buffer key derived from every field of its body (README
"HTTP API"): the same POST sent again (a client retrying after a timeout) writes the same buffer
record again, which the replicas keep once, while a message that differs in any field (another
``repeat`` too) with the same id is a new message.

Runs on the proxy's asyncio loop; the functions are safe from any thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

from confluent_kafka import KafkaException
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from kdelay import buffer
from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from kdelay.headers import DelayPolicy
from kdelay.proxy import internal_topics
from kdelay.proxy.availability import UpstreamAvailability
from kdelay.proxy.buffer_keys import (
    ACCEPTANCE_ORDER,
    AcceptanceOrder,
    BrokerTimeUnknownError,
    Origin,
)
from kdelay.proxy.cancel_acks import CancelAcks
from kdelay.proxy.http_auth import Caller, current_caller
from kdelay.proxy.http_errors import (
    ApiError,
    BadRequestError,
    ForbiddenTopicError,
    OverLimitError,
    Problem,
    UnavailableError,
    upstream_refusal,
)
from kdelay.proxy.internal_topics import RefusedTopicError
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.owners import Owners, refusal
from kdelay.proxy.routing import (
    DEFAULT_LIMITS,
    Incoming,
    Kind,
    Outgoing,
    RejectedRecordError,
    route,
)
from kdelay.proxy.topics import Topics
from kdelay.proxy.upstream import Upstream, UpstreamError

_FIELD_OF_HEADER = {
    h.DELAY_MS: "delay_ms",
    h.DELIVER_AT: "deliver_at",
    h.DELAY_LEVEL: "delay_level",
    h.ID: "id",
    h.REPEAT: "repeat",
    h.CANCEL: "id",
}
TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
#: The request's caller (proxy/http_auth.py), for a route's parameters.
CallerParam = Annotated[Caller, Depends(current_caller)]


class NotOwnerError(ApiError):
    """The message belongs to another principal and the caller is no administrator (403)."""

    status = 403


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


def utf8(field: str, text: str | None) -> bytes | None:
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
    return utf8("value", msg.value)


def _control_headers(msg: MessageIn) -> list[tuple[str, bytes | None]]:
    timing: list[tuple[str, bytes | None]] = []
    if msg.delay_ms is not None:
        timing.append((h.DELAY_MS, str(msg.delay_ms).encode()))
    if msg.deliver_at is not None:
        at = msg.deliver_at
        timing.append((h.DELIVER_AT, utf8("deliver_at", str(at))))
    if msg.delay_level is not None:
        timing.append((h.DELAY_LEVEL, str(msg.delay_level).encode()))
    if len(timing) > 1 or (not timing and msg.repeat is None):
        raise BadRequestError(
            f"delay_ms: give exactly one of delay_ms, deliver_at, delay_level ({len(timing)} given)"
        )
    if msg.repeat is not None:
        timing.append((h.REPEAT, utf8("repeat", msg.repeat)))
    if msg.id is not None:
        timing.append((h.ID, utf8("id", msg.id)))
    return timing


#: No Kafka producer has a negative epoch: buffer keys derived from a posted message's content
#: (:func:`_content_origin`) never equal those derived from an idempotent producer's batch.
_CONTENT_EPOCH = -1
#: A replace (``PUT``) of the same body as a POST is another message: its keys use this epoch.
_REPLACE_EPOCH = -2


def _content_origin(msg: MessageIn, value: bytes | None) -> Origin:
    """Where the buffer key of a posted message with an id derives from: every field of its
    body (a field added to :class:`MessageIn` later too; a field at its default counts as
    absent), the value as the bytes ``value`` or ``value_b64`` gave. So the same POST sent
    twice writes the same buffer key (the replicas keep one record per id and buffer key), and
    any other message with that id, another ``repeat`` included, gets a key of its own.
    ``buffer_keys.buffer_key`` hashes the origin's fields (uuid5); the digest stands in for an
    idempotent producer's id."""
    fields = msg.model_dump(mode="json", exclude_defaults=True, exclude={"value", "value_b64"})
    # A JSON object ends where it ends: the value after it is not ambiguous; None apart from b"".
    digest = hashlib.sha256(json.dumps(fields).encode())
    digest.update(b"-" if value is None else b"%d:" % len(value))
    digest.update(value or b"")
    return Origin(int.from_bytes(digest.digest(), "big"), _CONTENT_EPOCH, 0)


def _route_message(
    msg: MessageIn,
    now_ms: int,
    policy: DelayPolicy,
    limits: RecordLimits = DEFAULT_LIMITS,
    buffer_partitions: int = 1,
    *,
    order: AcceptanceOrder = ACCEPTANCE_ORDER,
    replace: bool = False,
    owner: str | None = None,
    admin: bool = False,
) -> Outgoing:
    """The buffer record for a posted message (``replace``: one put in place of what its id
    has pending; ``owner``: the caller's principal, ``admin``: a kdelay administrator's);
    BadRequestError names the bad field, OverLimitError the limit it is over,
    ForbiddenTopicError refuses an internal topic."""
    value = _value(msg)
    key = utf8("key", msg.key)
    own = [(k, utf8(f"headers.{k}", v)) for k, v in (msg.headers or {}).items()]
    for name, _ in own:
        if name in h.CONTROL_HEADERS:
            raise BadRequestError(f"headers.{name}: use the JSON field, not the header")
    control = _control_headers(msg)
    origin = None if msg.id is None else _content_origin(msg, value)
    if replace:
        assert origin is not None  # a replace's id is the path's
        control.append((h.REPLACE, b"true"))
        origin = Origin(origin.producer_id, _REPLACE_EPOCH, origin.base_sequence)
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
            order=order,
            owner=owner,
            admin=admin,
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
    except BrokerTimeUnknownError as exc:
        raise UnavailableError(str(exc)) from None
    except RefusedTopicError as exc:
        # The rule alone: a posted message is never the cancel the buffer topic may carry.
        rule = internal_topics.refusal(exc.topic) or exc.rule
        raise ForbiddenTopicError(f"topic: {rule}", field="topic") from None
    return routed


async def buffer_partitions(topics: Topics) -> int:
    """The buffer topic's partition count (cached), or UnavailableError (503)."""
    try:
        info = await topics.info(buffer.BUFFER_TOPIC)
    except KafkaException as exc:
        raise UnavailableError(f"upstream Kafka unreachable: {exc}") from None
    if info.error_code != 0 or info.partitions <= 0:
        raise UnavailableError(f"{buffer.BUFFER_TOPIC} is not available upstream")
    return info.partitions


def path_id(message_id: str) -> str:
    """The message id of a request path, checked as a ``kdelay-id`` header's value is."""
    try:
        return h.validate_id("id", utf8("id", message_id))
    except InvalidHeaderError as exc:
        raise BadRequestError(f"id: {exc.problem}") from None


#: The error answers an operation documents (proxy/http_errors.py).
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem} for code in (400, 403, 413, 422, 502, 503)
}


async def _write(
    upstream: Upstream, availability: UpstreamAvailability | None, records: list[Any]
) -> int:
    """Write ``records`` upstream; an error answer says why upstream did not take them. While
    upstream is known to be down, answer 503 at once rather than after the upstream timeout."""
    down = None if availability is None else availability.problem()
    if down is not None:
        raise UnavailableError(down)
    try:
        return await upstream.send(records)
    except UpstreamError as exc:
        raise upstream_refusal(exc.code, str(exc)) from None


async def _writable(caller: Caller, topic: str) -> None:
    """ForbiddenTopicError (403) when Kafka does not allow the caller WRITE on ``topic``."""
    if caller.principal is not None and not await caller.writable(topic):
        raise ForbiddenTopicError(
            f"topic: Kafka's ACLs do not allow {caller.principal} to WRITE topic {topic}",
            field="topic",
        )


class Sender(TypedDict):
    """Who sends a cancel or replace: the routing functions' ``owner`` and ``admin``."""

    owner: str | None
    admin: bool


async def as_owner(owners: Owners | None, caller: Caller, msg_id: str, action: str) -> Sender:
    """The caller as the sender of a cancel or replace of message ``msg_id`` (``admin``: a
    kdelay administrator); NotOwnerError (403) when it may not ``action`` it (module
    docstring). ``owners`` None: owners are unknown, the replicas decide."""
    if caller.principal is None:
        return Sender(owner=None, admin=False)
    admin = await caller.admin()
    if owners is not None and not await owners.allowed(caller.principal, admin, msg_id):
        raise NotOwnerError(refusal(msg_id, action), field="id")
    return Sender(owner=caller.principal, admin=admin)


def install_message_routes(
    app: FastAPI,
    topics: Topics,
    upstream: Upstream,
    metrics: ProxyMetrics,
    policy: DelayPolicy,
    *,
    now_ms: Callable[[], int],
    limits: RecordLimits,
    availability: UpstreamAvailability | None,
    order: AcceptanceOrder = ACCEPTANCE_ORDER,
    cancel_acks: CancelAcks | None = None,
    owners: Owners | None = None,
) -> Callable[[list[Any]], Awaitable[int]]:
    """``POST /v1/messages`` and ``PUT /v1/messages/{id}`` on ``app`` (module docstring);
    ``owners`` says who owns a message (None: unknown, the replicas decide). Returns how a
    cancel is written (answered once it may be acknowledged), for proxy/http_cancels.py."""

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

    async def write(records: list[Any]) -> int:
        return await _write(upstream, availability, records)

    async def write_cancel(records: list[Any]) -> int:
        """``write``, answered once the cancel can no longer cancel what is sent next; the
        offset of the batch's first immediate record (-1: none)."""
        offset = await write(records)
        if cancel_acks is not None:
            await cancel_acks.hold()
        return offset

    errors = ERRORS

    @app.post("/v1/messages", status_code=202, response_model=Accepted, responses=errors)
    async def post_message(msg: MessageIn, caller: CallerParam) -> Accepted:
        """Schedule one message for delivery at a later time. ``deliver_at`` in the answer is
        exact for ``deliver_at``; for a delay it is the proxy's estimate (the due time counts
        from the buffer record's append time; the delivered ``kdelay-deliver-at`` is exact)."""
        partitions = await buffer_partitions(topics)
        routed = _route_message(
            msg, now_ms(), policy, limits, partitions, order=order, owner=caller.principal
        )
        await _writable(caller, msg.topic)
        assert routed.kind is Kind.DELAYED
        assert routed.id is not None
        assert routed.deliver_at_ms is not None
        await check_target(msg.topic, msg.partition)
        await write([routed])
        metrics.records.labels(Kind.DELAYED.value).inc()
        return Accepted(id=routed.id, deliver_at=routed.deliver_at_ms)

    @app.put(
        "/v1/messages/{message_id}", status_code=202, response_model=Accepted, responses=errors
    )
    async def put_message(message_id: str, msg: MessageIn, caller: CallerParam) -> Accepted:
        """Replace the pending message ``message_id`` (due time, value, headers, target) with
        this one, in one step, whatever else is in flight; with nothing pending, schedule it
        (the body of a POST, without ``id``: the path names it). Answered once durable."""
        msg_id = path_id(message_id)
        if msg.id is not None and msg.id != msg_id:
            raise BadRequestError(f"id: the path names the message ({msg_id!r}); leave id out")
        msg = msg.model_copy(update={"id": msg_id})
        partitions = await buffer_partitions(topics)
        await _writable(caller, msg.topic)
        routed = _route_message(
            msg,
            now_ms(),
            policy,
            limits,
            partitions,
            order=order,
            replace=True,
            **await as_owner(owners, caller, msg_id, "replace"),
        )
        assert routed.deliver_at_ms is not None
        await check_target(msg.topic, msg.partition)
        await write_cancel([routed])
        metrics.records.labels(Kind.DELAYED.value).inc()
        return Accepted(id=msg_id, deliver_at=routed.deliver_at_ms)

    return write_cancel
