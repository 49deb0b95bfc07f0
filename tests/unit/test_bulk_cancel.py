"""Bulk cancels (delay_service/store/bulk_cancels.py, kdelay.buffer's ``px``): the record's codec,
and a store applying one: by id prefix (and topic), over every buffer partition, before and
after the messages it cancels, its owners, its count, and its window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay import buffer
from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.store.bulk_cancels import WINDOW_MS, _id_of, ids_with_prefix
from kdelay.delay_service.store.store import Store
from kdelay.errors import BufferFormatError

T0 = 1_700_000_000_000  # the bulk cancel's append time


def sched(
    msg_id: str,
    uid: str,
    accepted: int | None = T0 - 1_000,
    *,
    topic: str = "t",
    owner: str | None = None,
) -> Scheduled:
    seq = 0 if accepted is None else accepted << 20
    return Scheduled(msg_id, topic, 0, None, b"v", T0 + 60_000, uid=uid, seq=seq, owner=owner)


def bulk(prefix: str, topic: str | None = None, **kw: object) -> Cancel:
    return Cancel("bulk.1", "kb1", prefix=prefix, topic=topic, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[str]:
    return sorted(e.message.id for e in store.due(2**62, 10_000))


def test_the_codec_round_trips_a_bulk_cancel_and_old_readers_see_a_cancel() -> None:
    record = Cancel("bulk.9", "k9", owner="User:bob", prefix="cust-42-", topic="orders")
    enc = buffer.encode(record)
    route = enc.headers[-1][1]
    assert route is not None
    assert b'"px":"cust-42-"' in route
    assert b'"t":"orders"' in route
    assert b'"op":"cancel"' in route  # a reader without px cancels id bulk.9: nothing
    back = buffer.decode(enc.key, enc.value, enc.headers, T0)
    assert back == record
    assert isinstance(back, Cancel)
    assert back.bulk
    assert "px" in buffer.ROUTE_FIELDS
    plain = buffer.encode(Cancel("x", "k"))
    single = buffer.decode(plain.key, plain.value, plain.headers, T0)
    assert isinstance(single, Cancel)
    assert not single.bulk
    assert single.topic is None


def test_the_codec_refuses_an_empty_prefix() -> None:
    enc = buffer.encode(Cancel("bulk.9", "k9", prefix="p"))
    headers = [(enc.headers[-1][0], enc.headers[-1][1].replace(b'"px":"p"', b'"px":""'))]  # type: ignore[union-attr]
    with pytest.raises(BufferFormatError, match="prefix"):
        buffer.decode(enc.key, enc.value, headers, T0)


def test_the_prefix_scan_finds_every_length_and_only_the_prefix(store: Store) -> None:
    ids = ["cust-42-", "cust-42-1", "cust-42-10", "cust-42-" + "x" * 200, "cust-421", "cust-4"]
    ids += ["a", "zzzzzzzzzzzzzzzzzzzzzzzz", "cust-43-1"]
    store.apply([(0, i, sched(m, f"u{i}"), T0 - 500) for i, m in enumerate(ids)], {0: len(ids)})
    found = sorted(_id_of(k).decode() for k, _ in ids_with_prefix(store.state.ids, "cust-42-"))
    assert found == sorted(["cust-42-", "cust-42-1", "cust-42-10", "cust-42-" + "x" * 200])


def test_a_bulk_cancel_cancels_the_prefix_in_every_partition_and_counts(store: Store) -> None:
    mine = [
        (p, i, sched(f"cust-42-{p}-{i}", f"m{p}.{i}"), T0 - 500) for p in range(3) for i in range(5)
    ]
    others = [
        (p, 10 + i, sched(f"cust-420-{i}", f"o{p}.{i}"), T0 - 500)
        for p in range(3)
        for i in range(2)
    ]
    store.apply([*mine, *others], {0: 12, 1: 12, 2: 12})
    result = store.apply([(1, 12, bulk("cust-42-"), T0)], {1: 13})
    assert (result.bulk_cancels, result.bulk_cancelled, result.cancelled) == (1, 15, 15)
    assert len(result.retired) == 15  # the cancelled records' tombstones; its own at its close
    assert pending(store) == sorted(f"cust-420-{i}" for _ in range(3) for i in range(2))
    counted = store.bulk_result("bulk.1")
    assert counted is not None
    assert (counted["cancelled"], counted["refused"], counted["at"]) == (15, 0, T0)
    out = store.outcome("cust-42-1-3")
    assert out is not None
    assert out.state == "cancelled"
    assert store.bulk_result("bulk.2") is None


def test_a_bulk_cancel_limited_to_a_topic_leaves_the_other_topics(store: Store) -> None:
    store.apply(
        [
            (0, 0, sched("p-1", "a", topic="orders"), T0 - 9),
            (0, 1, sched("p-2", "b", topic="mail"), T0 - 9),
        ],
        {0: 2},
    )
    result = store.apply([(0, 2, bulk("p-", "orders"), T0)], {0: 3})
    assert result.bulk_cancelled == 1
    assert pending(store) == ["p-2"]


def test_a_message_read_after_it_but_sent_before_is_cancelled_and_counted(store: Store) -> None:
    store.apply([(0, 0, bulk("p-"), T0)], {0: 1})
    # Accepted before the bulk cancel was appended (+ the sent-with margin), read later from
    # another partition; one accepted after is a new message.
    before = sched("p-1", "a", T0 + WITH)
    after = sched("p-2", "b", T0 + WITH + 1)
    result = store.apply([(2, 0, before, T0 + 5), (2, 1, after, T0 + 300)], {2: 2})
    assert (result.bulk_cancelled, result.scheduled) == (1, 1)
    assert pending(store) == ["p-2"]
    assert store.bulk_result("bulk.1")["cancelled"] == 1  # type: ignore[index]


def test_a_message_sent_after_the_bulk_cancel_but_read_before_it_stays(store: Store) -> None:
    # A replica reading partition 2 ahead of partition 0: the message is in the store when
    # the bulk cancel is read, but a proxy accepted it after the bulk cancel was appended.
    store.apply([(2, 0, sched("p-1", "a", T0 + 5_000), T0 + 5_000)], {2: 1})
    result = store.apply([(0, 0, bulk("p-"), T0)], {0: 1})
    assert result.bulk_cancelled == 0
    assert pending(store) == ["p-1"]


def test_owners_a_principals_bulk_cancel_cancels_only_its_own(store: Store) -> None:
    store.apply(
        [
            (0, 0, sched("p-1", "a", owner="User:alice"), T0 - 9),
            (0, 1, sched("p-2", "b", owner="User:bob"), T0 - 9),
            (0, 2, sched("p-3", "c"), T0 - 9),
        ],
        {0: 3},
    )
    result = store.apply([(0, 3, bulk("p-", owner="User:bob"), T0)], {0: 4})
    assert (result.bulk_cancelled, result.bulk_refused) == (2, 1)
    assert pending(store) == ["p-1"]
    assert store.bulk_result("bulk.1")["refused"] == 1  # type: ignore[index]
    late = store.apply([(1, 0, sched("p-4", "d", owner="User:alice"), T0 + 1)], {1: 1})
    assert late.bulk_cancelled == 0
    assert pending(store) == ["p-1", "p-4"]
    assert store.bulk_result("bulk.1")["refused"] == 2  # type: ignore[index]


def test_an_administrators_bulk_cancel_cancels_everyones(store: Store) -> None:
    store.apply([(0, 0, sched("p-1", "a", owner="User:alice"), T0 - 9)], {0: 1})
    result = store.apply([(0, 1, bulk("p-", owner="User:carol", admin=True), T0)], {0: 2})
    assert result.bulk_cancelled == 1


def test_it_closes_after_its_window_owes_its_tombstone_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "db")
    store.apply([(0, 0, bulk("p-"), T0)], {0: 1})
    store.close()
    store = Store(tmp_path / "db")  # reopened: still open
    result = store.apply([(1, 0, sched("p-1", "a", T0 - 1), T0 + 1_000)], {1: 1})
    assert result.bulk_cancelled == 1
    result = store.apply([(1, 1, sched("p-2", "b", T0 - 1), T0 + WINDOW_MS + 1)], {1: 2})
    assert ("bulk.1", "kb1", 0, 0) in [r[:4] for r in result.retired]  # closed: its tombstone
    assert result.bulk_cancelled == 0  # read after it closed
    assert pending(store) == ["p-2"]
    store.close()


def test_single_cancels_count_their_outcome(store: Store) -> None:
    store.apply([(0, 0, sched("x", "a"), T0 - 9)], {0: 1})
    result = store.apply([(0, 1, Cancel("x", "c1"), T0), (0, 2, Cancel("nope", "c2"), T0)], {0: 3})
    assert dict(result.cancel_outcomes) == {"cancelled": 1, "unknown": 1}


def test_a_bulk_cancel_sees_the_messages_of_its_own_batch(store: Store) -> None:
    result = store.apply(
        [(1, 0, sched("p-1", "a"), T0 - 9), (0, 0, bulk("p-"), T0), (1, 1, sched("q-1", "b"), T0)],
        {0: 1, 1: 2},
    )
    assert (result.bulk_cancelled, result.scheduled) == (1, 2)
    assert pending(store) == ["q-1"]


def _steps(store: Store, at: tuple[int, int, int], record: Cancel, limit: int) -> int:
    """Run ``bulk_step`` until done, as ingest does; how many it retired."""
    retired, done, steps = 0, False, 0
    while not done:
        out, done = store.bulk_step(at, record, limit=limit)
        retired += len(out)
        steps += 1
    assert steps > 1
    return retired


def test_bulk_steps_then_the_batch_cancel_each_once_and_count_them_all(store: Store) -> None:
    mine = [(0, i, sched(f"p-{i}", f"m{i}"), T0 - 9) for i in range(25)]
    hers = [(1, i, sched(f"p-a{i}", f"a{i}", owner="User:alice"), T0 - 9) for i in range(5)]
    others = [(2, i, sched(f"q-{i}", f"o{i}"), T0 - 9) for i in range(7)]
    store.apply([*mine, *hers, *others], {0: 25, 1: 5, 2: 7})
    record = bulk("p-", owner="User:bob")
    assert _steps(store, (3, 0, T0), record, limit=4) == 25
    assert len(pending(store)) == 12  # the steps' deletions are written, the lock was free
    result = store.apply([(3, 0, record, T0)], {3: 1})
    assert (result.bulk_cancels, result.bulk_cancelled, result.bulk_refused) == (1, 0, 5)
    counted = store.bulk_result("bulk.1")
    assert counted is not None
    assert (counted["cancelled"], counted["refused"]) == (25, 5)
    assert store.bulk_step((3, 0, T0), record) == ([], True)  # applied: nothing more


def test_bulk_steps_go_on_after_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.apply([(0, i, sched(f"p-{i}", f"m{i}"), T0 - 9) for i in range(10)], {0: 10})
    record = bulk("p-")
    out, done = store.bulk_step((1, 0, T0), record, limit=3)
    assert (len(out), done) == (3, False)
    store.close()  # a crash after a step: the bulk cancel's offset was not consumed
    store = Store(tmp_path / "db")
    assert _steps(store, (1, 0, T0), record, limit=3) == 7
    result = store.apply([(1, 0, record, T0)], {1: 1})
    assert result.bulk_cancelled == 0
    counted = store.bulk_result("bulk.1")
    assert counted is not None
    assert counted["cancelled"] == 10
    assert pending(store) == []
    store.close()
