"""Recurring messages: the kdelay-repeat forms, their occurrence times, the header rules, the
buffer and store formats of a series. (The next occurrence the sender writes with a release:
test_sender.py.)"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay import buffer
from kdelay import headers as h
from kdelay.delay_service.store.entry import decode_entry, encode_entry
from kdelay.errors import InvalidHeaderError
from kdelay.repeat import MIN_GAP_MS, parse_repeat

HORIZON = h.DEFAULT_MAX_HORIZON_MS
T = 1_800_000_000_000  # 2027-01-15T08:00:00Z
NOW = T


def times(text: str, start: int = T, limit: int = 10) -> list[int]:
    rule = parse_repeat(text, HORIZON)
    out = [rule.first(start)]
    while len(out) < limit and (nxt := rule.after(len(out), out[-1])) is not None:
        out.append(nxt)
    return [t - out[0] for t in out]


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


@pytest.mark.parametrize(
    ("text", "gaps"),
    [
        ("R5/PT1S", [0, 1000, 2000, 3000, 4000]),
        ("R3/PT0.5S", [0, 500, 1000]),
        ("R2/P1DT1H", [0, 90_000_000]),
        ("R4/P1W", [0, 604_800_000, 1_209_600_000, 1_814_400_000]),
        ("exp:1s,2,1m,8", [0, 1000, 3000, 7000, 15000, 31000, 63000, 123000]),
        ("exp:500ms,3,2s,4", [0, 500, 2000, 4000]),
        ("R3/cron:*/5 * * * *", [0, 300_000, 600_000]),
    ],
)
def test_occurrence_times_follow_the_due_times_not_the_releases(text: str, gaps: list[int]) -> None:
    assert times(text) == gaps


def test_an_end_time_stops_an_unbounded_interval() -> None:
    end = "2027-01-15T08:00:02.500Z"
    assert times(f"R/PT1S/{end}") == [0, 1000, 2000]
    assert parse_repeat("R/PT1H", HORIZON).count is None  # unbounded: until cancelled


def test_cron_follows_its_time_zone_across_daylight_saving() -> None:
    # 09:00 in Berlin: 08:00 UTC in winter, 07:00 UTC in summer (DST began 2027-03-28).
    rule = parse_repeat("cron:CRON_TZ=Europe/Berlin 0 9 * * *", HORIZON)
    first = rule.first(utc("2027-03-26T12:00:00+00:00"))
    second = rule.after(1, first)
    third = rule.after(2, second or 0)
    assert first == utc("2027-03-27T08:00:00+00:00")
    assert second == utc("2027-03-28T07:00:00+00:00")
    assert third == utc("2027-03-29T07:00:00+00:00")
    assert rule.text == "cron:CRON_TZ=Europe/Berlin DST=shift,once 0 9 * * *"  # cron's default
    assert parse_repeat("cron:0 9 * * *", HORIZON).zone == "UTC"


def test_a_cron_start_on_a_match_is_the_first_occurrence() -> None:
    rule = parse_repeat("cron:* * * * *", HORIZON)
    assert rule.first(utc("2027-01-15T08:00:00+00:00")) == utc("2027-01-15T08:00:00+00:00")
    assert rule.first(utc("2027-01-15T08:00:00.001+00:00")) == utc("2027-01-15T08:01:00+00:00")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("P1D", "none of kdelay's repeat forms"),
        ("R0/PT1S", "at least one occurrence"),
        ("R5/PT0.05S", f"at least {MIN_GAP_MS} ms apart"),
        ("R5/P1M", "months and years vary"),
        ("R5/PT1S/tomorrow", "not an RFC 3339 time"),
        ("R5/PT1S/2027-01-01T00:00:00", "no UTC offset"),
        ("R2/P400D", "beyond the maximum horizon"),
        ("exp:1s,2,1m", "INITIAL,FACTOR,MAX,COUNT"),
        ("exp:1s,0.5,1m,3", "between 1 and 1000"),
        ("exp:1x,2,1m,3", "not a duration"),
        ("cron:* * *", "five fields"),
        ("cron:61 * * * *", "cron expression"),
        ("cron:TZ=Mars/Olympus * * * * *", "unknown time zone"),
        ("cron:0 0 29 2 *", "beyond the maximum horizon"),  # leap days: 4 years apart
    ],
)
def test_a_bad_value_is_rejected_naming_the_header_and_why(text: str, said: str) -> None:
    with pytest.raises(InvalidHeaderError, match=said) as bad:
        parse_repeat(text, HORIZON)
    assert bad.value.header == h.REPEAT


DAY = 86_400_000


@pytest.mark.parametrize(
    ("text", "horizon", "said"),
    [
        # 1st and 2nd of the month: a day apart, then a month (checked at every next match)
        ("cron:0 0 1,2 * *", 7 * DAY, "gap between cron matches after .* beyond"),
        ("cron:0 0 1,2 * *", 31 * DAY, None),
        ("R2/cron:0 0 1,2 * *", 2 * DAY, None),  # a counted series: only its own gaps
        ("R3/cron:0 0 1,2 * *", 2 * DAY, "beyond the maximum horizon"),
        # every minute of the first three days of a month: dense, then four weeks of nothing
        ("cron:* * 1-3 * *", 7 * DAY, "after .*T23:59"),
        # every minute of March: eleven months apart, found within the four years checked
        ("cron:* * * 3 *", 300 * DAY, "beyond the maximum horizon"),
        # a daily time in a zone with daylight saving: one gap a year is 25 hours
        ("cron:CRON_TZ=Europe/Berlin 30 2 * * *", DAY, "90000 s"),
        ("cron:CRON_TZ=Europe/Berlin 30 2 * * *", DAY + 3_600_000, None),
        ("cron:*/5 * * * *", 600_000, None),
        # what the replicas pass (the proxy checked): no horizon, no date beyond any calendar
        ("cron:CRON_TZ=Europe/Berlin * * * * *", 2**62, None),
        ("cron:0 0 29 2 *", 2**62, None),
    ],
)
def test_the_maximum_horizon_holds_for_every_next_cron_occurrence(
    text: str, horizon: int, said: str | None
) -> None:
    if said is None:
        parse_repeat(text, horizon)
    else:
        with pytest.raises(InvalidHeaderError, match=said):
            parse_repeat(text, horizon)


@pytest.mark.parametrize(
    "expr", ["0 0 1,2 * *", "*/7 3-5 * * 1,3", "0 9 * * 1-5", "* * 1-3 * *", "15 */6 13 * 5"]
)
def test_the_gap_walk_finds_what_every_gap_shows(expr: str) -> None:
    """The horizon check jumps over dense matches; it must find the first gap too wide that
    stepping through every match finds (60 days, horizons from 1 hour to 40 days)."""
    rule = parse_repeat(f"cron:{expr}", 10**13)
    first = rule.first(T)
    until = first + 60 * DAY
    gaps, m = [], first
    while m < until and (nxt := rule.after(1, m)) is not None:
        gaps.append((nxt - m, m))
        m = nxt
    for horizon in (3_600_000, DAY, 7 * DAY, 40 * DAY):
        over = [g for g in gaps if g[0] > horizon]
        gap, at = rule.widest_cron_gap(first, until, horizon, 10**6)
        if over:  # the first gap too wide, and where
            assert (gap, at) == over[0]
        else:  # none too wide: what the walk saw was one of them
            assert gap in {g for g, _ in gaps}
            assert gap <= horizon


def classify(*hdrs: tuple[str, bytes]) -> h.Delay | h.CancelRequest | None:
    return h.classify(list(hdrs), NOW, h.DelayPolicy())


def test_a_series_starts_at_its_timing_header_or_at_once() -> None:
    assert classify((h.REPEAT, b"R5/PT1S"), (h.DELAY_MS, b"300")) == h.Delay(
        NOW + 300, None, 300, "R5/PT1S"
    )
    assert classify((h.REPEAT, b"R5/PT1S")) == h.Delay(NOW, None, 0, "R5/PT1S")
    cron = classify((h.REPEAT, b"cron:*/10 * * * *"), (h.ID, b"c"))
    assert cron == h.Delay(NOW, "c", None, "cron:CRON_TZ=UTC */10 * * * *")  # T is on a match


def test_an_endless_series_needs_an_id_and_a_cancel_takes_no_repeat() -> None:
    with pytest.raises(InvalidHeaderError, match="needs 'kdelay-id'"):
        classify((h.REPEAT, b"R/PT1H"))
    assert classify((h.REPEAT, b"R/PT1H"), (h.ID, b"x")) is not None
    with pytest.raises(InvalidHeaderError, match="cannot be combined with 'kdelay-repeat'"):
        classify((h.CANCEL, b"x"), (h.REPEAT, b"R5/PT1S"))


def test_a_series_round_trips_through_the_buffer_and_the_store() -> None:
    msg = buffer.Scheduled(
        "s", "t", 1, b"k", b"v", T, (("app", b"1"),), "u" * 32, seq=7 << 20, repeat="R5/PT1S"
    )
    decoded = buffer.decode(*_kafka(buffer.encode(msg)), timestamp_ms=T)
    assert decoded == msg
    assert decode_entry(encode_entry(msg)) == dataclasses.replace(msg, seq=0)  # seq: in the key
    assert encode_entry(buffer.Scheduled("s", "t", 1, None, b"v", T))[0] == 3  # no series: v3
    assert msg.delivered_headers()[-1] == (h.OCCURRENCE, b"1")


def _kafka(enc: buffer.Encoded) -> tuple[bytes, bytes | None, list[tuple[str, bytes | None]]]:
    return enc.key, enc.value, list(enc.headers)


# ---- exponential series over their whole accepted domain ----------------
# `factor ** n` overflowed a float past occurrence ~1,024 (factor 2) or ~309 (factor 10) and
# the series ended early; the gap is now min(MAX, INITIAL * FACTOR ** (n - 1)) for every n.


@pytest.mark.parametrize(
    ("text", "occurrence"), [("exp:100ms,2,200ms,1100", 1025), ("exp:1s,10,1h,400", 310)]
)
def test_a_long_exponential_series_runs_to_its_count(text: str, occurrence: int) -> None:
    rule = parse_repeat(text, HORIZON)
    assert rule.max_ms is not None
    assert rule.count is not None
    for n in (occurrence - 1, occurrence, occurrence + 1, rule.count - 1):
        assert rule.after(n, T) == T + rule.max_ms
    assert rule.after(rule.count, T) is None


@given(
    initial=st.integers(MIN_GAP_MS, HORIZON),
    cap=st.integers(MIN_GAP_MS, HORIZON),
    factor=st.floats(1.0, 1000.0, allow_nan=False),
    count=st.integers(1, 10**12),
    occurrence=st.integers(1, 10**12),
    due=st.integers(0, 10**13),
)
def test_an_exponential_series_ends_only_by_its_count(
    *, initial: int, cap: int, factor: float, count: int, occurrence: int, due: int
) -> None:
    rule = parse_repeat(f"exp:{initial}ms,{factor!r},{cap}ms,{count}", HORIZON)
    top = max(initial, cap)
    nxt = rule.after(occurrence, due)
    if occurrence >= count:
        assert nxt is None
        return
    assert nxt is not None
    gap = nxt - due
    assert initial <= gap <= top
    grows = (occurrence - 1) * math.log(factor)  # log of FACTOR ** (n - 1): never overflows
    if grows < math.log(top / initial) - 1e-9:
        assert gap == int(initial * factor ** (occurrence - 1))
    elif grows > math.log(top / initial) + 1e-9:
        assert gap == top
    # the gaps never shrink: the series is a backoff
    if occurrence > 1:
        before = rule.after(occurrence - 1, due)
        assert before is not None
        assert before - due <= gap


@given(
    every=st.integers(MIN_GAP_MS, HORIZON),
    count=st.one_of(st.none(), st.integers(1, 10**12)),
    occurrence=st.integers(1, 10**12),
    due=st.integers(0, 10**13),
)
def test_an_interval_series_ends_only_by_its_count(
    every: int, count: int | None, occurrence: int, due: int
) -> None:
    seconds = f"{every // 1000}.{every % 1000:03d}" if every < 10**6 else None
    text = f"R{'' if count is None else count}/PT{seconds}S" if seconds else None
    if text is None:
        text = f"R{'' if count is None else count}/PT{every // 1000}S"
        every = every // 1000 * 1000
    rule = parse_repeat(text, HORIZON)
    nxt = rule.after(occurrence, due)
    if count is not None and occurrence >= count:
        assert nxt is None
    else:
        assert nxt == due + every
