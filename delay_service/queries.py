"""What a replica answers about messages, from its own store: one message's status, and the
pending timeline (docs/status.md). health.py serves them on the replica's HTTP port as
``GET /v1/messages/<id>`` and ``GET /v1/pending?bucket=1m&horizon=24h``; the proxy and
``kdelay status --id`` ask a replica through ``zk/replica_api.py``.

Every answer states its freshness (:class:`Freshness`): which replica answered, its role, its
clock when it answered (``as_of_ms``, the broker's clock as the replica estimates it), and how
far its store is behind the buffer topic (``ingest_lag`` records, refreshed every second, and
the ``ingested_offsets``: every buffer record below them is in the answer). A follower learns of
a release from the master's tombstone or checkpoint, so it may still call a message pending
shortly after the master released it; the master's answer is the reference.

Message status: a pending entry (:meth:`Store.get`) is ``pending``, with its due time, target,
buffer position and ``owner`` (the principal that scheduled it; absent without
authentication); a message that left the store is what :meth:`Store.outcome` remembers, without
its owner (``delivered``, ``cancelled``, ``dead_lettered``). When both exist (a reused id, or a
recurring message whose earlier occurrence was released) the answer is ``pending`` and carries
the other as ``last_outcome``. Neither: unknown (404).

Timeline: the pending entries due before ``now + horizon`` (overdue ones included), counted
per due-time bucket and per target topic. Buckets are aligned to multiples of the bucket size
since the epoch (UTC), so a message's bucket does not depend on when one asks; only non-empty
buckets are listed. The scan reads the store in chunks of :data:`CHUNK` entries
(:meth:`Store.chunk_after`), holding its lock for one chunk at a time and decoding outside it,
so it never stalls ingest or the forwarder for long; it stops after ``max_scan`` entries and
then says ``"truncated": true`` (the counts cover the earliest-due entries scanned, exactly up
to ``scanned_until``). Entries added or released while the scan runs may or may not be counted:
the counts are not a snapshot. At most :data:`MAX_SCANS` timelines are computed at once per
replica; another asks again later (503).

Threads: any thread may call these functions; :class:`Answers` is shared by the HTTP server's
request threads (it reads the store, which locks, and callbacks that only read thread-safe
state). replica.py builds it before the store's readers start and attaches the ingest and
forwarder state once they exist (:meth:`Answers.attach`); until then the role is ``starting``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delay_service.entry import Entry, decode_entry, split_key
from delay_service.outcomes import CANCELLED, Outcome
from delay_service.store import Store
from kdelay import headers as h
from kdelay.clock import now_ms as wall_ms
from kdelay.durations import duration_ms
from kdelay.errors import InvalidHeaderError, KdelayError

PENDING = "pending"
#: Entries read per store-lock acquisition by the timeline scan.
CHUNK = 5_000
#: Default bucket and horizon of ``GET /v1/pending`` (CONTRACT.md's example).
DEFAULT_BUCKET = "1m"
DEFAULT_HORIZON = "24h"
#: Most buckets one timeline may span (horizon / bucket).
MAX_BUCKETS = 100_000
#: Longest bucket or horizon: ten years (beyond any due time the proxy accepts by default).
MAX_WINDOW_MS = 10 * 365 * 86_400_000
#: Timelines computed at once per replica; more are refused with 503 (a scan is CPU-heavy).
MAX_SCANS = 2


class QueryError(KdelayError):
    """A question this replica cannot answer: ``status`` (400, 404, 503) and, for a bad
    parameter, the ``field`` at fault; the message names it."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field

    def body(self) -> dict[str, Any]:
        """The one error shape of kdelay's HTTP APIs (proxy/http_errors.py)."""
        out: dict[str, Any] = {"error": str(self)}
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass(frozen=True, slots=True)
class Freshness:
    """How current an answer is: who answered, as what, when, and how far behind."""

    answered_by: str
    role: str
    as_of_ms: int
    ingest_lag: int | None
    ingested_offsets: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "answered_by": self.answered_by,
            "role": self.role,
            "as_of_ms": self.as_of_ms,
            "ingest_lag": self.ingest_lag,
            "ingested_offsets": {str(p): o for p, o in sorted(self.ingested_offsets.items())},
        }


def pending_status(entry: Entry) -> dict[str, Any]:
    """The status document of a pending entry."""
    msg = entry.message
    doc: dict[str, Any] = {
        "id": msg.id,
        "state": PENDING,
        "deliver_at": msg.deliver_at_ms,
        "topic": msg.topic,
        # -1: the partitioner picks one from the key when it is released.
        "partition": None if msg.partition < 0 else msg.partition,
        "buffer": {"partition": entry.partition, "offset": entry.offset, "key": msg.buffer_key},
    }
    if msg.owner is not None:  # the principal that scheduled it (README "Message owners")
        doc["owner"] = msg.owner
    if msg.repeat is not None:  # a recurring message: which occurrence is pending
        doc["repeat"] = msg.repeat
        doc["occurrence"] = msg.occurrence
    return doc


