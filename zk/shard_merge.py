"""One ``GET /v1/pending`` answer from each shard's replica, merged into the delay set's.

Buckets are aligned to multiples of the bucket width (``delay_service/queries/queries.py``), so the
shards' buckets add up start by start; counts, per-topic counts, ``overdue`` and ``pending``
add up; ``truncated`` holds if any shard's scan was cut, and ``scanned_until`` is then the
earliest place a shard stopped. The freshness is per shard in ``shards``; the top level keeps
the oldest ``as_of_ms`` and the summed ingest lag (unknown if any shard's is).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def merge_pending(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The delay set's timeline from its shards' timelines ``docs`` (shard 0 first)."""
    first = docs[0]
    buckets: dict[int, Counter[str]] = {}
    counts: Counter[int] = Counter()
    topics: Counter[str] = Counter()
    for doc in docs:
        for bucket in doc["buckets"]:
            start = int(bucket["start"])
            buckets.setdefault(start, Counter()).update(bucket["topics"])
            counts[start] += int(bucket["count"])
        topics.update(doc["topics"])
    lags = [doc.get("ingest_lag") for doc in docs]
    offsets: dict[str, int] = {}
    for doc in docs:
        offsets.update(doc.get("ingested_offsets") or {})
    return {
        **first,
        "now_ms": min(int(doc["now_ms"]) for doc in docs),
        "until_ms": min(int(doc["until_ms"]) for doc in docs),
        "buckets": [
            {"start": start, "count": counts[start], "topics": dict(sorted(buckets[start].items()))}
            for start in sorted(buckets)
        ],
        "topics": dict(sorted(topics.items())),
        "counted": sum(int(doc["counted"]) for doc in docs),
        "overdue": sum(int(doc["overdue"]) for doc in docs),
        "pending": sum(int(doc["pending"]) for doc in docs),
        "truncated": any(doc["truncated"] for doc in docs),
        "scanned_until": min(int(doc["scanned_until"]) for doc in docs),
        "answered_by": ",".join(str(doc.get("answered_by")) for doc in docs),
        "as_of_ms": min(int(doc["as_of_ms"]) for doc in docs),
        "ingest_lag": None if None in lags else sum(int(lag) for lag in lags if lag is not None),
        "ingested_offsets": dict(sorted(offsets.items(), key=lambda kv: int(kv[0]))),
        "shards": [
            {
                "shard": i,
                "answered_by": doc.get("answered_by"),
                "role": doc.get("role"),
                "as_of_ms": doc.get("as_of_ms"),
                "ingest_lag": doc.get("ingest_lag"),
                "pending": doc.get("pending"),
                "truncated": doc.get("truncated"),
            }
            for i, doc in enumerate(docs)
        ],
    }
