"""Cron matches in a time zone under an explicit daylight-saving policy.

A cron expression names *wall-clock* minutes; in a zone with daylight saving some wall-clock
times do not exist (spring forward: 02:30 in Europe/Berlin on the last Sunday of March) and
some happen twice (fall back: 02:30 on the last Sunday of October). :class:`DstPolicy` says
what a series does with each:

- nonexistent: ``skip`` (no occurrence that day) or ``shift`` (one occurrence at the first
  instant after the gap, the transition itself: 03:00 CEST; several matches in one gap make
  one occurrence there);
- ambiguous: ``once`` (the first of the two instants, the earlier in UTC, as cron runs it) or
  ``twice`` (both instants, in real-time order).

The default, :func:`default_policy`, is what cronsim (and Vixie/Debian cron before it) did for
the same expression, so every spelling accepted before keeps its meaning: a job at fixed times
(the minute and hour fields both start with something other than ``*``) is ``shift,once``;
any other (``*/15 * * * *``, ``0 * * * *``) follows real time: ``skip,twice``.

How: the zone's UTC offset is constant between two transitions, so each such *segment* of
time is a plain shift of the wall clock. :class:`ZonedCron` walks the segments from a given
instant, asks cronsim for the first (or last) match of the expression on the naive wall
clock within the segment's wall-clock range, and applies the policy at the segment's start:
after a gap, ``shift`` adds the transition instant if a match lies in the gap; after an
overlap, ``once`` excludes the wall-clock times the segment before already had. The
transitions of a zone are found with :mod:`zoneinfo` (a scan per year, cached).

Invariants (tests/unit/test_repeat_dst.py): occurrences strictly increase; consecutive ones
are at least a minute apart (cron's resolution; offsets are whole minutes), whatever the
policy; with ``once`` no wall-clock time has two occurrences.

Pure values and functions, caches behind :func:`functools.lru_cache`: any thread may use them.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronsim import CronSim

NONEXISTENT = ("skip", "shift")
AMBIGUOUS = ("once", "twice")

_NAIVE_EPOCH = datetime(1970, 1, 1)
_HOUR = 3_600_000
_DAY = 24 * _HOUR
#: Transitions are searched at this step, then bisected to the second; no zone has two
#: transitions within six hours.
_SCAN_STEP_MS = 6 * _HOUR
#: A match whose wall-clock time is further ahead than this margin lets the walk jump over the
#: segments before it (no zone's offset changes by a day or more in one go), when the walk is
#: at least this far from the segment's end: an overlap just after it cannot reach back to
#: wall-clock times before the one it searched from.
_JUMP_MARGIN_MS = 2 * _DAY
#: The walk gives up (no next occurrence) after this many segments (about three a year).
_MAX_SEGMENTS = 2000


@dataclass(frozen=True, slots=True)
class DstPolicy:
    """What a cron series does with nonexistent and ambiguous wall-clock times."""

    nonexistent: str = "shift"
    ambiguous: str = "once"

    @property
    def text(self) -> str:
        """The canonical spelling, as in ``kdelay-repeat``: ``DST=shift,once``."""
        return f"DST={self.nonexistent},{self.ambiguous}"


def parse_policy(value: str) -> DstPolicy:
    """``skip|shift,once|twice`` (the part after ``DST=``); ValueError naming what is wrong."""
    parts = [p.strip().lower() for p in value.split(",")]
    if len(parts) != 2 or parts[0] not in NONEXISTENT or parts[1] not in AMBIGUOUS:
        raise ValueError(
            f"DST={value!r} is not a daylight-saving policy: DST=NONEXISTENT,AMBIGUOUS with "
            f"NONEXISTENT one of {'|'.join(NONEXISTENT)} (a time in the spring gap) and "
            f"AMBIGUOUS one of {'|'.join(AMBIGUOUS)} (a time in the autumn's repeated hour), "
            "e.g. DST=shift,once"
        )
    return DstPolicy(parts[0], parts[1])


def default_policy(expr: str) -> DstPolicy:
    """cronsim's (Vixie/Debian cron's) behaviour for ``expr``: ``shift,once`` for a job at
    fixed times (minute and hour fields not starting with ``*``), else ``skip,twice``."""
    fields = expr.split()
    if fields[0].startswith("*") or fields[1].startswith("*"):
        return DstPolicy("skip", "twice")
    return DstPolicy("shift", "once")


def _offset_ms(zone: ZoneInfo, at_ms: int) -> int:
    off = datetime.fromtimestamp(at_ms / 1000, tz=zone).utcoffset()
    assert off is not None
    return off // timedelta(milliseconds=1)


def _year_start_ms(year: int) -> int:
    return (datetime(year, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
        milliseconds=1
    )


@lru_cache(maxsize=1024)
def _boundaries(zone_name: str, year: int) -> tuple[int, ...]:
    """The start of ``year`` (UTC) and every instant in it at which ``zone_name``'s offset
    changes, ascending (epoch ms, whole seconds)."""
    zone = ZoneInfo(zone_name)
    start, end = _year_start_ms(year), _year_start_ms(year + 1)
    out = [start]
    at, off = start, _offset_ms(zone, start)
    while at < end:
        nxt = min(at + _SCAN_STEP_MS, end)
        nxt_off = _offset_ms(zone, nxt)
        if nxt_off != off:
            lo, hi = at // 1000, nxt // 1000  # offset(lo) == off, offset(hi) != off
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset_ms(zone, mid * 1000) == off:
                    lo = mid
                else:
                    hi = mid
            out.append(hi * 1000)
        at, off = nxt, nxt_off
    return tuple(out)


def _year_of(at_ms: int) -> int:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms)).year


@dataclass(frozen=True, slots=True)
class _Segment:
    start: int  # epoch ms: a transition or the start of a year
    end: int  # epoch ms: the next one
    off: int  # the UTC offset in [start, end), ms
    before: int  # the UTC offset just before start, ms


class ZonedCron:
    """A five-field cron expression in an IANA zone, under a :class:`DstPolicy`."""

    __slots__ = ("_expr", "_policy", "_zone", "_zone_name")

    def __init__(self, expr: str, zone: str, policy: DstPolicy) -> None:
        self._expr = expr
        self._zone_name = zone
        self._zone = ZoneInfo(zone)
        self._policy = policy

    def _segment(self, at_ms: int) -> _Segment:
        year = _year_of(at_ms)
        bounds = _boundaries(self._zone_name, year)
        i = bisect_right(bounds, at_ms) - 1
        start = bounds[i]
        end = bounds[i + 1] if i + 1 < len(bounds) else _year_start_ms(year + 1)
        return _Segment(
            start, end, _offset_ms(self._zone, start), _offset_ms(self._zone, start - 1)
        )

    def _first_wall_match(self, wall_ms: int) -> int | None:
        """The first match at or after the naive wall-clock time ``wall_ms``."""
        start = _NAIVE_EPOCH + timedelta(milliseconds=wall_ms - 1)
        try:
            match = next(iter(CronSim(self._expr, start)))
        except StopIteration:
            return None
        return (match - _NAIVE_EPOCH) // timedelta(milliseconds=1)

    def _last_wall_match(self, wall_ms: int) -> int | None:
        """The last match at or before the naive wall-clock time ``wall_ms``."""
        start = _NAIVE_EPOCH + timedelta(milliseconds=wall_ms + 1)
        try:
            match = next(iter(CronSim(self._expr, start, reverse=True)))
        except StopIteration:
            return None
        return (match - _NAIVE_EPOCH) // timedelta(milliseconds=1)

    def _low_wall(self, seg: _Segment) -> int:
        """The earliest wall-clock time segment ``seg`` has an occurrence for: with ``once``,
        the times of an overlap at its start belong to the segment before."""
        if self._policy.ambiguous == "once" and seg.off < seg.before:
            return seg.start + seg.before
        return seg.start + seg.off

    def _gap_matches(self, seg: _Segment) -> bool:
        """Whether ``shift`` gives an occurrence at ``seg.start``: a gap before it holds a match."""
        if self._policy.nonexistent != "shift" or seg.off <= seg.before:
            return False
        m = self._first_wall_match(seg.start + seg.before)
        return m is not None and m < seg.start + seg.off

    def after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms`` (None: none within cronsim's 50
        years)."""
        at = after_ms + 1
        for _ in range(_MAX_SEGMENTS):
            seg = self._segment(at)
            if at == seg.start and self._gap_matches(seg):
                return seg.start
            m = self._first_wall_match(max(at + seg.off, self._low_wall(seg)))
            if m is None:
                return None
            if m < seg.end + seg.off:
                return m - seg.off
            at_was = at
            at = seg.end
            if seg.end - at_was >= _JUMP_MARGIN_MS:  # no overlap after seg.end reaches back
                at = max(seg.end, m - seg.off - _JUMP_MARGIN_MS)
        return None

    def at_or_before(self, at_ms: int) -> int | None:
        """The last occurrence at or before ``at_ms`` (None: none within cronsim's 50 years)."""
        at = at_ms
        for _ in range(_MAX_SEGMENTS):
            seg = self._segment(at)
            m = self._last_wall_match(at + seg.off)
            if m is not None and m >= self._low_wall(seg):
                return m - seg.off
            if self._gap_matches(seg):
                return seg.start
            if m is None:
                return None
            at_was, at = at, seg.start - 1
            if at_was - seg.start >= _JUMP_MARGIN_MS:  # no overlap before seg.start reaches on
                at = min(seg.start - 1, m - seg.off + _JUMP_MARGIN_MS)
        return None
