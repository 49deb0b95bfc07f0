"""A recurring message's next occurrence: the buffer record its release writes with it.

Releasing occurrence n of a series (``kdelay-repeat``) also writes occurrence n+1 to the buffer
topic, to the same buffer partition, with buffer key ``<key of occurrence 1>#<n+1>``: the
sender produces it with the release and the entry completes only when both are acknowledged
(exactly-once: in the same transaction), so a series loses no occurrence whoever is master;
written twice, the copies share a buffer key and the store keeps one.

A repeat value this version cannot follow ends the series at this occurrence, loudly
(``sender.series_ended``): it must not stop every release.

Threads: called by the sender, on the forwarder thread; no state of its own.
"""

from __future__ import annotations

from kdelay import logs
from kdelay.buffer import encode
from kdelay.buffer.records import REPEAT_ERRORS
from kdelay.delay_service.release.producer import Outgoing
from kdelay.delay_service.store.entry import Entry, entry_seq

log = logs.get(__name__)


def next_occurrence(entry: Entry, buffer_topic: str) -> Outgoing | None:
    """The buffer record of ``entry``'s next occurrence, or None (not recurring, or the series
    ends here)."""
    msg = entry.message
    try:
        due = msg.next_due()
    except REPEAT_ERRORS as exc:
        # A value this version cannot follow (or a bug computing it) must not stop every
        # release: this occurrence goes out, the series ends here, loudly.
        log.exception(
            "sender.series_ended",
            id=msg.id,
            repeat=msg.repeat,
            occurrence=msg.occurrence,
            error=f"{type(exc).__name__}: {exc}",
            consequence="this occurrence is released; no later one is scheduled",
        )
        return None
    if due is None:
        return None
    enc = encode(msg.next_occurrence(due, entry_seq(entry.key)))
    return Outgoing(buffer_topic, enc.key, enc.value, entry.partition, list(enc.headers), 0)
