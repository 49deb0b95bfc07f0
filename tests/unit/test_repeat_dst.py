"""Cron series across daylight-saving transitions: the ``DST=`` policy of
``kdelay-repeat``'s cron form, for Europe/Berlin and America/New_York over every transition of
2027 and 2028 (found here with zoneinfo, independently of kdelay.cron_dst's own search).

Invariants checked on every walk: occurrences strictly increase; consecutive ones are at least
a minute apart (cron's resolution) whatever the policy, so never within MIN_GAP_MS; with
``once`` no wall-clock time has two occurrences; ``twice`` gives both instants of a repeated
time; ``skip`` gives nothing for a time in the gap; ``shift`` gives the transition instant.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from kdelay.repeat import MIN_GAP_MS, Repeat, parse_repeat

ZONES = ("Europe/Berlin", "America/New_York")
POLICIES = ("skip,once", "skip,twice", "shift,once", "shift,twice")
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms(dt: datetime) -> int:
    return (dt.astimezone(UTC) - _EPOCH) // timedelta(milliseconds=1)


def offset_ms(zone: str, at: int) -> int:
    off = datetime.fromtimestamp(at / 1000, tz=ZoneInfo(zone)).utcoffset()
    assert off is not None
    return off // timedelta(milliseconds=1)


def transitions(zone: str, years: tuple[int, ...] = (2027, 2028)) -> list[tuple[int, int, int]]:
    """``(instant, offset before, offset after)`` of every change of ``zone``'s UTC offset in
    ``years``: a day whose noon offset differs from the day before's, then its minutes."""
    out = []
    day = date(years[0], 1, 1)
    while day.year <= years[-1]:
        noon = ms(datetime(day.year, day.month, day.day, 12, tzinfo=UTC))
        if offset_ms(zone, noon - DAY) != offset_ms(zone, noon):
            at = noon - DAY
            while offset_ms(zone, at + MINUTE) == offset_ms(zone, at):
                at += MINUTE
            out.append((at + MINUTE, offset_ms(zone, at), offset_ms(zone, at + MINUTE)))
        day += timedelta(days=1)
    return out


TRANSITIONS = [(zone, *t) for zone in ZONES for t in transitions(zone)]


def test_two_transitions_a_year_each_way() -> None:
    for zone in ZONES:
        found = transitions(zone)
        assert len(found) == 4
        assert [after - before for _, before, after in found] == [HOUR, -HOUR] * 2


def walk(rule: Repeat, start: int, until: int) -> list[int]:
    """Every occurrence from ``start`` up to ``until``, checking the walk's invariants."""
    out: list[int] = []
    nxt: int | None = rule.first(start)
    # The first occurrence too must be within ``until``: from a start a day before a spring gap
    # a daily time that falls in the gap under ``skip`` is next due two days later.
    while nxt is not None and nxt <= until:
        out.append(nxt)
        nxt = rule.after(len(out), nxt)
    gaps = [b - a for a, b in pairwise(out)]
    assert all(gap >= MINUTE > MIN_GAP_MS for gap in gaps), "strictly increasing, a minute apart"
    if rule.dst.ambiguous == "once":
        walls = [datetime.fromtimestamp(t / 1000, ZoneInfo(rule.zone)).replace(fold=0) for t in out]
        assert len(set(walls)) == len(walls), "a wall-clock time twice under 'once'"
    return out


def local(zone: str, day: date, hh: int, mm: int, fold: int = 0) -> int:
    return ms(datetime(day.year, day.month, day.day, hh, mm, tzinfo=ZoneInfo(zone), fold=fold))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("zone", "instant", "before", "after"), TRANSITIONS)
