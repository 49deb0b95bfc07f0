"""The buffer records as values: a scheduled message, a cancel, a tombstone and the fate it
carries (the contract is :mod:`kdelay.buffer`'s docstring; :mod:`kdelay.buffer.codec` turns
them into Kafka records and back).

Immutable values (``@immutable``); safe from any thread.
"""

from __future__ import annotations

from dataclasses import field, replace

from kdelay import headers as h
from kdelay.errors import KdelayError
from kdelay.immutable import immutable
from kdelay.repeat import parse_repeat

#: What :meth:`Scheduled.next_due` raises for a repeat value this version cannot follow.
REPEAT_ERRORS = (KdelayError, ValueError, OverflowError)
#: The proxy checked each gap of a series against its maximum horizon; no second check here.
_NO_HORIZON = 2**62


@immutable
class Scheduled:
    """A message waiting in the buffer topic for its due time."""

    id: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    deliver_at_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())  # None: a null value
    uid: str = ""  # the buffer key; "" for a version-1 record, whose key is the id
    seq: int = 0  # order among messages due at the same millisecond
    delay_ms: int | None = None  # set: written as "r", due = append time + delay_ms
    repeat: str | None = None  # a recurring message's canonical kdelay-repeat value
    occurrence: int = 1  # which occurrence of its series this record is
    #: Sent with ``kdelay-replace: true``: it also cancels what its id has pending (the
    #: cancel rule's, :func:`kdelay.buffer.cancels`), and is itself pending.
    replace: bool = False
    #: The principal that scheduled it (``"User:alice"``); None without authentication.
    owner: str | None = None
    #: A replace by a kdelay administrator: its cancel part may cancel any owner's messages.
    admin: bool = False
    #: Who produced it in which order (route field ``q``, ``cancel_rule.producer_seq``): an
    #: idempotent producer's id, epoch, target partition, sequence number and target topic;
    #: None when unknown (HTTP, a producer without idempotence, an older proxy).
    producer_seq: str | None = None

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic."""
        return self.uid or self.id

    @property
    def series_key(self) -> str:
        """The buffer key of occurrence 1 of this record's series (its own for occurrence 1
        and for a message that does not repeat): occurrence n is ``<that key>#<n>``."""
        return self.buffer_key.partition("#")[0]

    def delivered_headers(self) -> list[tuple[str, bytes | None]]:
        """Headers of the released record: the producer's own, plus the id and the due time
        (and a recurring message's occurrence number)."""
        out = [
            *self.headers,
            (h.ID, self.id.encode()),
            (h.DELIVER_AT, str(self.deliver_at_ms).encode()),
        ]
        if self.repeat is not None:
            out.append((h.OCCURRENCE, str(self.occurrence).encode()))
        return out

    def next_due(self) -> int | None:
        """When occurrence n+1 of this recurring message is due: None when it does not repeat
        or its series ends at this occurrence; raises one of :data:`REPEAT_ERRORS` for a
        repeat value this version cannot follow."""
        if self.repeat is None:
            return None
        return parse_repeat(self.repeat, _NO_HORIZON).after(self.occurrence, self.deliver_at_ms)

    def next_occurrence(self, deliver_at_ms: int, seq: int) -> Scheduled:
        """Occurrence n+1 of this recurring message, due at ``deliver_at_ms``: same id, order
        ``seq`` (occurrence 1's: its acceptance time, so a cancel of the series also cancels an
        occurrence written just after it, ``cancels.py`` rule 2) and content, buffer key ``<key
        of occurrence 1>#<n+1>`` (so a copy written twice, by two masters around a failover,
        is kept once)."""
        return replace(
            self,
            deliver_at_ms=deliver_at_ms,
            uid=f"{self.series_key}#{self.occurrence + 1}",
            delay_ms=None,
            seq=seq,
            occurrence=self.occurrence + 1,
            # Occurrence 1 replaced what was pending; the next ones replace nothing, and the
            # replace's own cancel part does not cancel them (``cancel_rule.own_series``).
            replace=False,
            admin=False,
        )


@immutable
class Cancel:
    """Cancels the pending messages ``id`` produced before it; a no-op for delivered ones."""

    id: str
    uid: str = ""  # the buffer key; "" for a version-1 record
    #: The principal that sent it; None without authentication.
    owner: str | None = None
    #: Sent by a kdelay administrator: it cancels any owner's messages.
    admin: bool = False
    #: A bulk cancel (route field ``px``): it cancels the pending messages whose id starts with
    #: this prefix (never empty), ``id`` being the bulk cancel's own id; None: a cancel of ``id``.
    prefix: str | None = None
    #: A bulk cancel limited to messages for this target topic (route field ``t``).
    topic: str | None = None
    #: As :attr:`Scheduled.producer_seq`: the topic-partition the cancel was produced to.
    producer_seq: str | None = None

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic."""
        return self.uid or self.id

    @property
    def bulk(self) -> bool:
        """Whether this is a bulk cancel (by id prefix)."""
        return self.prefix is not None


@immutable
class Fate:
    """What became of a message, as its tombstone tells: ``state`` is ``delivered``,
    ``dead_lettered`` or ``cancelled``; ``partition``/``offset`` where it was written;
    ``reason`` why it was dead-lettered; ``accepted_ms`` when a proxy accepted it and ``owner``
    who scheduled it (its history, ``delay_service/store/outcomes.py``)."""

    state: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    released_ms: int | None = None
    deliver_at_ms: int | None = None
    occurrence: int | None = None
    reason: str | None = None
    accepted_ms: int | None = None
    owner: str | None = None


@immutable
class Tombstone:
    """Retires the record at ``offset`` (message ``id``, buffer key ``uid``): delivered or
    cancelled."""

    id: str
    offset: int
    uid: str = ""  # the retired record's buffer key; "" for version 1 (the id)
    fate: Fate | None = None  # what became of it, when the master knows

    @property
    def buffer_key(self) -> str:
        """The Kafka key of this record in the buffer topic: the retired record's."""
        return self.uid or self.id


BufferRecord = Scheduled | Cancel | Tombstone
