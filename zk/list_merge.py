"""One ``GET /v1/messages?state=pending...`` page from each shard's replica, merged into the
delay set's page (``zk/replica_api.py``; the replicas' pages: ``delay_service/queries/listing.py``).

A replica's cursor is base64url of a store key (due time first, big-endian), so cursors of
different shards compare as the keys do: bytewise, in the order every store lists. A shard's
page holds every matching entry up to its ``next`` (all of them when ``next`` is null), so the
merged page may only hold messages up to the smallest ``next`` of the shards that have more:
beyond it, that shard has not looked. Of those, the first ``limit`` in key order are listed;
``next`` is the cursor of the last one listed when more were cut, else that smallest ``next``
(null when every shard is done). Each shard is asked the same cursor, so a merged page goes on
exactly where the last one stopped in every shard.

Pure functions; any thread may use them.
"""

from __future__ import annotations

import base64
from typing import Any


def cursor_key(cursor: str) -> bytes:
    """The bytes a cursor stands for (they order the listing); ValueError when it is none."""
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))


def merge_pages(docs: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The delay set's page from its shards' pages ``docs`` (shard 0 first; module
    docstring), each message keyed by the cursor the shard's replica would give after it."""
    nexts = sorted((str(d["next"]) for d in docs if d.get("next")), key=cursor_key)
    bound = cursor_key(nexts[0]) if nexts else None
    rows: list[tuple[bytes, dict[str, Any]]] = []
    for doc in docs:
        for message in doc["messages"]:
            key = cursor_key(message["cursor"])
            if bound is None or key <= bound:
                rows.append((key, message))
    rows.sort(key=lambda row: row[0])
    cut = len(rows) > limit
    rows = rows[:limit]
    next_cursor = str(rows[-1][1]["cursor"]) if cut else (nexts[0] if nexts else None)
    return {
        "messages": [m for _, m in rows],
        "next": next_cursor,
        "scanned": sum(int(d.get("scanned", 0)) for d in docs),
        "shards": [{k: v for k, v in d.items() if k not in ("messages", "next")} for d in docs],
        "answered_by": ",".join(str(d.get("answered_by")) for d in docs),
    }
