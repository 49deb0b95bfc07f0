"""The replicas' cancel rule: which schedules a cancel cancels
(README "Cancelling a message"), from the records' buffer offsets, append times and the
proxy's acceptance order, stamped on the broker's clock (rounded up: never behind it), or,
for a message and a cancel of one idempotent producer to one topic-partition, from that
producer's sequence numbers (:func:`produced_before`, stamps of ``sequences.py``); and
whose (README "Message owners"): :func:`may_cancel`; a replace never cancels its own series'
later occurrences: :func:`own_series`. The verifier does not import it: it judges by its own
reading of the contract (``verifier/cancel_contract.py``), so a bug here is not its bug too.

Functions of their arguments; safe from any thread.
"""

from __future__ import annotations

from kdelay.buffer.sequences import SEQUENCES, parse_stamp

#: How long after its own append time a cancel still cancels a schedule appended after it (5
#: minutes of the records' append time; covers a proxy's upstream delivery timeout, 30 s by
#: default, with room to spare).
CANCEL_WINDOW_MS = 300_000
#: A schedule accepted by a proxy up to this long after a cancel's append time (both by the
#: broker's clock) counts as sent with it: the cancel wins. The proxy acknowledges a cancel only
#: once this much has surely passed (proxy/routing/cancel_acks.py), so what is sent after the
#: acknowledgement is never cancelled by it.
CANCEL_SENT_WITH_MS = 100
#: The order field ``s`` a proxy writes: the millisecond it accepted the record, by the broker's
#: clock rounded up (proxy/app.py, ``kdelay.broker_clock``), << this | a counter
#: (proxy/routing/buffer_keys.py ``AcceptanceOrder``).
ORDER_SHIFT = 20


def produced_before(cancel_seq: str | None, schedule_seq: str | None) -> bool | None:
    """Whether the schedule stamped ``schedule_seq`` was produced before the cancel stamped
    ``cancel_seq``: True when the same idempotent producer (id and epoch) sent both to the
    same topic-partition, the schedule with the lower sequence number (modulo 2**31, within
    half of it); False when it sent the schedule with the same or a higher one; None when
    they are not comparable (either unstamped, or another producer, epoch or partition)."""
    if cancel_seq is None or schedule_seq is None:
        return None
    c, s = parse_stamp(cancel_seq), parse_stamp(schedule_seq)
    if c is None or s is None or c[0] != s[0]:
        return None
    ahead = (c[1] - s[1]) % SEQUENCES
    return 0 < ahead < SEQUENCES // 2


def accepted_ms(seq: int) -> int | None:
    """When a proxy accepted a schedule with order field ``seq`` (its millisecond), None if
    unknown (format 1, or not written by a proxy's router)."""
    ms = seq >> ORDER_SHIFT
    return ms if ms > 0 else None


def cancels(
    cancel_offset: int,
    cancel_ms: int | None,
    offset: int,
    time_ms: int | None,
    accepted: int | None,
    *,
    order: bool | None = None,
) -> bool:
    """Whether a cancel of an id, at ``cancel_offset`` of a buffer partition and appended at
    ``cancel_ms``, cancels a schedule of that id in the same partition at ``offset``, appended
    at ``time_ms`` and accepted by a proxy at ``accepted`` (README "Cancelling a message"):
    the schedule comes before the cancel (then only a delivery first escapes it), or after it
    but was accepted no later than :data:`CANCEL_SENT_WITH_MS` after the cancel's append, by the
    broker's clock, and appended within :data:`CANCEL_WINDOW_MS` of it (sent with it: the
    cancel wins).

    Why this never cancels what was sent after the cancel's acknowledgement: ``accepted`` is the
    broker clock's upper bound rounded up, and the proxy acknowledges a cancel only once the
    broker clock's lower bound is past its append time plus :data:`CANCEL_SENT_WITH_MS`
    (proxy/routing/cancel_acks.py), so a schedule accepted after that has ``accepted`` beyond it.

    ``order``: :func:`produced_before` of the two records' producer-sequence stamps. When it
    is known (one idempotent producer sent both to one topic-partition: the cancel sent to the
    message's topic with its key) it decides instead of the offsets and times: the schedule
    produced before the cancel is cancelled, whichever reaches the buffer first (appended
    within :data:`CANCEL_WINDOW_MS` after the cancel when after it); one produced after it
    never is.

    The replicas also close a cancel once 50,000 newer ones of its partition are open
    (``delay_service/store/cancels.py``); this rule of one cancel and one schedule does not count.
    """
    if order is not None:
        return order and _in_window(cancel_offset, cancel_ms, offset, time_ms)
    if offset < cancel_offset:
        return True
    if offset == cancel_offset or cancel_ms is None or accepted is None:
        return False
    if accepted > cancel_ms + CANCEL_SENT_WITH_MS:
        return False
    return time_ms is None or time_ms - cancel_ms <= CANCEL_WINDOW_MS


def _in_window(cancel_offset: int, cancel_ms: int | None, offset: int, time_ms: int | None) -> bool:
    """Whether a schedule at ``offset`` (appended at ``time_ms``) is before the cancel at
    ``cancel_offset`` (appended at ``cancel_ms``), or after it within
    :data:`CANCEL_WINDOW_MS` (unknown times: within)."""
    if offset == cancel_offset:
        return False
    if offset < cancel_offset or cancel_ms is None or time_ms is None:
        return True
    return time_ms - cancel_ms <= CANCEL_WINDOW_MS


def own_series(replace_key: str, schedule_key: str) -> bool:
    """Whether the schedule with buffer key ``schedule_key`` is a later occurrence of the series
    the replace with buffer key ``replace_key`` started (``<replace_key>#<n>``): a replace is a
    cancel of what its id had *before* it and a new message, and its series' occurrences are
    that new message, so its own cancel part never cancels them (README "Replacing a
    message"). Any later cancel or replace of the id still does, by :func:`cancels` with the
    occurrence's order field, occurrence 1's. An empty ``replace_key`` (unknown) matches
    nothing."""
    root, sep, _ = schedule_key.partition("#")
    return bool(replace_key) and bool(sep) and root == replace_key


def may_cancel(principal: str | None, admin: bool, owner: str | None) -> bool:
    """Whether a cancel (or a replace's cancel part) sent by ``principal`` (None: through a
    proxy without authentication), ``admin`` when a kdelay administrator sent it, may cancel a
    message owned by ``owner`` (None: scheduled without authentication): its owner's own,
    anyone's for an administrator, and a message without an owner for anyone. A cancel
    without a principal thus never cancels an owned message."""
    return owner is None or admin or principal == owner
