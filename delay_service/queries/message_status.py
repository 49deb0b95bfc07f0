"""One message's status document, as a replica answers ``GET /v1/messages/<id>``
(queries.py serves it; docs/status.md).

A pending entry (:meth:`Store.get`) is ``pending``, with its due time, target, buffer position,
headers and ``owner`` (the principal that scheduled it; absent without authentication); a
message that left the store is what :meth:`Store.outcome` remembers (``delivered``,
``cancelled``, ``dead_lettered``), with who cancelled it (``cancelled_by``) or why it was
dead-lettered (``reason``) when known. A pending entry the master is releasing right now (its
outcome not known yet: a cancel read meanwhile waits for it, ``in_round.py``) carries
``"releasing": true``: a confirmed cancel is not decided by such an answer; nor by that of a
series whose released occurrence a cancel waited on, until the store reads the next occurrence
that release wrote (``pending``, ``releasing``, the last outcome as ``last_outcome``,
``in_round.py``). When both exist (a reused id, or a recurring message whose earlier
occurrence was released) the answer is ``pending`` and carries the other as ``last_outcome``.
Neither: unknown (None; the caller answers 404).

Every answer carries the id's ``history``, oldest first: each message with the id (each
occurrence of a series) as ``accepted`` (when a proxy accepted it, by whom), then what became
of it: ``delivered`` or ``dead_lettered`` (at what time, ``lateness_ms`` after its due time, and
why for a dead letter), ``cancelled`` (when, by whom), or ``replaced`` (by a message sent with
``kdelay-replace``: when, by whom). A replica keeps the last
:data:`delay_service.store.outcomes.HISTORY_MAX` outcomes per id, for as long as it keeps outcomes.
"""

from __future__ import annotations

import base64
from typing import Any

from kdelay.buffer import accepted_ms
from kdelay.delay_service.store.entry import Entry, entry_seq
from kdelay.delay_service.store.outcomes import CANCELLED, REPLACED, Outcome
from kdelay.delay_service.store.store import Store

PENDING = "pending"
#: The time field of an outcome's document, by state (the others: ``released_at``).
_AT_FIELD = {CANCELLED: "cancelled_at", REPLACED: "replaced_at"}
#: Who removed it, by state.
_BY = {CANCELLED: "cancelled_by", REPLACED: "replaced_by"}


def headers_doc(headers: tuple[tuple[str, bytes | None], ...]) -> list[dict[str, Any]]:
    """A message's headers as JSON: ``{"key", "value"}`` with the value as text, or
    ``{"key", "value_base64"}`` when it is not UTF-8; a null value stays null."""
    out: list[dict[str, Any]] = []
    for key, value in headers:
        if value is None:
            out.append({"key": key, "value": None})
            continue
        try:
            out.append({"key": key, "value": value.decode("utf-8")})
        except UnicodeDecodeError:
            out.append({"key": key, "value_base64": base64.b64encode(value).decode()})
    return out


def pending_status(entry: Entry) -> dict[str, Any]:
    """The status document of a pending entry."""
    msg = entry.message
    doc: dict[str, Any] = {
        "id": msg.id,
        "state": PENDING,
        "deliver_at": msg.deliver_at_ms,
        "topic": msg.topic,
        # -1: the partitioner picks one from the key when it is released.
        "partition": None if msg.partition < 0 else msg.partition,
        "buffer": {"partition": entry.partition, "offset": entry.offset, "key": msg.buffer_key},
        "headers": headers_doc(msg.headers),
    }
    if (accepted := accepted_ms(entry_seq(entry.key))) is not None:
        doc["accepted_at"] = accepted
    if msg.owner is not None:  # the principal that scheduled it (README "Message owners")
        doc["owner"] = msg.owner
    if msg.repeat is not None:  # a recurring message: which occurrence is pending
        doc["repeat"] = msg.repeat
        doc["occurrence"] = msg.occurrence
    return doc


