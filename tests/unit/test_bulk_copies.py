"""A bulk cancel written as one copy per buffer partition (delay_service/store/bulk_cancels.py,
"Copies"): each copy cancels the messages of its own partition, before and after it; a store
that reads several copies counts each message once and lists the partitions it applied; the
same records read again by a rebuilt store count the same; and the proxy's wait
(proxy/http/cancel_wait.py) answers only once every partition's copy was applied once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kdelay.buffer import CANCEL_SENT_WITH_MS as WITH
from kdelay.buffer import Cancel, Scheduled
from kdelay.buffer.bulk_ids import bulk_copies, new_bulk_id
from kdelay.delay_service.store.store import Store
from kdelay.proxy.http.cancel_wait import bulk_decision
from kdelay.zk.replica_api import ReplicaAnswer

T0 = 1_700_000_000_000  # the copies' append time
PARTS = 3
BULK = new_bulk_id(PARTS)


def sched(msg_id: str, uid: str, accepted: int = T0 - 1_000, owner: str | None = None) -> Scheduled:
    return Scheduled(
        msg_id, "t", 0, None, b"v", T0 + 60_000, uid=uid, seq=accepted << 20, owner=owner
    )


def copy(partition: int, owner: str | None = "User:bob") -> Cancel:
    return Cancel(BULK, f"kb{partition}", owner=owner, prefix="p-")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[str]:
    return sorted(e.message.id for e in store.due(2**62, 10_000))


def messages() -> list[tuple[int, int, Scheduled, int]]:
    """Per partition: two of bob's, one of alice's (bob's bulk cancel refuses it), one out of
    the prefix; offsets 0..3."""
    out = []
    for p in range(PARTS):
        out += [
            (p, 0, sched(f"p-{p}-a", f"a{p}", owner="User:bob"), T0 - 9),
            (p, 1, sched(f"p-{p}-b", f"b{p}"), T0 - 9),
            (p, 2, sched(f"p-{p}-z", f"z{p}", owner="User:alice"), T0 - 9),
            (p, 3, sched(f"q-{p}", f"q{p}"), T0 - 9),
        ]
    return out


def test_each_copy_cancels_its_own_partition_and_the_store_counts_each_message_once(
    store: Store,
) -> None:
    store.apply(messages(), dict.fromkeys(range(PARTS), 4))
    first = store.apply([(1, 4, copy(1), T0)], {1: 5})
    assert (first.bulk_cancelled, first.bulk_refused) == (2, 1)  # partition 1's only
    assert "p-0-a" in pending(store)
    for p in (0, 2):
        store.apply([(p, 4, copy(p), T0 + p)], {p: 5})
    alice = [f"p-{p}-z" for p in range(PARTS)]
    assert pending(store) == sorted([*alice, *(f"q-{p}" for p in range(PARTS))])
    counted = store.bulk_result(BULK)
    assert counted is not None
    assert (counted["cancelled"], counted["refused"]) == (2 * PARTS, PARTS)
    assert counted["partitions"] == list(range(PARTS))


def test_a_message_read_after_its_partitions_copy_is_cancelled_once(store: Store) -> None:
    store.apply([(p, 0, copy(p), T0) for p in range(PARTS)], dict.fromkeys(range(PARTS), 1))
    # Sent with the bulk cancel, read after it from partition 2: its copy there cancels it,
    # the other (open) copies do not count it again.
    late = store.apply([(2, 1, sched("p-late", "l", T0 + WITH), T0 + 5)], {2: 2})
    assert late.bulk_cancelled == 1
    after = store.apply([(2, 2, sched("p-new", "n", T0 + WITH + 1), T0 + 300)], {2: 3})
    assert after.scheduled == 1
    counted = store.bulk_result(BULK)
    assert counted is not None
    assert (counted["cancelled"], counted["refused"]) == (1, 0)
    assert pending(store) == ["p-new"]


def test_a_copy_read_again_changes_nothing_but_owes_its_tombstone(store: Store) -> None:
    store.apply(messages(), dict.fromkeys(range(PARTS), 4))
    store.apply([(0, 4, copy(0), T0)], {0: 5})
    again = store.apply([(0, 5, copy(0), T0 + 1)], {0: 6})
    assert (again.bulk_cancels, again.bulk_refused) == (0, 0)
    assert (BULK, "kb0", 0, 5) in [r[:4] for r in again.retired]
    counted = store.bulk_result(BULK)
    assert counted is not None
    assert (counted["cancelled"], counted["refused"], counted["partitions"]) == (2, 1, [0])


def test_a_rebuilt_store_reading_the_same_records_counts_the_same(tmp_path: Path) -> None:
    records = [*messages(), *[(p, 4, copy(p), T0 + p) for p in range(PARTS)]]
    results = []
    for name, order in (("first", records), ("rebuilt", sorted(records, key=lambda r: -r[0]))):
        store = Store(tmp_path / name)
        by_partition: dict[int, list[Any]] = {}
        for r in order:
            by_partition.setdefault(r[0], []).append(r)
        for p, rs in by_partition.items():  # partition by partition, in another order
            store.apply(rs, {p: 5})
        counted = store.bulk_result(BULK)
        assert counted is not None
        results.append((counted["cancelled"], counted["refused"], counted["partitions"]))
        assert len(pending(store)) == 2 * PARTS
        store.close()
    assert results[0] == results[1] == (2 * PARTS, PARTS, list(range(PARTS)))


def test_bulk_steps_keep_to_their_copys_partition(store: Store) -> None:
    store.apply(messages(), dict.fromkeys(range(PARTS), 4))
    retired, done = 0, False
    while not done:
        out, done = store.bulk_step((1, 4, T0), copy(1), limit=1)
        retired += len(out)
    assert retired == 2
    store.apply([(1, 4, copy(1), T0)], {1: 5})
    counted = store.bulk_result(BULK)
    assert counted is not None
    assert (counted["cancelled"], counted["refused"], counted["partitions"]) == (2, 1, [1])


def summed(partitions: list[int], role: str = "master,master") -> ReplicaAnswer:
    body = {"cancelled": 7, "refused": 1, "role": role, "partitions": partitions}
    return ReplicaAnswer(200, body, "r1,r2")


def test_the_proxy_answers_once_every_partitions_copy_was_applied_exactly_once() -> None:
    bulk_id = new_bulk_id(6)
    assert bulk_copies(bulk_id) == 6
    done = bulk_decision(bulk_id, summed([0, 1, 2, 3, 4, 5]))
    assert done is not None
    assert (done.status, done.body) == (200, {"id": bulk_id, "cancelled": 7, "refused": 1})
    assert bulk_decision(bulk_id, summed([0, 2, 4])) is None  # a shard has not read its own
    assert bulk_decision(bulk_id, summed([0, 0, 1, 2, 3, 4, 5])) is None  # two layouts mixed
    assert bulk_decision(bulk_id, summed(list(range(6)), "master,follower")) is None
    assert bulk_decision(bulk_id, ReplicaAnswer(404, {"error": "id: none"}, "r1")) is None
