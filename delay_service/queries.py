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

Message status: message_status.py builds it (pending, or what became of it, and the id's
history); unknown is 404.

Timeline: the pending entries due before ``now + horizon`` (overdue ones included), counted per
due-time bucket and per target topic; optionally only those for one ``topic`` or whose id
starts with ``id_prefix`` (the console's counts of a listing's filters). Buckets are aligned to
multiples of the bucket size since the epoch (UTC), so a message's bucket does not depend on
when one asks; only non-empty buckets are listed. The scan reads the store in chunks of
:data:`CHUNK` entries (:meth:`Store.chunk_after`), holding its lock for one chunk at a time and
decoding outside it, so it never stalls ingest or the forwarder for long; it stops after
``max_scan`` entries and then says ``"truncated": true`` (the counts cover the earliest-due
entries scanned, exactly up to ``scanned_until``). Entries added or released while the scan
runs may or may not be counted: the counts are not a snapshot. At most :data:`MAX_SCANS`
timelines are computed at once per replica; another asks again later (503).

Listing (``GET /v1/messages?state=pending&topic=..&id_prefix=..&due_before=..&limit=..
&cursor=..``, CONTRACT.md v3): the pending entries in key order (due time, then the order the
proxy accepted them in), one page at a time, filtered by target topic, id prefix, due time and
``owner`` (the proxy sets it for a non-administrator). The cursor is base64url of the last
entry key a page covered, so it is stable under concurrent releases: the next page seeks past
that key, and a message still pending after it is listed exactly once; an entry released
meanwhile is simply gone, one scheduled meanwhile is listed if its key sorts after the cursor
(one scheduled earlier in due order than the cursor, or replaced to such a due time, is not).
A page examines at most ``min(LIST_SCAN, max_scan)`` entries, chunk by chunk like the timeline
(and a value that cannot match, lacking the filter's bytes, is never decoded); when that
budget runs out before the page is full, the page is short (even empty) and ``next`` goes on
from the last entry examined, so a filter that matches rarely costs bounded pages, not one
unbounded scan. Only ``pending`` is listed: what left the store is remembered by id only.

Bulk cancels (``GET /v1/bulk-cancels/<id>``): what a bulk cancel did in this replica's store,
its count (delay_service/bulk_cancels.py); the proxy asks it to answer ``DELETE
/v1/messages?id_prefix=..&wait=..``.

Threads: any thread may call these functions; :class:`Answers` is shared by the HTTP server's
request threads (it reads the store, which locks, and callbacks that only read thread-safe
state). replica.py builds it before the store's readers start and attaches the ingest and
forwarder state once they exist (:meth:`Answers.attach`); until then the role is ``starting``.
"""

from __future__ import annotations

import base64
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delay_service.entry import decode_entry, split_key
from delay_service.message_status import PENDING, message_status
from delay_service.store import Store
from kdelay import headers as h
from kdelay.buffer import Scheduled
from kdelay.clock import now_ms as wall_ms
from kdelay.durations import duration_ms
from kdelay.errors import InvalidHeaderError, KdelayError

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

    def bulk_cancel(self, raw_id: bytes) -> tuple[int, dict[str, Any]]:
        """``GET /v1/bulk-cancels/<id>``: 200 and what bulk cancel ``id`` did here
        (``{"id", "cancelled", "refused", "applied_ms", "at"}``, delay_service/bulk_cancels.py),
        404 when this replica has not applied it (not read yet, or forgotten), 400 a bad id."""
        try:
            bulk_id = h.validate_id("id", raw_id)
        except InvalidHeaderError as exc:
            return 400, QueryError(400, f"id: {exc.problem}", "id").body()
        fresh = self.freshness()
        doc = self._store.bulk_result(bulk_id)
        if doc is None:
            error = QueryError(
                404,
                f"id: replica {fresh.answered_by} ({fresh.role}) has not applied a bulk cancel "
                f"{bulk_id!r} (not read yet, or forgotten)",
                "id",
            )
            return 404, {**error.body(), **fresh.to_json()}
        return 200, {"id": bulk_id, **doc, **fresh.to_json()}

    def pending(self, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """``GET /v1/pending?bucket=..&horizon=..[&topic=..][&id_prefix=..]``: 200 and the
        timeline, 400 a bad parameter, 503 while MAX_SCANS others run."""
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
                self._store,
                fresh.as_of_ms,
                bucket_ms,
                horizon_ms,
                max_scan=self._max_scan,
                topic=params.get("topic") or None,
                id_prefix=params.get("id_prefix") or None,
            )
        finally:
            self._scans.release()
        return 200, {**doc, **fresh.to_json()}

    def listing(self, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """``GET /v1/messages?state=pending&topic=..&id_prefix=..&owner=..&due_before=..
        &limit=..&cursor=..``: 200 and one page (:func:`list_pending`, at most
        ``min(LIST_SCAN, max_scan)`` entries examined), 400 a bad parameter."""
        try:
            flt, limit, after = parse_listing(params)
        except QueryError as exc:
            return exc.status, exc.body()
        fresh = self.freshness()
        doc = list_pending(
            self._store, flt, limit=limit, after=after, max_scan=min(LIST_SCAN, self._max_scan)
        )
        return 200, {**doc, **fresh.to_json()}


# -- the listing (GET /v1/messages?state=pending...) -----------------------------------------

#: Messages per listing page: by default, and at most (CONTRACT.md v3 "Listing").
LIST_DEFAULT = 100
LIST_MAX = 1000
#: Most entries one listing page examines (with ``max_scan`` when smaller): a page whose
#: filters match rarely stops there and says where to go on (``next``), so no page costs more.
LIST_SCAN = 200_000
#: No due time is this late: the upper bound of a listing without ``due_before``.
_NO_BOUND_MS = 2**63 - 1
_KEY_SIZES = frozenset({20, 28})  # entry.py's keys, old and current


def encode_cursor(key: bytes) -> str:
    """The opaque cursor of a listing that goes on after entry ``key``: base64url of the
    store key (due time first), unpadded."""
    return base64.urlsafe_b64encode(key).rstrip(b"=").decode("ascii")


def decode_cursor(text: str) -> bytes:
    """The entry key a cursor goes on after; QueryError (400, ``cursor``) when it is not one
    this API gave out."""
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        key = b""
    if len(key) not in _KEY_SIZES or encode_cursor(key) != text:
        raise QueryError(400, f"cursor: {text[:80]!r} is not a cursor this API gave", "cursor")
    return key


@dataclass(frozen=True, slots=True)
class ListFilter:
    """Which pending messages a listing shows: all those given must hold. ``owner``: only the
    messages this principal scheduled (a non-administrator's listing; the proxy sets it)."""

    topic: str | None = None
    id_prefix: str | None = None
    owner: str | None = None
    due_before_ms: int | None = None

    def needles(self) -> list[bytes]:
        """Byte strings every matching entry's value contains (entry.py stores id, topic and
        owner as UTF-8): a value missing one is passed over without decoding it."""
        texts = (self.topic, self.id_prefix, self.owner)
        return [t.encode("utf-8", "surrogatepass") for t in texts if t]

    def matches(self, msg: Scheduled) -> bool:
        """Whether a decoded pending message is listed."""
        return (
            (self.topic is None or msg.topic == self.topic)
            and (self.id_prefix is None or msg.id.startswith(self.id_prefix))
            and (self.owner is None or msg.owner == self.owner)
        )


def listed(key: bytes, msg: Scheduled) -> dict[str, Any]:
    """A message of a listing page (CONTRACT.md v3): id, state, due time and target, and the
    ``cursor`` of a listing that goes on after it (the proxy merges shards' pages by it)."""
    return {
        "id": msg.id,
        "state": PENDING,
        "deliver_at": split_key(key)[0],
        "topic": msg.topic,
        "partition": None if msg.partition < 0 else msg.partition,
        "cursor": encode_cursor(key),
    }


def list_pending(
    store: Store,
    flt: ListFilter,
    *,
    limit: int,
    after: bytes | None = None,
    max_scan: int = LIST_SCAN,
    chunk: int = CHUNK,
) -> dict[str, Any]:
    """One page of the pending messages that ``flt`` lets through, in key order (due time,
    then acceptance order), after the entry key ``after``: ``{"messages", "next",
    "scanned"}``.

    It reads the store chunk by chunk (:meth:`Store.chunk_after`, the lock held per chunk)
    until ``limit`` messages plus one more are found, the store (below ``due_before``) is
    exhausted, or ``max_scan`` entries were examined. ``next`` is the cursor after the last
    listed message when one more matched, after the last entry examined when the scan budget
    ran out first (the page may then be short, even empty, and the next goes on from there),
    and None at the end. The cursor is a key: entries released meanwhile are simply no longer
    there, entries still pending after it are all found by the next page, none listed twice.
    """
    until = _NO_BOUND_MS if flt.due_before_ms is None else flt.due_before_ms
    needles = flt.needles()
    found: list[tuple[bytes, Scheduled]] = []
    scanned = 0
    cursor = after
    while True:
        want = min(chunk, max_scan - scanned)
        rows = store.chunk_after(cursor, until, want)
        for key, value in rows:
            scanned += 1
            cursor = key
            if needles and not all(n in value for n in needles):
                continue
            msg = decode_entry(value)
            if flt.matches(msg):
                if len(found) == limit:  # one more matched: the next page has it
                    return _page(found, found[-1][0], scanned)
                found.append((key, msg))
        if len(rows) < want:
            return _page(found, None, scanned)
        if scanned >= max_scan:
            # Out of budget: whatever is left may match (a chunk of exactly the rest ends
            # with one empty page).
            return _page(found, cursor, scanned)


def _page(
    found: list[tuple[bytes, Scheduled]], next_key: bytes | None, scanned: int
) -> dict[str, Any]:
    return {
        "messages": [listed(key, msg) for key, msg in found],
        "next": None if next_key is None else encode_cursor(next_key),
        "scanned": scanned,
    }


def parse_listing(params: Mapping[str, str]) -> tuple[ListFilter, int, bytes | None]:
    """The filter, page size and cursor of a listing's query parameters; QueryError (400)
    naming the parameter at fault. Only ``state=pending`` is listed (the default): what left
    the store is remembered by id only (outcomes.py), not in due order."""
    state = params.get("state", PENDING)
    if state != PENDING:
        raise QueryError(
            400, f"state: only pending messages are listed, not {state[:40]!r}", "state"
        )
    raw_limit = params.get("limit", str(LIST_DEFAULT))
    digits = raw_limit.strip()
    if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= LIST_MAX:
        raise QueryError(
            400, f"limit: {raw_limit[:40]!r} is not a whole number from 1 to {LIST_MAX}", "limit"
        )
    due_before = params.get("due_before")
    due_ms = None
    if due_before:
        try:
            due_ms = h.parse_deliver_at("due_before", due_before.encode("utf-8"))
        except InvalidHeaderError as exc:
            raise QueryError(400, f"due_before: {exc.problem}", "due_before") from None
    cursor = params.get("cursor")
    after = decode_cursor(cursor) if cursor else None
    flt = ListFilter(
        topic=params.get("topic") or None,
        id_prefix=params.get("id_prefix") or None,
        owner=params.get("owner") or None,
        due_before_ms=due_ms,
    )
    return flt, int(raw_limit), after