def outcome_status(outcome: Outcome) -> dict[str, Any]:
    """The status document of a message that left the store."""
    doc: dict[str, Any] = {
        "id": outcome.id,
        "state": outcome.state,
        "deliver_at": outcome.deliver_at_ms,
        "topic": outcome.topic,
        "partition": outcome.partition,
        "offset": outcome.offset,
        _AT_FIELD.get(outcome.state, "released_at"): outcome.at_ms,
        "source": outcome.source,
    }
    if outcome.occurrence is not None:
        doc["occurrence"] = outcome.occurrence
    if outcome.accepted_ms is not None:
        doc["accepted_at"] = outcome.accepted_ms
    if outcome.owner is not None:
        doc["owner"] = outcome.owner
    if outcome.reason is not None:
        doc["reason"] = outcome.reason
    if outcome.state in _BY and (outcome.by is not None or outcome.admin):
        doc[_BY[outcome.state]] = _canceller(outcome)
    return doc


def _canceller(outcome: Outcome) -> dict[str, Any]:
    return {"principal": outcome.by, "admin": bool(outcome.admin)}


def outcome_events(outcome: Outcome) -> list[dict[str, Any]]:
    """One message's history: its acceptance (when known) and what became of it."""
    events: list[dict[str, Any]] = []
    common: dict[str, Any] = {"deliver_at": outcome.deliver_at_ms}
    if outcome.occurrence is not None:
        common["occurrence"] = outcome.occurrence
    if outcome.owner is not None:  # whose message (the proxy shows a principal only its own)
        common["owner"] = outcome.owner
    if outcome.accepted_ms is not None:
        accepted = {"event": "accepted", "at": outcome.accepted_ms, **common}
        if outcome.owner is not None:
            accepted["by"] = outcome.owner
        events.append(accepted)
    last: dict[str, Any] = {"event": outcome.state, "at": outcome.at_ms, **common}
    if outcome.state in _BY:
        if outcome.by is not None or outcome.admin:
            last["by"] = _canceller(outcome)
    else:
        last.update(topic=outcome.topic, partition=outcome.partition, offset=outcome.offset)
        if outcome.at_ms is not None and outcome.deliver_at_ms is not None:
            last["lateness_ms"] = outcome.at_ms - outcome.deliver_at_ms
        if outcome.reason is not None:
            last["reason"] = outcome.reason
    last["source"] = outcome.source
    events.append(last)
    return events


def pending_events(entry: Entry) -> list[dict[str, Any]]:
    """A pending message's history so far: its acceptance, when known."""
    msg = entry.message
    at = accepted_ms(entry_seq(entry.key))
    if at is None:
        return []
    event: dict[str, Any] = {"event": "accepted", "at": at, "deliver_at": msg.deliver_at_ms}
    if msg.repeat is not None:
        event["occurrence"] = msg.occurrence
    if msg.owner is not None:
        event["by"] = event["owner"] = msg.owner
    return [event]


def message_status(store: Store, msg_id: str) -> dict[str, Any] | None:
    """The status of message ``msg_id`` in ``store`` (module docstring), None when unknown."""
    entry = store.get(msg_id)
    earlier = store.history(msg_id)
    history = [event for outcome in earlier for event in outcome_events(outcome)]
    if entry is not None:
        doc = pending_status(entry)
        if store.in_release(entry.key):
            doc["releasing"] = True
        if earlier:
            doc["last_outcome"] = outcome_status(earlier[-1])
        doc["history"] = [*history, *pending_events(entry)]
        return doc
    if not earlier:
        return None
    if store.awaits_next(msg_id):  # a cancel awaits the series' next occurrence (in_round.py)
        last = outcome_status(earlier[-1])
        doc = {"id": msg_id, "state": PENDING, "releasing": True, "topic": last["topic"]}
        if "owner" in last:
            doc["owner"] = last["owner"]
        return {**doc, "last_outcome": last, "history": history}
    return {**outcome_status(earlier[-1]), "history": history}
