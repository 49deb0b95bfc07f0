"""Confirmed and bulk cancels over HTTP: wait until the master has decided (CONTRACT.md v3
"Confirmed cancel", "Bulk cancel"; proxy/http/messages.py writes the records).

Confirmed cancel (``DELETE /v1/messages/{id}?wait=S``): the proxy knows where its cancel was
appended (buffer partition and offset, from its delivery report). It asks the replicas of the
shard that owns that partition (zk/replica_api.py, the master first) for the id's status until
the answer comes from the **master** and says the master's store has applied the cancel (its
``ingested_offsets`` of that partition is past the cancel's offset). The status then decides:

- ``cancelled``: 200 ``{"id", "state": "cancelled"}`` (it will never be delivered);
- ``delivered``: 409 ``{"id", "state": "already_delivered", "delivered_at"}`` (the release's
  time, epoch ms); ``dead_lettered``: 409 ``{"id", "state": "dead_lettered",
  "dead_lettered_at"}``;
- ``pending`` with ``releasing``: the master was releasing it when it read the cancel, which
  waits for that release's outcome (delivered: 409; surely not written: the cancel applies,
  200); not decided yet, so the proxy keeps asking (CONTRACT.md v4: 200 only when it can no
  longer be delivered);
- ``pending``: a message with that id is pending although the cancel was applied: another
  principal's the proxy could not tell (the replicas left it, README "Message owners"), or
  one sent after the cancel; 409 ``{"id", "state": "not_cancelled", "reason"}``;
- unknown to the master once the cancel is applied: 404.

Not decided within ``S`` seconds (no master answered, or it has not read the cancel yet): 202
``{"id", "state": "pending"}``, as without ``wait``: the cancel is durable and will be applied.

Bulk cancel (``DELETE /v1/messages?id_prefix=P&wait=S``): the proxy writes one copy in each
of the ``N`` buffer partitions, with the id ``bulk.p<N>.<hex>`` (``kdelay.buffer.bulk_ids``;
delay_service/store/bulk_cancels.py, "Copies"). The count the masters recorded for that id
(``GET /v1/bulk-cancels/<id>`` of every shard of the layout at answer time, summed), once the
masters that answered have applied, between them, the copy of every partition ``0..N-1``,
each exactly once: 200 ``{"id", "cancelled", "refused"}``; not within ``S``: 202 ``{"id",
"state": "pending"}``. So the answer does not depend on the shard layout when the cancel was
written (a reshard in between) or on whether this proxy could ask ZooKeeper for it.

The questions run on worker threads (``asyncio.to_thread``); they are asked every
:data:`POLL_S` (growing to :data:`POLL_MAX_S`) until the deadline. A replica question that
fails (NoReplicaError) is asked again until the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.zk.replica_api import NoReplicaError, ReplicaAnswer, ReplicaApi

#: Longest ``wait`` a request may ask for, seconds.
MAX_WAIT_S: Final = 60.0
POLL_S: Final = 0.05
POLL_MAX_S: Final = 0.5


def parse_wait(text: str | None) -> float | None:
    """``wait`` in seconds (None: absent); ValueError naming it when it is not a number of
    seconds from 0 to MAX_WAIT_S."""
    if text is None:
        return None
    try:
        wait = float(text)
    except ValueError:
        raise ValueError(f"wait: {text[:40]!r} is not a number of seconds") from None
    if not 0 <= wait <= MAX_WAIT_S:  # also refuses nan
        raise ValueError(f"wait: must be from 0 to {MAX_WAIT_S:g} seconds, not {text[:40]}")
    return wait


def _applied(body: dict[str, Any], partition: int, offset: int) -> bool:
    """Whether an answer says its replica has applied the buffer record at ``partition`` /
    ``offset`` (its ingested offset is past it)."""
    offsets = body.get("ingested_offsets")
    if not isinstance(offsets, dict):
        return False
    ingested = offsets.get(str(partition))
    return isinstance(ingested, int) and ingested > offset


#: A message that left before the cancel: its state in the 409, and its time's field.
_LEFT: Final = {
    "delivered": ("already_delivered", "delivered_at"),
    "dead_lettered": ("dead_lettered", "dead_lettered_at"),
}


def decide(msg_id: str, answer: ReplicaAnswer, partition: int, offset: int) -> Decision | None:
    """The confirmed cancel's answer from one replica answer (module docstring), None while
    it does not decide (not the master, or the cancel not applied yet)."""
    body = answer.body
    releasing = body.get("state") == "pending" and body.get("releasing")  # outcome not known
    if body.get("role") != "master" or not _applied(body, partition, offset) or releasing:
        return None
    if answer.status != 200:  # 404: unknown to the master (400: a bad id, refused before)
        return Decision(answer.status, {"error": body.get("error"), "field": "id"})
    state = body.get("state")
    if state == "cancelled":
        return Decision(200, {"id": msg_id, "state": "cancelled"})
    if state == "delivered":
        return Decision(
            409,
            {"id": msg_id, "state": "already_delivered", "delivered_at": body.get("released_at")},
        )
    if state == "dead_lettered":
        return Decision(
            409,
            {"id": msg_id, "state": "dead_lettered", "dead_lettered_at": body.get("released_at")},
        )
    reason = (
        f"a message with id {msg_id!r} is pending after the master applied the cancel: "
        "another principal's, or one sent after the cancel"
    )
    return Decision(409, {"id": msg_id, "state": "not_cancelled", "reason": reason})


class Decision:
    """An HTTP status and its JSON body."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body


