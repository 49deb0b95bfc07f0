"""A bulk cancel's id: ``bulk.p<N>.<32 hex>``, written as one copy in each of buffer partitions
``0..N-1``, each copy deciding the messages of its own partition (the proxy writes it,
proxy/http/cancels.py; the replicas apply it, delay_service/store/bulk_cancels.py). An older
proxy's ``bulk.<32 hex>`` (one record per shard) applies to every partition of the store that
reads it. No message has either id: readers that predate bulk cancels see a no-op cancel.

Pure functions; any thread.
"""

from __future__ import annotations

import functools
import re
import uuid

#: Every bulk cancel's id starts with this.
BULK_ID_PREFIX = "bulk."
_COPIES = re.compile(r"bulk\.p(\d{1,9})\.")


def new_bulk_id(partitions: int) -> str:
    """A new bulk cancel's id, for one copy in each of ``partitions`` buffer partitions."""
    return f"{BULK_ID_PREFIX}p{partitions}.{uuid.uuid4().hex}"


@functools.lru_cache(maxsize=1024)
def bulk_copies(bulk_id: str) -> int | None:
    """How many buffer partitions bulk cancel ``bulk_id`` was written to, one copy each; None
    for an id of one record per shard (applies to every partition of the store reading it)."""
    found = _COPIES.match(bulk_id)
    return None if found is None else int(found[1])
