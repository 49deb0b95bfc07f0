"""Message owners: who is a kdelay administrator, the owner stamped in buffer
records, and the cancel rule with owners."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.buffer import Cancel, Scheduled, may_cancel
from kdelay.delay_service.store.entry import decode_entry, encode_entry, entry_owner
from kdelay.delay_service.store.store import Store
from kdelay.proxy.auth.authorization import Access, AclCache, TopicAccess
from kdelay.proxy.auth.owners import Owners, others_in, own_view
from kdelay.proxy.routing.route import Incoming, Outgoing, route
from kdelay.proxy.sasl import Principal
from kdelay.proxy.wire import records as rec
from kdelay.zk.replica_api import NoReplicaError, ReplicaAnswer

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


# -- the proxy: the routing stamp and the owners' check -----------------------------------

POLICY = h.DelayPolicy()
NOW = 1_700_000_000_000


def _routed(*records: Incoming, owner: str | None = None, admin: bool = False) -> list[Outgoing]:
    out, _ = route("t", 0, list(records), NOW, POLICY, buffer_partitions=4, owner=owner,
                   admin=admin)  # fmt: skip
    return out


def _decoded(out: Outgoing) -> buffer.BufferRecord:
    assert out.key is not None
    return buffer.decode(out.key, out.value, out.headers, NOW)


DELAYED = Incoming(None, b"v", [(h.DELAY_MS, b"1000"), (h.ID, b"x")])
CANCELS = Incoming(None, None, [(h.CANCEL, b"x")])
REPLACES = Incoming(None, b"v", [(h.DELAY_MS, b"1000"), (h.ID, b"x"), (h.REPLACE, b"true")])
PLAIN = Incoming(None, b"v", [])


def test_routing_stamps_the_owner_on_delayed_records_and_cancels() -> None:
    delayed, cancel, replace, plain = _routed(DELAYED, CANCELS, REPLACES, PLAIN, owner=ALICE)
    scheduled = _decoded(delayed)
    assert isinstance(scheduled, Scheduled)
    assert (scheduled.owner, scheduled.admin) == (ALICE, False)
    assert _decoded(cancel) == Cancel("x", _decoded(cancel).buffer_key, owner=ALICE)
    decoded = _decoded(replace)
    assert isinstance(decoded, Scheduled)
    assert (decoded.owner, decoded.replace, decoded.admin) == (ALICE, True, False)
    assert plain.headers == []  # an immediate record is not touched
    # An administrator's flag goes on cancels and replaces only.
    delayed, cancel, replace = _routed(DELAYED, CANCELS, REPLACES, owner=ADMIN, admin=True)
    assert [getattr(_decoded(r), "admin", None) for r in (delayed, cancel, replace)] == [
        False,
        True,
        True,
    ]
    # Without a principal nothing is stamped: the route header is what it was.
    for out in _routed(DELAYED, CANCELS, REPLACES):
        assert b'"w"' not in (out.headers[-1][1] or b"")
        assert b'"a"' not in (out.headers[-1][1] or b"")


class _Replicas:
    """A ReplicaApi answering each id's status from ``owners`` (absent: 404)."""

    def __init__(self, owners: dict[str, str | None]) -> None:
        self.owners = owners
        self.asked: list[str] = []

    def message(self, msg_id: str) -> ReplicaAnswer:
        self.asked.append(msg_id)
        if msg_id not in self.owners:
            return ReplicaAnswer(404, {"error": "unknown"}, "r1")
        owner = self.owners[msg_id]
        doc: dict[str, Any] = {"id": msg_id, "state": "pending"}
        if owner is not None:
            doc["owner"] = owner
        return ReplicaAnswer(200, doc, "r1")


def _access(principal: str, operations: set[int]) -> TopicAccess:
    link = _Link(0, operations)
    return TopicAccess(Principal(principal), link, AclCache(60.0))  # type: ignore[arg-type]


def test_another_principals_cancel_or_replace_is_refused_with_a_record_error() -> None:
    replicas = _Replicas({"x": ALICE})
    owners = Owners(lambda: replicas)  # type: ignore[arg-type,return-value]
    routed = _routed(PLAIN, CANCELS, owner="User:bob")
    with pytest.raises(rec.BatchError) as refused:
        asyncio.run(owners.check_batch(routed, _access("bob", {4})))
    assert refused.value.code == 87  # INVALID_RECORD
    assert refused.value.reason == "not_owner"
    ((index, message),) = refused.value.record_errors
    assert index == 1
    assert message is not None
    assert "'x' belongs to another principal" in message
    assert "ALTER on __kdelay_buffer" in message
    assert "alice" not in message  # the owner is not disclosed
    with pytest.raises(rec.BatchError, match="may replace it"):
        asyncio.run(owners.check_batch(_routed(REPLACES, owner=BOB), _access("bob", {4})))
    # Its owner may; so may an administrator, whose records then carry "a": true.
    mine = _routed(CANCELS, owner=ALICE)
    assert asyncio.run(owners.check_batch(mine, _access("alice", {4}))) == mine
    replicas.asked.clear()
    stamped = asyncio.run(owners.check_batch(_routed(CANCELS, REPLACES, owner=ADMIN),
                                             _access("admin", {4, 7})))  # fmt: skip
    assert [getattr(_decoded(r), "admin", None) for r in stamped] == [True, True]
    assert replicas.asked == []  # an administrator's needs no owner


def test_an_unknown_owner_lets_the_cancel_through_for_the_replicas_to_decide() -> None:
    unknown = _routed(CANCELS, owner=BOB)
    for replicas in (_Replicas({}), _Replicas({"x": None}), None):
        owners = Owners(lambda r=replicas: r)  # type: ignore[misc]
        assert asyncio.run(owners.check_batch(unknown, _access("bob", {4}))) == unknown

    class _Down:
        def message(self, msg_id: str) -> ReplicaAnswer:
            raise NoReplicaError("no replica registered")

    owners = Owners(_Down)  # type: ignore[arg-type]
    assert asyncio.run(owners.check_batch(unknown, _access("bob", {4}))) == unknown


def test_a_reused_ids_history_shows_a_principal_only_its_own_messages() -> None:
    """bob reused alice's id: bob's view of his pending message leaves out alice's earlier
    message (its events and its outcome); an anonymous one (no owner) stays."""
    doc: dict[str, Any] = {
        "id": "x",
        "state": "pending",
        "owner": "User:bob",
        "last_outcome": {"id": "x", "state": "delivered", "owner": "User:alice"},
        "history": [
            {"event": "accepted", "at": 1, "owner": "User:alice", "by": "User:alice"},
            {"event": "delivered", "at": 2, "owner": "User:alice"},
            {"event": "accepted", "at": 3},
            {"event": "cancelled", "at": 4},
            {"event": "accepted", "at": 5, "owner": "User:bob", "by": "User:bob"},
        ],
    }
    assert others_in(doc, "User:bob")
    assert others_in(doc, "User:alice")
    view = own_view(doc, "User:bob")
    assert [e["at"] for e in view["history"]] == [3, 4, 5]
    assert "last_outcome" not in view
    assert doc["last_outcome"]["owner"] == "User:alice"  # the answer itself is left alone
    mine = {**doc, "last_outcome": {"owner": "User:bob"}, "history": doc["history"][2:]}
    assert not others_in(mine, "User:bob")
    assert own_view(mine, "User:bob") == mine