def test_a_daily_time_inside_the_gap_or_the_repeated_hour(
    zone: str, instant: int, before: int, after: int, policy: str
) -> None:
    """A daily job at 30 minutes into the gap (spring) or the repeated hour (autumn): 02:30 in
    Berlin both ways and in New York's spring, 01:30 in New York's autumn."""
    wall = datetime(1970, 1, 1) + timedelta(milliseconds=instant + min(before, after) + 30 * MINUTE)
    day = wall.date()
    hh, mm = wall.hour, wall.minute
    rule = parse_repeat(f"cron:CRON_TZ={zone} DST={policy} {mm} {hh} * * *", 2 * DAY)
    got = walk(rule, instant - 36 * HOUR, instant + 36 * HOUR)
    yesterday, tomorrow = (
        local(zone, day - timedelta(1), hh, mm),
        local(zone, day + timedelta(1), hh, mm),
    )
    if after > before:  # spring forward: hh:mm does not exist on the day
        today = [] if policy.startswith("skip") else [instant]  # shift: 03:00, the gap's end
    else:  # fall back: hh:mm happens twice
        today = [local(zone, day, hh, mm, 0)]
        if policy.endswith("twice"):
            today.append(local(zone, day, hh, mm, 1))
        assert today[-1] - today[0] in (0, before - after)
    assert got == [yesterday, *today, tomorrow]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("zone", "instant", "before", "after"), TRANSITIONS)
def test_a_daily_time_outside_the_transition_is_once_a_day(
    zone: str, instant: int, before: int, after: int, policy: str
) -> None:
    day = (datetime(1970, 1, 1) + timedelta(milliseconds=instant + before)).date()
    rule = parse_repeat(f"cron:CRON_TZ={zone} DST={policy} 0 12 * * *", 2 * DAY)
    got = walk(rule, instant - 2 * DAY, instant + 3 * DAY)
    assert got == [local(zone, day + timedelta(n), 12, 0) for n in (-2, -1, 0, 1, 2)]
    assert sorted({b - a for a, b in pairwise(got)}) == sorted({DAY, DAY + before - after})


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("zone", "instant", "before", "after"), TRANSITIONS)
@pytest.mark.parametrize(("expr", "every"), [("0 * * * *", HOUR), ("*/15 * * * *", 15 * MINUTE)])
def test_hourly_and_every_15_minutes_across_a_transition(
    *, zone: str, instant: int, before: int, after: int, policy: str, expr: str, every: int
) -> None:
    """Real time goes on every hour (15 minutes) except where 'once' drops the repeated hour's
    second pass: one gap of an hour more. In spring the gap's times would shift to its end,
    03:00, which is a match already: skip and shift agree."""
    rule = parse_repeat(f"cron:CRON_TZ={zone} DST={policy} {expr}", 2 * DAY)
    got = walk(rule, instant - 6 * HOUR, instant + 6 * HOUR)
    gaps = [b - a for a, b in pairwise(got)]
    if after < before and policy.endswith("once"):
        assert gaps.count(every + HOUR) == 1
        assert all(g == every for g in gaps if g != every + HOUR)
        skipped = got[gaps.index(every + HOUR)]
        assert skipped == instant - every  # the last occurrence before the clocks go back
        assert len(got) == 12 * HOUR // every + 1 - HOUR // every
    else:
        assert set(gaps) == {every}
        assert got[0] == instant - 6 * HOUR
        assert got[-1] == instant + 6 * HOUR


# ---- the policy against a brute-force oracle, anywhere near a transition ------------------


def matches(expr: str, wall: datetime) -> bool:
    return next(iter(CronSim(expr, wall - timedelta(seconds=1)))) == wall


