"""One duration grammar (kdelay/durations.py) for ``kdelay send --delay`` and the verifier."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.durations import duration_ms


def _old_send_delay(text: str) -> int | None:
    """What ``kdelay send --delay`` accepted before the parsers were merged (None: refused;
    digits that ``str.isdigit`` took but ``int`` did not, like "²", crashed it)."""
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    t = text.strip().lower()
    try:
        for unit, factor in units.items():
            if t.endswith(unit) and t[: -len(unit)].isdigit():
                return int(t[: -len(unit)]) * factor
        return int(t) if t.isdigit() else None
    except ValueError:
        return None


def _old_verifier(text: str) -> int | None:
    """What the verifier's ``--window``/``--trigger`` accepted before (None: refused)."""
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
    match = re.match(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$", text)
    return None if match is None else int(match.group(1)) * units[match.group(2) or "ms"]


texts = st.from_regex(r"\A\s?[0-9]{1,6}\s?(ms|s|m|h|d|MS|S|M|H|D|x|sec)?\s?\Z") | st.text(
    max_size=8
)


@given(texts)
def test_everything_either_old_parser_accepted_means_the_same(text: str) -> None:
    for old in (_old_send_delay(text), _old_verifier(text)):
        if old is not None:
            assert duration_ms(text) == old


@pytest.mark.parametrize(
    ("text", "ms"),
    [("1500", 1500), ("500ms", 500), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000),
     ("1d", 86_400_000), (" 10 S ", 10_000)],
)  # fmt: skip
def test_units(text: str, ms: int) -> None:
    assert duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "ten seconds", "5parsecs", "-1s", "1.5s", "s"])
def test_what_is_not_a_duration_is_named(text: str) -> None:
    with pytest.raises(ValueError, match=rf"{re.escape(repr(text))} is not a duration"):
        duration_ms(text)
