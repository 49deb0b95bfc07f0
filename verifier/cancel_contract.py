"""Which messages a cancel cancels, as the contract words it: the verifier's own reading.

The verifier is the oracle of the delay service, so it shares nothing with the code it judges
(docs/DESIGN.md "v4 directions"): it does not import ``kdelay.buffer.cancel_rule``, the rule
the replicas apply (import-linter forbids it, pyproject.toml). Had it shared it, a bug in that
rule would be the verifier's bug too, and would be judged correct: a replace with ``repeat``
cancelled its own series after occurrence 1, and the verifier, applying the same rule, counted
the missing occurrences as cancelled.

The contract, in the words this module implements (README "Cancelling a message", "Replacing
a message", "Recurring messages"; CONTRACT.md v2 to v4):

1. A cancel of an id cancels every message with that id appended to the buffer topic
   *before* it (in its buffer partition, where the id's messages and cancels all go).
2. It also cancels every message with that id appended *after* it that a proxy accepted no
   later than :data:`SENT_WITH_MS` after the cancel was appended, both by the broker's clock,
   and that was appended at most :data:`WINDOW_MS` after the cancel: it was sent with it.
   A message no proxy stamped (no acceptance time) or a cancel without an append time is
   judged by 1 only.
3. A replace is a cancel of its id at its own position *plus a new message*. The new message
   is the replacement itself and, when it repeats, every occurrence of its series: "a series
   replaced with repeat delivers every occurrence of the replacement". So a replace never
   cancels an occurrence of its own series, whatever the order and times.
4. A series' occurrence n is its own buffer record, written when occurrence n-1 is released,
   with occurrence 1's acceptance stamp and the buffer key ``<key of occurrence 1>#<n>``
   (the buffer format, ``kdelay.buffer``'s docstring): it belongs to the message that
   occurrence 1 is, so any other cancel or replace judges it by 1 and 2 like any message
   ("``kdelay-cancel`` with the id stops the series: the occurrence pending, and any written
   just after the cancel").

A message delivered despite a cancel counts as delivered (the cancel came too late, which the
contract allows); this module only says which undelivered ones are excused.

Plain values and functions; safe from any thread. :mod:`verifier.matching` applies the same
words as Spark columns (``cancels_column``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdelay.buffer.sequences import parse_stamp

#: README "Cancelling a message": a message "that a proxy accepted no later than 100 ms after
#: the cancel was appended" was sent with it.
SENT_WITH_MS = 100
#: README "Cancelling a message": "the message was appended at most 5 minutes after the cancel".
WINDOW_MS = 5 * 60 * 1000
#: The buffer format (``kdelay.buffer``'s docstring): the order field ``s`` is the millisecond
#: a proxy accepted the message ``<< 20``, or'ed with a counter.
ORDER_SHIFT = 20
#: The buffer format: occurrence n of a series has the buffer key ``<key of occurrence 1>#<n>``.
OCCURRENCE_SEPARATOR = "#"
#: Kafka's producer sequence numbers are int32s that wrap (KIP-98): "before" is modulo this.
SEQUENCE_MODULUS = 2**31


def sequence_before(earlier: int, later: int) -> bool:
    """Whether sequence number ``earlier`` precedes ``later`` modulo :data:`SEQUENCE_MODULUS`:
    ``later`` is ahead of it by at least 1 and less than half the modulus (so a producer's
    sequence that wrapped past 2**31 - 1 to 0 still counts as later)."""
    ahead = (later - earlier) % SEQUENCE_MODULUS
    return 0 < ahead < SEQUENCE_MODULUS // 2


def produced_before(cancel_stamp: str | None, message_stamp: str | None) -> bool | None:
    """Rule 5's order: whether the message stamped ``message_stamp`` was produced before the
    cancel stamped ``cancel_stamp``; None when the two are not comparable (either unstamped or
    malformed, or another producer stream: producer id, epoch, partition, topic)."""
    cancel, message = parse_stamp(cancel_stamp), parse_stamp(message_stamp)
    if cancel is None or message is None or cancel[0] != message[0]:
        return None
    return sequence_before(message[1], cancel[1])


def accepted_ms(order: int | None) -> int | None:
    """When a proxy accepted a message with order field ``order`` (ms by the broker's clock),
    None when unknown (format 1, or not stamped by a proxy)."""
    ms = (order or 0) >> ORDER_SHIFT
    return ms if ms > 0 else None


def series_key(buffer_key: str) -> str:
    """The buffer key of occurrence 1 of the series a schedule record belongs to (its own key
    when it is occurrence 1, or does not repeat)."""
    return buffer_key.partition(OCCURRENCE_SEPARATOR)[0]


@dataclass(frozen=True, slots=True)
class CancelAt:
    """A cancel record, or a replace (a schedule that is also a cancel of its id)."""

    id: str
    partition: int  # buffer partition
    offset: int
    appended_ms: int | None  # its append time (LogAppendTime of the buffer topic)
    #: A replace's own buffer key (that of occurrence 1 of its series); None for a cancel.
    replace_key: str | None = None
    #: Its producer-sequence stamp (route field ``q``; None: unstamped), rule 5.
    stamp: str | None = None


@dataclass(frozen=True, slots=True)
class MessageAt:
    """A scheduled message, judged at its (last) schedule record."""

    id: str
    partition: int
    offset: int
    appended_ms: int | None
    accepted_ms: int | None  # when a proxy accepted it (occurrence 1's for a series)
    buffer_key: str = ""  # its record's buffer key ("": unknown)
    stamp: str | None = None  # its record's producer-sequence stamp (route field ``q``)


def cancels(cancel: CancelAt, message: MessageAt) -> bool:
    """Whether ``cancel`` cancels ``message`` (the module docstring's words 1 to 5)."""
    if cancel.id != message.id or cancel.partition != message.partition:
        return False
    if cancel.replace_key and series_key(message.buffer_key) == cancel.replace_key:
        return False  # 3: the replacement, or an occurrence of its series
    order = produced_before(cancel.stamp, message.stamp)
    if order is not None:  # 5: the producer's sequence decides, within the window
        return order and message.offset != cancel.offset and _within_window(cancel, message)
    return _by_position(cancel, message)


def _by_position(cancel: CancelAt, message: MessageAt) -> bool:
    """Words 1 and 2: ``message`` appended before ``cancel``, or sent with it."""
    if message.offset < cancel.offset:
        return True  # 1: appended before it
    if message.offset == cancel.offset:
        return False
    if cancel.appended_ms is None or message.accepted_ms is None:
        return False
    sent_with_it = message.accepted_ms <= cancel.appended_ms + SENT_WITH_MS
    in_window = message.appended_ms is None or message.appended_ms - cancel.appended_ms <= (
        WINDOW_MS
    )
    return sent_with_it and in_window  # 2


def _within_window(cancel: CancelAt, message: MessageAt) -> bool:
    """Rule 5's bound: ``message`` is appended before ``cancel``, or at most :data:`WINDOW_MS`
    after it (within when either append time is unknown)."""
    if message.offset < cancel.offset:
        return True
    if cancel.appended_ms is None or message.appended_ms is None:
        return True
    return message.appended_ms - cancel.appended_ms <= WINDOW_MS
