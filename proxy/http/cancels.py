"""The HTTP API's cancel routes (CONTRACT.md, v3): ``DELETE /v1/messages/{id}`` cancels one
message, and with ``wait=S`` answers the master's decision (a confirmed cancel,
proxy/http/cancel_wait.py); ``DELETE /v1/messages?id_prefix=P[&topic=T][&wait=S]`` cancels every
pending message whose id starts with P with one buffer record per buffer partition (a bulk
cancel: whatever the shard layout, each shard reads the copies of its own partitions).

Owners as for the other message routes (proxy/http/messages.py): another principal's message
is 403 unless the caller is a kdelay administrator; a non-administrator's bulk cancel cancels
only its own messages (the replicas decide, delay_service/bulk_cancels.py).

Runs on the proxy's asyncio loop.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kdelay import buffer
from kdelay import headers as h
from kdelay.buffer.bulk_ids import new_bulk_id
from kdelay.errors import InvalidHeaderError
from kdelay.proxy.auth.owners import Owners
from kdelay.proxy.http.cancel_wait import bulk_count, confirm_cancel, parse_wait
from kdelay.proxy.http.errors import BadRequestError, Problem
from kdelay.proxy.http.message_records import TOPIC_PATTERN, utf8
from kdelay.proxy.http.messages import (
    ERRORS,
    CallerParam,
    Sender,
    as_owner,
    buffer_partitions,
    path_id,
)
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Kind, Outgoing, cancel
from kdelay.proxy.routing.topics import Topics
from kdelay.zk.replica_api import ReplicaApi


def install_cancel_routes(
    app: FastAPI,
    topics: Topics,
    metrics: ProxyMetrics,
    owners: Owners | None,
    write_cancel: Callable[[list[Any]], Awaitable[int]],
) -> None:
    """``DELETE /v1/messages/{id}`` (with ``wait``: a confirmed cancel) and ``DELETE
    /v1/messages?id_prefix=..`` (a bulk cancel) on ``app``; ``write_cancel`` writes cancels
    and answers once they may be acknowledged, with the offset of the batch's first
    immediate record."""
    errors = ERRORS

    def replica_api() -> ReplicaApi:
        """The replicas to ask for a ``wait``; 400 naming ``wait`` when this proxy has none to
        ask (a setting of this proxy, not a passing outage: leave ``wait`` out)."""
        replicas = None if owners is None else owners.replica_api()
        if replicas is None:
            raise BadRequestError(
                "wait: this proxy cannot confirm a cancel: it has no zk_connect to find the "
                "delay-service replicas; cancel without wait"
            )
        return replicas

    @app.delete(
        "/v1/messages/{message_id}",
        status_code=202,
        response_model=None,
        responses={
            **errors,
            200: {"description": "with wait: the master cancelled it"},
            404: {"model": Problem, "description": "with wait: no message has that id"},
            409: {"description": "with wait: already delivered (or dead-lettered)"},
        },
    )
    async def delete_message(
        message_id: str, caller: CallerParam, wait: str | None = None
    ) -> JSONResponse:
        """Cancel a pending message; answered once the cancel is durable (202). With ``wait``
        (seconds, at most 60): once the master has decided, 200 ``{"id", "state":
        "cancelled"}``, 409 ``{"id", "state": "already_delivered", "delivered_at"}``, 404 for
        an unknown id, or 202 ``{"id", "state": "pending"}`` when not decided in time
        (proxy/http/cancel_wait.py). 403: it belongs to another principal (and the caller is no
        kdelay administrator)."""
        msg_id = path_id(message_id)
        wait_s = _wait(wait)
        replicas = replica_api() if wait_s is not None else None
        admin = await as_owner(owners, caller, msg_id, "cancel")
        partitions = await buffer_partitions(topics)
        record = cancel(msg_id, uid=h.new_id(), buffer_partitions=partitions, **admin)
        if replicas is None:
            await write_cancel([record])
            metrics.records.labels(Kind.CANCEL.value).inc()
            return JSONResponse({"id": msg_id}, status_code=202)
        # Sent as the batch's "immediate" record only so that its delivery report gives its
        # offset (proxy/upstream/producer.py): the record itself is the same cancel.
        offset = await write_cancel([record._replace(kind=Kind.IMMEDIATE)])
        metrics.records.labels(Kind.CANCEL.value).inc()
        assert wait_s is not None
        decision = await confirm_cancel(replicas, msg_id, record.partition, offset, wait_s)
        return JSONResponse(decision.body, status_code=decision.status)

    @app.delete(
        "/v1/messages",
        status_code=202,
        response_model=None,
        responses={**errors, 200: {"description": "with wait: the count the masters cancelled"}},
    )
    async def delete_messages(
        caller: CallerParam,
        id_prefix: str | None = None,
        topic: str | None = None,
        wait: str | None = None,
    ) -> JSONResponse:
        """Bulk cancel: every pending message whose id starts with ``id_prefix`` (and whose
        target is ``topic``), accepted before this cancel; one buffer record per buffer
        partition, not one per message. A non-administrator's cancels only its own messages.
        202 ``{"id"}`` once durable; with ``wait`` (seconds, at most 60), 200 ``{"id", "cancelled",
        "refused"}`` once the masters applied every copy (``cancelled``: the pending messages
        it cancelled, as the masters counted them; ``refused``: other principals' it left), or
        202 ``{"id", "state": "pending"}`` when not in time."""
        prefix = _prefix(id_prefix)
        if topic is not None and not re.fullmatch(TOPIC_PATTERN, topic):
            raise BadRequestError(f"topic: {topic[:80]!r} is not a topic name")
        wait_s = _wait(wait)
        replicas = replica_api() if wait_s is not None else None
        sender = Sender(owner=caller.principal, admin=False)
        if caller.principal is not None:
            sender = Sender(owner=caller.principal, admin=await caller.admin())
        partitions = await buffer_partitions(topics)
        bulk_id = new_bulk_id(partitions)
        records = [
            bulk_cancel(bulk_id, prefix, topic, uid=h.new_id(), partition=p, **sender)
            for p in range(partitions)
        ]
        await write_cancel(records)
        metrics.records.labels(Kind.CANCEL.value).inc(len(records))
        if replicas is None or wait_s is None:
            return JSONResponse({"id": bulk_id}, status_code=202)
        decision = await bulk_count(replicas, bulk_id, wait_s)
        return JSONResponse(decision.body, status_code=decision.status)


def _wait(text: str | None) -> float | None:
    try:
        return parse_wait(text)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


def _prefix(text: str | None) -> str:
    """The bulk cancel's id prefix: a non-empty id-like string (400 naming ``id_prefix``)."""
    if not text:
        raise BadRequestError(
            "id_prefix: give the id prefix of the messages to cancel (an empty one would "
            "cancel everything: refused)"
        )
    try:
        return h.validate_id("id_prefix", utf8("id_prefix", text))
    except InvalidHeaderError as exc:
        raise BadRequestError(f"id_prefix: {exc.problem}") from None


def bulk_cancel(
    bulk_id: str,
    prefix: str,
    topic: str | None,
    *,
    uid: str,
    partition: int,
    owner: str | None,
    admin: bool,
) -> Outgoing:
    """The buffer record of a bulk cancel (``kdelay.buffer``'s contract) for buffer
    ``partition``: the copy that cancels that partition's messages. Its id (``kdelay-route``
    ``i``, :func:`new_bulk_id`) is no message's (README "Bulk cancel"); readers that predate
    bulk cancels see a cancel of this id, a no-op."""
    enc = buffer.encode(
        buffer.Cancel(bulk_id, uid, owner=owner, admin=admin, prefix=prefix, topic=topic)
    )
    return Outgoing(
        Kind.CANCEL,
        buffer.BUFFER_TOPIC,
        partition,
        enc.key,
        enc.value,
        list(enc.headers),
        None,
        bulk_id,
    )
