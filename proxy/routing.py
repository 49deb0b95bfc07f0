"""Where each produced record goes (CONTRACT.md): through, into the buffer topic, or a cancel.

``route`` is the one entry point, shared by the Kafka listener (a partition's parsed batch) and
the HTTP API (one posted message). A batch is routed all-or-nothing: the first record that
cannot be routed raises RejectedRecordError and nothing of the batch is written. Every record is
first held to the proxy's limits (proxy/limits.py), here and nowhere else, so both listeners
enforce them alike.

Pure functions; safe from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from kdelay import buffer
from kdelay.errors import InvalidHeaderError, KdelayError
from kdelay.headers import (
    CONTROL_HEADERS,
    CancelRequest,
    Delay,
    DelayPolicy,
    classify,
    new_id,
    strip_control,
)
from proxy.limits import LimitExceededError, RecordLimits, Violation
from proxy.records import Record

HeaderList = list[tuple[str, bytes | None]]

#: Every control header starts with it: a record without such a header name passes through
#: without being parsed (the common case, kept cheap).
CONTROL_PREFIX = "kdelay-"
assert all(name.startswith(CONTROL_PREFIX) for name in CONTROL_HEADERS)


class Kind(StrEnum):
    """What a record turned out to be (also the ``kind`` label of records_total)."""

    IMMEDIATE = "immediate"
    DELAYED = "delayed"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record as the producer sent it, when it did not come in a record batch (the HTTP
    API). Routing passes ``headers`` on as they are: give each record its own list."""

    key: bytes | None
    value: bytes | None
    headers: HeaderList
    timestamp: int | None = None


class RejectedRecordError(KdelayError):
    """Record ``index`` of a batch cannot be routed, so nothing of the batch is written;
    ``header_error`` is set when one of its control headers is at fault (it names the header),
    ``limit`` when the record is over one of the proxy's limits (it names the setting)."""

    def __init__(
        self,
        index: int,
        message: str,
        header_error: InvalidHeaderError | None = None,
        *,
        limit: Violation | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.header_error = header_error
        self.limit = limit

    @property
    def reason(self) -> str:
        """The ``reason`` label of the rejected-records metric."""
        return self.limit.setting if self.limit is not None else "invalid_record"


#: The limits of a proxy whose configuration does not say otherwise.
DEFAULT_LIMITS = RecordLimits()


def wall_clock_ms() -> int:
    """Now in epoch milliseconds: a delay counts from the moment the proxy accepted a record."""
    return time.time_ns() // 1_000_000


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


def _over_limit(index: int, exc: LimitExceededError) -> RejectedRecordError:
    return RejectedRecordError(
        index, f"record {index}: {exc.violation.describe()}", limit=exc.violation
    )


def route(
    topic: str,
    partition: int,
    records: Iterable[Record],
    now_ms: int,
    policy: DelayPolicy,
    *,
    limits: RecordLimits = DEFAULT_LIMITS,
) -> tuple[list[Outgoing], dict[Kind, int]]:
    """The records to write upstream for ``records`` produced to ``topic``/``partition``, in
    order, and how many of each kind; raises RejectedRecordError for the first record that
    cannot be routed (over one of ``limits``, a malformed control header, or no control header
    on a record for the buffer topic, which only the proxy writes)."""
    out: list[Outgoing] = []
    append = out.append
    immediate = Kind.IMMEDIATE
    counts = dict.fromkeys(Kind, 0)
    to_buffer = topic == buffer.BUFFER_TOPIC
    # Locals: these checks run per record on the immediate path.
    max_headers = limits.max_headers
    max_key = limits.max_key_bytes
    max_value = limits.max_value_bytes
    # A name of at most this many characters is within the limit in UTF-8 bytes too.
    name_chars = limits.max_header_name_bytes // 4
    max_header_value = limits.max_header_value_bytes
    for i, r in enumerate(records):
        headers = r.headers
        key = r.key
        value = r.value
        control = False
        try:
            if (
                len(headers) > max_headers
                or (key is not None and len(key) > max_key)
                or (value is not None and len(value) > max_value)
            ):
                limits.check_body(key, value, headers)
            # limits.scan_headers inlined: one pass per record on the immediate path.
            for name, hv in headers:
                if len(name) > name_chars or (hv is not None and len(hv) > max_header_value):
                    control = limits.scan_headers(headers, CONTROL_PREFIX)  # raises when over
                    break
                if name.startswith(CONTROL_PREFIX):
                    control = True
        except LimitExceededError as exc:
            raise _over_limit(i, exc) from None
        ts = r.timestamp
        passed = Outgoing(
            immediate,
            topic,
            partition,
            key,
            value,
            headers,
            ts if ts is not None and ts >= 0 else None,
        )
        if not (to_buffer or control):
            append(passed)  # the common case: no header can be a control one
            continue
        try:
            asked = classify(headers, now_ms, policy) if control else None
        except InvalidHeaderError as exc:
            raise RejectedRecordError(i, str(exc), exc) from None
        if asked is None:
            if to_buffer:
                raise RejectedRecordError(
                    i, f"{buffer.BUFFER_TOPIC} is written by the proxy only; send kdelay headers"
                )
            routed = passed  # names with the control prefix that are no control header
        elif isinstance(asked, CancelRequest):
            routed = cancel(asked.id)
        else:
            assert isinstance(asked, Delay)
            routed = scheduled(
                asked.id or new_id(),
                topic=topic,
                partition=partition,
                key=key,
                value=value,
                deliver_at_ms=asked.deliver_at_ms,
                headers=headers,
            )
        counts[routed.kind] += 1
        append(routed)
    counts[immediate] = len(out) - counts[Kind.DELAYED] - counts[Kind.CANCEL]
    return out, counts
