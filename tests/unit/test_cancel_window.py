"""Cancels win whatever the arrival order (delay_service/store/cancels.py): a cancel read before its
message, in one buffer partition, still cancels it; within its window and bounds only, the same
way on every replica and across restarts; and every cancel gets its tombstone."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import Cancel, Scheduled, Tombstone
from kdelay.delay_service.store import cancels
from kdelay.delay_service.store.cancels import WINDOW_MS, accepted_ms
from kdelay.delay_service.store.store import Incoming, Store
from kdelay.delay_service.store.tombstones import Retired

T0 = 1_700_000_000_000  # the cancel's append time in most tests


def order(accepted: int, counter: int = 0) -> int:
    """The order field a proxy gives a record it accepted at ``accepted``
    (proxy/routing/buffer_keys.py)."""
    return accepted << 20 | counter


def sched(msg_id: str, uid: str, accepted: int | None, due: int = T0 + 60_000) -> Scheduled:
    seq = 0 if accepted is None else order(accepted)
    return Scheduled(msg_id, "t", 0, None, b"v", due, uid=uid, seq=seq)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[str]:
    return sorted(e.message.uid for e in store.due(2**62, 1000))


def test_the_acceptance_time_is_the_order_fields_millisecond() -> None:
    assert accepted_ms(sched("x", "a", T0)) == T0
    assert accepted_ms(dataclasses.replace(sched("x", "a", T0), seq=order(T0, 5))) == T0
    assert accepted_ms(sched("x", "a", None)) is None  # format 1, or not written by a router
    assert accepted_ms(dataclasses.replace(sched("x", "a", None), seq=4)) is None


def test_a_cancel_appended_before_its_message_in_one_batch_cancels_it(store: Store) -> None:
    # The README's example: message and cancel in one request, the cancel's partition first.
    result = store.apply(
        [(0, 0, Cancel("x", "c1"), T0), (0, 1, sched("x", "s1", T0 - 1), T0)], {0: 2}
    )
    assert (result.scheduled, result.cancelled, result.cancelled_on_arrival) == (0, 1, 1)
    assert [r[:4] for r in result.retired] == [
        ("x", "s1", 0, 1)
    ]  # the schedule's tombstone, at once
    assert pending(store) == []
    assert store.get("x") is None


def test_a_cancel_wins_over_a_message_read_in_a_later_batch_and_one_sent_with_it(
    store: Store,
) -> None:
    store.apply([(3, 10, Cancel("x", "c1"), T0)], {3: 11})
    assert store.open_cancels == 1
    # Accepted within the window after the cancel's append (on the broker's clock), and
    # appended seconds later (a retry inside the proxy's upstream producer).
    late = dataclasses.replace(sched("x", "s1", T0 + WITH), partition=3)
    result = store.apply([(3, 11, late, T0 + 20_000)], {3: 12})
    assert result.cancelled_on_arrival == 1
    assert pending(store) == []


def test_a_message_sent_after_the_cancel_is_a_new_message(store: Store) -> None:
    """Ids are reusable: a schedule accepted after the cancel's window (as one sent after the
    cancel's acknowledgement always is) is a reschedule, pending, and a later cancel cancels it
    as usual."""
    store.apply([(0, 0, sched("x", "s1", T0 - 5), T0 - 3)], {0: 1})
    store.apply([(0, 1, Cancel("x", "c1"), T0)], {0: 2})
    again = sched("x", "s2", T0 + WITH + 1)
    result = store.apply([(0, 2, again, T0 + WITH + 2)], {0: 3})
    assert (result.scheduled, result.cancelled_on_arrival) == (1, 0)
    assert pending(store) == ["s2"]
    store.apply([(0, 3, Cancel("x", "c2"), T0 + 5_000)], {0: 4})
    assert pending(store) == []


def test_the_window_is_counted_in_append_time(store: Store) -> None:
    store.apply([(0, 0, Cancel("x", "c1"), T0), (0, 1, Cancel("y", "c2"), T0)], {0: 2})
    # Accepted before the cancel, appended exactly at the end of the window: cancelled.
    at_end = store.apply([(0, 2, sched("x", "s1", T0 - 1), T0 + WINDOW_MS)], {0: 3})
    assert at_end.cancelled_on_arrival == 1
    # One millisecond beyond it: a new message, however early it was accepted.
    beyond = store.apply([(0, 3, sched("y", "s2", T0 - 1), T0 + WINDOW_MS + 1)], {0: 4})
    assert (beyond.scheduled, beyond.cancelled_on_arrival) == (1, 0)
    assert pending(store) == ["s2"]
    assert store.open_cancels == 0  # that record closed both windows


def test_a_schedule_without_acceptance_time_is_cancelled_only_if_it_came_first(
    store: Store,
) -> None:
    store.apply([(0, 0, Cancel("x", "c1"), T0), (0, 1, sched("x", "s1", None), T0)], {0: 2})
    assert pending(store) == ["s1"]


def test_records_of_other_partitions_neither_match_nor_close(store: Store) -> None:
    store.apply([(0, 0, Cancel("x", "c1"), T0)], {0: 1})
    other = dataclasses.replace(sched("x", "s1", T0 - 1), partition=1)
    result = store.apply([(1, 0, other, T0 + 1)], {1: 1})  # ids live in one partition
    assert result.cancelled_on_arrival == 0
    store.apply([(1, 1, Cancel("z", "c2"), T0 + 10 * WINDOW_MS)], {1: 2})
    assert store.open_cancels == 2
    result = store.apply([(0, 1, sched("x", "s2", T0 - 1), T0 + 2)], {0: 2})
    assert result.cancelled_on_arrival == 1


def test_an_unmatched_cancel_gets_its_tombstone_when_its_window_closes(store: Store) -> None:
    result = store.apply([(0, 0, Cancel("nobody", "c1"), T0)], {0: 1})
    assert (result.cancelled, result.retired) == (0, [])
    # Any later record of the partition ends the window, a tombstone as well as a schedule.
    quiet = store.apply([(0, 1, Tombstone("other", 9, "o1"), T0 + WINDOW_MS)], {0: 2})
    assert [r[:4] for r in quiet.retired] == []
    closing = store.apply([(0, 2, Tombstone("other", 9, "o1"), T0 + WINDOW_MS + 1)], {0: 3})
    assert [r[:4] for r in closing.retired] == [("nobody", "c1", 0, 0)]
    assert store.open_cancels == 0


def test_an_unmatched_cancel_owes_again_what_it_cancelled_then_itself(store: Store) -> None:
    """So the compacted topic never drops it before a message it cancelled on arrival, even
    when a master crashed before producing that message's first tombstone."""
    assert store.apply([(0, 0, Cancel("x", "c1"), T0)], {0: 1}).retired == []
    late = store.apply([(0, 1, sched("x", "s1", T0 - 1), T0 + 1)], {0: 2})
    assert [r[:4] for r in late.retired] == [("x", "s1", 0, 1)]
    closing = store.apply([(0, 2, None, T0 + WINDOW_MS + 1)], {0: 3})
    assert [r[:4] for r in closing.retired] == [("x", "s1", 0, 1), ("x", "c1", 0, 0)]
    assert closing.invalid == 1


