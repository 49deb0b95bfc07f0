"""Where each produced record goes (CONTRACT.md): through, into the buffer topic, or a cancel.

Pure functions over one partition's records, shared by the Kafka listener and the HTTP API. A
batch is routed all-or-nothing: the first invalid control header raises InvalidHeaderError and
nothing of the batch is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from kdelay import buffer
from kdelay.headers import (
    CONTROL_HEADERS,
    CancelRequest,
    Delay,
    DelayPolicy,
    classify,
    new_id,
    strip_control,
)

HeaderList = list[tuple[str, bytes | None]]

#: Every control header starts with it: a record without such a header name passes through
#: without being parsed (the common case, kept cheap).
CONTROL_PREFIX = "kdelay-"
assert all(name.startswith(CONTROL_PREFIX) for name in CONTROL_HEADERS)


def has_control_header(headers: Iterable[tuple[str, bytes | None]]) -> bool:
    """Whether any header name could be a control header."""
    # A loop, not any() over a generator: this runs per record, and the generator costs more
    # than the test itself.
    for name, _ in headers:  # noqa: SIM110 - see above
        if name.startswith(CONTROL_PREFIX):
            return True
    return False


class Kind(StrEnum):
    """What a record turned out to be (also the ``kind`` label of records_total)."""

    IMMEDIATE = "immediate"
    DELAYED = "delayed"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record as the producer sent it."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    timestamp_ms: int | None = None


class Outgoing(NamedTuple):
    """One record to write upstream. ``partition`` -1 lets the upstream partitioner choose
    (by key: the buffer topic is keyed by message id).

    A NamedTuple, not a frozen dataclass: one is made per record on the immediate path, and a
    frozen dataclass's ``__init__`` (``object.__setattr__`` per field) costs about 6x more."""

    kind: Kind
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: HeaderList
    timestamp_ms: int | None
    id: str | None = None
    deliver_at_ms: int | None = None


def scheduled(
    msg_id: str,
    *,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    deliver_at_ms: int,
    headers: Iterable[tuple[str, bytes | None]],
) -> Outgoing:
    """The buffer-topic record of a delayed message."""
    enc = buffer.encode(
        buffer.Scheduled(
            id=msg_id,
            topic=topic,
            partition=partition,
            key=key,
            value=value,
            deliver_at_ms=deliver_at_ms,
            headers=strip_control(headers),
        )
    )
    return Outgoing(
        Kind.DELAYED,
        buffer.BUFFER_TOPIC,
        -1,
        enc.key,
        enc.value,
        list(enc.headers),
        None,
        msg_id,
        deliver_at_ms,
    )


def cancel(msg_id: str) -> Outgoing:
    """The buffer-topic record that cancels ``msg_id``."""
    enc = buffer.encode(buffer.Cancel(msg_id))
    return Outgoing(
        Kind.CANCEL, buffer.BUFFER_TOPIC, -1, enc.key, enc.value, list(enc.headers), None, msg_id
    )


def route_record(
    topic: str, partition: int, record: Incoming, now_ms: int, policy: DelayPolicy
) -> Outgoing:
    """Route one record; raises InvalidHeaderError naming the header."""
    asked = classify(record.headers, now_ms, policy) if has_control_header(record.headers) else None
    if asked is None:
        return Outgoing(
            Kind.IMMEDIATE,
            topic,
            partition,
            record.key,
            record.value,
            list(record.headers),
            record.timestamp_ms,
        )
    if isinstance(asked, CancelRequest):
        return cancel(asked.id)
    assert isinstance(asked, Delay)
    return scheduled(
        asked.id or new_id(),
        topic=topic,
        partition=partition,
        key=record.key,
        value=record.value,
        deliver_at_ms=asked.deliver_at_ms,
        headers=record.headers,
    )


def route_batch(
    topic: str, partition: int, records: Iterable[Incoming], now_ms: int, policy: DelayPolicy
) -> list[Outgoing]:
    """Route every record of one partition's batch, or raise on the first invalid one."""
    return [route_record(topic, partition, r, now_ms, policy) for r in records]
