"""The verifier's arithmetic, free of Spark: outcomes per message, percentiles, summaries, SLOs.

Definitions (the Spark job, :mod:`verifier.aggregates`, computes exactly these;
:func:`summarise` is the executable specification the unit tests pin down):

- A *message* is a ``schedule`` record in the buffer topic, identified by its id *and* its due
  time in epoch ms: an id may be reused (delivered, then scheduled again with a new due time),
  and each use is a message of its own. Its due time is the record's ``d`` (deliver-at), or,
  for a relative delay (format version 2, ``r``), the buffer record's timestamp (its
  LogAppendTime) + ``r``. Copies of one buffer record (same buffer key: a client's retried
  produce) are one message, the first copy's.
- A *delivery* is a record on a target topic with ``kdelay-id`` and ``kdelay-deliver-at``
  headers; it belongs to the message with that id and that due time. Its *delivery time* is
  the broker's clock when it can be had: the record timestamp on a topic with
  ``message.timestamp.type=LogAppendTime``; on a ``CreateTime`` topic (where the timestamp is
  whatever the releasing master's clock said) the verifier's own receipt time, an upper bound
  of the append time (see :mod:`verifier.source`). The report's ``clock`` says which:
  ``"receipt"`` as soon as any delivery counted used receipt time, else ``"log-append-time"``
  (also when nothing was delivered).
- *early*: deliveries whose delivery time is before the due time their own
  ``kdelay-deliver-at`` header carries, whether or not a schedule record exists for them (a
  record written straight to a target topic with a future due time is early).
- *cancelled*: a ``cancel`` record (or a replace) for the id cancels the message's schedule
  record, as the contract says, read by the verifier itself and not shared with the replicas
  (:func:`verifier.cancel_contract.cancels`: the cancel follows it in the buffer, same
  partition and higher offset, the proxy putting every record of an id in one partition; or
  precedes it, but a proxy accepted the schedule within 100 ms of the cancel's append and it
  was appended within five minutes of it: sent with it; a replace never cancels its own
  series' occurrences), and the message was never delivered.
  It is left out of every count (reported on its own as ``cancelled``). A message delivered
  despite a cancel counts as delivered: the cancel came too late, which the contract allows.
- *delivered*: messages delivered at least once (messages, not deliveries).
- *duplicates*: deliveries beyond the first per message, summed over messages.
- *missing*: never delivered, not cancelled, and due + grace < end of input (the ``--once``
  run's end instant; in the streaming job, the watermark).
- *pending*: never delivered, not cancelled, not yet missing. Not a verdict either way, so it
  is left out of ``scheduled`` and reported on its own; hence always
  ``scheduled == delivered + missing``.
- Deliveries of no known message (no schedule record with that id and due time) count in
  nothing but ``early`` (and, in ``--once`` details, ``unmatched_deliveries``).
- *lateness* of a delivered message: its first delivery's delivery time - due time, in ms
  (early deliveries give negative lateness). Percentiles are over delivered messages, exact, by
  :func:`kdelay.stats.percentile` (linear interpolation between closest ranks: numpy's
  default, Hyndman & Fan type 7; also Spark's exact ``percentile``); with no delivered message
  every percentile is 0.0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdelay.stats import percentile

#: The quantiles of the report, in the order of ``Lateness``'s fields.
QUANTILES = (0.5, 0.95, 0.99)
#: The report's ``clock``: every delivery timed by the broker (LogAppendTime topics) ...
CLOCK_LOG_APPEND = "log-append-time"
#: ... or at least one by the verifier's receipt time (a CreateTime topic).
CLOCK_RECEIPT = "receipt"


@dataclass(frozen=True, slots=True)
class Lateness:
    """Lateness percentiles and maximum, in milliseconds."""

    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Lateness:
        if not values:
            return cls()
        p50, p95, p99 = (percentile(values, q) for q in QUANTILES)
        return cls(p50, p95, p99, float(max(values)))

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99, "max": self.max}


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts and lateness over a set of messages: the whole run, or one window."""

    scheduled: int = 0
    delivered: int = 0
    missing: int = 0
    duplicates: int = 0
    early: int = 0
    lateness: Lateness = field(default_factory=Lateness)
    pending: int = 0
    cancelled: int = 0
    clock: str = CLOCK_LOG_APPEND

    def report(self) -> dict[str, Any]:
        """The CONTRACT.md report's verdicts, with the v2 ``clock`` (``isolation`` is a setting:
        :mod:`verifier.cli` adds it)."""
        return {
            "scheduled": self.scheduled,
            "delivered": self.delivered,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "early": self.early,
            "lateness_ms": self.lateness.as_dict(),
            "clock": self.clock,
        }

    def details(self) -> dict[str, Any]:
        """The report plus the counts that are not a verdict."""
        return {**self.report(), "pending": self.pending, "cancelled": self.cancelled}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Summary:
        """From an aggregate row with the column names of :data:`SUMMARY_COLUMNS`."""
        delivered = int(row["delivered"] or 0)

        def num(name: str) -> float:
            value = row[name]
            return 0.0 if delivered == 0 or value is None else float(value)

        return cls(
            scheduled=int(row["scheduled"] or 0),
            delivered=delivered,
            missing=int(row["missing"] or 0),
            duplicates=int(row["duplicates"] or 0),
            early=int(row["early"] or 0),
            lateness=Lateness(num("p50"), num("p95"), num("p99"), num("max")),
            pending=int(row["pending"] or 0),
            cancelled=int(row["cancelled"] or 0),
            clock=CLOCK_RECEIPT if row.get("receipt") else CLOCK_LOG_APPEND,
        )


