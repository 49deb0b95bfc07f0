"""The HTTP API's query routes, answered by a delay-service replica (docs/status.md):
``GET /v1/messages/{id}`` (a message's status), ``GET /v1/messages?state=pending&...`` (the
listing, CONTRACT.md v3) and ``GET /v1/pending`` (the pending timeline).

The proxy keeps no message state: a replica, found through ZooKeeper and asked over HTTP by
``zk/replica_api.py`` on a worker thread (at most :data:`REPLICA_QUESTIONS` at once), answers,
and its document, freshness included, is passed on as it is. 404: no replica knows the id; 503
with ``Retry-After``: no replica answered in ``replica_timeout_ms`` / ``pending_timeout_ms``;
503 without it: ``zk_connect`` is not set, so the proxy cannot find them.

Owners (README "Message owners"): a message's status is for its owner (the principal that
scheduled it, ``owner`` in the answer) and kdelay administrators (ALTER on the buffer topic);
another caller gets 403. A status without an owner (a message scheduled without
authentication, or one that left the store: the replicas keep no owner in an outcome) is
shown to any authenticated caller. The timeline counts every principal's messages: it is for
administrators only (403 otherwise). The listing shows a non-administrator only its own
messages (the replica filters by ``owner``), an administrator every principal's. An open API
(``http_auth = "none"``) answers everyone.

Runs on the proxy's asyncio loop; the questions themselves on worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from kdelay.buffer import BUFFER_TOPIC
from kdelay.durations import duration_ms
from kdelay.listing import listing_filters
from kdelay.proxy.auth.owners import others_in, own_view, refusal
from kdelay.proxy.http.errors import ApiError, BadRequestError, Problem, UnavailableError
from kdelay.proxy.http.messages import CallerParam, NotOwnerError, path_id
from kdelay.zk.list_merge import cursor_key
from kdelay.zk.replica_api import NoReplicaError, ReplicaAnswer, ReplicaApi

#: Messages per listing page: by default, and at most (delay_service/listing.py's).
LIST_DEFAULT = 100
LIST_MAX = 1000
#: Replica questions (status, timeline, listing) in flight at once; more wait their turn.
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
    owner: str | None = Field(
        default=None,
        description="pending: the principal that scheduled it (User:alice); absent: none",
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
    accepted_at: int | None = Field(
        default=None, description="when a proxy accepted it, epoch milliseconds (if known)"
    )
    headers: list[dict[str, Any]] | None = Field(
        default=None,
        description='pending: its headers, [{"key", "value"}] ("value_base64" if not UTF-8)',
    )
    reason: str | None = Field(
        default=None, description="dead_lettered: why (the kdelay-error of its dead letter)"
    )
    cancelled_by: dict[str, Any] | None = Field(
        default=None,
        description='cancelled: who sent the cancel, {"principal", "admin"} (if known)',
    )
    history: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the id's messages and occurrences, oldest first: each accepted (when, by "
        "whom), then delivered or dead_lettered (at, lateness_ms, reason) or cancelled (at, by)",
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
    counted: int = Field(description="entries counted (those matching topic and id_prefix)")
    scanned: int | None = Field(default=None, description="entries examined")
    overdue: int = Field(description="counted entries already due (awaiting release)")
    pending: int = Field(description="every pending entry of the replica, due whenever")
    truncated: bool = Field(description="the scan stopped at scan_limit entries")
    scan_limit: int
    scanned_until: int | None = Field(description="the counts are exact for due times before it")


class ListedMessage(BaseModel):
    """A pending message of a listing page (CONTRACT.md v3 "Listing")."""

    model_config = ConfigDict(extra="allow")

    id: str
    state: Literal["pending"]
    deliver_at: int = Field(description="due time, epoch milliseconds")
    topic: str = Field(description="target topic")
    partition: int | None = Field(description="target partition; null: chosen by key at release")
    cursor: str | None = Field(
        default=None, description="the cursor of a listing that goes on after this message"
    )


class PendingPage(BaseModel):
    """One page of the pending messages, in due order (CONTRACT.md v3 "Listing")."""

    model_config = ConfigDict(extra="allow")

    messages: list[ListedMessage]
    next: str | None = Field(
        description="the cursor of the next page (pass it as cursor=); null: no more. A page "
        "may be short, even empty, with a next: its scan budget ran out first"
    )
    scanned: int = Field(description="store entries examined for this page")


class MessageNotFoundError(ApiError):
    """No replica knows the id (404)."""

    status = 404


class AdministratorsOnlyError(ApiError):
    """The timeline is for kdelay administrators (403)."""

    status = 403


class ReplicasNotConfiguredError(ApiError):
    """The proxy was not told where the replicas are (503, no Retry-After: retrying is futile
    until ``zk_connect`` is set)."""

    status = 503


def listing_params(
    state: str, topic: str | None, id_prefix: str | None, due_before: str | None, cursor: str | None
) -> dict[str, str]:
    """The replica's query parameters of a listing; BadRequestError naming the one at fault."""
    if state != "pending":
        raise BadRequestError(f"state: only pending messages are listed, not {state[:40]!r}")
    try:
        params = listing_filters(topic, id_prefix, due_before)
    except ValueError as exc:
        raise BadRequestError(f"due_before: {exc}") from None
    if cursor:
        try:
            key = cursor_key(cursor)
        except ValueError:
            key = b""
        if len(key) not in (20, 28):
            raise BadRequestError(f"cursor: {cursor[:80]!r} is not a cursor this API gave")
        params["cursor"] = cursor
    return params


