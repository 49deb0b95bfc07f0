"""What one application of consumed buffer records to the store did (:meth:`Store.apply`,
``store/writes.py``), and the shape of a consumed record it takes; ingest counts the metrics
from it (``ingest/batch.py``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kdelay.buffer import BufferRecord
from kdelay.delay_service.store.cancels import Refused
from kdelay.delay_service.store.tombstones import Retired


@dataclass(slots=True)
class ApplyResult:
    """What one :meth:`Store.apply` did; counts feed the metrics."""

    scheduled: int = 0
    duplicates: int = 0
    covered: int = 0
    cancelled: int = 0  # entries a cancel removed, and schedules cancelled on arrival
    cancelled_on_arrival: int = 0  # schedules an earlier cancel cancelled (cancels.py rule 2)
    replaced: int = 0  # of ``cancelled``, entries a replace removed
    retired: list[Retired] = field(default_factory=list)  # records owed a tombstone
    tombstoned: int = 0
    invalid: int = 0
    earliest_new_ms: int | None = None
    #: Pending messages a cancel or replace may not cancel: another principal's (cancels.py).
    refused: list[Refused] = field(default_factory=list)
    #: Single-id cancels read, by what they found: ``cancelled`` (removed a pending message),
    #: ``already_delivered`` (none pending; the last with its id was delivered), ``unknown``.
    cancel_outcomes: Counter[str] = field(default_factory=Counter)
    bulk_cancels: int = 0  # bulk cancels read (bulk_cancels.py)
    bulk_cancelled: int = 0  # of ``cancelled``, messages a bulk cancel cancelled
    bulk_refused: int = 0  # messages a bulk cancel left alone: another principal's
    #: Messages the bulk cancels of this batch cancelled in all, their steps' included.
    bulk_total: int = 0


#: One consumed buffer record: partition, offset, the decoded record (None: undecodable) and,
#: optionally, its timestamp (the buffer's LogAppendTime; None or absent: unknown).
Incoming = tuple[int, int, BufferRecord | None] | tuple[int, int, BufferRecord | None, int | None]
