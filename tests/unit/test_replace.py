"""Replace by id (``kdelay-replace: true``): the header, its buffer record, and
what a replica's store does with it (delay_service/store/writes.py): the replace cancels what
its id has pending (by the cancel rule), whatever else is in flight, and is pending itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.store.store import Store
from kdelay.errors import InvalidHeaderError
from kdelay.headers import Delay, DelayPolicy

T0 = 1_700_000_000_000


def sched(msg_id: str, uid: str, accepted: int, *, replace: bool = False) -> Scheduled:
    return Scheduled(
        msg_id, "t", 0, None, uid.encode(), T0 + 60_000, uid=uid, seq=accepted << 20,
        replace=replace,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[str]:
    return sorted(e.message.uid for e in store.due(2**62, 1000))


def test_the_header_asks_for_a_replace_and_needs_an_id() -> None:
    policy = DelayPolicy()
    asked = h.classify([(h.DELAY_MS, b"10"), (h.ID, b"x"), (h.REPLACE, b"true")], T0, policy)
    assert asked == Delay(T0 + 10, "x", 10, replace=True)
    plain = h.classify([(h.DELAY_MS, b"10"), (h.ID, b"x"), (h.REPLACE, b"False")], T0, policy)
    assert plain == Delay(T0 + 10, "x", 10)
    with pytest.raises(InvalidHeaderError, match=r"kdelay-replace.*'kdelay-id' is missing"):
        h.classify([(h.DELAY_MS, b"10"), (h.REPLACE, b"true")], T0, policy)
    with pytest.raises(InvalidHeaderError, match=r"kdelay-replace.*'yes' is not true or false"):
        h.classify([(h.DELAY_MS, b"10"), (h.ID, b"x"), (h.REPLACE, b"yes")], T0, policy)
    with pytest.raises(InvalidHeaderError, match=r"kdelay-cancel.*cannot be combined"):
        h.classify([(h.CANCEL, b"x"), (h.REPLACE, b"true")], T0, policy)
    assert h.REPLACE not in dict(h.strip_control([(h.REPLACE, b"true"), ("own", b"1")]))


def test_the_buffer_record_carries_the_replace_and_its_next_occurrence_does_not() -> None:
    record = dataclasses.replace(sched("x", "r1", T0, replace=True), repeat="R3/PT1S")
    enc = buffer.encode(record)
    decoded = buffer.decode(enc.key, enc.value, enc.headers)
    assert isinstance(decoded, Scheduled)
    assert decoded.replace
    assert not decoded.next_occurrence(T0 + 61_000, record.seq).replace
    plain = buffer.encode(sched("x", "s1", T0))
    assert b'"rx"' not in (
        dict(plain.headers)[buffer.ROUTE_HEADER] or b""
    )  # unchanged for the others


def test_a_replace_replaces_every_pending_message_with_its_id(store: Store) -> None:
    store.apply([(0, 0, sched("x", "s1", T0 - 9), T0 - 8), (0, 1, sched("x", "s2", T0 - 7), T0)],
                {0: 2})  # fmt: skip
    store.apply([(0, 2, sched("y", "y1", T0 - 5), T0 - 4)], {0: 3})
    result = store.apply([(0, 3, sched("x", "r1", T0 + 5_000, replace=True), T0 + 5_001)], {0: 4})
    assert (result.scheduled, result.replaced) == (1, 2)
    assert sorted(r.uid for r in result.retired) == ["s1", "s2"]  # their tombstones are owed
    assert pending(store) == ["r1", "y1"]


def test_with_nothing_pending_a_replace_schedules(store: Store) -> None:
    result = store.apply([(0, 0, sched("x", "r1", T0, replace=True), T0 + 1)], {0: 1})
    assert (result.scheduled, result.replaced, result.retired) == (1, 0, [])
    assert pending(store) == ["r1"]


def test_a_message_sent_before_the_replace_but_appended_after_it_is_replaced_too(
    store: Store,
) -> None:
    store.apply([(0, 0, sched("x", "r1", T0, replace=True), T0 + 2)], {0: 1})
    late = store.apply([(0, 1, sched("x", "s0", T0 - 1), T0 + 3)], {0: 2})  # accepted before
    assert late.cancelled_on_arrival == 1
    assert pending(store) == ["r1"]


def test_among_replaces_in_flight_together_the_last_in_the_buffer_wins(store: Store) -> None:
    """Two replaces sent one right after the other (the second within the first's window):
    the buffer's order decides, which is the order they were sent in through one connection."""
    store.apply([(0, 0, sched("x", "s1", T0 - 50), T0 - 40)], {0: 1})
    store.apply([(0, 1, sched("x", "r1", T0 - 1, replace=True), T0)], {0: 2})
    result = store.apply([(0, 2, sched("x", "r2", T0 + 2, replace=True), T0 + 3)], {0: 3})
    assert (result.scheduled, result.cancelled_on_arrival, result.replaced) == (1, 0, 1)
    assert pending(store) == ["r2"]


def test_a_replace_sent_with_a_cancel_but_appended_after_it_is_cancelled(store: Store) -> None:
    store.apply([(0, 0, Cancel("x", "c1"), T0)], {0: 1})
    result = store.apply([(0, 1, sched("x", "r1", T0 + 1, replace=True), T0 + 2)], {0: 2})
    assert (result.scheduled, result.cancelled_on_arrival, result.replaced) == (0, 1, 0)
    assert pending(store) == []


def test_a_replace_written_twice_is_kept_once_and_does_not_replace_itself(store: Store) -> None:
    store.apply([(0, 0, sched("x", "r1", T0, replace=True), T0 + 1)], {0: 1})
    again = store.apply([(0, 1, sched("x", "r1", T0, replace=True), T0 + 2)], {0: 2})
    assert (again.duplicates, again.retired) == (1, [])
    assert pending(store) == ["r1"]


def test_a_cancel_after_a_replace_cancels_it_and_a_message_after_that_is_new(
    store: Store,
) -> None:
    store.apply([(0, 0, sched("x", "r1", T0, replace=True), T0 + 1)], {0: 1})
    store.apply([(0, 1, Cancel("x", "c1"), T0 + 10)], {0: 2})
    assert pending(store) == []
    after_ack = T0 + 10 + buffer.CANCEL_SENT_WITH_MS + 1
    store.apply([(0, 2, sched("x", "s9", after_ack), after_ack + 1)], {0: 3})
    assert pending(store) == ["s9"]
