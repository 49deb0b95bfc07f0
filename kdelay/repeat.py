"""Recurring messages: the ``kdelay-repeat`` header's three forms and their occurrence times.

A series is one message delivered again and again, each occurrence as its own record carrying
``kdelay-occurrence`` (1, 2, ...). The first occurrence is due at the time the timing header
asks for (at once without one); :meth:`Repeat.after` gives each next due time from the one
before, so a series never drifts with release lateness. Forms (README "Recurring messages"):

- ISO 8601 repeating interval: ``R5/PT1S`` (5 occurrences, 1 s apart), ``R/PT1H`` (until
  cancelled), ``R/PT1H/2027-01-01T00:00:00Z`` or ``R10/PT1M/<end>`` (none due after the end, an
  RFC 3339 time). The duration takes weeks, days, hours, minutes and (fractional) seconds:
  ``P1W``, ``P1DT12H``, ``PT0.5S``; not months or years, whose length varies (use cron).
- Exponential backoff: ``exp:INITIAL,FACTOR,MAX,COUNT``, durations in kdelay's grammar
  (``500ms``, ``10s``, ``2m``, ``1h``): ``exp:1s,2,1m,8`` is due at t, t+1 s, t+3 s, t+7 s,
  t+15 s, t+31 s, t+63 s, t+123 s (the gap doubles up to MAX), 8 occurrences in all.
- Cron, in a time zone: ``cron:0 9 * * 1-5`` (UTC) or ``cron:CRON_TZ=Europe/Berlin 0 9 * * 1-5``
  (the ``CRON_TZ=`` prefix of Kubernetes CronJobs), five fields matched by cronsim on the
  zone's wall clock. Occurrences are the matching minutes at or after the series' start;
  ``R<n>/cron:...`` stops after n of them. ``DST=NONEXISTENT,AMBIGUOUS`` after the zone
  (``cron:CRON_TZ=Europe/Berlin DST=skip,twice 30 2 * * *``) chooses what a wall-clock time in
  the spring gap (``skip`` or ``shift``) and in the autumn's repeated hour (``once`` or
  ``twice``) gives; without it, what cron does (:mod:`kdelay.cron_dst`). The canonical text
  of a zone other than UTC always carries the policy, so every replica follows the same one.

Every form is parsed and checked by :func:`parse` (the proxy, which rejects a bad value like any
bad header) and kept as :attr:`Repeat.text`, its canonical spelling, in the buffer record; the
delay service calls :func:`parse` again (cached) when it releases an occurrence. A gap between
occurrences must be at least :data:`MIN_GAP_MS` and at most the proxy's maximum horizon, so
every next occurrence is within the horizon when it is scheduled.

Pure values and functions: any thread may use them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from kdelay.cron_dst import DstPolicy, ZonedCron, default_policy, parse_policy
from kdelay.durations import duration_ms
from kdelay.errors import InvalidHeaderError

REPEAT = "kdelay-repeat"

#: The shortest gap between two occurrences: a next occurrence is scheduled when the one
#: before it is released, which takes a round trip to Kafka; shorter gaps would only be late.
MIN_GAP_MS = 100
_ISO = re.compile(r"R(\d*)/(P[^/]+)(?:/(.+))?\Z")
_DURATION = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:[.,]\d{1,3})?)S)?)?\Z"
)
_COUNTED = re.compile(r"R(\d+)/(cron:.*)\Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SHIFT_ONCE = DstPolicy("shift", "once")  # not used without a cron rule


def _bad(reason: str) -> InvalidHeaderError:
    return InvalidHeaderError(REPEAT, reason)


@dataclass(frozen=True, slots=True)
class Repeat:
    """A parsed ``kdelay-repeat`` value.

    ``count`` is the number of occurrences (None: unbounded, until ``end_ms`` or a cancel).
    Exactly one of ``every_ms`` (fixed interval), ``initial_ms`` (exponential) and ``cron`` is
    the rule.
    """

    text: str
    count: int | None = None
    end_ms: int | None = None
    every_ms: int | None = None
    initial_ms: int | None = None
    factor: float = 1.0
    max_ms: int | None = None
    cron: str | None = None
    zone: str = "UTC"
    dst: DstPolicy = _SHIFT_ONCE

    def first(self, start_ms: int) -> int:
        """The due time of occurrence 1 for a series that starts at ``start_ms``."""
        if self.cron is None:
            return start_ms
        due = self._cron_after(start_ms - 1)
        if due is None:
            raise _bad(f"cron expression {self.cron!r} matches no time after the start")
        return due

    def after(self, occurrence: int, due_ms: int) -> int | None:
        """The due time of occurrence ``occurrence + 1``, given occurrence ``occurrence`` was
        due at ``due_ms``; None when the series ends with ``occurrence``."""
        if self.count is not None and occurrence >= self.count:
            return None
        if self.every_ms is not None:
            nxt: int | None = due_ms + self.every_ms
        elif self.initial_ms is not None:
            nxt = due_ms + self._exp_gap(occurrence)
        else:
            nxt = self._cron_after(due_ms)
        if nxt is None or (self.end_ms is not None and nxt > self.end_ms):
            return None
        return nxt

    def _exp_gap(self, occurrence: int) -> int:
        """The gap after occurrence ``occurrence`` of an exponential series:
        ``min(max, initial * factor ** (occurrence - 1))``, compared in logarithms first so a
        late occurrence (``factor ** n`` past a float's range) gets the cap, never an error."""
        assert self.initial_ms is not None
        cap = self.max_ms or self.initial_ms
        exponent = occurrence - 1
        if self.factor > 1.0 and exponent * math.log(self.factor) > math.log(cap / self.initial_ms):
            return cap
        return min(cap, int(self.initial_ms * self.factor**exponent))

    def _cron_after(self, after_ms: int) -> int | None:
        """The first cron match strictly after ``after_ms`` (cron has minute resolution)."""
        return self._cron_match(after_ms, reverse=False)

    def cron_at_or_before(self, at_ms: int) -> int | None:
        """The last cron match at or before ``at_ms`` (a cron rule only)."""
        return self._cron_match(at_ms + 1, reverse=True)

    def _cron_match(self, from_ms: int, *, reverse: bool) -> int | None:
        assert self.cron is not None
        rule = ZonedCron(self.cron, self.zone, self.dst)
        return rule.at_or_before(from_ms - 1) if reverse else rule.after(from_ms)

    def widest_cron_gap(
        self, first_ms: int, until_ms: int, max_gap_ms: int, max_steps: int
    ) -> tuple[int, int]:
        """``(gap, at)``: the first gap between consecutive matches from ``first_ms`` to
        ``until_ms`` wider than ``max_gap_ms`` (the match it follows), else the widest one
        seen; in at most ``max_steps`` steps, each at least half of ``max_gap_ms`` on
        average, however dense the matches: from a match ``m`` the walk jumps to the last
        match at or before ``m + max_gap_ms``, since matches closer together than that cannot
        be too far apart.
        """
        widest, at, m = 0, first_ms, first_ms
        for _ in range(max_steps):
            if m >= until_ms:
                break
            nxt = self._cron_after(m)
            if nxt is None:
                break
            if nxt - m > widest:
                widest, at = nxt - m, m
            if nxt - m > max_gap_ms:
                break
            m = max(nxt, self.cron_at_or_before(min(m + max_gap_ms, until_ms)) or nxt)
        return widest, at


def _iso_duration_ms(text: str) -> int:
    m = _DURATION.match(text)
    if not m or text in ("P", "PT") or text.endswith("T"):
        raise _bad(
            f"{text!r} is not an ISO 8601 duration kdelay takes (weeks, days, hours, minutes, "
            "seconds: P1W, P1DT12H, PT0.5S; months and years vary in length: use cron)"
        )
    parts = {k: v for k, v in m.groupdict().items() if v}
    seconds = float(parts.get("s", "0").replace(",", "."))
    return round(
        ((int(parts.get("w", 0)) * 7 + int(parts.get("d", 0))) * 86400) * 1000
        + (int(parts.get("h", 0)) * 3600 + int(parts.get("m", 0)) * 60) * 1000
        + seconds * 1000
    )


def _end_ms(text: str) -> int:
    try:
        end = datetime.fromisoformat(text)
    except ValueError:
        raise _bad(f"end {text!r} is not an RFC 3339 time") from None
    if end.tzinfo is None:
        raise _bad(f"end {text!r} has no UTC offset (RFC 3339 needs one)")
    return -(-((end - _EPOCH) // timedelta(microseconds=1)) // 1000)


def _count(text: str) -> int | None:
    if not text:
        return None
    count = int(text)
    if count < 1:
        raise _bad(f"R{count}: a series has at least one occurrence")
    return count


def _checked_gap(what: str, gap_ms: int, max_horizon_ms: int) -> int:
    if gap_ms < MIN_GAP_MS:
        raise _bad(f"{what} is {gap_ms} ms; occurrences must be at least {MIN_GAP_MS} ms apart")
    if gap_ms > max_horizon_ms:
        raise _bad(
            f"{what} is {gap_ms // 1000} s, beyond the maximum horizon of "
            f"{max_horizon_ms // 1000} s"
        )
    return gap_ms


def _parse_iso(m: re.Match[str], max_horizon_ms: int) -> Repeat:
    every = _checked_gap("the interval", _iso_duration_ms(m[2]), max_horizon_ms)
    end = _end_ms(m[3]) if m[3] else None
    return Repeat(m[0], count=_count(m[1]), end_ms=end, every_ms=every)


def _parse_exp(body: str, max_horizon_ms: int) -> Repeat:
    parts = [p.strip() for p in body.split(",")]
    if len(parts) != 4:
        raise _bad(f"exp:{body!r} needs INITIAL,FACTOR,MAX,COUNT (e.g. exp:1s,2,1m,8)")
    try:
        initial, cap = duration_ms(parts[0]), duration_ms(parts[2])
        factor, count = float(parts[1]), int(parts[3])
    except ValueError as exc:
        raise _bad(f"exp:{body!r}: {exc}") from None
    if not 1.0 <= factor <= 1000.0:
        raise _bad(f"exp factor {parts[1]} must be between 1 and 1000")
    _checked_gap("the initial gap", initial, max_horizon_ms)
    _checked_gap("the maximum gap", max(cap, initial), max_horizon_ms)
    return Repeat(
        f"exp:{parts[0]},{parts[1]},{parts[2]},{count}",
        count=_count(str(count)),
        initial_ms=initial,
        factor=factor,
        max_ms=max(cap, initial),
    )


_CRON_PREFIX = re.compile(r"(CRON_TZ|TZ|DST)=(\S*)\s+")


def _parse_cron(body: str, count: int | None, max_horizon_ms: int) -> Repeat:
    zone, policy = "UTC", None
    expr = body.strip()
    while prefix := _CRON_PREFIX.match(expr):
        if prefix[1] == "DST":
            if policy is not None:
                raise _bad("DST= is given twice")
            try:
                policy = parse_policy(prefix[2])
            except ValueError as exc:
                raise _bad(str(exc)) from None
        else:
            zone = prefix[2]
        expr = expr[prefix.end() :]
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise _bad(f"unknown time zone {zone!r} (an IANA name such as Europe/Berlin)") from None
    if len(expr.split()) != 5:
        raise _bad(f"cron expression {expr!r} needs five fields: minute hour day month weekday")
    try:
        CronSim(expr, datetime.now(UTC))
    except CronSimError as exc:
        raise _bad(f"cron expression {expr!r}: {exc}") from None
    expr = " ".join(expr.split())
    policy = policy or default_policy(expr)
    # UTC has no daylight saving: its canonical text stays the one it always was.
    text = (
        f"cron:CRON_TZ={zone} {expr}"
        if zone == "UTC"
        else (f"cron:CRON_TZ={zone} {policy.text} {expr}")
    )
    rule = Repeat(
        text if count is None else f"R{count}/{text}", count=count, cron=expr, zone=zone, dst=policy
    )
    now = int(datetime.now(UTC).timestamp() * 1000)
    first = rule.first(now)
    second = rule.after(1, first) if count != 1 else None
    if second is not None:
        _checked_gap("the gap between cron matches", second - first, max_horizon_ms)
        # The maximum horizon holds for *every* next occurrence: the widest gap between
        # matches, over long enough for every day-of-month, month and leap-day pattern.
        last = first + _CRON_CHECK_SPAN_MS
        if count is not None and count <= _CRON_COUNTED_WALK:
            last = min(last, _nth_match(rule, first, count))
        gap, at = rule.widest_cron_gap(first, last, max_horizon_ms, _CRON_CHECK_STEPS)
        if gap > max_horizon_ms:
            when = datetime.fromtimestamp(at / 1000, tz=UTC).isoformat(timespec="minutes")
            _checked_gap(f"the gap between cron matches after {when}", gap, max_horizon_ms)
    return rule


#: How far ahead a cron series' gaps are checked: four years and a day (leap days), or as far
#: as this many steps reach (about 1,000 horizons: a horizon under a day and a half checks less
#: than four years; each distinct value is checked once, then cached).
_CRON_CHECK_SPAN_MS = (4 * 365 + 2) * 86_400_000
_CRON_CHECK_STEPS = 2000
#: A counted series of at most this many occurrences has only its own gaps checked.
_CRON_COUNTED_WALK = 1000


def _nth_match(rule: Repeat, first: int, count: int) -> int:
    """The due time of occurrence ``count`` (or of the last one, if it ends before)."""
    due = first
    for occurrence in range(1, count):
        nxt = rule.after(occurrence, due)
        if nxt is None:
            break
        due = nxt
    return due


@lru_cache(maxsize=4096)
def parse_repeat(text: str, max_horizon_ms: int) -> Repeat:
    """Parse a ``kdelay-repeat`` value; InvalidHeaderError naming the header and the reason."""
    text = text.strip()
    if m := _ISO.match(text):
        return _parse_iso(m, max_horizon_ms)
    if text.startswith("exp:"):
        return _parse_exp(text[4:], max_horizon_ms)
    counted = _COUNTED.match(text)
    if counted:
        return _parse_cron(counted[2][5:], _count(counted[1]), max_horizon_ms)
    if text.startswith("cron:"):
        return _parse_cron(text[5:], None, max_horizon_ms)
    raise _bad(
        f"{text!r} is none of kdelay's repeat forms: R5/PT1S, R/PT1H/<end>, "
        "exp:1s,2,1m,8 or cron:CRON_TZ=Europe/Berlin 0 9 * * 1-5"
    )