async def _poll(question: Callable[[], Decision | None], wait_s: float) -> Decision | None:
    """Ask ``question()`` (returns a Decision or None) until it decides or ``wait_s`` pass."""
    deadline = time.monotonic() + wait_s
    pause = POLL_S
    while True:
        try:
            decision = await asyncio.to_thread(question)
        except NoReplicaError:
            decision = None
        if decision is not None:
            return decision
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, POLL_MAX_S)


async def confirm_cancel(
    replicas: ReplicaApi, msg_id: str, partition: int, offset: int, wait_s: float
) -> Decision:
    """Wait up to ``wait_s`` for the master's decision on the cancel of ``msg_id`` appended
    at ``partition``/``offset`` (module docstring)."""

    def ask() -> Decision | None:
        return decide(msg_id, replicas.message_in(msg_id, partition), partition, offset)

    decision = await _poll(ask, wait_s)
    return decision or Decision(202, {"id": msg_id, "state": "pending"})


def bulk_decision(bulk_id: str, answer: ReplicaAnswer) -> Decision | None:
    """The bulk cancel's 200 from the shards' summed answer (``ReplicaApi.bulk_cancel``), None
    while it does not decide: not every partition's copy applied exactly once, or an answer
    not from a master."""
    body = answer.body
    roles = str(body.get("role", "")).split(",")
    if answer.status != 200 or any(role != "master" for role in roles):
        return None
    copies = bulk_copies(bulk_id)
    if copies is not None and sorted(body.get("partitions") or []) != list(range(copies)):
        return None
    return Decision(
        200,
        {
            "id": bulk_id,
            "cancelled": int(body.get("cancelled", 0)),
            "refused": int(body.get("refused", 0)),
        },
    )


async def bulk_count(replicas: ReplicaApi, bulk_id: str, wait_s: float) -> Decision:
    """Wait up to ``wait_s`` for the masters to have applied every copy of bulk cancel
    ``bulk_id``; its counts then (module docstring)."""

    def ask() -> Decision | None:
        return bulk_decision(bulk_id, replicas.bulk_cancel(bulk_id))

    decision = await _poll(ask, wait_s)
    return decision or Decision(202, {"id": bulk_id, "state": "pending"})
