"""Percentiles, defined once for every report kdelay prints.

numpy's ``linear`` method: linear interpolation between closest ranks (Hyndman & Fan type 7,
numpy's default). Spark's exact ``percentile``, which the verifier's job uses, computes the same,
so the verifier's Spark output, its executable specification (:mod:`verifier.report`) and the
benchmarks agree on what "p99" means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

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
    return float(np.quantile(np.asarray(values, dtype=float), q, method=METHOD))
