"""JSON to bytes for records kept in memory on hot paths (routing headers, tombstones).

``orjson.dumps`` writes into a buffer of about 1 KB from glibc's ``malloc`` and shrinks it to
the document's size. A shrunken chunk that stays alive splits glibc's heap: with a batch of
them held (a proxy's routed batch, a round's tombstones), each next ``malloc`` of the 1 KB
buffer searched the fragments first. Measured on 2026-11-27 (one thread, 1,000 documents of
~200 bytes held at a time): ``orjson.dumps`` 0.15 µs freed at once, 1.8 µs kept; copied into
an exact-size ``bytes`` (Python's small-object allocator) and the buffer freed at once, 0.3 µs
kept. In ``proxy.routing.route`` it was half the time of a delayed record.
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """``orjson.dumps(obj)`` as a fresh exact-size ``bytes``; orjson's buffer is freed at once."""
    return bytes(memoryview(orjson.dumps(obj)))
