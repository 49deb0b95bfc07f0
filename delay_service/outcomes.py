"""What became of a message that left the pending set: delivered, cancelled or dead-lettered.

Every replica keeps the outcomes of the messages that left its store for a while (``status
retention``), so that ``GET /v1/messages/{id}`` and ``kdelay status --id`` can answer after
delivery, from any replica. :class:`Outcome` is the value; how outcomes are recorded and
pruned is below it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The states a message that left the store can be in (CONTRACT.md v2).
DELIVERED = "delivered"
CANCELLED = "cancelled"
DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The last known outcome of message ``id``.

    ``partition`` is the target partition the record was written to (when known: a record
    released with partition -1 learns it from the acknowledgement); ``offset`` its offset there
    (None when this replica learnt of the delivery from a checkpoint rather than from the
    master's tombstone); ``at_ms`` the release or cancel time; ``source`` how this replica
    knows: ``"master"`` (it released the message), ``"tombstone"`` (the master's tombstone in
    the buffer topic), ``"checkpoint"`` (a checkpoint covered it), ``"cancel"`` (a cancel
    record removed it).
    """

    id: str
    state: str
    source: str
    deliver_at_ms: int | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    at_ms: int | None = None
    occurrence: int | None = None
