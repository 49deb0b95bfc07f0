"""What a replica answers about messages, from its own store: one message's status, the
pending timeline and the listing of pending messages (docs/status.md). health.py serves them on
the replica's HTTP port as ``GET /v1/messages/<id>``, ``GET /v1/pending?bucket=1m&horizon=24h``
and ``GET /v1/messages?state=pending...``; the proxy and ``kdelay status --id`` ask a replica
through ``zk/replica_api.py``.

Every answer states its freshness (:class:`Freshness`): which replica answered, its role, its
clock when it answered (``as_of_ms``, the broker's clock as the replica estimates it), and how
far its store is behind the buffer topic (``ingest_lag`` records, refreshed every second, and
the ``ingested_offsets``: every buffer record below them is in the answer). A follower learns of
a release from the master's tombstone or checkpoint, so it may still call a message pending
shortly after the master released it; the master's answer is the reference.

Message status: message_status.py builds it (pending, or what became of it, and the id's
history); unknown is 404.

Timeline: timeline.py counts it, in chunks, up to ``max_scan`` entries. At most
:data:`MAX_SCANS` timelines are computed at once per replica; another asks again later (503).

Listing: listing.py pages through the pending entries in key order, with a cursor that is
stable under concurrent releases, examining at most ``min(LIST_SCAN, max_scan)`` entries a page.

Bulk cancels (``GET /v1/bulk-cancels/<id>``): what a bulk cancel did in this replica's store,
its count (delay_service/store/bulk_cancels.py); the proxy asks it to answer ``DELETE
/v1/messages?id_prefix=..&wait=..``.

Threads: any thread may call these functions; :class:`Answers` is shared by the HTTP server's
request threads (it reads the store, which locks, and callbacks that only read thread-safe
state). replica.py builds it before the store's readers start and attaches the ingest and
forwarder state once they exist (:meth:`Answers.attach`); until then the role is ``starting``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kdelay import headers as h
from kdelay.clock import now_ms as wall_ms
from kdelay.delay_service.errors import QueryError
from kdelay.delay_service.queries.listing import LIST_SCAN, list_pending, parse_listing
from kdelay.delay_service.queries.message_status import message_status
from kdelay.delay_service.queries.timeline import (
    DEFAULT_BUCKET,
    DEFAULT_HORIZON,
    parse_window,
    timeline,
)
from kdelay.delay_service.store.store import Store
from kdelay.errors import InvalidHeaderError

#: Timelines computed at once per replica; more are refused with 503 (a scan is CPU-heavy).
MAX_SCANS = 2


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


class Answers:
    """The replica's answers, as health.py serves them: ``(HTTP status, JSON document)``."""

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        max_scan: int,
        scans: threading.Semaphore | None = None,
    ) -> None:
        self._store = store
        self._name = name
        self._max_scan = max_scan
        # The timelines computed at once, MAX_SCANS at most (a test holds them itself).
        self._scans = threading.BoundedSemaphore(MAX_SCANS) if scans is None else scans
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
        (``{"id", "cancelled", "refused", "applied_ms", "at"}``,
        delay_service/store/bulk_cancels.py),
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