def oracle(expr: str, zone: str, policy: str, start: int, end: int) -> list[int]:
    """Every occurrence in [start, end] by the policy's definition, minute by minute."""
    tz = ZoneInfo(zone)
    out = set()
    for at in range(start - start % MINUTE + MINUTE * (start % MINUTE > 0), end + 1, MINUTE):
        here = datetime.fromtimestamp(at / 1000, tz)
        if matches(expr, here.replace(tzinfo=None)) and not (here.fold and "once" in policy):
            out.add(at)
    if policy.startswith("shift"):
        for zone_, instant, before, after in TRANSITIONS + LORD_HOWE:
            if zone_ != zone or after <= before or not start <= instant <= end:
                continue
            gap = datetime(1970, 1, 1) + timedelta(milliseconds=instant + before)
            if any(
                matches(expr, gap + timedelta(minutes=n)) for n in range((after - before) // MINUTE)
            ):
                out.add(instant)
    return sorted(out)


# Australia/Lord_Howe: a half-hour shift (02:00 -> 02:30 in spring, 02:00 -> 01:30 in autumn)
LORD_HOWE = [("Australia/Lord_Howe", *t) for t in transitions("Australia/Lord_Howe")]
EXPRS = ["30 2 * * *", "*/15 * * * *", "0 * * * *", "45 1,2 * * *", "*/10 2 * * *", "5 1-3 * * *"]


@settings(max_examples=60, deadline=None)
@given(
    where=st.sampled_from(TRANSITIONS + LORD_HOWE),
    policy=st.sampled_from(POLICIES),
    expr=st.sampled_from(EXPRS),
    start=st.integers(-DAY, DAY),
)
# Found by CI: the walk's first occurrence (two days on, past the gap) beyond its end.
@example(
    where=("Europe/Berlin", 1806195600000, HOUR, 2 * HOUR),
    policy="skip,once",
    expr="30 2 * * *",
    start=-84420000,
)
def test_every_walk_is_what_the_policy_defines(
    where: tuple[str, int, int, int], policy: str, expr: str, start: int
) -> None:
    zone, instant, _, _ = where
    rule = parse_repeat(f"cron:CRON_TZ={zone} DST={policy} {expr}", 2**62)
    begin = instant + start
    got = walk(rule, begin, begin + DAY + 6 * HOUR)
    assert got == oracle(expr, zone, policy, begin, begin + DAY + 6 * HOUR)
    # the backward search (the horizon check's jumps) finds the same occurrences
    for prev, this in pairwise(got):
        assert rule.cron_at_or_before(this) == this
        assert rule.cron_at_or_before(this - 1) == prev


# ---- the default: what cron did, so every earlier spelling keeps its meaning ---------------


@pytest.mark.parametrize(
    ("expr", "default"),
    [
        ("30 2 * * *", "shift,once"),
        ("0 9 * * 1-5", "shift,once"),
        ("15,45 1-3 * * *", "shift,once"),
        ("0 * * * *", "skip,twice"),
        ("*/15 * * * *", "skip,twice"),
        ("30 */2 * * *", "skip,twice"),
    ],
)
@pytest.mark.parametrize("zone", ZONES)
def test_without_dst_the_policy_is_crons_and_the_times_are_cronsims(
    zone: str, expr: str, default: str
) -> None:
    """Vixie/Debian cron (and cronsim, which kdelay used alone before): a job at fixed times
    runs a skipped time just after the change and a repeated time once; a job with ``*`` in
    the minute or hour field follows real time."""
    rule = parse_repeat(f"cron:CRON_TZ={zone} {expr}", 2**62)
    assert rule.text == f"cron:CRON_TZ={zone} DST={default} {expr}"
    assert parse_repeat(rule.text, 2**62) == rule  # what the replicas parse again
    tz = ZoneInfo(zone)
    for zone_, instant, _, _ in TRANSITIONS:
        if zone_ != zone:
            continue
        ours = walk(rule, instant - DAY, instant + 3 * DAY)  # weekdays: past the weekend
        assert ours
        theirs = [ours[0]]
        while theirs[-1] < ours[-1]:
            start = datetime.fromtimestamp(theirs[-1] / 1000, tz)
            theirs.append(ms(next(iter(CronSim(expr, start)))))
        assert ours == theirs


# ---- the spelling ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        (
            "cron:CRON_TZ=Europe/Berlin DST=skip,twice 30 2 * * *",
            "cron:CRON_TZ=Europe/Berlin DST=skip,twice 30 2 * * *",
        ),
        (
            "cron:DST=Shift,Twice  TZ=America/New_York   0 9 * * 1-5",
            "cron:CRON_TZ=America/New_York DST=shift,twice 0 9 * * 1-5",
        ),
        (
            "R3/cron:CRON_TZ=Europe/Berlin DST=skip,once */15 * * * *",
            "R3/cron:CRON_TZ=Europe/Berlin DST=skip,once */15 * * * *",
        ),
        # UTC has no daylight saving: the policy changes nothing, the text is what it was
        ("cron:DST=skip,twice */10 * * * *", "cron:CRON_TZ=UTC */10 * * * *"),
        ("cron:*/10 * * * *", "cron:CRON_TZ=UTC */10 * * * *"),
    ],
)
def test_the_canonical_text_carries_the_policy(text: str, canonical: str) -> None:
    rule = parse_repeat(text, 2**62)
    assert rule.text == canonical
    assert parse_repeat(rule.text, 2**62) == rule


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("cron:CRON_TZ=Europe/Berlin DST=sometimes 30 2 * * *", "DST='sometimes' is not a"),
        ("cron:CRON_TZ=Europe/Berlin DST=skip 30 2 * * *", "DST=NONEXISTENT,AMBIGUOUS"),
        ("cron:CRON_TZ=Europe/Berlin DST=once,skip 30 2 * * *", "skip|shift"),
        ("cron:CRON_TZ=Europe/Berlin DST=skip,once,twice 30 2 * * *", "once|twice"),
        ("cron:DST=skip,once CRON_TZ=Europe/Berlin DST=skip,once 30 2 * * *", "given twice"),
        ("cron:CRON_TZ=Europe/Berlin DST= 30 2 * * *", "is not a daylight-saving policy"),
    ],
)
def test_the_proxy_refuses_an_unknown_policy_naming_the_header(value: str, said: str) -> None:
    with pytest.raises(InvalidHeaderError, match=said) as bad:
        h.classify(
            [(h.REPEAT, value.encode()), (h.ID, b"series")], 1_800_000_000_000, h.DelayPolicy()
        )
    assert bad.value.header == h.REPEAT


