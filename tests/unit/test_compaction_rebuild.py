"""Nothing cancelled, bulk-cancelled or replaced comes back when a store is rebuilt from the
compacted buffer topic (DESIGN.md "Compaction is an adversary"): every replica records the
tombstones it owes in its store, so whichever replica is master next writes them, and a store
rebuilt from what the cleaner keeps holds only what is pending."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay.buffer import CANCEL_WINDOW_MS as WINDOW_MS
from kdelay.buffer import BufferRecord, Cancel, Scheduled
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.store import Store
from tests.support.compaction import Log
from tests.support.fakes import FakeClock, FakeProducer, Sent
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, FakeTxnProducer

BUFFER = "__kdelay_buffer"
FAR = 10**15  # due long after the test
T0 = 1_000_000  # append time of the first records


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[Store]]:
    opened = [Store(tmp_path / f"db{i}") for i in range(3)]
    yield opened
    for s in opened:
        s.close()


def scheduled(msg_id: str, uid: str, at: int = FAR, *, replace: bool = False) -> Scheduled:
    return Scheduled(msg_id, "t", 0, b"k", b"v", at, uid=uid, replace=replace)


def forwarder(store: Store, producer: FakeProducer) -> tuple[Forwarder, FakeClock]:
    cfg = ReplicaConfig(name="r", checkpoint_interval_ms=1)
    clock = FakeClock(now_ms=T0, mono=50.0)
    producer.clock = clock
    sender = Sender(lambda: producer, buffer_topic=BUFFER, produce_timeout_ms=1000, clock=clock)
    fwd = Forwarder(
        cfg, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    return fwd, clock


def eo_forwarder(store: Store, producer: FakeTxnProducer) -> tuple[ExactlyOnceForwarder, TxnSender]:
    """An exactly-once forwarder and its sender (not started: its term starts it)."""
    cfg = ReplicaConfig(name="r", delivery="exactly-once", checkpoint_interval_ms=1)
    clock = FakeClock(now_ms=T0, mono=50.0)
    producer.clock = clock
    sender = TxnSender(
        lambda: producer,
        buffer_topic=BUFFER,
        produce_timeout_ms=1000,
        checkpoint_key="set",
        clock=clock,
    )
    fwd = ExactlyOnceForwarder(
        cfg, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    return fwd, sender


def feed(
    log: Log,
    stores: list[Store],
    records: list[tuple[int, BufferRecord, int]],
    fwd: Forwarder | None = None,
) -> None:
    """Append ``(partition, record, append time)`` to the topic and let every replica in
    ``stores`` ingest them, handing what they retire to ``fwd`` as ingest does."""
    items = []
    for partition, record, time_ms in records:
        offset = log.append(partition, record.buffer_key.encode(), record)
        items.append((partition, offset, record, time_ms))
    for store in stores:
        offsets = {p: o + 1 for p, o, _, _ in items}
        result = store.apply(items, offsets)
        if fwd is not None:
            fwd.control.add_tombstones(result.retired)


def store_ends(records: list[tuple[int, int, BufferRecord]]) -> dict[int, int]:
    """The next offset of each partition after ``records``."""
    ends: dict[int, int] = {}
    for p, o, _ in records:
        ends[p] = max(ends.get(p, 0), o + 1)
    return ends


def tombstone_keys(sent: list[Sent]) -> list[bytes]:
    return [s.key or b"" for s in sent if s.value is None]


def pending_ids(store: Store) -> set[str]:
    return {e.message.id for e in store.due(FAR * 2, 1000)}


def test_a_replica_made_master_writes_the_tombstones_it_owed_as_follower(
    stores: list[Store],
) -> None:
    follower = stores[0]
    producer = FakeProducer()
    fwd, _clock = forwarder(follower, producer)
    feed(Log(), [follower], [(0, scheduled("m", "u-m"), T0), (1, Cancel("m", "u-c"), T0)], fwd)
    cps = FakeCheckpoints()
    fwd.forward_once(cps, fwd.control.activate(cps))
    keys = tombstone_keys(producer.to(BUFFER))
    assert keys == [b"u-m", b"u-c"]  # the message's first, then its cancel's


def test_a_master_that_steps_down_leaves_its_tombstones_to_the_next(
    stores: list[Store],
) -> None:
    log = Log()
    first_store, next_store = stores[0], stores[1]
    first, _ = eo_forwarder(first_store, FakeTxnProducer())
    cps = FakeCheckpoints()
    first.control.activate(cps)
    records: list[tuple[int, BufferRecord, int]] = [
        (0, scheduled("m", "u-m"), T0),
        (1, Cancel("m", "u-c"), T0),
    ]
    feed(log, [first_store], records, first)
    feed(Log(), [next_store], records)
    first.control.deactivate("step-down")  # its queued tombstones were never written

    producer = FakeTxnProducer()
    after, sender = eo_forwarder(next_store, producer)
    sender.start()
    after.forward_once(cps, after.control.activate(cps))
    assert tombstone_keys(producer.visible(BUFFER)) == [b"u-m", b"u-c"]

    # Once a replica has read them back it owes them no more.
    tombstones = log.append_tombstones(producer.visible(BUFFER))
    for store in (first_store, next_store):
        store.apply([(p, o, r, T0) for p, o, r in tombstones], store_ends(tombstones))
    again = FakeTxnProducer()
    later, sender = eo_forwarder(next_store, again)
    sender.start()
    later.forward_once(cps, later.control.activate(cps))
    assert tombstone_keys(again.visible(BUFFER)) == []


def test_a_bulk_cancel_owes_the_tombstone_of_each_message_it_cancelled(
    stores: list[Store],
) -> None:
    follower = stores[0]
    producer = FakeProducer()
    fwd, _clock = forwarder(follower, producer)
    feed(
        Log(),
        [follower],
        [
            (0, scheduled("cust-42-1", "u-1"), T0),
            (1, scheduled("cust-42-2", "u-2"), T0),
            (0, Cancel("b", "u-b", prefix="cust-42-"), T0),
        ],
        fwd,
    )
    cps = FakeCheckpoints()
    fwd.forward_once(cps, fwd.control.activate(cps))
    assert sorted(tombstone_keys(producer.to(BUFFER))) == [b"u-1", b"u-2"]


def test_a_store_rebuilt_from_the_compacted_topic_holds_nothing_retired(
    stores: list[Store],
) -> None:
    log = Log()
    a, b, rebuilt = stores
    producer = FakeProducer()
    fwd, clock = forwarder(a, producer)
    feed(
        log,
        [a, b],
        [
            (0, scheduled("m1", "u-m1"), T0),  # replaced below
            (0, scheduled("keep", "u-keep"), T0),
            (0, scheduled("cust-42-1", "u-x1"), T0),
            (1, scheduled("cust-42-2", "u-x2"), T0),
            (0, scheduled("solo", "u-solo"), T0),
            (1, scheduled("m1", "u-r1", 100, replace=True), T0),  # due: released
            (1, Cancel("solo", "u-c"), T0),
            (1, Cancel("b", "u-b", prefix="cust-42-"), T0),
        ],
        fwd,  # followers both: what they retire is not written yet
    )
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    fwd.forward_once(cps, gen)  # releases the replacement, writes the tombstones owed
    assert [s.key for s in producer.to("t")] == [b"k"]
    # A later record closes the bulk cancel and the cancel: their own tombstones are owed.
    later = T0 + WINDOW_MS + 1_000
    feed(log, [a, b], [(0, scheduled("fill", "u-fill"), later)], fwd)
    clock.mono += 1
    fwd.forward_once(cps, gen)
    keys = tombstone_keys(producer.to(BUFFER))
    for retired, by in ((b"u-m1", b"u-r1"), (b"u-solo", b"u-c"), (b"u-x1", b"u-b")):
        assert keys.index(retired) < keys.index(by)  # what a record retired goes first
    tombstones = log.append_tombstones(producer.to(BUFFER))
    for store in (a, b):  # the replicas read them back: nothing is owed any more
        store.apply([(p, o, r, later) for p, o, r in tombstones], store_ends(tombstones))
        assert store.owed_tombstones() == []

    survivors = log.compacted()
    rebuilt.apply([(p, o, r, T0) for p, o, r in survivors], store_ends(survivors))
    assert pending_ids(rebuilt) == {"keep", "fill"}
    assert pending_ids(rebuilt) == pending_ids(b)
