"""Poison records: buffer records a replica cannot decode or store become dead-letter entries.

A record in the buffer topic may have been written by another kdelay version, by hand, or be
corrupt (no or a bad ``kdelay-route`` header, an unknown format version, a due time or a string
the store cannot hold). Ingest must never stop on one: every later record would wait behind it
for ever, on every replica alike, since all of them read the same topic.

Such a record is stored like any scheduled message, addressed to the dead-letter topic
(``__kdelay_dead_letter``, partition chosen by the key): the original key, value and headers,
plus ``kdelay-error`` (``invalid_buffer_record: <reason>``) and ``kdelay-source``
(``<buffer topic>/<partition>/<offset>``); on release the forwarder adds ``kdelay-id`` and
``kdelay-deliver-at`` as to every message. Its id is ``kdelay-invalid/<partition>/<offset>``
(unique within the store) and its due time is the record's own timestamp, which is the same on
every replica, so every replica builds the identical entry (a record stamped in the future,
possible only with CreateTime and a broker that allows it, waits until then). From there it
is the normal path, with the delivery invariant's guarantees: only the master writes the dead
letter, once, after which the checkpoint covers it and followers (and replicas that rebuild
later) drop it; a master that dies before its next checkpoint may write it twice, like any
message. Dead-lettering from ingest instead would have every replica write it, or lose it when
the master changes.

A record whose *write* to RocksDB fails is not poison: that is an infrastructure failure, and
ingest's supervisor restarts it or ends the process (threads.py).

Pure functions; any thread may use them.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdelay.buffer import DEAD_LETTER_TOPIC, Scheduled
from kdelay.delay_service.errors import UnstorableError
from kdelay.delay_service.store.entry import check_storable

ERROR_HEADER = "kdelay-error"  # the same header the forwarder's dead letters carry
SOURCE_HEADER = "kdelay-source"
ID_PREFIX = "kdelay-invalid/"
#: The ``reason`` label of ``kdelay_replica_invalid_records_total``.
UNDECODABLE = "undecodable"  # not a buffer record this version reads
UNSTORABLE = "unstorable"  # a buffer record the store's entry format cannot hold
_I64_MAX = 2**63 - 1


def dead_letter_entry(  # noqa: PLR0917 - one field of the consumed record each
    buffer_topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    reason: str,
) -> Scheduled:
    """The entry that releases an unusable buffer record to the dead-letter topic.

    ``timestamp_ms`` is the record's Kafka timestamp (<= 0: none), the entry's due time.
    """
    extra = (
        (ERROR_HEADER, f"invalid_buffer_record: {reason}".encode("utf-8", "backslashreplace")),
        (SOURCE_HEADER, f"{buffer_topic}/{partition}/{offset}".encode("utf-8", "backslashreplace")),
    )
    own = tuple((name, b"" if v is None else v) for name, v in headers)
    entry = Scheduled(
        id=f"{ID_PREFIX}{partition}/{offset}",
        topic=DEAD_LETTER_TOPIC,
        partition=-1,
        key=key,
        value=value,
        deliver_at_ms=min(max(timestamp_ms, 0), _I64_MAX),
        headers=(*own, *extra),
    )
    try:
        check_storable(entry)
    except UnstorableError:
        # Header names Kafka delivers are UTF-8 already; this keeps "never fails" unconditional.
        names = tuple((n.encode("utf-8", "backslashreplace").decode(), v) for n, v in own)
        entry = Scheduled(
            entry.id, entry.topic, -1, key, value, entry.deliver_at_ms, (*names, *extra)
        )
    return entry
