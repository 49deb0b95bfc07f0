"""The master's pass over the due entries, carried from round to round (isolation at any size).

One scan passes over at most ``scan_skip_limit`` entries of held targets (``Store.due_skipping``)
so that no round walks millions of them. Started from the floor every round, it met the same
held entries first each time: a held target with more due entries than the limit hid
everything due after them, for every other target, until it recovered. A :class:`Sweep` makes
the scans one *pass*: a scan cut at a bound ends where the next round's scan begins, and a scan
that reaches the due horizon ends the pass, so the next one starts from the floor again. A pass
over N due entries of held targets takes about ``N / scan_skip_limit`` rounds, each bounded as
before; what is due beyond them waits that many rounds, never for ever.

Order per target partition: during a pass, a target whose entries were passed over (it was
held) stays passed over until the pass ends, even once it is no longer held: its entries below
the resume point must leave before its later ones, and only the next pass, from the floor,
meets them first. A scan's entries that are still pending after the round (in flight, failed,
not sent) are examined again: the pass resumes at the first of them if it is below where the
scan stopped. So below the resume point lies only what was passed over, what was released, and
entries that arrived there since (a message stored after its due time: released by the next
pass, as late arrivals may be, after later-due ones).

The checkpoint rule: a resumed scan reports the due time of the earliest entry of the store as
passed over, so the round's claim stays below every entry still pending, wherever the pass is
(``round.claim_ms``); a cut scan's claim also stays below the last entry it examined. A new
master starts a new pass (:meth:`Sweep.restart`): nothing of a pass is persisted.

Threads: a Sweep belongs to the forwarder thread; it is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kdelay.delay_service.store.due_scan import DueScan, Target
from kdelay.delay_service.store.keyspace import NEXT_KEY as _NEXT


class Sweep:
    """Where the next scan of the pass starts and which targets the pass passed over."""

    def __init__(self) -> None:
        #: The key the next scan starts at; None: the floor (a new pass).
        self.start: bytes | None = None
        self._known: dict[bytes, Target] = {}  # the target of entries passed over, by key
        self._passed: set[Target] = set()

    @property
    def known(self) -> dict[bytes, Target] | None:
        """The cache of targets the next scan reads and fills (``Store.due_skipping``'s
        ``known``), or None: only the first scan of a pass, from the floor, has one. It so
        holds about ``scan_skip_limit`` keys, those every pass meets first; a whole pass's
        would grow with the held entries (millions of keys)."""
        return self._known if self.start is None else None

    @property
    def cached(self) -> int:
        """How many keys the cache of targets holds now (bounded: see :attr:`known`)."""
        return len(self._known)

    def skip(
        self, held: Collection[Target], keep: Collection[str] = (), cap: int = 0
    ) -> set[Target]:
        """The targets the next scan passes over: ``held`` now, and every target this pass
        passed over before. Forgets the cached targets of the others, except those of the
        topics in ``keep`` (rate-limited ones, ``smoothing.py``: passed over again and again
        while their backlog drains) unless the cache holds more than ``cap`` keys."""
        skip = set(held) | self._passed
        if keep and len(self._known) <= cap:
            self._known = {k: t for k, t in self._known.items() if t in skip or t[0] in keep}
        else:
            self._known = {k: t for k, t in self._known.items() if t in skip}
        return skip

    def forget(self, keys: Iterable[bytes]) -> None:
        """Drop the cached targets of entries that were released."""
        for key in keys:
            self._known.pop(key, None)

    def advance(self, scan: DueScan, kept: Iterable[bytes]) -> None:
        """After the round of ``scan``: ``kept`` are the keys of its entries still pending (in
        flight, failed, not sent). A scan that reached the horizon ends the pass."""
        if not scan.truncated or scan.stopped_at is None:
            self.restart()
            return
        self._passed |= scan.passed
        resume = scan.stopped_at + _NEXT
        self.start = min([resume, *kept])

    def restart(self) -> None:
        """The next scan starts a new pass, from the floor."""
        self.start = None
        self._passed.clear()
