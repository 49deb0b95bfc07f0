"""Isolation whatever the number of held entries: one scan passes over at most
``scan_skip_limit`` entries of held targets, and the next round goes on from where it stopped,
so a held target with more due entries than that delays the others by a bounded number of
rounds, never for ever; per-target order and the checkpoint rule hold across those rounds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kdelay.buffer import Scheduled
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.round import RoundResult
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.sweep import Sweep
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.store import Store
from tests.support.fakes import FakeClock, FakeProducer, Sent
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, FakeTxnProducer, ids_to, msg

SKIP_LIMIT = 5
HELD = 50  # entries of the held target "x", due before everything else but "w"
BACKOFF_MS = 5_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def config(**settings: object) -> ReplicaConfig:
    return ReplicaConfig(
        name="r1",
        checkpoint_interval_ms=1,
        scan_skip_limit=SKIP_LIMIT,
        retry_backoff_ms=BACKOFF_MS,
        retry_backoff_max_ms=BACKOFF_MS,
        dead_letter_after=100,
        **settings,  # type: ignore[arg-type]
    )


def forwarder(
    store: Store, producer: FakeProducer, clock: FakeClock, sweep: Sweep | None = None
) -> Forwarder:
    cfg = config()
    producer.clock = clock
    sender = Sender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=cfg.produce_timeout_ms,
        clock=clock,
    )
    return Forwarder(
        cfg,
        store,
        FakeIngest(),
        Metrics(),
        sender=sender,
        on_fenced=lambda _w: None,
        clock=clock,
        sweep=sweep,
    )


def txn_forwarder(
    store: Store, producer: FakeTxnProducer, clock: FakeClock
) -> tuple[Forwarder, TxnSender]:
    """An exactly-once forwarder and its sender (not started: its term starts it)."""
    cfg = config(delivery="exactly-once", txn_ack_wait_ms=10)
    producer.clock = clock
    sender = TxnSender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=cfg.produce_timeout_ms,
        checkpoint_key="set",
        clock=clock,
    )
    fwd = ExactlyOnceForwarder(
        cfg, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    return fwd, sender


def held_then_healthy() -> list[tuple[int, int, Scheduled]]:
    """``HELD`` entries of "x" (due 100..149), then three of "y" (due 200..202)."""
    held = [(0, i, msg(i, 100 + i, topic="x")) for i in range(HELD)]
    return [*held, *((1, i, msg(1000 + i, 200 + i, topic="y")) for i in range(3))]


def checked_round(fwd: Forwarder, store: Store, cps: FakeCheckpoints, gen: int) -> RoundResult:
    """One round; its claim never reaches an entry still pending (the checkpoint rule)."""
    result = fwd.forward_once(cps, gen)
    earliest = store.next_due_ms()
    assert earliest is None or result.claim_ms < earliest, (result, earliest)
    return result


def rounds_until(
    fwd: Forwarder,
    store: Store,
    cps: FakeCheckpoints,
    gen: int,
    *,
    done: Callable[[], bool],
    most: int,
) -> int:
    """Rounds run until ``done()`` holds (at most ``most``)."""
    for n in range(1, most + 1):
        checked_round(fwd, store, cps, gen)
        if done():
            return n
    raise AssertionError(f"not done after {most} rounds")


def test_a_held_target_with_more_entries_than_the_skip_limit_starves_no_one(
    store: Store,
) -> None:
    producer = FakeProducer(hold=lambda s: s.topic == "x")  # x never acknowledges
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    sweep = Sweep()
    fwd = forwarder(store, producer, clock, sweep)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    entries = held_then_healthy()
    store.apply(entries[:1], {0: 1})
    checked_round(fwd, store, cps, gen)  # x0 goes, and stays in flight: x is held
    store.apply(entries[1:], {0: HELD, 1: 3})
    # Each round passes over at most SKIP_LIMIT of x's entries, and goes on from there.
    rounds = rounds_until(
        fwd,
        store,
        cps,
        gen,
        done=lambda: len(ids_to(producer, "y")) == 3,
        most=HELD // SKIP_LIMIT + 2,
    )
    assert ids_to(producer, "y") == ["m1000", "m1001", "m1002"]
    assert rounds >= HELD // SKIP_LIMIT  # never more than the limit in one round
    assert [s.topic for s, _ in producer.queued] == ["x"]  # x1.. wait behind x0
    assert cps.writes[-1][0] == 99  # below x0, the earliest entry still pending
    # Only a pass's first scan caches the targets it passed over: bounded by the limit.
    assert sweep.cached <= SKIP_LIMIT


def test_exactly_once_a_held_target_with_more_entries_than_the_skip_limit_starves_no_one(
    store: Store,
) -> None:
    producer = FakeTxnProducer(
        fail=lambda s: KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION) if s.topic == "x" else None
    )
    producer.leaderless.add("x")
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    fwd, sender = txn_forwarder(store, producer, clock)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    sender.start()  # what _serve does first: init_transactions
    entries = held_then_healthy()
    store.apply(entries[:1], {0: 1})
    checked_round(fwd, store, cps, gen)  # x0's transaction is aborted: x is held
    assert producer.aborts == 1
    store.apply(entries[1:], {0: HELD, 1: 3})
    rounds_until(
        fwd,
        store,
        cps,
        gen,
        done=lambda: len(producer.visible("y")) == 3,
        most=HELD // SKIP_LIMIT + 2,
    )
    assert [dict(s.headers)["kdelay-id"] for s in producer.visible("y")] == [
        b"m1000",
        b"m1001",
        b"m1002",
    ]
    assert producer.visible("x") == []
    assert store.pending == HELD


def test_a_target_held_and_freed_during_the_pass_keeps_its_order(store: Store) -> None:
    """w fails once, so it is held and passed over among x's entries; its backoff ends while
    the rounds are still working through x: none of w's later entries may leave before the
    one that failed, and all of them, and y's, leave within a bounded number of rounds."""
    w_down = True

    def fail(s: Sent) -> KafkaError | None:
        return KafkaError(KafkaError._TRANSPORT) if s.topic == "w" and w_down else None

    producer = FakeProducer(hold=lambda s: s.topic == "x", fail=fail)
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    fwd = forwarder(store, producer, clock)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    entries = held_then_healthy()
    store.apply(entries[:1], {0: 1})
    checked_round(fwd, store, cps, gen)  # x0 in flight: x is held
    # w's entries lie among x's: w0 after x9, w1 after x24, w2 after x39.
    ws = [(2, i, msg(500 + i, 110 + 15 * i, topic="w")) for i in range(3)]
    store.apply([*entries[1:], *ws], {0: HELD, 1: 3, 2: 3})
    rounds_until(fwd, store, cps, gen, done=lambda: producer.produced[-1].topic == "w", most=4)
    assert store.get("m500") is not None  # w0 failed: w waits out its backoff
    checked_round(fwd, store, cps, gen)  # w is held: the pass passes over w0
    w_down = False
    clock.advance_ms(BACKOFF_MS + 1)  # w's backoff is over, x's records are still in flight
    rounds_until(
        fwd,
        store,
        cps,
        gen,
        done=lambda: len(ids_to(producer, "w")) == 3 and len(ids_to(producer, "y")) == 3,
        most=2 * (HELD // SKIP_LIMIT + 2),
    )
    assert ids_to(producer, "w") == ["m500", "m501", "m502"]
    released_w = [dict(s.headers)["kdelay-id"] for s in producer.produced if s.topic == "w"]
    assert released_w == [b"m500", b"m500", b"m501", b"m502"]  # w1 never before w0
    assert ids_to(producer, "y") == ["m1000", "m1001", "m1002"]
