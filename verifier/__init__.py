"""The Spark Structured Streaming verifier: lateness, early, duplicate and missing deliveries.

``kdelay verify`` (see :mod:`verifier.cli`). The definitions of every count are in
:mod:`verifier.report`; the Spark pipeline is :mod:`verifier.job` (the session and the
``--once`` driver), :mod:`verifier.matching` (deliveries to messages, cancels),
:mod:`verifier.aggregates` (summaries per window) and :mod:`verifier.stream` (the continuous
driver), all imported lazily: they pull in PySpark.
"""

from __future__ import annotations

from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.report import (
    Lateness,
    Outcome,
    Slo,
    Summary,
    WindowResult,
    breaches,
    summarise,
)

__all__ = [
    "Lateness",
    "Outcome",
    "Slo",
    "Summary",
    "VerifierConfig",
    "WindowResult",
    "breaches",
    "summarise",
]
