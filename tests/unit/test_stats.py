"""The one percentile definition (kdelay/stats.py): numpy's linear method, named, to the bit.

numpy is a test dependency only: the module is standard library, and these hold it to
``numpy.quantile(..., method=METHOD)`` exactly, and to ``statistics.quantiles``' inclusive
method (the same definition, computed in exact fractions) up to rounding.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.stats import METHOD, percentile

finite = st.floats(-1e15, 1e15, allow_nan=False) | st.integers(-(2**60), 2**60)


@given(st.lists(finite, min_size=1, max_size=100), st.floats(0.0, 1.0))
def test_is_numpys_quantile_with_the_named_method_exactly(values: list[float], q: float) -> None:
    # What kdelay/stats.py computed with numpy, ints converted to floats first.
    expected = float(np.quantile(np.asarray(values, dtype=float), q, method=METHOD))
    assert percentile(values, q) == expected


@given(
    st.lists(st.floats(-1e7, 1e7, allow_nan=False), min_size=1, max_size=100),
    st.floats(0.0, 1.0),
)
def test_is_numpys_percentile_with_the_named_method(values: list[float], q: float) -> None:
    expected = float(np.percentile(values, q * 100, method=METHOD))
    assert percentile(values, q) == pytest.approx(expected, abs=1e-6)


@given(st.lists(st.floats(-1e7, 1e7, allow_nan=False), min_size=2, max_size=100), st.data())
def test_is_the_standard_librarys_inclusive_quantiles(
    values: list[float], data: st.DataObject
) -> None:
    n = data.draw(st.integers(2, 100))
    cuts = statistics.quantiles(values, n=n, method="inclusive")
    for i, cut in enumerate(cuts, start=1):
        assert percentile(values, i / n) == pytest.approx(cut, rel=1e-9, abs=1e-6)


def test_one_value_is_every_quantile() -> None:
    assert [percentile([7.0], q) for q in (0.0, 0.5, 1.0)] == [7.0, 7.0, 7.0]


def test_a_nan_gives_nan_as_numpy_does() -> None:
    assert math.isnan(percentile([1.0, math.nan, 3.0], 0.5))
    assert math.isnan(float(np.quantile([1.0, math.nan, 3.0], 0.5, method=METHOD)))


def test_an_empty_set_gives_the_callers_choice() -> None:
    assert percentile([], 0.99) == 0.0
    assert math.isnan(percentile([], 0.99, empty=math.nan))


def test_a_quantile_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], -0.1)