#: The columns an aggregate row must have for :meth:`Summary.from_row`.
SUMMARY_COLUMNS = (
    "scheduled",
    "delivered",
    "missing",
    "duplicates",
    "early",
    "p50",
    "p95",
    "p99",
    "max",
    "pending",
    "cancelled",
    "receipt",
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one (id, due time): its deliveries, and whether it is a message."""

    id: str
    due_ms: int
    deliveries: tuple[int, ...] = ()  # delivery times, epoch ms
    cancelled: bool = False
    scheduled: bool = True  # False: deliveries of no schedule record (they count only as early)
    receipt: bool = False  # some delivery was timed by the verifier's receipt time


def summarise(outcomes: Iterable[Outcome], *, end_ms: int | None, grace_ms: int) -> Summary:
    """The summary of ``outcomes`` by the module's definitions (``end_ms`` None: all settled)."""
    scheduled = delivered = missing = duplicates = early = pending = cancelled = 0
    receipt = False
    lateness: list[float] = []
    for o in outcomes:
        early += sum(1 for t in o.deliveries if t < o.due_ms)
        receipt = receipt or (o.receipt and bool(o.deliveries))
        if not o.scheduled:
            continue
        if o.deliveries:
            delivered += 1
            duplicates += len(o.deliveries) - 1
            lateness.append(float(min(o.deliveries) - o.due_ms))
        elif o.cancelled:
            cancelled += 1
            continue
        elif end_ms is None or o.due_ms + grace_ms < end_ms:
            missing += 1
        else:
            pending += 1
            continue
        scheduled += 1
    clock = CLOCK_RECEIPT if receipt else CLOCK_LOG_APPEND
    return Summary(
        scheduled,
        delivered,
        missing,
        duplicates,
        early,
        Lateness.of(lateness),
        pending,
        cancelled,
        clock,
    )


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One event-time window's summary (windows are over the due time)."""

    start_ms: int
    end_ms: int
    summary: Summary

    def as_dict(self) -> dict[str, Any]:
        return {"window_start_ms": self.start_ms, "window_end_ms": self.end_ms} | (
            self.summary.details()
        )


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives; None = not checked."""

    max_p99_ms: float | None = None
    max_early: int | None = None
    max_missing: int | None = None
    max_duplicates: int | None = None


def breaches(summary: Summary, slo: Slo) -> list[str]:
    """One line per SLO that ``summary`` misses, naming its flag; empty when all are met."""
    found: list[str] = []
    if slo.max_p99_ms is not None and summary.lateness.p99 > slo.max_p99_ms:
        found.append(
            f"SLO --max-p99-ms missed: p99 lateness {summary.lateness.p99:.1f} ms "
            f"> {slo.max_p99_ms:g} ms"
        )
    checks = (
        ("--max-early", slo.max_early, summary.early, "early deliveries"),
        ("--max-missing", slo.max_missing, summary.missing, "missing messages"),
        ("--max-duplicates", slo.max_duplicates, summary.duplicates, "duplicate deliveries"),
    )
    for flag, limit, actual, what in checks:
        if limit is not None and actual > limit:
            found.append(f"SLO {flag} missed: {actual} {what} > {limit}")
    return found
