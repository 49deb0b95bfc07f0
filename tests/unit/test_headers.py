"""kdelay/headers.py: every control header, RFC 3339, levels, horizon, duplicates, ids, cancel,
look-alike header names, and epoch seconds sent for milliseconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay import headers as h
from kdelay.errors import InvalidHeaderError

NOW = 1_700_000_000_000
POLICY = h.DelayPolicy()


def classify(*headers: tuple[str, bytes | None]) -> h.Delay | h.CancelRequest | None:
    return h.classify(list(headers), NOW, POLICY)


def test_no_control_header_passes_through() -> None:
    assert classify() is None
    assert classify(("app", b"1"), ("x-kdelay-delay-ms", b"x"), ("kdelayed", b"x")) is None


def test_delay_ms() -> None:
    assert classify((h.DELAY_MS, b"1500")) == h.Delay(NOW + 1500, None, 1500)
    assert classify((h.DELAY_MS, b" 0 ")) == h.Delay(NOW, None, 0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"1700000001000", 1_700_000_001_000),
        (b"2023-11-14T22:13:21Z", 1_700_000_001_000),
        (b"2023-11-14T23:13:21.5+01:00", 1_700_000_001_500),
        (b"978307200000", 978_307_200_000),  # 2001-01-01, in the past: due now
    ],
)
def test_deliver_at_epoch_and_rfc3339(raw: bytes, expected: int) -> None:
    assert classify((h.DELIVER_AT, raw)) == h.Delay(expected, None)


@pytest.mark.parametrize("raw", [b"2023-11-14T22:13:21", b"tomorrow", b"", None, "é".encode()])
def test_deliver_at_rejects(raw: bytes | None) -> None:
    with pytest.raises(InvalidHeaderError, match=h.DELIVER_AT):
        classify((h.DELIVER_AT, raw))


@pytest.mark.parametrize(
    ("level", "delay"), [(1, 1000), (4, 30_000), (18, 7_200_000), (99, 7_200_000)]
)
def test_levels_including_above_the_maximum(level: int, delay: int) -> None:
    assert classify((h.DELAY_LEVEL, str(level).encode())) == h.Delay(NOW + delay, None, delay)


def test_custom_level_table() -> None:
    policy = h.DelayPolicy(levels_ms=(10, 20))
    assert h.classify([(h.DELAY_LEVEL, b"5")], NOW, policy) == h.Delay(NOW + 20, None, 20)


@pytest.mark.parametrize(
    ("header", "raw"),
    [
        (h.DELAY_MS, b"-1"),
        (h.DELAY_MS, b"1.5"),
        (h.DELAY_MS, b"abc"),
        (h.DELAY_MS, None),
        (h.DELAY_LEVEL, b"0"),
        (h.DELAY_LEVEL, b"-3"),
        (h.DELAY_LEVEL, b"x"),
    ],
)
def test_malformed_values_name_the_header(header: str, raw: bytes | None) -> None:
    with pytest.raises(InvalidHeaderError) as info:
        classify((header, raw))
    assert info.value.header == header
    assert header in str(info.value)


def test_horizon() -> None:
    limit = h.DEFAULT_MAX_HORIZON_MS
    assert classify((h.DELAY_MS, str(limit).encode())) == h.Delay(NOW + limit, None, limit)
    with pytest.raises(InvalidHeaderError, match="horizon"):
        classify((h.DELAY_MS, str(limit + 1).encode()))
    with pytest.raises(InvalidHeaderError, match="horizon"):
        classify((h.DELIVER_AT, str(NOW + limit + 1).encode()))
    small = h.DelayPolicy(max_horizon_ms=1000)
    with pytest.raises(InvalidHeaderError, match=h.DELAY_LEVEL):
        h.classify([(h.DELAY_LEVEL, b"2")], NOW, small)


@pytest.mark.parametrize(
    "pair", [(h.DELAY_MS, h.DELIVER_AT), (h.DELAY_MS, h.DELAY_LEVEL), (h.DELIVER_AT, h.DELAY_LEVEL)]
)
def test_two_timing_headers_are_rejected(pair: tuple[str, str]) -> None:
    with pytest.raises(InvalidHeaderError, match="only one of"):
        classify((pair[0], b"1"), (pair[1], b"1"))


@pytest.mark.parametrize("name", sorted(h.CONTROL_HEADERS))
def test_duplicates_are_rejected(name: str) -> None:
    with pytest.raises(InvalidHeaderError, match="more than once") as info:
        classify((name, b"1"), (name, b"1"))
    assert info.value.header == name


def test_id_bounds() -> None:
    assert classify((h.DELAY_MS, b"1"), (h.ID, b"a")) == h.Delay(NOW + 1, "a", 1)
    long_id = "é" * 127  # 254 bytes
    assert classify((h.DELAY_MS, b"1"), (h.ID, long_id.encode())) == h.Delay(NOW + 1, long_id, 1)
    for bad in (b"", None, b"x" * 256, b"\xff"):
        with pytest.raises(InvalidHeaderError, match=h.ID):
            classify((h.DELAY_MS, b"1"), (h.ID, bad))
    with pytest.raises(InvalidHeaderError, match="needs one of"):
        classify((h.ID, b"a"))


def test_cancel_combinations() -> None:
    assert classify((h.CANCEL, b"m-1")) == h.CancelRequest("m-1")
    assert classify((h.CANCEL, b"m-1"), (h.ID, b"other"), ("app", b"x")) == h.CancelRequest("m-1")
    for timing in h.TIMING_HEADERS:
        with pytest.raises(InvalidHeaderError, match=h.CANCEL):
            classify((h.CANCEL, b"m-1"), (timing, b"1"))
    with pytest.raises(InvalidHeaderError, match=h.CANCEL):
        classify((h.CANCEL, b""))


def test_strip_control_keeps_own_headers_in_order() -> None:
    raw = [("a", b"1"), (h.DELAY_MS, b"5"), ("b", None), (h.ID, b"x"), ("a", b"2")]
    assert h.strip_control(raw) == (("a", b"1"), ("b", None), ("a", b"2"))


def test_new_ids_are_unique_and_valid() -> None:
    ids = {h.new_id() for _ in range(100)}
    assert len(ids) == 100
    for i in ids:
        assert h.validate_id(h.ID, i.encode()) == i


@given(st.lists(st.tuples(st.sampled_from([*h.CONTROL_HEADERS, "x"]), st.none() | st.binary())))
def test_classify_never_fails_otherwise(headers: list[tuple[str, bytes | None]]) -> None:
    named: str | None = None
    try:
        h.classify(headers, NOW, POLICY)
    except InvalidHeaderError as exc:
        named = exc.header
    assert named is None or named in h.CONTROL_HEADERS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z", 1_767_225_600_000),
        ("2026-01-01T00:00:00.999Z", 1_767_225_600_999),
        ("2026-01-01T00:00:00.0004Z", 1_767_225_600_001),  # rounding would give ...000
        ("2026-01-01T00:00:00.0000001Z", 1_767_225_600_001),  # beyond microseconds
        ("2026-01-01T00:00:00.9995+01:00", 1_767_222_001_000),
    ],
)
def test_sub_millisecond_times_are_ceiled_never_early(text: str, expected: int) -> None:
    assert h.parse_deliver_at(h.DELIVER_AT, text.encode()) == expected


def test_delays_and_levels_say_they_are_relative_and_times_do_not() -> None:
    assert classify((h.DELAY_MS, b"1500")).delay_ms == 1500  # type: ignore[union-attr]
    assert classify((h.DELAY_LEVEL, b"1")).delay_ms == 1000  # type: ignore[union-attr]
    assert classify((h.DELIVER_AT, b"978307200005")).delay_ms is None  # type: ignore[union-attr]


# -- look-alike header names (issue "Safe by default") -----------------------------------------


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("KDELAY-DELAY-MS", h.DELAY_MS),
        ("kdelay-delay", h.DELAY_MS),
        ("kdelay_delay_ms", h.DELAY_MS),
        ("Kdelay-Deliver-At", h.DELIVER_AT),
        ("kdelay-deliverat", h.DELIVER_AT),
        ("kdelay_delay_level", h.DELAY_LEVEL),
        ("KDELAY-ID", h.ID),
        ("kdelay-cancell", h.CANCEL),
    ],
)
def test_a_look_alike_name_is_rejected_naming_the_closest_header(name: str, closest: str) -> None:
    with pytest.raises(h.UnknownHeaderError) as info:
        classify((name, b"1000"))
    assert info.value.header == name
    assert f"did you mean {closest!r}?" in str(info.value)
    with pytest.raises(h.UnknownHeaderError):  # also next to a valid control header
        classify((h.DELAY_MS, b"5"), (name, b"1000"))


@pytest.mark.parametrize("name", ["kdelay-other", "kdelay", "KDELAY_", "kdelay-x"])
def test_a_name_like_no_header_lists_the_valid_ones(name: str) -> None:
    with pytest.raises(h.UnknownHeaderError, match="kdelay's headers are kdelay-cancel, "):
        classify((name, b"x"))


@pytest.mark.parametrize("name", ["KDELAY_REPEAT", "kdelay-repeats"])
def test_a_look_alike_of_repeat_is_rejected_naming_it(name: str) -> None:
    with pytest.raises(h.UnknownHeaderError, match="did you mean 'kdelay-repeat'"):
        classify((h.DELAY_MS, b"5"), (name, b"R5/PT1S"))


@pytest.mark.parametrize("name", sorted(h.DELIVERED_HEADERS))
def test_headers_kdelay_delivers_pass_through(name: str) -> None:
    assert classify((name, b"x")) is None
    assert classify((name, b"x"), (h.DELAY_MS, b"5")) == h.Delay(NOW + 5, None, 5)


@pytest.mark.parametrize(
    ("name", "inside"),
    [
        ("kdelay-delay-ms", True),
        ("KDELAY_ID", True),
        ("kDeLaY-x", True),
        ("kdelay", True),
        ("kdelayed", False),
        ("x-kdelay-id", False),
        ("kdela", False),
        ("", False),
    ],
)
def test_the_namespace(name: str, inside: bool) -> None:
    assert h.in_namespace(name) is inside


_names = st.builds(
    lambda head, sep, tail: head + sep + tail,
    st.sampled_from(["kdelay", "KDELAY", "kDelay", "kdela", "x-kdelay", ""]),
    st.sampled_from(["", "-", "_", "x"]),
    st.sampled_from(["", "delay-ms", "DELAY_MS", "id", "repeat", "error", "other"]) | st.text(),
)


@given(_names)
def test_every_name_in_the_namespace_is_known_or_rejected(name: str) -> None:
    headers = [(h.DELAY_MS, b"5"), (name, b"x")]
    known = name in h.KNOWN_HEADERS and name not in h.RESERVED_HEADERS
    if h.in_namespace(name) and not known:
        with pytest.raises(h.UnknownHeaderError) as info:
            h.classify(headers, NOW, POLICY)
        assert info.value.header == name
    elif name not in h.CONTROL_HEADERS:
        assert h.classify(headers, NOW, POLICY) == h.Delay(NOW + 5, None, 5)


# -- epoch seconds for milliseconds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"1763900000", "looks like epoch seconds; send milliseconds (1763900000000)"),
        (b"1", "is 1970-01-01T00:00:00.001+00:00, before 2001"),
        (b"978307199999", "before 2001"),
        (b"1763900000000000", "looks like epoch microseconds or nanoseconds"),
        (b"1763900000000000000", "looks like epoch microseconds or nanoseconds"),
    ],
)
def test_deliver_at_in_the_wrong_unit_is_rejected_saying_so(raw: bytes, said: str) -> None:
    with pytest.raises(InvalidHeaderError) as info:
        classify((h.DELIVER_AT, raw))
    assert info.value.header == h.DELIVER_AT
    assert said in str(info.value)


def test_deliver_at_from_2001_is_milliseconds_and_rfc3339_before_is_due_now() -> None:
    first = h.EARLIEST_DELIVER_AT_MS
    assert classify((h.DELIVER_AT, str(first).encode())) == h.Delay(first, None)
    assert classify((h.DELIVER_AT, b"1999-12-31T23:59:59Z")) == h.Delay(946_684_799_000, None)