def page_size(limit: str) -> int:
    """A listing's ``limit``; BadRequestError unless 1 to LIST_MAX."""
    digits = limit.strip()
    if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= LIST_MAX:
        raise BadRequestError(f"limit: {limit[:40]!r} is not a whole number from 1 to {LIST_MAX}")
    return int(limit)


def install_replica_queries(
    app: FastAPI, replicas: ReplicaApi | None, pending_timeout_s: float
) -> None:
    """``GET /v1/messages/{id}`` and ``GET /v1/pending`` on ``app`` (module docstring)."""
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

    lookups: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (400, 403, 404, 503)}
    timelines: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (400, 403, 503)}

    @app.get("/v1/messages", response_model=PendingPage, responses=timelines)
    async def list_messages(
        caller: CallerParam,
        *,
        state: Annotated[str, Query(description="only pending is listed")] = "pending",
        topic: Annotated[str | None, Query(description="only those for this topic")] = None,
        id_prefix: Annotated[str | None, Query(description="only those whose id starts so")] = None,
        due_before: Annotated[
            str | None,
            Query(description="only those due before: epoch milliseconds or RFC 3339"),
        ] = None,
        limit: Annotated[
            str, Query(description=f"messages per page, 1 to {LIST_MAX} [{LIST_DEFAULT}]")
        ] = str(LIST_DEFAULT),
        cursor: Annotated[
            str | None, Query(description="the previous page's next: go on after it")
        ] = None,
    ) -> Response:
        """The pending messages in due order (then acceptance order), one page at a time,
        filtered by target topic, id prefix and due time, from a delay-service replica's store
        (each shard's, merged). Follow ``next`` for more: a page goes on after the last message
        the previous one saw, so a message still pending is never listed twice nor skipped
        while others are released. A kdelay administrator lists every principal's messages,
        anyone else only its own."""
        params = listing_params(state, topic, id_prefix, due_before, cursor)
        size = page_size(limit)
        if caller.principal is not None and not await caller.admin():
            params["owner"] = caller.principal
        answer = await ask(lambda api: api.list_pending(params, size, pending_timeout_s))
        return JSONResponse(answer.body)

    @app.get("/v1/messages/{message_id}", response_model=MessageStatus, responses=lookups)
    async def get_message(message_id: str, caller: CallerParam) -> Response:
        """The status of a message: pending (due time, target, owner), delivered (offset,
        release time), cancelled or dead_lettered, as a delay-service replica knows it (the
        master when it answers), with the answer's freshness. 404: no replica knows the id;
        403: it belongs to another principal (and the caller is no kdelay administrator)."""
        msg_id = path_id(message_id)
        answer = await ask(lambda api: api.message(msg_id))
        if answer.status == 404:
            error = answer.body.get("error") or f"id: no message {msg_id!r} is known"
            raise MessageNotFoundError(str(error), field="id")
        owner = answer.body.get("owner")
        principal = caller.principal
        if principal is None:
            return JSONResponse(answer.body)
        if owner is not None and owner != principal and not await caller.admin():
            raise NotOwnerError(refusal(msg_id, "read"), field="id")
        if others_in(answer.body, principal) and not await caller.admin():
            return JSONResponse(own_view(answer.body, principal))  # a reused id: only its own
        return JSONResponse(answer.body)

    @app.get("/v1/pending", response_model=PendingTimeline, responses=timelines)
    async def get_pending(
        caller: CallerParam,
        bucket: Annotated[
            str, Query(description=f"bucket width, {DURATION}", pattern=DURATION_PATTERN)
        ] = "1m",
        horizon: Annotated[
            str, Query(description=f"how far ahead, {DURATION}", pattern=DURATION_PATTERN)
        ] = "24h",
        topic: Annotated[str | None, Query(description="count only this topic's")] = None,
        id_prefix: Annotated[
            str | None, Query(description="count only those whose id starts so")
        ] = None,
    ) -> Response:
        """Pending messages per due-time bucket (aligned to multiples of ``bucket``) and per
        target topic, due before now + ``horizon`` (overdue ones included), from a
        delay-service replica's store, with the answer's freshness; only those for ``topic``
        and whose id starts with ``id_prefix`` when given. Every principal's messages: for
        kdelay administrators only (403)."""
        if not await caller.admin():
            raise AdministratorsOnlyError(
                f"the pending timeline counts every principal's messages: only a principal "
                f"with ALTER on {BUFFER_TOPIC} (a kdelay administrator) may read it"
            )
        for name, text in (("bucket", bucket), ("horizon", horizon)):
            try:
                if duration_ms(text) <= 0:
                    raise BadRequestError(f"{name}: must be more than 0")
            except ValueError as exc:
                raise BadRequestError(f"{name}: {exc}") from None
        answer = await ask(
            lambda api: api.pending(
                bucket, horizon, pending_timeout_s, topic=topic or None, id_prefix=id_prefix or None
            )
        )
        return JSONResponse(answer.body)
