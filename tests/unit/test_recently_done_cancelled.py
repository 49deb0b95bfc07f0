"""A retry of a cancelled or replaced message is a duplicate, not a new message: the store
remembers the records a cancel, a bulk cancel or a replace removed as it remembers delivered
ones (``delay_service.store.ids.RecentlyDone``), for the same window.

A retry is the same record again (same id, same buffer key: an idempotent producer's retry
through a restarted proxy). Its order field carries no acceptance time here, so the open
cancel's rule 2 (cancelled on arrival) does not apply: only the store's memory stops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.store.store import Store

T = 1_000_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def order(uid: str, *, replace: bool = False, msg_id: str = "order-1") -> Scheduled:
    return Scheduled(msg_id, "t", 0, b"k", b"v", T + 60_000, uid=uid, replace=replace)


def test_a_retry_of_a_cancelled_message_is_a_duplicate(store: Store) -> None:
    store.apply([(0, 0, order("u1"), T)], {0: 1})
    store.apply([(0, 1, Cancel("order-1", "c1"), T + 1)], {0: 2})
    assert store.pending == 0
    result = store.apply([(0, 2, order("u1"), T + 2)], {0: 3})  # the client's retry
    assert result.duplicates == 1
    assert result.scheduled == 0
    assert store.pending == 0


def test_a_retry_of_a_replaced_message_is_a_duplicate(store: Store) -> None:
    store.apply([(0, 0, order("u1"), T)], {0: 1})
    store.apply([(0, 1, order("u2", replace=True), T + 1)], {0: 2})
    assert store.pending == 1
    result = store.apply([(0, 2, order("u1"), T + 2)], {0: 3})  # a retry of the replaced one
    assert result.duplicates == 1
    assert store.pending == 1
    pending = store.get("order-1")
    assert pending is not None
    assert pending.message.uid == "u2"


def test_a_retry_of_a_bulk_cancelled_message_is_a_duplicate(store: Store) -> None:
    store.apply([(0, 0, order("u1"), T)], {0: 1})
    bulk = Cancel("bulk.1", "b1", prefix="order-")
    store.apply([(0, 1, bulk, T + 1)], {0: 2})
    assert store.pending == 0
    result = store.apply([(0, 2, order("u1"), T + 2)], {0: 3})
    assert result.duplicates == 1
    assert store.pending == 0


def test_a_new_message_reusing_the_id_is_still_new(store: Store) -> None:
    store.apply([(0, 0, order("u1"), T)], {0: 1})
    store.apply([(0, 1, Cancel("order-1", "c1"), T + 1)], {0: 2})
    result = store.apply([(0, 2, order("u9"), T + 2)], {0: 3})  # another buffer key: new
    assert result.scheduled == 1
    assert store.pending == 1
