"""A message and its cancel from one idempotent producer to one topic-partition (the cancel sent
to the message's topic with its key) are ordered by that producer's sequence numbers
(``kdelay.buffer.produced_before``, delay_service/store/cancels.py): the message produced before
the cancel is cancelled whatever order or request they reach the buffer in, and one produced
after it never is. Records without the stamp, or of another producer or partition, keep the
rule of offsets and acceptance times.

The store tests build their records from the buffer format itself (``kdelay.buffer.decode`` of
a route header with ``q``), as a replica reads them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from kdelay import buffer
from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import CANCEL_WINDOW_MS as WINDOW
from kdelay.buffer import Cancel, Scheduled, produced_before, producer_seq
from kdelay.delay_service.store.entry import decode_entry, encode_entry
from kdelay.delay_service.store.store import Store
from kdelay.headers import CANCEL, DELAY_MS, ID, DelayPolicy
from kdelay.proxy.routing.buffer_keys import Origin
from kdelay.proxy.routing.route import Incoming, route

T0 = 1_700_000_000_000  # the cancel's append time
PID, EPOCH, TOPIC, PART = 7, 0, "orders", 3


def q(seq: int, *, pid: int = PID, epoch: int = EPOCH, part: int = PART) -> str:
    return f"{pid}/{epoch}/{part}/{seq}/{TOPIC}"


def _decode(uid: str, fields: dict[str, Any], time_ms: int) -> Any:
    header = orjson.dumps({"v": 2, **fields})
    return buffer.decode(uid.encode(), b"v", [(buffer.ROUTE_HEADER, header)], time_ms)


def message(
    uid: str, accepted: int, stamp: str | None, msg_id: str = "x", **more: Any
) -> Scheduled:
    """A schedule of ``msg_id`` for ``orders``-3, accepted by a proxy at ``accepted``."""
    fields = {"op": "schedule", "i": msg_id, "t": TOPIC, "p": PART, "k": None, "n": False}
    fields |= {"d": T0 + 60_000, "r": None, "s": accepted << 20, **more}
    if stamp is not None:
        fields["q"] = stamp
    record = _decode(uid, fields, T0)
    assert isinstance(record, Scheduled)
    return record


def cancel(uid: str, stamp: str | None, msg_id: str = "x") -> Cancel:
    fields: dict[str, Any] = {"op": "cancel", "i": msg_id}
    if stamp is not None:
        fields["q"] = stamp
    record = _decode(uid, fields, T0)
    assert isinstance(record, Cancel)
    return record


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[str]:
    return sorted(e.message.uid for e in store.due(2**62, 1000))


# -- the rule ----------------------------------------------------------------------------------


def test_one_producers_sequence_orders_its_records_to_one_partition() -> None:
    assert produced_before(q(10), q(9)) is True
    assert produced_before(q(10), q(10)) is False  # itself
    assert produced_before(q(10), q(11)) is False  # produced after the cancel
    assert produced_before(q(0), q(2**31 - 1)) is True  # across the wrap (KIP-98)
    assert produced_before(q(2**31 - 1), q(0)) is False
    assert produced_before(q(10), q(9, pid=8)) is None  # another producer
    assert produced_before(q(10), q(9, epoch=1)) is None  # another epoch
    assert produced_before(q(10), q(9, part=2)) is None  # another partition
    assert produced_before(q(10), "7/0/3/9/other") is None  # another topic
    assert produced_before(None, q(9)) is None
    assert produced_before(q(10), None) is None
    assert produced_before(q(10), "garbage") is None


def test_the_sequence_decides_over_offsets_and_times_when_it_is_known() -> None:
    late = T0 + 10_000  # accepted long after the cancel's append (a later request)
    assert buffer.cancels(10, T0, 11, late, late, order=True)  # produced before: cancelled
    assert not buffer.cancels(10, T0, 11, late, late)  # the window rule: a new message
    assert not buffer.cancels(10, T0, 11, T0 + 1, T0, order=False)  # produced after
    assert buffer.cancels(10, T0, 11, T0 + 1, T0)  # ... which the window rule cancels
    assert not buffer.cancels(10, T0, 9, T0, T0, order=False)  # before it in the buffer too
    assert buffer.cancels(10, T0, 9, T0, T0, order=True)
    assert buffer.cancels(10, T0, 11, T0 + WINDOW, T0 + WINDOW, order=True)
    assert not buffer.cancels(10, T0, 11, T0 + WINDOW + 1, T0, order=True)  # window closed
    assert not buffer.cancels(10, T0, 10, T0, T0, order=True)  # itself


def test_the_stamp_round_trips_and_a_malformed_one_is_ignored() -> None:
    stamp = producer_seq(PID, EPOCH, TOPIC, PART, 2**31 + 4)
    assert stamp == q(4)
    s = message("s1", T0, stamp)
    assert s.producer_seq == stamp
    enc = buffer.encode(s)
    assert buffer.decode(enc.key, enc.value, enc.headers, T0) == s
    c = Cancel("x", "c1", producer_seq=stamp)
    enc = buffer.encode(c)
    assert buffer.decode(enc.key, enc.value, enc.headers, T0) == c
    for bad in ("7/0/3/x/orders", "7/0/3/2147483648/orders", "7/0/3/1/a/b", 12, ""):
        assert message("s1", T0, bad).producer_seq is None  # type: ignore[arg-type]
    assert message("s1", T0, None).producer_seq is None
    assert decode_entry(encode_entry(s)).producer_seq == stamp  # the store keeps it


# -- the replicas ----------------------------------------------------------------------------


def test_a_message_produced_before_its_cancel_but_accepted_long_after_is_cancelled(
    store: Store,
) -> None:
    """librdkafka carried the message in a request after the cancel's answer."""
    store.apply([(0, 10, cancel("c1", q(10)), T0)], {0: 11})
    late = message("s1", T0 + 5_000, q(9))
    result = store.apply([(0, 11, late, T0 + 5_001)], {0: 12})
    assert (result.scheduled, result.cancelled_on_arrival) == (0, 1)
    assert pending(store) == []


