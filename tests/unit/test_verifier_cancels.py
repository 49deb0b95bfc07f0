"""The streaming verifier's cancel bookkeeping, by its own reading of the contract
(``verifier.cancel_contract``), and the replicas' rule (``kdelay.buffer.cancels``) in the same
cases: a cancel cancels what it follows, and what was sent with it."""

from __future__ import annotations

from kdelay import buffer
from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import CANCEL_WINDOW_MS as WINDOW
from kdelay.verifier.stream import CancelRegistry

T = 1_800_000_000_000


def test_a_cancel_applies_to_schedules_before_it_in_its_partition() -> None:
    registry = CancelRegistry()
    registry.add([("a", 0, 10, T, None), ("a", 0, 30, T, None), ("b", 1, 5, T, None)])
    registry.add(
        [("a", 0, 20, T, None), ("a", 0, 30, T, None)]
    )  # the bounded read and the stream overlap
    schedules = [
        ("a", 0, 25, T, None, "t", None),  # followed by the cancel at 30
        ("a", 0, 40, T, None, "t", None),  # after every cancel, no acceptance time: a new message
        ("a", 1, 1, T, None, "t", None),  # another partition: not this cancel's
        ("b", 1, 5, T, None, "t", None),  # the cancel itself is not a schedule it follows
        ("c", 0, 0, T, None, "t", None),
    ]
    assert registry.cancelled(schedules) == [("a", 0, 25)]


def test_a_cancel_also_applies_to_a_schedule_sent_with_it_but_appended_after_it() -> None:
    registry = CancelRegistry()
    registry.add([("x", 2, 7, T, None)])
    schedules = [
        ("x", 2, 8, T + 3, T + WITH, "t", None),  # accepted within the window: sent with it
        ("x", 2, 9, T + 3, T + WITH + 1, "t", None),  # accepted after: a new message
        ("x", 2, 10, T + WINDOW + 1, T, "t", None),  # appended beyond the window
        ("x", 2, 11, T + WINDOW, T, "t", None),  # at the window's edge
        ("x", 3, 12, T + 3, T, "t", None),  # another partition
    ]
    assert registry.cancelled(schedules) == [("x", 2, 8), ("x", 2, 11)]


def test_a_bulk_cancel_applies_to_its_prefix_on_its_topic_sent_before_it() -> None:
    """The streaming job's bulk cancels (the batch job's bulk_cancelled_positions, and
    delay_service/store/bulk_cancels.py's rule, owners aside)."""
    registry = CancelRegistry()
    registry.add([], [("cust-42-", "orders", T), ("all-", None, T)])
    schedules = [
        ("cust-42-1", 0, 1, T - 5, T - 5, "orders", None),  # before it, on its topic
        ("cust-42-2", 1, 9, T + 3, T + WITH, "orders", None),  # appended after, sent with it
        ("cust-42-3", 1, 10, T + 3, T + WITH + 1, "orders", None),  # accepted after: a new message
        ("cust-42-4", 0, 2, T - 5, T - 5, "audit", None),  # another topic
        ("cust-43-1", 0, 3, T - 5, T - 5, "orders", None),  # another prefix
        ("cust-42-5", 0, 4, T - 5, None, "orders", None),  # no acceptance time, appended before
        ("cust-42-6", 0, 5, T + 1, None, "orders", None),  # no acceptance time, appended after
        ("cust-42-7", 0, 6, T + WINDOW + 1, T, "orders", None),  # beyond the window
        ("all-1", 2, 1, T - 5, T - 5, "audit", None),  # no topic named: every topic
    ]
    assert registry.cancelled(schedules) == [
        ("cust-42-1", 0, 1),
        ("cust-42-2", 1, 9),
        ("cust-42-5", 0, 4),
        ("all-1", 2, 1),
    ]


def test_the_shared_rule_in_each_case() -> None:
    assert buffer.cancels(10, None, 9, None, None)  # before it: whatever the times
    assert not buffer.cancels(10, T, 10, T, T)  # itself
    assert buffer.cancels(10, T, 11, T + 1, T + WITH)  # sent with it
    assert not buffer.cancels(10, T, 11, T + 1, T + WITH + 1)  # a new message
    assert not buffer.cancels(10, None, 11, T + 1, T)  # a cancel of unknown time: rule 1 only
    assert not buffer.cancels(10, T, 11, T + 1, None)  # a schedule no proxy stamped
    assert buffer.cancels(10, T, 11, None, T)  # an in-process record without a time
    assert not buffer.cancels(10, T, 11, T + WINDOW + 1, T)
    assert buffer.accepted_ms((T << buffer.ORDER_SHIFT) | 5) == T
    assert buffer.accepted_ms(4) is None
