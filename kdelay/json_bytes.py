"""JSON to bytes for records kept in memory on hot paths (routing headers, tombstones).

``orjson.dumps`` writes into a buffer of about 1 KB from glibc's ``malloc`` and shrinks it to
the document's size. A shrunken chunk that stays alive splits glibc's heap: with a batch of
them held (a proxy's routed batch, a round's tombstones), each next ``malloc`` of the 1 KB
buffer searches the fragments first, several times slower. :func:`dumps` copies the document
into an exact-size ``bytes`` (Python's small-object allocator) and lets orjson's buffer go at
once (docs/decisions/0009-hot-paths-native-where-a-library-is.md).

Pure: safe from any thread.
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """``orjson.dumps(obj)`` as a fresh exact-size ``bytes``; orjson's buffer is freed at once."""
    return bytes(memoryview(orjson.dumps(obj)))