def test_a_message_produced_after_its_cancel_is_never_cancelled_by_it(store: Store) -> None:
    # Appended after the cancel, accepted with it: the window rule alone would cancel it.
    store.apply([(0, 10, cancel("c1", q(10)), T0)], {0: 11})
    with_it = store.apply([(0, 11, message("s1", T0, q(11)), T0 + 1)], {0: 12})
    assert (with_it.scheduled, with_it.cancelled_on_arrival) == (1, 0)
    # Appended before the cancel (the proxy writes a request's cancels last): left pending.
    store.apply([(1, 0, message("s2", T0, q(21), "y"), T0)], {1: 1})
    result = store.apply([(1, 1, cancel("c2", q(20), "y"), T0 + 1)], {1: 2})
    assert result.cancelled == 0
    assert pending(store) == ["s1", "s2"]
    # One produced before it, pending when it came: cancelled as always.
    store.apply([(2, 0, message("s3", T0, q(30), "z"), T0)], {2: 1})
    assert store.apply([(2, 1, cancel("c3", q(31), "z"), T0 + 1)], {2: 2}).cancelled == 1


def test_other_producers_and_unstamped_records_keep_the_window_rule(store: Store) -> None:
    store.apply([(0, 0, cancel("c1", q(10)), T0)], {0: 1})
    late = T0 + WITH + 1
    other = store.apply([(0, 1, message("s1", late, q(9, part=2)), late)], {0: 2})
    unstamped = store.apply([(0, 2, message("s2", late, None), late)], {0: 3})
    assert other.cancelled_on_arrival == unstamped.cancelled_on_arrival == 0
    sent_with = store.apply([(0, 3, message("s3", T0, q(11, pid=9)), T0 + 1)], {0: 4})
    assert sent_with.cancelled_on_arrival == 1
    store.apply([(1, 0, cancel("c2", None, "y"), T0)], {1: 1})
    assert store.apply([(1, 1, message("s4", late, q(1), "y"), late)], {1: 2}).scheduled == 1
    assert pending(store) == ["s1", "s2", "s4"]


def test_a_reopened_store_remembers_the_open_cancels_stamp(tmp_path: Path) -> None:
    first = Store(tmp_path / "db")
    first.apply([(0, 0, cancel("c1", q(10)), T0)], {0: 1})
    first.close()
    again = Store(tmp_path / "db")
    try:
        late = T0 + 60_000
        assert again.apply([(0, 1, message("s1", late, q(9)), late)], {0: 2}).cancelled == 1
        assert again.apply([(0, 2, message("s2", T0, q(11)), T0 + 2)], {0: 3}).scheduled == 1
        assert pending(again) == ["s2"]
    finally:
        again.close()


def test_one_producers_replaces_replace_in_the_order_it_sent_them(store: Store) -> None:
    """The replace sent last wins, whichever the buffer has last."""
    store.apply([(0, 0, message("r2", T0, q(6), rx=True), T0)], {0: 1})
    result = store.apply([(0, 1, message("r1", T0 + 5_000, q(5), rx=True), T0 + 5_001)], {0: 2})
    assert (result.scheduled, result.cancelled_on_arrival) == (0, 1)
    assert pending(store) == ["r2"]


# -- the proxy -------------------------------------------------------------------------------


def test_the_proxy_stamps_an_idempotent_producers_delayed_records_and_cancels() -> None:
    batch = [
        Incoming(b"k", b"a", [(DELAY_MS, b"10"), (ID, b"x")], timestamp=T0),
        Incoming(b"k", b"", [(CANCEL, b"x")], timestamp=T0),
        Incoming(b"k", b"now", [], timestamp=T0),
    ]

    def stamps(origin: Origin | None) -> list[str | None]:
        out, _ = route(TOPIC, PART, batch, T0, DelayPolicy(), buffer_partitions=6, origin=origin)
        return [
            orjson.loads(o.headers[-1][1] or b"{}").get("q") if o.headers else None for o in out[:2]
        ]

    assert stamps(Origin(PID, EPOCH, 2**31 - 1)) == [q(2**31 - 1), q(0)]
    assert stamps(None) == [None, None]
