"""The one percentile definition (kdelay/stats.py): numpy's linear method, named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.stats import METHOD, percentile


@given(
    st.lists(st.floats(-1e7, 1e7, allow_nan=False), min_size=1, max_size=100),
    st.floats(0.0, 1.0),
)
def test_is_numpys_percentile_with_the_named_method(values: list[float], q: float) -> None:
    expected = float(np.percentile(values, q * 100, method=METHOD))
    assert percentile(values, q) == pytest.approx(expected, abs=1e-6)


def test_an_empty_set_gives_the_callers_choice() -> None:
    assert percentile([], 0.99) == 0.0
    assert math.isnan(percentile([], 0.99, empty=math.nan))
