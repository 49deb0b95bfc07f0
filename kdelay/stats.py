"""Percentiles, defined once for every report kdelay prints.

numpy's ``linear`` method: linear interpolation between closest ranks (Hyndman & Fan type 7,
numpy's default; the standard library's ``statistics.quantiles(method="inclusive")``). Spark's
exact ``percentile``, which the verifier's job uses, computes the same, so the verifier's Spark
output, its executable specification (:mod:`verifier.report`) and the benchmarks agree on what
"p99" means.

Standard library only: neither the proxy, the replicas nor the verifier needs numpy for it. The
arithmetic is numpy's own, step for step (``numpy.quantile``'s index, fraction and two-sided
interpolation), so a value equals ``numpy.quantile(values, q, method=METHOD)`` to the last bit
(a property test holds it to that); a set holding NaN gives NaN, as numpy's does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

#: numpy's name for the method (``numpy.quantile(..., method=METHOD)``).
METHOD: Final = "linear"
#: The method in words, for reports.
METHOD_DESCRIPTION = "linear interpolation between closest ranks (numpy default, type 7)"


def percentile(values: Sequence[float], q: float, *, empty: float = 0.0) -> float:
    """The ``q``-quantile (0 <= q <= 1) of ``values`` by :data:`METHOD`; ``empty`` if none.

    The verifier reports 0.0 for an empty set (CONTRACT.md); benchmarks pass ``nan``.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if len(values) == 0:
        return empty
    if any(map(math.isnan, values)):
        return math.nan
    # Sorted as given: float() is monotonic, so the ranks of the floats are these, converted.
    ordered = sorted(values)
    last = len(ordered) - 1
    position = last * q
    below = math.floor(position)
    if below >= last:
        return float(ordered[last])
    low, high = float(ordered[below]), float(ordered[below + 1])
    fraction = position - below
    # numpy's _lerp: from the nearer rank, so a fraction of 1 gives the higher rank exactly.
    if fraction >= 0.5:
        return high - (high - low) * (1 - fraction)
    return low + (high - low) * fraction
