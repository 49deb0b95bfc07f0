"""Message owners (issue 36 point 3): who is a kdelay administrator, the owner stamped in buffer
records, and the cancel rule with owners."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from delay_service.entry import decode_entry, encode_entry, entry_owner
from delay_service.store import Store
from kdelay import buffer
from kdelay.buffer import Cancel, Scheduled, may_cancel
from proxy.authorization import Access, AclCache, TopicAccess
from proxy.sasl import Principal

BUFFER = "__kdelay_buffer"


class _Link:
    """A link answering Metadata with fixed authorized operations for the buffer topic."""

    def __init__(self, error_code: int, operations: set[int] | None) -> None:
        self.error_code = error_code
        self.operations = operations
        self.requests = 0

    async def request(self, request: Any) -> Any:
        self.requests += 1
        topic = SimpleNamespace(
            name=BUFFER,
            error_code=self.error_code,
            authorized_operations=self.operations,
            partitions=[],
        )
        return SimpleNamespace(cluster_id="c", topics=[topic])


def _admin(error_code: int, operations: set[int] | None) -> bool:
    link = _Link(error_code, operations)
    access = TopicAccess(Principal("alice"), link, AclCache(60.0))  # type: ignore[arg-type]
    return asyncio.run(access.admin(BUFFER))


def test_an_administrator_is_allowed_alter_or_all_on_the_buffer_topic() -> None:
    assert _admin(0, {3, 7, 8})  # READ, ALTER, DESCRIBE
    assert _admin(0, {2})  # ALL
    assert not _admin(0, {3, 4, 8})  # READ, WRITE, DESCRIBE
    assert not _admin(29, None)  # may not even DESCRIBE it
    assert not Access(0, None).alterable


def test_the_admin_answer_is_cached_per_principal() -> None:
    link = _Link(0, {7})
    cache = AclCache(60.0)
    access = TopicAccess(Principal("alice"), link, cache)  # type: ignore[arg-type]

    async def twice() -> list[bool]:
        return [await access.admin(BUFFER), await access.admin(BUFFER)]

    assert asyncio.run(twice()) == [True, True]
    assert link.requests == 1


# -- the buffer format and the rule ---------------------------------------------------------

T0 = 1_700_000_000_000
ALICE, BOB, ADMIN = "User:alice", "User:bob", "User:admin"


def test_owner_and_admin_round_trip_the_buffer_format_and_the_store_entry() -> None:
    records: list[buffer.BufferRecord] = [
        Cancel("x", "c", owner=BOB),
        Cancel("x", "c", owner=ADMIN, admin=True),
        Cancel("x", "c"),
        Scheduled("x", "t", 0, None, b"v", T0, uid="s", owner=ALICE),
        Scheduled("x", "t", 0, None, b"v", T0, uid="s", owner=ADMIN, replace=True, admin=True),
    ]
    for record in records:
        enc = buffer.encode(record)
        assert buffer.decode(enc.key, enc.value, enc.headers, T0) == record
    # Without an owner the route header is exactly what it was (no "w", no "a").
    assert b'"w"' not in (buffer.encode(Cancel("x", "c")).headers[-1][1] or b"")
    owned = Scheduled("x", "t", 0, b"k", b"v", T0, (("h", b"1"),), uid="s", owner=ALICE)
    for msg in (owned, dataclasses.replace(owned, repeat="every 1m", occurrence=3)):
        data = encode_entry(msg)
        assert decode_entry(data) == msg
        assert entry_owner(data) == ALICE
    assert entry_owner(encode_entry(dataclasses.replace(owned, owner=None))) is None


def test_who_may_cancel_a_message() -> None:
    assert may_cancel(ALICE, False, ALICE)  # its owner
    assert not may_cancel(BOB, False, ALICE)  # another principal
    assert may_cancel(ADMIN, True, ALICE)  # an administrator
    assert may_cancel(BOB, False, None)  # a message without an owner: anyone
    assert may_cancel(None, False, None)  # no authentication anywhere: as before
    assert not may_cancel(None, False, ALICE)  # a cancel without a principal: not an owned one


def sched(msg_id: str, uid: str, owner: str | None, accepted: int = T0 - 1) -> Scheduled:
    return Scheduled(
        msg_id, "t", 0, None, b"v", T0 + 60_000, uid=uid, seq=accepted << 20, owner=owner
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def pending(store: Store) -> list[tuple[str, str | None]]:
    return sorted((e.message.uid, e.message.owner) for e in store.due(2**62, 1000))


def test_a_replica_applies_a_cancel_only_to_what_its_sender_may_cancel(store: Store) -> None:
    store.apply(
        [
            (0, 0, sched("x", "a1", ALICE), T0),
            (0, 1, sched("y", "a2", ALICE), T0),
            (0, 2, sched("z", "a3", ALICE), T0),
            (0, 3, sched("x", "b1", BOB), T0),
        ],
        {0: 4},
    )
    result = store.apply(
        [
            (0, 4, Cancel("x", "c1", owner=BOB), T0 + 1),  # bob's own b1 only
            (0, 5, Cancel("y", "c2"), T0 + 1),  # no principal: not alice's
            (0, 6, Cancel("z", "c3", owner=ADMIN, admin=True), T0 + 1),  # an administrator
        ],
        {0: 7},
    )
    assert result.cancelled == 2
    assert [(r.id, r.owner, r.principal, r.offset) for r in result.refused] == [
        ("x", ALICE, BOB, 4),
        ("y", ALICE, None, 5),
    ]
    assert pending(store) == [("a1", ALICE), ("a2", ALICE)]
    left = store.get("x")
    assert left is not None
    assert left.message.owner == ALICE
    result = store.apply([(0, 7, Cancel("x", "c4", owner=ALICE), T0 + 2)], {0: 8})
    assert (result.cancelled, result.refused) == (1, [])
    assert pending(store) == [("a2", ALICE)]


def test_a_replace_cancels_only_its_senders_messages_and_is_pending_as_its_own(
    store: Store,
) -> None:
    store.apply([(0, 0, sched("x", "a1", ALICE), T0)], {0: 1})
    forged = dataclasses.replace(sched("x", "b1", BOB, T0 + 5), replace=True)
    result = store.apply([(0, 1, forged, T0 + 5)], {0: 2})
    assert (result.replaced, len(result.refused)) == (0, 1)
    assert pending(store) == [("a1", ALICE), ("b1", BOB)]
    by_admin = dataclasses.replace(sched("x", "d1", ADMIN, T0 + 9), replace=True, admin=True)
    result = store.apply([(0, 2, by_admin, T0 + 9)], {0: 3})
    assert result.replaced == 2
    assert pending(store) == [("d1", ADMIN)]


def test_a_cancel_read_before_its_message_cancels_it_on_arrival_only_for_its_owner(
    store: Store,
) -> None:
    # The race the proxy cannot see: a cancel accepted before the replicas know the message.
    result = store.apply(
        [(0, 0, Cancel("x", "c1", owner=BOB), T0), (0, 1, sched("x", "a1", ALICE, T0), T0)],
        {0: 2},
    )
    assert (result.cancelled_on_arrival, len(result.refused)) == (0, 1)
    assert pending(store) == [("a1", ALICE)]
    result = store.apply(
        [(0, 2, Cancel("y", "c2", owner=ALICE), T0), (0, 3, sched("y", "a2", ALICE, T0), T0)],
        {0: 4},
    )
    assert (result.cancelled_on_arrival, result.refused) == (1, [])
    result = store.apply(
        [
            (0, 4, Cancel("z", "c3", owner=ADMIN, admin=True), T0),
            (0, 5, sched("z", "a3", ALICE, T0), T0),
        ],
        {0: 6},
    )
    assert result.cancelled_on_arrival == 1
    assert pending(store) == [("a1", ALICE)]


def test_an_open_cancels_sender_survives_a_restart(tmp_path: Path) -> None:
    first = Store(tmp_path / "db")
    first.apply([(0, 0, Cancel("x", "c1", owner=BOB), T0)], {0: 1})
    first.close()
    again = Store(tmp_path / "db")
    try:
        result = again.apply([(0, 1, sched("x", "a1", ALICE, T0), T0)], {0: 2})
        assert (result.cancelled_on_arrival, len(result.refused)) == (0, 1)
        result = again.apply([(0, 2, sched("x", "b1", BOB, T0), T0)], {0: 3})
        assert result.cancelled_on_arrival == 1
    finally:
        again.close()


def test_without_owners_nothing_changes(store: Store) -> None:
    store.apply([(0, 0, sched("x", "s1", None), T0)], {0: 1})
    result = store.apply([(0, 1, Cancel("x", "c1"), T0 + 1)], {0: 2})
    assert (result.cancelled, result.refused) == (1, [])
