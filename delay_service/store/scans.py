"""The store's reads: what is due, what passes over held targets, counts, chunks, one id.

Every scan seeks straight to the floor (``store/state.py``) and stops at an iterator upper
bound at the due time, so it never walks the point tombstones that deleting in key order leaves
in front. A scan that finds due entries moves the floor up to the first of them: everything
below was deleted. The master's scan may resume a pass where the previous one stopped
(:meth:`StoreScans.due_skipping`'s ``start``, ``sweep.py``): it still seeks the floor first,
once, for the due time of the earliest entry, which bounds the round's claim. Each public
method holds the store's lock for its whole scan, except :meth:`StoreScans.chunk_after`, which a
long reader calls chunk by chunk.

A part of ``store.Store``, working on its ``StoreState``. Concurrency: see the top of
``store.py``; any thread may call these.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rocksdict import ReadOptions

from kdelay.delay_service.store.due_scan import DueScan, Holds, Target
from kdelay.delay_service.store.entry import (
    Entry,
    decode_entry,
    due_bound,
    entry_target,
    split_key,
)
from kdelay.delay_service.store.ids import first_with_id
from kdelay.delay_service.store.outcomes import Outcome
from kdelay.delay_service.store.state import StoreState


class StoreScans:
    """Reads of the pending set, in key order (due time, then acceptance order)."""

    def __init__(self, state: StoreState) -> None:
        self._st = state

    def due(self, now_ms: int, limit: int) -> list[Entry]:
        """Entries with deliver-at <= ``now_ms`` in key order, at most ``limit`` of them."""
        out: list[Entry] = []
        with self._st.lock:
            self._st.check_open()
            for key, value in self._st.iter_from_floor(due_bound(now_ms + 1)):
                _, partition, offset = split_key(key)
                out.append(Entry(key, decode_entry(value), partition, offset))
                if len(out) >= limit:
                    break
            if out:
                self._st.floor = out[0].key
        return out

    def due_skipping(
        self,
        now_ms: int,
        limit: int,
        skip: Collection[Target],
        max_skipped: int,
        known: dict[bytes, Target] | None = None,
        *,
        start: bytes | None = None,
    ) -> DueScan:
        """Like :meth:`due`, but passes over entries whose target (topic, partition) is in
        ``skip``, so one held target cannot fill the scan and starve the others. Stops after
        ``limit`` entries returned or ``max_skipped`` passed over (``truncated``, with the last
        key examined in ``stopped_at``). ``known`` caches the target of each entry passed over
        (a key's target never changes), so the next scan passes over it without decoding it
        again.

        ``start`` resumes a pass (``sweep.py``): the scan begins at that key instead of the
        floor, and the entries below it count as passed over: ``first_skipped_ms`` is the due
        time of the first of them (one seek finds it), so a claim stays below every one of
        them. A ``start`` at or below the first entry is a scan from the floor."""
        out: list[Entry] = []
        known = {} if known is None else known
        passed: set[Target] = set()
        held = Holds(skip).holds
        # What this scan passed over holds what may share its partition, in turn: a (t, -1)
        # passed over because (t, p) is held holds (t, q) after it (it may land in q).
        behind = Holds(passed)

        def holds(target: Target) -> bool:
            return behind.holds(target) or held(target)  # held(...) may charge a budget: last

        skipped, first_skipped_ms, last_ms, last, cut = 0, None, None, None, False
        with self._st.lock:
            self._st.check_open()
            it, _bound = self._st.cursor_at_floor(due_bound(now_ms + 1))  # keep it alive
            if it.valid():
                self._st.floor = bytes(it.key())  # the first entry: none is below it
                if start is not None and self._st.floor < start:
                    first_skipped_ms = split_key(self._st.floor)[0]
                    it.seek(start)
            while it.valid():
                last = bytes(it.key())
                last_ms, partition, offset = split_key(last)
                target = known.get(last)
                if target is None or not holds(target):
                    value = bytes(it.value())
                    target = entry_target(value)  # most entries examined are passed over
                    if not holds(target):
                        out.append(Entry(last, decode_entry(value), partition, offset))
                        cut = len(out) >= limit
                        if cut:
                            break
                        it.next()
                        continue
                    known[last] = target
                behind.add(target)  # into passed
                skipped += 1
                first_skipped_ms = last_ms if first_skipped_ms is None else first_skipped_ms
                cut = skipped >= max_skipped
                if cut:
                    break
                it.next()
        return DueScan(
            out,
            skipped,
            first_skipped_ms,
            last_ms,
            truncated=cut,
            passed=frozenset(passed),
            stopped_at=last if cut else None,
        )

    def next_due_ms(self, after_ms: int | None = None) -> int | None:
        """The earliest deliver-at in the store (later than ``after_ms``), or None."""
        with self._st.lock:
            self._st.check_open()
            it = self._st.db.iter()
            start = self._st.floor if after_ms is None else due_bound(after_ms + 1)
            it.seek(max(start, self._st.floor))
            if not it.valid():
                return None
            return split_key(bytes(it.key()))[0]

    def count_due_within(self, now_ms: int, windows_ms: list[int], cap: int) -> list[int]:
        """Cumulative counts of entries due within each window (counting stops at ``cap``).

        One pass over the keys only, in key order (due time first): the count of a window is
        how many keys came before the first one at or past its bound. Each replica refreshes
        its due-window gauges with it, holding the store's lock, over up to ``cap`` entries.
        """
        if not windows_ms:
            return []
        order = sorted(range(len(windows_ms)), key=windows_ms.__getitem__)
        bounds = [due_bound(now_ms + windows_ms[i] + 1) for i in order]
        counts = [0] * len(windows_ms)
        seen = crossed = 0
        with self._st.lock:
            self._st.check_open()
            it, _bound = self._st.cursor_at_floor(bounds[-1])  # keep the bound alive
            while it.valid() and seen < cap:
                key = it.key()
                while key >= bounds[crossed]:  # the upper bound keeps crossed in range
                    counts[order[crossed]] = seen
                    crossed += 1
                seen += 1
                it.next()
        for i in order[crossed:]:
            counts[i] = seen
        return counts

    def chunk_after(
        self, after: bytes | None, until_ms: int, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """One chunk of a long read: up to ``limit`` raw ``(key, value)`` pairs of entries
        due before ``until_ms`` whose key sorts after ``after`` (from the first entry when
        None), in key order. The lock is held for this chunk only, and the caller decodes
        outside it (``entry.split_key``, ``entry.decode_entry``), so a reader walking the
        whole store (queries.py) never stalls ingest or the forwarder for long; entries added
        or removed between two chunks may or may not be seen."""
        out: list[tuple[bytes, bytes]] = []
        with self._st.lock:
            self._st.check_open()
            ro = ReadOptions()
            ro.set_iterate_upper_bound(due_bound(until_ms))
            it = self._st.db.iter(ro)
            it.seek(self._st.floor if after is None else max(after, self._st.floor))
            while it.valid() and len(out) < limit:
                key = bytes(it.key())
                if key != after:
                    out.append((key, bytes(it.value())))
                it.next()
        return out

    def get(self, msg_id: str) -> Entry | None:
        """A pending entry with id ``msg_id`` (the earliest-produced one), if any."""
        with self._st.lock:
            self._st.check_open()
            key = first_with_id(self._st.ids, msg_id)
            if key is None:
                return None
            value = self._st.db.get(key)
            if value is None:
                return None
            _, partition, offset = split_key(bytes(key))
            return Entry(bytes(key), decode_entry(bytes(value)), partition, offset)

    def bulk_result(self, bulk_id: str) -> dict[str, Any] | None:
        """What bulk cancel ``bulk_id`` did here (``bulk_cancels.py``): ``{"cancelled",
        "refused", "applied_ms", "at"}``, None when this replica has not applied it (or no
        longer remembers it)."""
        with self._st.lock:
            self._st.check_open()
            return self._st.bulks.result(bulk_id)

    def outcome(self, msg_id: str) -> Outcome | None:
        """What became of the last message with id ``msg_id`` that left the store, if this
        replica still remembers it (``outcomes.py``)."""
        with self._st.lock:
            self._st.check_open()
            return self._st.outcomes.get(msg_id)

    def history(self, msg_id: str) -> list[Outcome]:
        """What became of the messages with id ``msg_id`` that left the store (the last
        :data:`HISTORY_MAX` + 1 this replica remembers), oldest first (``outcomes.py``)."""
        with self._st.lock:
            self._st.check_open()
            return self._st.outcomes.history(msg_id)
