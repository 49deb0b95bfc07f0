"""The streaming verifier's cancel bookkeeping, by its own reading of the contract
(``verifier.cancel_contract``), and the replicas' rule (``kdelay.buffer.cancels``) in the same
cases: a cancel cancels what it follows, and what was sent with it."""

from __future__ import annotations

from kdelay import buffer
from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import CANCEL_WINDOW_MS as WINDOW
from kdelay.verifier.stream import CancelRegistry

T = 1_800_000_000_000
#: An older proxy's bulk cancel id (one record per shard): it applies to every partition.
OLD_BULK = "bulk.00ff"


def test_a_cancel_applies_to_schedules_before_it_in_its_partition() -> None:
    registry = CancelRegistry()
    registry.add(
        [("a", 0, 10, T, None, None), ("a", 0, 30, T, None, None), ("b", 1, 5, T, None, None)]
    )
    registry.add(
        [("a", 0, 20, T, None, None), ("a", 0, 30, T, None, None)]
    )  # the bounded read and the stream overlap
    schedules = [
        ("a", 0, 25, T, None, "t", None, None),  # followed by the cancel at 30
        (
            "a",
            0,
            40,
            T,
            None,
            "t",
            None,
            None,
        ),  # after every cancel, no acceptance time: a new message
        ("a", 1, 1, T, None, "t", None, None),  # another partition: not this cancel's
        ("b", 1, 5, T, None, "t", None, None),  # the cancel itself is not a schedule it follows
        ("c", 0, 0, T, None, "t", None, None),
    ]
    assert registry.cancelled(schedules) == [("a", 0, 25)]


def test_a_cancel_also_applies_to_a_schedule_sent_with_it_but_appended_after_it() -> None:
    registry = CancelRegistry()
    registry.add([("x", 2, 7, T, None, None)])
    schedules = [
        ("x", 2, 8, T + 3, T + WITH, "t", None, None),  # accepted within the window: sent with it
        ("x", 2, 9, T + 3, T + WITH + 1, "t", None, None),  # accepted after: a new message
        ("x", 2, 10, T + WINDOW + 1, T, "t", None, None),  # appended beyond the window
        ("x", 2, 11, T + WINDOW, T, "t", None, None),  # at the window's edge
        ("x", 3, 12, T + 3, T, "t", None, None),  # another partition
    ]
    assert registry.cancelled(schedules) == [("x", 2, 8), ("x", 2, 11)]


def test_a_bulk_cancel_applies_to_its_prefix_on_its_topic_sent_before_it() -> None:
    """The streaming job's bulk cancels (the batch job's bulk_cancelled_positions, and
    delay_service/store/bulk_cancels.py's rule, owners aside)."""
    registry = CancelRegistry()
    registry.add([], [("cust-42-", "orders", T, OLD_BULK, 0), ("all-", None, T, OLD_BULK, 0)])
    schedules = [
        ("cust-42-1", 0, 1, T - 5, T - 5, "orders", None, None),  # before it, on its topic
        ("cust-42-2", 1, 9, T + 3, T + WITH, "orders", None, None),  # appended after, sent with it
        (
            "cust-42-3",
            1,
            10,
            T + 3,
            T + WITH + 1,
            "orders",
            None,
            None,
        ),  # accepted after: a new message
        ("cust-42-4", 0, 2, T - 5, T - 5, "audit", None, None),  # another topic
        ("cust-43-1", 0, 3, T - 5, T - 5, "orders", None, None),  # another prefix
        (
            "cust-42-5",
            0,
            4,
            T - 5,
            None,
            "orders",
            None,
            None,
        ),  # no acceptance time, appended before
        (
            "cust-42-6",
            0,
            5,
            T + 1,
            None,
            "orders",
            None,
            None,
        ),  # no acceptance time, appended after
        ("cust-42-7", 0, 6, T + WINDOW + 1, T, "orders", None, None),  # beyond the window
        ("all-1", 2, 1, T - 5, T - 5, "audit", None, None),  # no topic named: every topic
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


def test_a_bulk_copy_decides_only_the_messages_of_its_own_buffer_partition() -> None:
    """A bulk cancel is one copy per buffer partition (``bulk.p<N>.<hex>``): partition 1's copy,
    appended at T, keeps a message of partition 1 accepted 5 s after it, though partition 0's
    copy comes later; an older ``bulk.<hex>`` applies to every partition."""
    copies = "bulk.p2." + "ab" * 16
    registry = CancelRegistry()
    registry.add(
        [],
        [
            ("cust-", None, T, copies, 1),
            ("cust-", None, T + 10_000, copies, 0),
            ("old-", None, T + 10_000, OLD_BULK, 0),
        ],
    )
    schedules = [
        ("cust-1", 1, 1, T + 5_000, T + 5_000, "orders", None, None),  # after its copy: kept
        ("cust-0", 0, 0, T + 5_000, T + 5_000, "orders", None, None),  # before its copy
        ("old-1", 1, 2, T + 5_000, T + 5_000, "orders", None, None),  # an older id: any partition
    ]
    assert registry.cancelled(schedules) == [("cust-0", 0, 0), ("old-1", 1, 2)]


def stamp(sequence: int, producer: int = 7) -> str:
    """A producer-sequence stamp (route field ``q``) of producer ``producer``, epoch 0, to
    orders/3."""
    return buffer.producer_seq(producer, 0, "orders", 3, sequence)


def test_one_producers_sequence_orders_a_message_and_its_cancel() -> None:
    """A message and a cancel of one idempotent producer to one topic-partition: the message
    sent after the cancel (higher sequence) but appended before it is kept; the one sent before
    it (lower sequence) but appended a minute after it, long past the 100 ms, is cancelled."""
    cancels = [
        ("after", 2, 1, T, None, stamp(100)),
        ("before", 2, 2, T, None, stamp(200)),
        ("other", 2, 4, T, None, stamp(300, producer=8)),  # another producer's
        ("far", 2, 6, T, None, stamp(400)),
        ("wrap", 2, 8, T, None, stamp(5)),
    ]
    schedules = [
        ("after", 2, 0, T - 1, T - 1, "orders", None, stamp(101)),
        ("before", 2, 3, T + 60_000, T + 60_000, "orders", None, stamp(199)),
        ("other", 2, 5, T + 60_000, T + 60_000, "orders", None, stamp(299)),  # 2: a new message
        ("far", 2, 7, T + WINDOW + 1, T, "orders", None, stamp(399)),  # beyond the window
        ("wrap", 2, 9, T + 60_000, T + 60_000, "orders", None, stamp(2**31 - 2)),  # wrapped
    ]
    registry = CancelRegistry()
    registry.add(cancels)
    assert registry.cancelled(schedules) == [("before", 2, 3), ("wrap", 2, 9)]
    replicas = [
        buffer.cancels(c_off, c_ms, off, ts, acc, order=buffer.produced_before(c_q, q))
        for (_, _, c_off, c_ms, _, c_q), (_, _, off, ts, acc, _, _, q) in zip(
            cancels, schedules, strict=True
        )
    ]
    assert replicas == [False, True, False, False, True]  # the replicas' rule agrees
