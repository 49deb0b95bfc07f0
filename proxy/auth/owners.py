"""Message owners at the proxy (README "Message owners"): who may cancel, replace or read a
message, decided before its cancel or replace is written.

A scheduled message records the principal that scheduled it (route field ``w``, stamped by
proxy/routing/route.py from the Kafka connection's SASL principal or the HTTP caller). Cancel,
replace and status are allowed to that principal and to kdelay administrators, the principals
Kafka allows ALTER on the buffer topic (``TopicAccess.admin``, proxy/auth/authorization.py).

The proxy keeps no message state: it asks the replicas who owns an id (``GET
/v1/messages/{id}`` through zk/replica_api.py, on a worker thread, at most
:data:`OWNER_QUESTIONS` at once) and refuses another principal's cancel or replace: over Kafka
with INVALID_RECORD and a record error naming the id (:meth:`Owners.check_batch`), over HTTP
with 403 (proxy/http/messages.py, proxy/http/queries.py). An administrator's cancel or replace
carries ``"a": true`` so that the replicas apply it to anyone's message.

When the owner is unknown to the proxy (no replica knows a pending message with that id: not
ingested yet, already released or cancelled; the replicas are unreachable or slow; or
``zk_connect`` is unset) the proxy lets the cancel or replace through: the replicas are the
source of truth and apply it only to the messages its principal owns (and to those without an
owner), so another principal's message stays pending whatever the proxy could not see
(delay_service/cancels.py, ``kdelay_replica_cancels_refused_total``). Only the error on the
record is lost then, never the protection.

Concurrency: runs on the proxy's asyncio loop; the replica questions on worker threads
(:class:`zk.replica_api.ReplicaApi` is thread-safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import kafka.errors as kerr
import orjson

from kdelay import logs
from kdelay.buffer import BUFFER_TOPIC, ROUTE_HEADER
from kdelay.json_bytes import dumps
from kdelay.proxy.auth.authorization import TopicAccess
from kdelay.proxy.routing.route import Kind, Outgoing
from kdelay.proxy.wire import records as rec
from kdelay.zk.replica_api import NoReplicaError, ReplicaApi

log = logs.get(__name__)

#: Owner questions to the replicas in flight at once; more wait their turn.
OWNER_QUESTIONS: Final = 8
#: The ``reason`` label of a batch refused for another principal's message.
NOT_OWNER: Final = "not_owner"


def refusal(msg_id: str, action: str) -> str:
    """The error for a principal that may not ``action`` message ``msg_id``: it names the id
    and who may, never the owner."""
    return (
        f"message {msg_id!r} belongs to another principal: only its owner or a principal "
        f"with ALTER on {BUFFER_TOPIC} (a kdelay administrator) may {action} it"
    )


def admin_stamped(record: Outgoing) -> Outgoing:
    """``record`` (a cancel or a replace) marked as sent by a kdelay administrator: its route
    header, always the last, gains ``"a": true``."""
    name, value = record.headers[-1]
    assert name == ROUTE_HEADER
    assert value is not None
    route = orjson.loads(value)
    route["a"] = True
    return record._replace(headers=[*record.headers[:-1], (ROUTE_HEADER, dumps(route))])


def cancelling(record: Outgoing) -> bool:
    """Whether ``record`` cancels what its id has pending (a cancel, or a replace)."""
    return record.kind is Kind.CANCEL or record.replace


class Owners:
    """Asks the replicas who owns a message (module docstring). ``replicas`` gives the proxy's
    :class:`ReplicaApi` when asked (None: ``zk_connect`` is unset, owners are unknown)."""

    def __init__(self, replicas: Callable[[], ReplicaApi | None]) -> None:
        self._replicas = replicas
        self._questions = asyncio.Semaphore(OWNER_QUESTIONS)

    def replica_api(self) -> ReplicaApi | None:
        """The proxy's :class:`ReplicaApi` (None: ``zk_connect`` is unset)."""
        return self._replicas()

    async def owner(self, msg_id: str) -> str | None:
        """The owner of the message ``msg_id`` has pending, as the replicas say; None when it
        has none or it is unknown (module docstring)."""
        replicas = self._replicas()
        if replicas is None:
            return None
        async with self._questions:
            try:
                answer = await asyncio.to_thread(replicas.message, msg_id)
            except NoReplicaError as exc:
                log.warning("proxy.owner_unknown", id=msg_id, error=str(exc))
                return None
        if answer.status != 200 or answer.body.get("state") != "pending":
            return None
        owner = answer.body.get("owner")
        return owner if isinstance(owner, str) else None

    async def allowed(self, principal: str | None, admin: bool, msg_id: str) -> bool:
        """Whether ``principal`` (``admin``: a kdelay administrator) may cancel, replace or
        read message ``msg_id``: an administrator always; anyone else unless the replicas
        name another owner."""
        if admin:
            return True
        owner = await self.owner(msg_id)
        return owner is None or owner == principal

    async def check_batch(self, routed: list[Outgoing], access: TopicAccess) -> list[Outgoing]:
        """A routed batch's cancels and replaces held to their owners (Kafka listener): the
        batch with an administrator's stamped ``"a": true``, or BatchError INVALID_RECORD with
        the record error of the first record that touches another principal's message (the
        batch index is the routed record's: ``route`` routes one record to one)."""
        if await access.admin(BUFFER_TOPIC):
            return [admin_stamped(r) if cancelling(r) else r for r in routed]
        principal = str(access.principal)
        decided: dict[str, bool] = {}
        for index, record in enumerate(routed):
            if not cancelling(record) or record.id is None:
                continue
            if record.id not in decided:
                decided[record.id] = await self.allowed(principal, False, record.id)
            if not decided[record.id]:
                action = "cancel" if record.kind is Kind.CANCEL else "replace"
                raise rec.BatchError(
                    kerr.InvalidRecordError.errno,
                    f"record {index}: {refusal(record.id, action)}",
                    index=index,
                    reason=NOT_OWNER,
                )
        return routed


def others_in(doc: dict[str, Any], principal: str) -> bool:
    """Whether a message status ``doc`` (its ``history`` and ``last_outcome``) tells of
    messages with the same id that another principal scheduled (a reused id)."""
    owners = {e.get("owner") for e in doc.get("history") or [] if isinstance(e, dict)}
    last = doc.get("last_outcome")
    if isinstance(last, dict):
        owners.add(last.get("owner"))
    return bool(owners - {None, principal})


def own_view(doc: dict[str, Any], principal: str) -> dict[str, Any]:
    """``doc`` as ``principal`` (no administrator) may see it: without the history events and
    the last outcome of another principal's messages with the same id."""
    out = dict(doc)
    out["history"] = [e for e in doc.get("history") or [] if e.get("owner") in (None, principal)]
    last = doc.get("last_outcome")
    if isinstance(last, dict) and last.get("owner") not in (None, principal):
        del out["last_outcome"]
    return out
