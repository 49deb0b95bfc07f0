"""The HTTP API's message routes (CONTRACT.md): ``POST /v1/messages`` schedules a message,
``PUT /v1/messages/{id}`` replaces one (the cancels: proxy/http/cancels.py, which shares this
module's checks).

A posted message becomes its buffer record as proxy/http/message_records.py says, and its topic is
looked up in the Kafka listener's topic cache (proxy/routing/topics.py). Errors have the statuses of
proxy/http/errors.py: 400 for a field's bad value, 403 for an internal topic, 413 for a size over a
limit (the proxy's, proxy/limits.py, or upstream's), 503 only while upstream Kafka is unavailable. A
record is acknowledged (202) only once upstream Kafka has it.

Owners (README "Message owners", proxy/auth/owners.py): each route acts for the request's caller
(proxy/http/auth.py). A posted or put message records the caller's principal as its owner; a
topic the caller may not WRITE is 403; ``PUT`` and ``DELETE`` of another principal's message
are 403 unless the caller is a kdelay administrator, whose replaces and cancels then carry
``"a": true``. An open API (``http_auth = "none"``) has no principal: it is refused nothing,
stamps no owner, and the replicas apply its cancels and replaces to messages without an owner
only.

Runs on the proxy's asyncio loop; the functions are safe from any thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

from confluent_kafka import KafkaException
from fastapi import Depends, FastAPI
from pydantic import BaseModel

from kdelay import buffer
from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from kdelay.headers import DelayPolicy
from kdelay.proxy.auth.owners import Owners, refusal
from kdelay.proxy.http.auth import Caller, current_caller
from kdelay.proxy.http.errors import (
    ApiError,
    BadRequestError,
    ForbiddenTopicError,
    Problem,
    UnavailableError,
    upstream_refusal,
)
from kdelay.proxy.http.message_records import MessageIn, route_message, utf8
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.buffer_keys import (
    ACCEPTANCE_ORDER,
    AcceptanceOrder,
)
from kdelay.proxy.routing.cancel_acks import CancelAcks
from kdelay.proxy.routing.route import (
    Kind,
)
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.availability import UpstreamAvailability
from kdelay.proxy.upstream.producer import Upstream, UpstreamError

#: The request's caller (proxy/http/auth.py), for a route's parameters.
CallerParam = Annotated[Caller, Depends(current_caller)]


class NotOwnerError(ApiError):
    """The message belongs to another principal and the caller is no administrator (403)."""

    status = 403


class Accepted(BaseModel):
    """The message is durable in the buffer topic."""

    id: str
    deliver_at: int


class CancelAccepted(BaseModel):
    """The cancel is durable in the buffer topic."""

    id: str


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


#: The error answers an operation documents (proxy/http/errors.py).
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
    cancel is written (answered once it may be acknowledged), for proxy/http/cancels.py."""

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
        offset of the batch's first immediate record (-1: none). While the broker's clock is
        unknown it could not be answered: 503 at once, nothing written."""
        if cancel_acks is not None and not cancel_acks.known():
            raise UnavailableError(
                "the broker's clock is not known yet (no probe of __kdelay_clock answered): "
                "a cancel is acknowledged only once it is; nothing was written, retry"
            )
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
        routed = route_message(
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
        routed = route_message(
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
