"""Where each produced record goes (CONTRACT.md): through, into the buffer topic, or a cancel.

``route`` is the one entry point, shared by the Kafka listener (a partition's parsed batch) and
the HTTP API (one posted message). A batch is routed all-or-nothing: the first record that
cannot be routed raises RejectedRecordError and nothing of the batch is written. Every record is
first held to the proxy's limits (proxy/limits.py), here and nowhere else, so both listeners
enforce them alike; so is the rule that internal topics are written by no client
(proxy/routing/internal_topics.py, RefusedTopicError).

Buffer records (CONTRACT.md, ``kdelay/buffer/``): each delayed record and cancel goes to the
buffer partition of its *id*, under a buffer key of its own (proxy/routing/buffer_keys.py: derived
from an idempotent producer's identity, so a retried batch writes the same keys; random for other
producers and the HTTP API). Each delayed record also carries its acceptance order
(proxy/routing/buffer_keys.py), which orders messages due at the same millisecond, and, behind
authentication, its owner: the principal that sent it (route field ``w``; README "Message
owners", proxy/auth/owners.py), on cancels too, with ``"a": true`` for a kdelay administrator's
cancel or replace.

Functions of their arguments; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

from kdelay import buffer
from kdelay.errors import InvalidHeaderError, KdelayError
from kdelay.headers import (
    CANCEL,
    CONTROL_HEADERS,
    CancelRequest,
    Delay,
    DelayPolicy,
    classify,
    in_namespace,
    strip_control,
)
from kdelay.proxy.limits import LimitExceededError, RecordLimits, Violation
from kdelay.proxy.routing import internal_topics
from kdelay.proxy.routing.buffer_keys import (
    ACCEPTANCE_ORDER,
    AcceptanceOrder,
    BatchKeys,
    Origin,
    ReservedOrder,
)
from kdelay.proxy.wire.records import Record

HeaderList = list[tuple[str, bytes | None]]

#: Every control header starts with it: a record without a header name in kdelay's namespace
#: passes through without being parsed (the common case, kept cheap).
CONTROL_PREFIX = "kdelay-"
assert all(name.startswith(CONTROL_PREFIX) for name in CONTROL_HEADERS)
#: First letters of a name in kdelay's namespace in any case (``KDELAY_ID`` is a mistake that
#: ``classify`` rejects, so it must not take the fast path); other names skip ``in_namespace``.
_NAMESPACE_FIRST = ("k", "K")


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


class BufferUnavailableError(KdelayError):
    """A delayed record or cancel came while the buffer topic's partitions are unknown."""


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
    replace: bool = False  # a delayed record that replaces its id: also a cancel


class UpstreamPort(Protocol):
    """Where routed records are written (proxy/upstream/producer.py; a fake in unit tests)."""

    async def submit(self, records: list[Outgoing]) -> Awaitable[int]: ...


def _known(partitions: int) -> int:
    if partitions <= 0:
        raise BufferUnavailableError(
            f"{buffer.BUFFER_TOPIC} is not available upstream (its partitions are unknown)"
        )
    return partitions


def _buffer_partition(msg_id: str, partitions: int) -> int:
    return buffer.partition_for(msg_id, _known(partitions))


def _pinned(uid: str, topic: str, partition: int, partitions: int) -> tuple[str, int]:
    """The id of a message sent without ``kdelay-id`` (``buffer.pinned_id``) and its buffer
    partition, which that id names."""
    known = _known(partitions)
    return (
        buffer.pinned_id(uid, topic, partition, known),
        buffer.target_pin(topic, partition, known),
    )


def scheduled(
    msg_id: str,
    *,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    deliver_at_ms: int,
    headers: Iterable[tuple[str, bytes | None]],
    uid: str,
    buffer_partitions: int,
    delay_ms: int | None = None,
    seq: int = 0,
    repeat: str | None = None,
    buffer_partition: int | None = None,
    replace: bool = False,
    owner: str | None = None,
    admin: bool = False,
    producer_seq: str | None = None,
) -> Outgoing:
    """The buffer-topic record of a delayed message (``delay_ms``: due at its append time +
    ``delay_ms``; ``deliver_at_ms`` is then only the proxy's estimate). ``buffer_partition``:
    the id's, when the caller knows it (a pinned id's); else computed from the id. ``owner``:
    the principal that sent it; ``admin``: a kdelay administrator's replace; ``producer_seq``:
    its producer-sequence stamp (``kdelay.buffer.producer_seq``)."""
    value, routed_headers = buffer.encode_schedule(
        msg_id,
        topic=topic,
        partition=partition,
        key=key,
        value=value,
        headers=strip_control(headers),
        deliver_at_ms=deliver_at_ms,
        delay_ms=delay_ms,
        seq=seq,
        repeat=repeat,
        replace=replace,
        owner=owner,
        admin=admin and replace,
        producer_seq=producer_seq,
    )
    return Outgoing(
        Kind.DELAYED,
        buffer.BUFFER_TOPIC,
        _buffer_partition(msg_id, buffer_partitions)
        if buffer_partition is None
        else buffer_partition,
        (uid or msg_id).encode(),
        value,
        routed_headers,
        None,
        msg_id,
        deliver_at_ms,
        replace,
    )