@pytest.mark.parametrize(
    ("policy", "horizon", "said"),
    [
        # skip: the day before the spring gap at 02:30 CET, then 02:30 CEST two days on: 47 h
        ("skip,once", DAY + HOUR, "169200 s"),
        ("skip,once", 2 * DAY, None),
        # shift: 02:30 CET, 03:00 CEST (23.5 h), 02:30 CEST (23.5 h); autumn once: 25 h
        ("shift,once", DAY, "90000 s"),
        ("shift,once", DAY + HOUR, None),
        # twice: 02:30 CEST, 02:30 CET an hour later, then 24 h
        ("shift,twice", DAY, None),
    ],
)
def test_the_horizon_check_follows_the_policy(policy: str, horizon: int, said: str | None) -> None:
    text = f"cron:CRON_TZ=Europe/Berlin DST={policy} 30 2 * * *"
    if said is None:
        parse_repeat(text, horizon)
    else:
        with pytest.raises(InvalidHeaderError, match=said):
            parse_repeat(text, horizon)


@pytest.mark.parametrize("policy", ["skip,once", "shift,twice"])
def test_a_sparse_schedule_on_the_transition_day_is_found_from_afar(policy: str) -> None:
    """02:30 on October's Sundays in Berlin: the last one is the autumn transition. The walk
    jumps over the months without a match, never over the repeated hour next to it."""
    rule = parse_repeat(f"cron:CRON_TZ=Europe/Berlin DST={policy} 30 2 * 10 0", 2**62)
    sunday = date(2027, 10, 31)
    week_before = local("Europe/Berlin", sunday - timedelta(7), 2, 30)
    first, second = (local("Europe/Berlin", sunday, 2, 30, fold) for fold in (0, 1))
    next_year = local("Europe/Berlin", date(2028, 10, 1), 2, 30)
    after_week_before = rule.after(1, week_before)
    assert after_week_before == first
    if policy.endswith("twice"):
        assert rule.after(1, first) == second
        assert rule.after(1, second) == next_year
        assert rule.cron_at_or_before(second - 1) == first
        assert rule.cron_at_or_before(next_year - 1) == second
    else:
        assert rule.after(1, first) == next_year
        assert rule.cron_at_or_before(next_year - 1) == first
    assert rule.cron_at_or_before(first - 1) == week_before
    assert rule.first(local("Europe/Berlin", date(2027, 11, 1), 0, 0)) == next_year


def test_a_series_starting_in_the_repeated_hour_never_starts_before_it() -> None:
    """cronsim alone put the first occurrence of a series started at 02:10 CET (the second
    pass) at 02:30 CEST, 40 minutes *before* the start; 'once' has had 02:30, so the next is
    tomorrow's, and 'twice' gives the second 02:30."""
    start = local("Europe/Berlin", date(2027, 10, 31), 2, 10, fold=1)
    once = parse_repeat("cron:CRON_TZ=Europe/Berlin 30 2 * * *", 2**62)
    twice = parse_repeat("cron:CRON_TZ=Europe/Berlin DST=shift,twice 30 2 * * *", 2**62)
    assert once.first(start) == local("Europe/Berlin", date(2027, 11, 1), 2, 30)
    assert twice.first(start) == local("Europe/Berlin", date(2027, 10, 31), 2, 30, fold=1)
