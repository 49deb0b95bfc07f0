"""A posted message's body (``MessageIn``, CONTRACT.md) and the buffer record it becomes.

A posted message is routed like a produced record (proxy/routing/route.py), so both reject the
same values with the same reason: 400 for a field's bad value, 403 for an internal topic, 413 for
a size over a limit (the statuses of proxy/http/errors.py); the routes are
proxy/http/messages.py's.

A posted message with an ``id`` gets a buffer key derived from every field of its body (README
"HTTP API"): the same POST sent again (a client retrying after a timeout) writes the same buffer
record again, which the replicas keep once, while a message that differs in any field (another
``repeat`` too) with the same id is a new message.

The functions are safe from any thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kdelay import headers as h
from kdelay.headers import DelayPolicy
from kdelay.proxy.http.errors import (
    BadRequestError,
    ForbiddenTopicError,
    OverLimitError,
    UnavailableError,
)
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.routing import internal_topics
from kdelay.proxy.routing.buffer_keys import (
    ACCEPTANCE_ORDER,
    AcceptanceOrder,
    BrokerTimeUnknownError,
    Origin,
)
from kdelay.proxy.routing.internal_topics import RefusedTopicError
from kdelay.proxy.routing.route import (
    DEFAULT_LIMITS,
    Incoming,
    Outgoing,
    RejectedRecordError,
    route,
)

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


def route_message(
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