def test_a_cancel_that_removed_a_message_is_retired_with_it_and_stays_open(
    store: Store,
) -> None:
    store.apply([(0, 0, sched("x", "s1", T0 - 9), T0 - 8)], {0: 1})
    first = store.apply([(0, 1, Cancel("x", "c1"), T0)], {0: 2})
    assert [r[:4] for r in first.retired] == [
        ("x", "s1", 0, 0),
        ("x", "c1", 0, 1),
    ]  # as before: together
    # A second message with that id, sent with the cancel, arriving after it: cancelled too.
    late = store.apply([(0, 2, sched("x", "s2", T0 - 1), T0 + 1)], {0: 3})
    assert [r[:4] for r in late.retired] == [("x", "s2", 0, 2)]
    closing = store.apply([(0, 3, None, T0 + WINDOW_MS + 1)], {0: 4})
    assert [r[:4] for r in closing.retired] == [("x", "s2", 0, 2)]


def test_open_cancels_survive_a_restart(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    s.apply([(0, 0, Cancel("y", "c0"), T0 - 5), (0, 1, sched("y", "s0", T0 - 9), T0 - 4)], {})
    s.apply([(0, 2, Cancel("x", "c1"), T0), (1, 0, Cancel("z", "c2"), T0)], {0: 3, 1: 1})
    s.close()
    s = Store(tmp_path / "db")
    try:
        assert s.open_cancels == 3
        result = s.apply([(0, 3, sched("x", "s1", T0 - 1), T0 + 2)], {0: 4})
        assert result.cancelled_on_arrival == 1
        assert pending(s) == []
        closing = s.apply([(0, 4, None, T0 + WINDOW_MS + 1)], {0: 5})
        assert [r[:4] for r in closing.retired] == [
            ("y", "s0", 0, 1),
            ("y", "c0", 0, 0),
            ("x", "s1", 0, 3),
            ("x", "c1", 0, 2),
        ]
        assert s.open_cancels == 1  # partition 1's
    finally:
        s.close()


def test_at_most_max_open_cancels_per_partition(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cancels, "MAX_OPEN", 3)
    store.apply([(0, i, Cancel(f"x{i}", f"c{i}"), T0) for i in range(3)], {0: 3})
    store.apply([(1, 0, Cancel("y", "cy"), T0)], {1: 1})
    result = store.apply([(0, 3, Cancel("x3", "c3"), T0)], {0: 4})
    assert [r[:4] for r in result.retired] == [("x0", "c0", 0, 0)]  # the oldest closed
    assert store.open_cancels == 4  # three in partition 0, one in partition 1
    result = store.apply(
        [(0, 4, sched("x0", "s0", T0 - 1), T0), (0, 5, sched("x1", "s1", T0 - 1), T0)], {0: 6}
    )
    assert (result.scheduled, result.cancelled_on_arrival) == (1, 1)
    assert pending(store) == ["s0"]


def test_the_newest_cancel_of_an_id_decides(store: Store) -> None:
    store.apply([(0, 0, Cancel("x", "c1"), T0), (0, 1, Cancel("x", "c2"), T0 + 60_000)], {})
    # Too late for the first cancel's window, within the second's, accepted before it.
    result = store.apply([(0, 2, sched("x", "s1", T0 + 59_000), T0 + WINDOW_MS + 30_000)], {})
    assert result.cancelled_on_arrival == 1
    assert result.retired[0][:4] == ("x", "c1", 0, 0)  # the record closed the first window
    closing = store.apply([(0, 3, None, T0 + 60_000 + WINDOW_MS + 1)], {})
    assert [r[:4] for r in closing.retired] == [("x", "s1", 0, 2), ("x", "c2", 0, 1)]


# -- every replica decides the same ---------------------------------------------------------

kinds = st.sampled_from(["cancel", "sent-before", "sent-after", "no-order", "tombstone"])
events = st.lists(
    st.tuples(kinds, st.sampled_from("abc"), st.integers(0, WINDOW_MS // 2)), max_size=30
)


def stream(ops: Sequence[tuple[str, str, int]]) -> list[Incoming]:
    """One buffer partition's records; appended ``gap`` ms apart, so windows close too."""
    out: list[Incoming] = []
    now = T0
    for offset, (kind, msg_id, gap) in enumerate(ops):
        now += gap
        uid = f"u{offset}"
        if kind == "cancel":
            out.append((0, offset, Cancel(msg_id, uid), now))
        elif kind == "tombstone":
            out.append((0, offset, Tombstone(msg_id, offset - 1, f"u{offset - 1}"), now))
        else:
            accepted = {"sent-before": now - 3_000, "sent-after": now + 3_000}.get(kind)
            out.append((0, offset, sched(msg_id, uid, accepted), now))
    return out


def model(records: list[Incoming]) -> list[str]:
    """The rule as the README states it, on one partition: the buffer keys left pending."""
    pending: dict[str, str] = {}  # buffer key -> id
    seen: list[tuple[str, int]] = []  # (id, append time) of each cancel so far
    for item in records:
        record, now = item[2], item[3] if len(item) == 4 else None
        assert now is not None
        if isinstance(record, Cancel):
            pending = {uid: i for uid, i in pending.items() if i != record.id}
            seen.append((record.id, now))
        elif isinstance(record, Tombstone):
            if pending.get(record.uid) == record.id:
                del pending[record.uid]
        elif isinstance(record, Scheduled):
            accepted = accepted_ms(record)
            if accepted is None or not any(
                i == record.id and now - at <= WINDOW_MS and accepted <= at + WITH for i, at in seen
            ):
                pending[record.uid] = record.id
    return sorted(pending)


def decisions(
    path: Path, records: list[Incoming], cuts: Sequence[int], *, reopen: bool
) -> tuple[object, ...]:
    """Apply ``records`` in batches cut at ``cuts``, the store reopened between batches when
    ``reopen`` (a restart)."""
    bounds = [0, *sorted(set(cuts)), len(records)]
    retired: list[Retired] = []
    on_arrival = 0
    s = Store(path)
    try:
        for start, end in itertools.pairwise(bounds):
            if reopen:
                s.close()
                s = Store(path)
            result = s.apply(records[start:end], {0: end})
            retired += result.retired
            on_arrival += result.cancelled_on_arrival
        return pending(s), on_arrival, sorted(set(retired)), s.open_cancels
    finally:
        s.close()


@settings(max_examples=20, deadline=None)
@given(ops=events, cuts=st.lists(st.integers(0, 30), max_size=3))
def test_batches_and_restarts_do_not_change_a_decision(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, str, int]],
    cuts: list[int],
) -> None:
    records = stream(ops)
    cuts = [c for c in cuts if c <= len(records)]
    whole = decisions(tmp_path_factory.mktemp("whole"), records, [], reopen=False)
    assert whole[0] == model(records)
    restarted = decisions(tmp_path_factory.mktemp("cut"), records, cuts, reopen=True)
    assert restarted == whole
    each = decisions(tmp_path_factory.mktemp("each"), records, range(len(records)), reopen=False)
    assert each == whole
