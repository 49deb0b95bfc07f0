"""Release smoothing: a rate limit per target topic (``--release-rate-limit``,
``release_rate_limits``), so a burst falling due at once reaches that topic's consumers at the
configured rate instead of all together.

One :class:`TokenBucket` per rate-limited topic holds what it may still be sent: it fills at
``rate`` messages per second up to ``burst`` (a tenth of a second's worth, at least one), or up to
:data:`BACKLOG_S` worth while the topic has due messages waiting: a scan pass that meets the topic
only every few rounds (a backlog of a million takes a pass of seconds, ``sweep.py``) does not lose
what it was owed, and sends it when it meets the topic again. What it has sent by any time stays
within its burst plus its rate times the time since its first release. The master's rounds consult
it through :class:`RoundQuota`, the collection of targets the round's scan passes over
(``Store.due_skipping``): it contains the held targets (``sweep.py``) and, once a rate-limited
topic's budget for the round is used up, every target of that topic. So the throttled topic's
remaining due entries are *passed over*, exactly like a held target's, and what is due for other
topics after them is released at once: one throttled topic never holds the others back (README
"Guarantees", isolation).

Order per partition: the scan examines the entries in key order (due time, then arrival) and
admits a topic's entries only while its budget lasts, so what it admits of a topic is a prefix
of that topic's due entries; once the budget is spent every later entry of the topic is passed
over, and the sweep keeps a target it passed over passed over until its pass ends
(``sweep.py``). A throttled entry is therefore never overtaken by a later one of its partition.
The bucket is charged for what the round actually sent (:meth:`Smoothing.released`), in both
delivery modes; an aborted transaction's records were charged (the rate errs low).

Cost: each round while a throttled topic's backlog waits passes over it again. The first scan
of a sweep's pass reads the targets of entries passed over from the sweep's cache
(``Sweep.known``), which keeps a rate-limited topic's entries (:class:`KnownView`), so such a
round decodes only what the budget admits; a pass cut at ``scan_skip_limit`` decodes what its
later scans pass over, as for held targets. A waiting topic wakes the forwarder every
:data:`BATCH_S` of tokens.

The extra lateness shows in ``kdelay_replica_release_throttled_total{topic}`` and
``kdelay_replica_release_smoothing_delay_seconds{topic}``: a released message counts as
throttled when it was already due at the last round in which its topic's budget ran out (the
limit held it back); its delay is its lateness.

Threads: a Smoothing and its quotas belong to the forwarder thread; not thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kdelay.clock import Clock
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.due_scan import Target
from kdelay.delay_service.store.entry import Entry

#: A bucket's burst when the topic has nothing waiting: this long at its rate (at least 1).
BURST_S = 0.1
#: While the topic has due messages waiting: up to this long at its rate. Longer than a sweep
#: pass over a backlog of millions (about 6 s for 1M here): with one second, a 1M backlog left
#: at 0.78 of its limit (bench.smoothing, 2026-12-07), with ten at 0.97.
BACKLOG_S = 10.0
#: A waiting topic wakes the forwarder once this long's worth of tokens is there (at least 1):
#: releases leave in batches, not one round per message, and each such round scans the topic's
#: backlog again (its entries passed over are decoded anew), so not more often than this.
BATCH_S = 0.1
#: The label of the default limit (``--release-rate-limit``) on the rate-limit gauge.
EVERY_TOPIC = "*"


@dataclass(slots=True)
class TokenBucket:
    """Tokens for one topic, refilled from a monotonic clock (seconds)."""

    rate: float  # tokens per second, > 0
    updated: float  # monotonic time of the last refill
    tokens: float = field(default=-1.0)  # -1: start full
    waiting_at: float = -math.inf  # when the topic last had due entries waiting

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    @property
    def burst(self) -> float:
        return max(1.0, self.rate * BURST_S)

    def capacity(self, now: float) -> float:
        """The most tokens the bucket holds now: more while the topic has a backlog."""
        if now - self.waiting_at <= BACKLOG_S:
            return max(self.burst, self.rate * BACKLOG_S)
        return self.burst

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.capacity(now), self.tokens + elapsed * self.rate)
        self.updated = max(self.updated, now)

    def available(self, now: float) -> int:
        """Whole messages that may be sent now."""
        self.refill(now)
        return max(0, math.floor(self.tokens))

    def take(self, count: int, now: float) -> None:
        """Charge ``count`` messages sent (the balance may go below zero: a debt)."""
        self.refill(now)
        self.tokens -= count

    def ready_in_s(self, now: float) -> float:
        """Seconds until a batch (:data:`BATCH_S` worth, at least one) can be sent."""
        self.refill(now)
        need = min(self.capacity(now), max(1.0, self.rate * BATCH_S))
        return 0.0 if self.tokens >= need else (need - self.tokens) / self.rate


class RoundQuota(Collection[Target]):
    """The targets one scan passes over: ``held`` ones, and a rate-limited topic's targets once
    its budget for the round is spent. Each membership test of a target the scan would return
    admits it and uses one unit of its topic's budget (``Store.due_skipping`` asks once per
    entry, in key order, and returns exactly the entries whose target was not contained)."""

    def __init__(self, held: Collection[Target], smoothing: Smoothing, now: float) -> None:
        self._held = held
        self._smoothing = smoothing
        self._now = now
        self._budget: dict[str, int] = {}
        self.denied: set[str] = set()  # topics whose budget ran out with entries due
        self.met: set[str] = set()  # rate-limited topics with due entries passed over

    def __contains__(self, target: object) -> bool:
        if not isinstance(target, tuple):
            return False
        topic = target[0]
        limited = self._smoothing.bucket(topic, self._now)
        if target in self._held:
            if limited is not None:
                self.met.add(topic)
            return True
        if limited is None:
            return False
        budget = self._budget.get(topic)
        if budget is None:
            budget = limited.available(self._now)
        if budget > 0:
            self._budget[topic] = budget - 1
            return False
        self._budget[topic] = 0
        self.denied.add(topic)
        self.met.add(topic)
        return True

    def closed(self, target: Target) -> bool:
        """Whether ``target`` is passed over whatever comes: held, or its topic's budget for
        the round is spent (or nil). Asks without using any budget."""
        if target in self._held:
            return True
        limited = self._smoothing.bucket(target[0], self._now)
        if limited is None:
            return False
        budget = self._budget.get(target[0])
        if budget is None:
            budget = self._budget[target[0]] = limited.available(self._now)
        return budget <= 0

    def __iter__(self) -> Iterator[Target]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class KnownView(dict[bytes, Target]):
    """The sweep's cache of targets passed over (``Store.due_skipping``'s ``known``) as a round
    with rate limits reads it: a cached target is given only when it is :meth:`closed
    <RoundQuota.closed>`, so an entry the round may admit is decoded and asked about once
    (each question uses budget); what the scan adds goes to the cache itself."""

    def __init__(self, inner: dict[bytes, Target], quota: RoundQuota) -> None:
        super().__init__()
        self._inner = inner
        self._quota = quota

    def get(self, key: bytes, default: Target | None = None) -> Target | None:  # type: ignore[override]
        found = self._inner.get(key)
        return found if found is not None and self._quota.closed(found) else default

    def __setitem__(self, key: bytes, value: Target) -> None:
        self._inner[key] = value


class Smoothing:
    """The rate limits of the master's releases, per target topic."""

    def __init__(
        self,
        default: float | None,
        per_topic: Mapping[str, float],
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        self._default = default
        self._per_topic = dict(per_topic)
        self._clock = clock
        self._metrics = metrics
        self._buckets: dict[str, TokenBucket] = {}
        self._denied_ms: dict[str, int] = {}  # the last round's time the topic's budget ran out
        self._waiting: set[str] = set()  # topics with due entries passed over, last round
        self._quota: RoundQuota | None = None  # the current round's, between skip and planned
        self._denied_now: dict[str, int] = {}  # this round's denials, until its releases count
        if metrics is not None:
            if default is not None:
                metrics.release_rate_limit.labels(EVERY_TOPIC).set(default)
            for topic, rate in self._per_topic.items():
                metrics.release_rate_limit.labels(topic).set(rate)

    @property
    def enabled(self) -> bool:
        return self._default is not None or bool(self._per_topic)

    def rate_of(self, topic: str) -> float | None:
        """The topic's limit in messages per second, or None: unlimited."""
        return self._per_topic.get(topic, self._default)

    def bucket(self, topic: str, now: float) -> TokenBucket | None:
        """The topic's bucket (created full), or None when the topic has no limit."""
        found = self._buckets.get(topic)
        if found is None:
            rate = self.rate_of(topic)
            if rate is None:
                return None
            found = self._buckets[topic] = TokenBucket(rate, now)
        return found

    def skip(self, held: Collection[Target]) -> Collection[Target]:
        """What this round's scan passes over: ``held``, plus the throttled topics' targets."""
        if not self.enabled:
            return held
        self._quota = RoundQuota(held, self, self._clock.monotonic())
        return self._quota

    @property
    def limited_topics(self) -> frozenset[str]:
        """The rate-limited topics met so far (their entries' cached targets are kept)."""
        return frozenset(self._buckets)

    def known_view(self, known: dict[bytes, Target] | None) -> dict[bytes, Target] | None:
        """The sweep's ``known`` cache as this round's scan should read it (:class:`KnownView`)."""
        if known is None or self._quota is None:
            return known
        return KnownView(known, self._quota)

    def planned(self, now_ms: int, passed: Collection[Target]) -> bool:
        """After the round's scan (with :meth:`skip`'s quota) at ``now_ms``; ``passed``: the
        targets held or passed over earlier in the sweep's pass. False: no limit is set."""
        skip, self._quota = self._quota, None
        if skip is None:
            return False
        now = self._clock.monotonic()
        self._denied_now = dict.fromkeys(skip.denied, now_ms)  # applies after released()
        waiting = skip.met | {t for t, _ in passed if t in self._buckets}
        for topic in waiting:
            self._buckets[topic].waiting_at = now
        self._waiting = waiting
        if self._metrics is not None:
            self._metrics.release_throttled_topics.set(len(skip.denied))
        return True

    def released(self, entries: Sequence[Entry], released_ms: int) -> None:
        """Charge the buckets for ``entries`` sent at ``released_ms``; count those the limit
        held back (due at or before their topic's last denial in an earlier round) and their
        lateness."""
        try:
            self._charge(entries, released_ms)
        finally:
            self._denied_ms.update(self._denied_now)  # this round's held later entries only
            self._denied_now = {}

    def _charge(self, entries: Sequence[Entry], released_ms: int) -> None:
        if not self.enabled or not entries:
            return
        now = self._clock.monotonic()
        counts: dict[str, int] = {}
        for entry in entries:
            topic = entry.message.topic
            if topic not in self._buckets and self.rate_of(topic) is None:
                continue
            counts[topic] = counts.get(topic, 0) + 1
            denied = self._denied_ms.get(topic)
            due = entry.message.deliver_at_ms
            if denied is not None and due <= denied and self._metrics is not None:
                self._metrics.release_throttled.labels(topic).inc()
                delay = max(0, released_ms - due) / 1000
                self._metrics.release_smoothing_delay.labels(topic).observe(delay)
        for topic, count in counts.items():
            bucket = self.bucket(topic, now)
            if bucket is not None:
                bucket.take(count, now)

    def ready_in_ms(self) -> int | None:
        """Milliseconds until a topic with due entries waiting may send again, or None."""
        if not self._waiting:
            return None
        now = self._clock.monotonic()
        soonest = min(self._buckets[t].ready_in_s(now) for t in self._waiting)
        return max(0, math.ceil(soonest * 1000))

    def restart(self) -> None:
        """A new term: nothing is known to wait (the buckets keep their tokens)."""
        self._waiting.clear()
        self._denied_ms.clear()