def cancel(
    msg_id: str,
    *,
    uid: str,
    buffer_partitions: int,
    owner: str | None = None,
    admin: bool = False,
    producer_seq: str | None = None,
) -> Outgoing:
    """The buffer-topic record that cancels ``msg_id``: in the id's partition, after it;
    ``owner``: the principal that sent it, ``admin``: a kdelay administrator;
    ``producer_seq``: its producer-sequence stamp (``kdelay.buffer.producer_seq``)."""
    enc = buffer.encode(
        buffer.Cancel(msg_id, uid, owner=owner, admin=admin, producer_seq=producer_seq)
    )
    return Outgoing(
        Kind.CANCEL,
        buffer.BUFFER_TOPIC,
        _buffer_partition(msg_id, buffer_partitions),
        enc.key,
        enc.value,
        list(enc.headers),
        None,
        msg_id,
    )


def _delayed(
    asked: Delay,
    r: Record,
    *,
    topic: str,
    partition: int,
    uid: str,
    buffer_partitions: int,
    seq: int,
    owner: str | None,
    admin: bool,
    producer_seq: str | None = None,
) -> Outgoing:
    """The buffer record of ``r``, delayed as ``asked``; without an id, one pinned to the
    target partition's buffer partition."""
    msg_id, pin = (
        (asked.id, None) if asked.id else _pinned(uid, topic, partition, buffer_partitions)
    )
    return scheduled(
        msg_id,
        topic=topic,
        partition=partition,
        key=r.key,
        value=r.value,
        deliver_at_ms=asked.deliver_at_ms,
        headers=r.headers,
        uid=uid,
        buffer_partitions=buffer_partitions,
        delay_ms=asked.delay_ms,
        seq=seq,
        repeat=asked.repeat,
        buffer_partition=pin,
        replace=asked.replace,
        owner=owner,
        admin=admin,
        producer_seq=producer_seq,
    )


def _over_limit(index: int, exc: LimitExceededError) -> RejectedRecordError:
    return RejectedRecordError(
        index, f"record {index}: {exc.violation.describe()}", limit=exc.violation
    )


def route(
    topic: str,
    partition: int,
    records: Sequence[Record],
    now_ms: int,
    policy: DelayPolicy,
    *,
    limits: RecordLimits = DEFAULT_LIMITS,
    buffer_partitions: int = 0,
    origin: Origin | None = None,
    order: AcceptanceOrder = ACCEPTANCE_ORDER,
    owner: str | None = None,
    admin: bool = False,
) -> tuple[list[Outgoing], dict[Kind, int]]:
    """The records to write upstream for ``records`` produced to ``topic``/``partition``, in
    order, and how many of each kind; raises RejectedRecordError for the first record that
    cannot be routed (over one of ``limits``, a malformed control header or a look-alike of
    one), RefusedTopicError when ``topic`` is internal (proxy/routing/internal_topics.py: only a
    cancel may be addressed to the buffer topic), BufferUnavailableError when a record is for the
    buffer and ``buffer_partitions`` is unknown (0). ``origin``: the batch's idempotent
    producer, from which buffer keys derive (see the module docstring). ``owner``: the
    principal that sent the records (None: no authentication), stamped on delayed records and
    cancels; ``admin``: it is a kdelay administrator, stamped on cancels and replaces."""
    out: list[Outgoing] = []
    append = out.append
    immediate = Kind.IMMEDIATE
    counts = dict.fromkeys(Kind, 0)
    # Raises unless only a cancel may go to ``topic``, and then says why the rest may not.
    to_buffer = (refused := internal_topics.check(topic)) is not None
    namespace_first = _NAMESPACE_FIRST
    # Locals: these checks run per record on the immediate path.
    max_headers = limits.max_headers
    max_key = limits.max_key_bytes
    max_value = limits.max_value_bytes
    # A name of at most this many characters is within the limit in UTF-8 bytes too.
    name_chars = limits.max_header_name_bytes // 4
    max_header_value = limits.max_header_value_bytes
    seqs = ReservedOrder(order)
    keys = BatchKeys(origin, topic, partition)
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
                    limits.scan_headers(headers, CONTROL_PREFIX)  # raises when over
                    control = any(in_namespace(n) for n, _ in headers)
                    break
                if name.startswith(CONTROL_PREFIX) or (
                    name.startswith(namespace_first) and in_namespace(name)
                ):
                    control = True
        except LimitExceededError as exc:
            raise _over_limit(i, exc) from None
        ts = r.timestamp
        if not (to_buffer or control):
            # the common case: no header can be a control one
            append(Outgoing(immediate, topic, partition, key, value, headers,
                            ts if ts is not None and ts >= 0 else None))  # fmt: skip
            continue
        if refused is not None and all(n != CANCEL for n, _ in headers):
            raise internal_topics.carrier_refusal(topic, i, refused)  # cancels only
        try:
            asked = classify(headers, now_ms, policy) if control else None
        except InvalidHeaderError as exc:
            raise RejectedRecordError(i, f"record {i}: {exc}", exc) from None
        if asked is None:
            # kdelay's own names that are no control header (delivered ones)
            routed = Outgoing(immediate, topic, partition, key, value, headers,
                              ts if ts is not None and ts >= 0 else None)  # fmt: skip
        elif isinstance(asked, CancelRequest):
            uid = keys.key(i, r)
            routed = cancel(
                asked.id,
                uid=uid,
                buffer_partitions=buffer_partitions,
                owner=owner,
                admin=admin,
                producer_seq=keys.stamp(i),
            )
        else:
            assert isinstance(asked, Delay)
            routed = _delayed(
                asked,
                r,
                topic=topic,
                partition=partition,
                uid=keys.key(i, r),
                buffer_partitions=buffer_partitions,
                seq=seqs.take(len(records) - i),
                owner=owner,
                admin=admin,
                producer_seq=keys.stamp(i),
            )
        counts[routed.kind] += 1
        append(routed)
    counts[immediate] = len(out) - counts[Kind.DELAYED] - counts[Kind.CANCEL]
    return out, counts
