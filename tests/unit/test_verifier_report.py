"""The verifier's arithmetic: percentiles, outcome classification, SLOs (no Spark)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.stats import percentile
from kdelay.verifier.report import (
    Lateness,
    Outcome,
    Slo,
    Summary,
    breaches,
    summarise,
)

finite = st.floats(min_value=-1e7, max_value=1e7, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=200), st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]))
def test_percentile_is_numpys_default_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)), abs=1e-6)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([10.0, 20.0, 30.0, 40.0], 0.5) == 25.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 100.0], 0.95) == pytest.approx(80.8)
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) == 0.0


def test_percentile_rejects_a_quantile_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 1.5)


def test_each_injected_fault_is_counted_once() -> None:
    outcomes = [
        Outcome("ok-1", 1_000, (1_010,)),
        Outcome("ok-2", 2_000, (2_030,)),
        Outcome("dup", 3_000, (3_005, 3_500)),  # one duplicate; lateness from the first
        Outcome("early", 4_000, (3_900,)),  # an early delivery: negative lateness
        Outcome("lost", 5_000),  # due long ago: missing
        Outcome("cancelled", 6_000, cancelled=True),  # neither scheduled nor missing
        Outcome("late-cancel", 7_000, (7_001,), cancelled=True),  # delivered anyway
        Outcome("future", 99_000),  # not due yet: pending
    ]
    s = summarise(outcomes, end_ms=50_000, grace_ms=1_000)
    assert (s.scheduled, s.delivered, s.missing, s.duplicates, s.early) == (6, 5, 1, 1, 1)
    assert (s.pending, s.cancelled) == (1, 1)
    lateness = [10.0, 30.0, 5.0, -100.0, 1.0]
    assert s.lateness == Lateness(
        float(np.percentile(lateness, 50)),
        float(np.percentile(lateness, 95)),
        float(np.percentile(lateness, 99)),
        30.0,
    )


def test_grace_decides_missing_against_the_end_of_input() -> None:
    undelivered = [Outcome("a", 10_000)]
    assert summarise(undelivered, end_ms=10_999, grace_ms=1_000).pending == 1
    assert summarise(undelivered, end_ms=11_001, grace_ms=1_000).missing == 1
    # Streaming rows are settled by the watermark: no end instant.
    assert summarise(undelivered, end_ms=None, grace_ms=1_000).missing == 1


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10_000),
            st.lists(st.integers(-500, 20_000), max_size=3),
            st.booleans(),
        ),
        max_size=60,
    ),
    st.integers(0, 30_000),
)
def test_scheduled_is_always_delivered_plus_missing(
    raw: list[tuple[int, list[int], bool]], end_ms: int
) -> None:
    outcomes = [Outcome(f"m{i}", due, tuple(d), c) for i, (due, d, c) in enumerate(raw)]
    s = summarise(outcomes, end_ms=end_ms, grace_ms=100)
    assert s.scheduled == s.delivered + s.missing
    assert s.scheduled + s.pending + s.cancelled == len(outcomes)
    assert s.duplicates == sum(max(len(d) - 1, 0) for _, d, _ in raw)


def test_report_has_exactly_the_contract_keys() -> None:
    report = Summary(3, 2, 1, 0, 0, Lateness(1.0, 2.0, 3.0, 4.0), pending=5).report()
    assert report == {
        "scheduled": 3,
        "delivered": 2,
        "missing": 1,
        "duplicates": 0,
        "early": 0,
        "lateness_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0, "max": 4.0},
        "clock": "log-append-time",
    }
    assert all(isinstance(v, float) for v in report["lateness_ms"].values())


def test_a_reused_id_is_two_messages_and_a_delivery_of_no_message_counts_only_as_early() -> None:
    outcomes = [
        # One id, two due times: two messages, each delivered once (no duplicate).
        Outcome("reused", 1_000, (1_010,)),
        Outcome("reused", 9_000, (9_020,)),
        # Written straight to a target with a due time ahead, no schedule record: early only.
        Outcome("forged", 60_000, (2_000, 2_500), scheduled=False),
        Outcome("stray", 1_000, (1_500,), scheduled=False),  # on time, of no message: nothing
    ]
    s = summarise(outcomes, end_ms=50_000, grace_ms=1_000)
    assert (s.scheduled, s.delivered, s.missing, s.duplicates, s.early) == (2, 2, 0, 0, 2)
    assert s.lateness.max == 20.0
    assert s.clock == "log-append-time"


def test_the_clock_is_receipt_as_soon_as_one_delivery_was_timed_on_receipt() -> None:
    timed = [Outcome("a", 1_000, (1_010,)), Outcome("b", 1_000, (1_020,), receipt=True)]
    assert summarise(timed, end_ms=None, grace_ms=0).clock == "receipt"
    assert summarise(timed[:1], end_ms=None, grace_ms=0).clock == "log-append-time"
    # Nothing delivered: no delivery used receipt time.
    assert summarise([Outcome("c", 1_000, receipt=True)], end_ms=None, grace_ms=0).clock == (
        "log-append-time"
    )
    assert Summary.from_row({**_ROW, "delivered": 1, "receipt": True}).clock == "receipt"


_ROW = {
    "scheduled": 2,
    "delivered": 0,
    "missing": 2,
    "duplicates": None,
    "early": None,
    "p50": None,
    "p95": None,
    "p99": None,
    "max": None,
    "pending": 0,
    "cancelled": 1,
    "receipt": None,
}


def test_summary_from_an_aggregate_row_without_deliveries_has_zero_lateness() -> None:
    s = Summary.from_row(_ROW)
    assert (s.scheduled, s.missing, s.duplicates, s.cancelled) == (2, 2, 0, 1)
    assert s.lateness == Lateness(0.0, 0.0, 0.0, 0.0)


def test_slo_breaches_name_their_flag_and_met_slos_are_silent() -> None:
    s = Summary(10, 9, 1, 2, 3, Lateness(5.0, 50.0, 120.0, 200.0))
    assert breaches(s, Slo(max_p99_ms=120.0, max_early=3, max_missing=1, max_duplicates=2)) == []
    found = breaches(s, Slo(max_p99_ms=100.0, max_early=0, max_missing=0, max_duplicates=1))
    assert len(found) == 4
    for flag, text in zip(
        ("--max-p99-ms", "--max-early", "--max-missing", "--max-duplicates"), found, strict=True
    ):
        assert flag in text
    assert breaches(s, Slo()) == []