def outcome_status(outcome: Outcome) -> dict[str, Any]:
    """The status document of a message that left the store."""
    doc: dict[str, Any] = {
        "id": outcome.id,
        "state": outcome.state,
        "deliver_at": outcome.deliver_at_ms,
        "topic": outcome.topic,
        "partition": outcome.partition,
        "offset": outcome.offset,
        ("cancelled_at" if outcome.state == CANCELLED else "released_at"): outcome.at_ms,
        "source": outcome.source,
    }
    if outcome.occurrence is not None:
        doc["occurrence"] = outcome.occurrence
    return doc


def message_status(store: Store, msg_id: str) -> dict[str, Any] | None:
    """The status of message ``msg_id`` in ``store`` (module docstring), None when unknown."""
    entry = store.get(msg_id)
    outcome = store.outcome(msg_id)
    if entry is not None:
        doc = pending_status(entry)
        if outcome is not None:
            doc["last_outcome"] = outcome_status(outcome)
        return doc
    return None if outcome is None else outcome_status(outcome)


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
) -> dict[str, Any]:
    """Counts of the entries due before ``now_ms + horizon_ms`` per bucket and per target
    topic, scanning at most ``max_scan`` entries (module docstring)."""
    until = now_ms + horizon_ms
    buckets: dict[int, Counter[str]] = {}
    topics: Counter[str] = Counter()
    overdue = scanned = 0
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
            topic = decode_entry(value).topic
            start = due - due % bucket_ms
            buckets.setdefault(start, Counter())[topic] += 1
            topics[topic] += 1
            overdue += due <= now_ms
            last_due = due
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
        "counted": scanned,
        "overdue": overdue,
        "pending": store.pending,
        "truncated": truncated,
        "scan_limit": max_scan,
        "scanned_until": last_due if truncated else until,
    }


class Answers:
    """The replica's answers, as health.py serves them: ``(HTTP status, JSON document)``."""

    def __init__(self, store: Store, name: str, *, max_scan: int) -> None:
        self._store = store
        self._name = name
        self._max_scan = max_scan
        self._scans = threading.BoundedSemaphore(MAX_SCANS)
        self._role: Callable[[], str] = lambda: "starting"
        self._lag: Callable[[], int | None] = lambda: None
        self._clock: Callable[[], int | None] = lambda: None

    def attach(
        self,
        *,
        role: Callable[[], str],
        lag: Callable[[], int | None],
        clock: Callable[[], int | None],
    ) -> None:
        """The replica's parts exist: its role, ingest lag and (broker) clock, read per answer
        (from request threads: each must only read thread-safe state)."""
        self._role, self._lag, self._clock = role, lag, clock

    def freshness(self) -> Freshness:
        """The freshness of an answer given now."""
        return Freshness(
            answered_by=self._name,
            role=self._role(),
            as_of_ms=self._clock() or wall_ms(),
            ingest_lag=self._lag(),
            ingested_offsets=self._store.offsets(),
        )

    def message(self, raw_id: bytes) -> tuple[int, dict[str, Any]]:
        """``GET /v1/messages/<id>``: 200 and the status, 404 unknown, 400 a bad id."""
        try:
            msg_id = h.validate_id("id", raw_id)
        except InvalidHeaderError as exc:
            return 400, QueryError(400, f"id: {exc.problem}", "id").body()
        fresh = self.freshness()  # before the lookup: the answer is at least this fresh
        doc = message_status(self._store, msg_id)
        if doc is None:
            lag = "unknown" if fresh.ingest_lag is None else f"{fresh.ingest_lag} records"
            error = QueryError(
                404,
                f"id: no message {msg_id!r} is pending, and replica {fresh.answered_by} "
                f"({fresh.role}, ingest lag {lag}) remembers none that left",
                "id",
            )
            return 404, {**error.body(), **fresh.to_json()}
        return 200, {**doc, **fresh.to_json()}

    def pending(self, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """``GET /v1/pending?bucket=..&horizon=..``: 200 and the timeline, 400 a bad
        parameter, 503 while MAX_SCANS others run."""
        try:
            bucket_ms, horizon_ms = parse_window(
                params.get("bucket", DEFAULT_BUCKET), params.get("horizon", DEFAULT_HORIZON)
            )
        except QueryError as exc:
            return exc.status, exc.body()
        if not self._scans.acquire(blocking=False):
            busy = QueryError(
                503, f"replica {self._name} is already computing {MAX_SCANS} timelines"
            )
            return 503, busy.body()
        try:
            fresh = self.freshness()
            doc = timeline(
                self._store, fresh.as_of_ms, bucket_ms, horizon_ms, max_scan=self._max_scan
            )
        finally:
            self._scans.release()
        return 200, {**doc, **fresh.to_json()}
