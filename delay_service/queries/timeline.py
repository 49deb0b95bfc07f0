"""The pending timeline a replica answers from its own store as ``GET
/v1/pending?bucket=1m&horizon=24h`` (queries.py serves it with its freshness; docs/status.md).

The pending entries due before ``now + horizon`` (overdue ones included), counted per
due-time bucket and per target topic; optionally only those for one ``topic`` or whose id
starts with ``id_prefix`` (the console's counts of a listing's filters). Buckets are aligned to
multiples of the bucket size since the epoch (UTC), so a message's bucket does not depend on
when one asks; only non-empty buckets are listed. The scan reads the store in chunks of
:data:`CHUNK` entries (:meth:`Store.chunk_after`), holding its lock for one chunk at a time and
decoding outside it, so it never stalls ingest or the forwarder for long; it stops after
``max_scan`` entries and then says ``"truncated": true`` (the counts cover the earliest-due
entries scanned, exactly up to ``scanned_until``). Entries added or released while the scan
runs may or may not be counted: the counts are not a snapshot.

Threads: any thread may call these functions (the store locks).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kdelay.delay_service.errors import QueryError
from kdelay.delay_service.store.entry import decode_entry, split_key
from kdelay.delay_service.store.store import Store
from kdelay.durations import duration_ms

#: Entries read per store-lock acquisition by the timeline scan (and the listing's).
CHUNK = 5_000
#: Default bucket and horizon of ``GET /v1/pending`` (CONTRACT.md's example).
DEFAULT_BUCKET = "1m"
DEFAULT_HORIZON = "24h"
#: Most buckets one timeline may span (horizon / bucket).
MAX_BUCKETS = 100_000
#: Longest bucket or horizon: ten years (beyond any due time the proxy accepts by default).
MAX_WINDOW_MS = 10 * 365 * 86_400_000


def parse_window(bucket: str, horizon: str) -> tuple[int, int]:
    """``(bucket_ms, horizon_ms)`` from the query's durations; QueryError (400) naming the
    parameter when one is not a duration, is 0 or over MAX_WINDOW_MS, or they span more than
    MAX_BUCKETS buckets."""
    parsed = []
    for name, text in (("bucket", bucket), ("horizon", horizon)):
        try:
            value = duration_ms(text)
        except ValueError as exc:
            raise QueryError(400, f"{name}: {exc}", name) from None
        if value <= 0:
            raise QueryError(400, f"{name}: must be more than 0", name)
        if value > MAX_WINDOW_MS:
            raise QueryError(400, f"{name}: must be at most {MAX_WINDOW_MS // 86_400_000}d", name)
        parsed.append(value)
    bucket_ms, horizon_ms = parsed
    if horizon_ms // bucket_ms > MAX_BUCKETS:
        raise QueryError(
            400,
            f"horizon: {horizon} in buckets of {bucket} is {horizon_ms // bucket_ms:,} buckets, "
            f"more than {MAX_BUCKETS:,}; ask for larger buckets or a shorter horizon",
            "horizon",
        )
    return bucket_ms, horizon_ms


def timeline(
    store: Store,
    now_ms: int,
    bucket_ms: int,
    horizon_ms: int,
    *,
    max_scan: int,
    chunk: int = CHUNK,
    topic: str | None = None,
    id_prefix: str | None = None,
) -> dict[str, Any]:
    """Counts of the entries due before ``now_ms + horizon_ms`` per bucket and per target
    topic, scanning at most ``max_scan`` entries (module docstring); with ``topic`` or
    ``id_prefix``, of the entries for that topic or whose id starts so only (``counted``: how
    many matched, ``scanned``: how many were examined)."""
    until = now_ms + horizon_ms
    buckets: dict[int, Counter[str]] = {}
    topics: Counter[str] = Counter()
    overdue = scanned = matched = 0
    last_due: int | None = None
    after: bytes | None = None
    truncated = False
    while True:
        want = min(chunk, max_scan - scanned)
        if want <= 0:
            # At the limit: truncated only if something is left to count.
            truncated = bool(store.chunk_after(after, until, 1))
            break
        rows = store.chunk_after(after, until, want)
        for key, value in rows:
            due = split_key(key)[0]
            last_due = due
            msg = decode_entry(value)
            if (topic is not None and msg.topic != topic) or (
                id_prefix is not None and not msg.id.startswith(id_prefix)
            ):
                continue
            start = due - due % bucket_ms
            buckets.setdefault(start, Counter())[msg.topic] += 1
            topics[msg.topic] += 1
            overdue += due <= now_ms
            matched += 1
        scanned += len(rows)
        if len(rows) < want:
            break
        after = rows[-1][0]
    return {
        "now_ms": now_ms,
        "until_ms": until,
        "bucket_ms": bucket_ms,
        "horizon_ms": horizon_ms,
        "buckets": [
            {"start": start, "count": sum(counts.values()), "topics": dict(sorted(counts.items()))}
            for start, counts in sorted(buckets.items())
        ],
        "topics": dict(sorted(topics.items())),
        "counted": matched,
        "scanned": scanned,
        "overdue": overdue,
        "pending": store.pending,
        "truncated": truncated,
        "scan_limit": max_scan,
        "scanned_until": last_due if truncated else until,
    }
