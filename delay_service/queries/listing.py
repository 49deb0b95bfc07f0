"""The listing of pending messages a replica answers from its own store (``GET
/v1/messages?state=pending&topic=..&id_prefix=..&due_before=..&limit=..&cursor=..``, CONTRACT.md
v3; queries.py serves it with its freshness).

The pending entries in key order (due time, then the order the proxy accepted them in), one
page at a time, filtered by target topic, id prefix, due time and ``owner`` (the proxy sets it
for a non-administrator). The cursor is base64url of the last entry key a page covered, so it
is stable under concurrent releases: the next page seeks past that key, and a message still
pending after it is listed exactly once; an entry released meanwhile is simply gone, one
scheduled meanwhile is listed if its key sorts after the cursor (one scheduled earlier in due
order than the cursor, or replaced to such a due time, is not). A page examines at most
``min(LIST_SCAN, max_scan)`` entries, chunk by chunk like the timeline (``timeline.py``; and a
value that cannot match, lacking the filter's bytes, is never decoded); when that budget runs
out before the page is full, the page is short (even empty) and ``next`` goes on from the last
entry examined, so a filter that matches rarely costs bounded pages, not one unbounded scan.
Only ``pending`` is listed: what left the store is remembered by id only.

Threads: any thread may call these functions (the store locks).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdelay import headers as h
from kdelay.buffer import Scheduled
from kdelay.delay_service.errors import QueryError
from kdelay.delay_service.queries.message_status import PENDING
from kdelay.delay_service.queries.timeline import CHUNK
from kdelay.delay_service.store.entry import decode_entry, split_key
from kdelay.delay_service.store.keyspace import ENTRY_KEY_SIZES as _KEY_SIZES
from kdelay.delay_service.store.store import Store
from kdelay.errors import InvalidHeaderError

#: Messages per listing page: by default, and at most (CONTRACT.md v3 "Listing").
LIST_DEFAULT = 100
LIST_MAX = 1000
#: Most entries one listing page examines (with ``max_scan`` when smaller): a page whose
#: filters match rarely stops there and says where to go on (``next``), so no page costs more.
LIST_SCAN = 200_000
#: No due time is this late: the upper bound of a listing without ``due_before``.
_NO_BOUND_MS = 2**63 - 1


def encode_cursor(key: bytes) -> str:
    """The opaque cursor of a listing that goes on after entry ``key``: base64url of the
    store key (due time first), unpadded."""
    return base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")


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
