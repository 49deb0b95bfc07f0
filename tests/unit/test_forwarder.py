"""The forwarder's round logic with in-process fakes and a fake clock: order, retry, dead letter,
checkpoint. Time moves only when a test advances the clock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kdelay.buffer import DEAD_LETTER_TOPIC, Cancel, decode
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.sender import ERROR_HEADER, Sender
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.tombstones import Retired
from tests.support.fakes import FakeClock, FakeProducer, Sent
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, ids_to, msg


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


@dataclass
class Rig:
    """A forwarder wired to fakes."""

    fwd: Forwarder
    metrics: Metrics
    clock: FakeClock
    fenced: list[str]
    on_fenced: threading.Event

    def value(self, name: str, **labels: str) -> float:
        """A metric's current value, read through the registry's public API."""
        found = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


def make(store: Store, producer: FakeProducer, **settings: object) -> Rig:
    cfg = ReplicaConfig(
        name="r1",
        checkpoint_interval_ms=settings.pop("checkpoint_interval_ms", 1),  # type: ignore[arg-type]
        dead_letter_after=settings.pop("dead_letter_after", 3),  # type: ignore[arg-type]
        retry_backoff_ms=1,
        retry_backoff_max_ms=1,
        **settings,  # type: ignore[arg-type]
    )
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer.clock = clock
    metrics = Metrics()
    fenced: list[str] = []
    on_fenced = threading.Event()

    def fence(why: str) -> None:
        fenced.append(why)
        on_fenced.set()

    sender = Sender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=cfg.produce_timeout_ms,
        clock=clock,
    )
    fwd = Forwarder(cfg, store, FakeIngest(), metrics, sender=sender, on_fenced=fence, clock=clock)
    return Rig(fwd, metrics, clock, fenced, on_fenced)


def timing_out(failing: set[str]) -> Callable[[Sent], KafkaError | None]:
    """A delivery report that times out the releases of the ids in ``failing`` (as it is then)."""

    def fail(s: Sent) -> KafkaError | None:
        ident = dict(s.headers).get("kdelay-id")
        if ident is not None and ident.decode() in failing:  # type: ignore[union-attr]
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None

    return fail


def test_releases_due_entries_in_key_order_with_delivered_format(store: Store) -> None:
    store.apply([(0, 0, msg(2, 200)), (1, 0, msg(1, 100)), (0, 1, msg(3, 10**15))], {0: 2, 1: 1})
    producer = FakeProducer()
    rig = make(store, producer)
    cps = FakeCheckpoints()
    result = rig.fwd.forward_once(cps, rig.fwd.control.activate(cps))
    assert result.delivered == 2
    assert [s.value for s in producer.to("t")] == [b"v1", b"v2"]
    first = producer.to("t")[0]
    assert first.key == b"k1"
    assert first.partition == 0
    assert first.headers == [("h", b"x"), ("kdelay-id", b"m1"), ("kdelay-deliver-at", b"100")]
    assert first.timestamp == rig.clock.now_ms  # the release time
    assert store.pending == 1
    assert rig.value("kdelay_replica_forwarded_total") == 2
    # The checkpoint claims "now" (not the future m3) and the offsets noted before the scan.
    assert len(cps.writes) == 1
    assert cps.writes[0] == (rig.clock.now_ms, {0: 2, 1: 1})
    assert (cps.records[0].writer, cps.records[0].written_at_ms) == ("r1", rig.clock.now_ms)
    # Tombstones for both delivered ids go to their own buffer partitions.
    tombs = producer.to("__kdelay_buffer")
    assert sorted((s.key, s.partition) for s in tombs) == [(b"m1", 1), (b"m2", 0)]
    assert all(s.value is None for s in tombs)
    assert decode(
        tombs[0].key,
        tombs[0].value,
        [(n, v) for n, v in tombs[0].headers if not isinstance(v, str)],
    ).id in {"m1", "m2"}


def test_transient_failure_holds_later_entries_of_the_same_target(store: Store) -> None:
    store.apply([(0, i, msg(i, 100 + i, partition=0 if i < 3 else 1)) for i in range(5)], {0: 5})
    failing = {"m0"}

    producer = FakeProducer(fail=timing_out(failing))
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    # m1, m2 (same target as m0) were sent in the same round (cannot be recalled) ...
    assert [dict(s.headers)["kdelay-id"] for s in producer.to("t")] == [b"m1", b"m2", b"m3", b"m4"]
    # ... m0 is held, and the claim stays below its due time.
    assert store.get("m0") is not None
    assert cps.writes[-1][0] == 99
    assert rig.value("kdelay_replica_forward_errors_total", error="_MSG_TIMED_OUT") == 1
    failing.clear()
    store.apply([(0, 5, msg(5, 101, partition=0))], {0: 6})
    store.apply([(0, 6, msg(6, 102, partition=1))], {0: 7})
    # While m0 waits out its backoff (the clock has not moved), m5 (same target) waits behind
    # it; m6 flows.
    result = rig.fwd.forward_once(cps, gen)
    assert (result.delivered, result.held) == (1, 2)
    assert store.get("m5") is not None
    assert store.get("m6") is None
    rig.clock.advance_ms(1)  # the backoff (1 ms) is over
    rig.fwd.forward_once(cps, gen)
    ids = [dict(s.headers)["kdelay-id"] for s in producer.to("t")]
    assert ids[-3:] == [b"m6", b"m0", b"m5"]
    assert store.pending == 0


def test_permanent_failure_goes_to_dead_letter_after_n_attempts(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100, topic="gone")), (0, 1, msg(1, 101, topic="ok"))], {0: 2})

    def sync_fail(s: Sent) -> KafkaError | None:
        return KafkaError(KafkaError._UNKNOWN_PARTITION) if s.topic == "gone" else None

    producer = FakeProducer(sync_fail=sync_fail)
    rig = make(store, producer, dead_letter_after=3)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    for _ in range(2):
        rig.fwd.forward_once(cps, gen)
        rig.clock.advance_ms(1_000)  # past the backoff
        assert store.get("m0") is not None
    assert [s.value for s in producer.to("ok")] == [b"v1"]  # the good target kept flowing
    assert producer.to(DEAD_LETTER_TOPIC) == []
    result = rig.fwd.forward_once(cps, gen)
    assert (result.delivered, result.dead_lettered, result.held) == (0, 1, 0)
    dead = producer.to(DEAD_LETTER_TOPIC)
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert headers["kdelay-id"] == b"m0"
    assert headers[ERROR_HEADER] is not None
    assert bytes(headers[ERROR_HEADER]).startswith(b"_UNKNOWN_PARTITION")  # type: ignore[arg-type]
    assert headers["kdelay-target"] == b"gone/0"
    assert store.pending == 0
    assert rig.value("kdelay_replica_dead_lettered_total", reason="_UNKNOWN_PARTITION") == 1
    assert rig.value("kdelay_replica_forward_errors_total", error="_UNKNOWN_PARTITION") == 3
    assert rig.value("kdelay_replica_forwarded_total") == 1  # dead letters are not deliveries


def test_an_unacknowledged_dead_letter_is_tried_again(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100, topic="gone"))], {0: 1})
    dead_letter_down = True

    def fail(s: Sent) -> KafkaError | None:
        if s.topic == "gone":
            return KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
        if s.topic == DEAD_LETTER_TOPIC and dead_letter_down:
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None

    producer = FakeProducer(fail=fail)
    rig = make(store, producer, dead_letter_after=1)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    result = rig.fwd.forward_once(cps, gen)
    assert (result.dead_lettered, result.held, result.claim_ms) == (0, 1, 99)
    assert store.get("m0") is not None
    # A failed dead-letter write backs off like a failed release: nothing is tried meanwhile.
    dead_letter_down = False
    written = len(producer.to(DEAD_LETTER_TOPIC))
    result = rig.fwd.forward_once(cps, gen)
    assert (result.dead_lettered, result.held) == (0, 1)
    assert len(producer.to(DEAD_LETTER_TOPIC)) == written
    assert rig.value("kdelay_replica_dead_letter_errors_total", error="_MSG_TIMED_OUT") == 1
    rig.clock.advance_ms(1)  # the backoff (1 ms) is over
    result = rig.fwd.forward_once(cps, gen)
    assert (result.dead_lettered, result.held) == (1, 0)
    assert store.pending == 0


def test_transient_errors_are_never_dead_lettered(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer(fail=lambda _s: KafkaError(KafkaError._TRANSPORT))
    rig = make(store, producer, dead_letter_after=1)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    for _ in range(4):
        rig.fwd.forward_once(cps, gen)
        rig.clock.advance_ms(1_000)  # past the backoff
    assert producer.to(DEAD_LETTER_TOPIC) == []
    assert rig.value("kdelay_replica_forward_errors_total", error="_TRANSPORT") == 4
    assert store.get("m0") is not None


def test_claim_never_moves_backwards(store: Store) -> None:
    producer = FakeProducer()
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    first = cps.writes[-1][0]
    assert first == rig.clock.now_ms
    store.apply([(0, 0, msg(0, 5, topic="gone"))], {0: 1})  # a failing late arrival
    producer.sync_fail = lambda _s: KafkaError(KafkaError._TRANSPORT)
    rig.clock.advance_ms(1_000)
    result = rig.fwd.forward_once(cps, gen)
    assert result.claim_ms == 4  # this round alone could claim only below the late arrival
    assert len(cps.writes) == 2
    assert cps.writes[-1][0] == first  # but the written claim stays where it was


def test_a_stale_generation_sends_nothing(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer()
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.control.deactivate("lost leadership")
    result = rig.fwd.forward_once(cps, gen)
    assert producer.sent == []
    assert (result.delivered, result.held, result.claim_ms) == (0, 1, 99)


def test_fenced_write_deactivates_and_reports(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer()
    rig = make(store, producer)
    cps = FakeCheckpoints(fenced=True)
    rig.fwd.control.activate(cps)
    thread = threading.Thread(target=rig.fwd.run)
    thread.start()
    try:
        assert rig.on_fenced.wait(10), "a rejected checkpoint write must call on_fenced"
        assert rig.fenced == ["newer epoch"]
        assert not rig.fwd.active.is_set()
        assert producer.to("t") == []  # the initial (fenced) write came before any record
    finally:
        rig.fwd.control.shutdown()
        thread.join(10)
    assert not thread.is_alive()


def test_cancelled_ids_get_tombstones_only_on_the_master(store: Store) -> None:
    producer = FakeProducer()
    rig = make(store, producer)
    rig.fwd.control.add_tombstones([Retired("x", "", 3, 7)])  # not master: ignored
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.control.add_tombstones([Retired("y", "", 2, 9)])
    store.apply([(2, 9, Cancel("y"))], {2: 10})
    rig.fwd.forward_once(cps, gen)
    tombs = producer.to("__kdelay_buffer")
    assert [(s.key, s.partition) for s in tombs] == [(b"y", 2)]


def test_a_held_target_filling_the_scan_does_not_starve_the_others(store: Store) -> None:
    # 12 entries for "x" come first in key order; the scan takes at most 5 per round.
    store.apply([(0, i, msg(i, 100 + i, topic="x")) for i in range(12)], {0: 12})
    store.apply([(1, i, msg(100 + i, 200 + i, topic="y")) for i in range(3)], {1: 3})
    producer = FakeProducer(hold=lambda s: s.topic == "x")  # x never acknowledges
    rig = make(store, producer, scan_batch=5)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.clock.advance_ms(1_000)  # everything is due
    first = rig.fwd.forward_once(cps, gen)  # x0..x4 fill the scan and stay in flight
    assert first.delivered == 0
    second = rig.fwd.forward_once(cps, gen)  # x is held: its 12 entries are passed over
    assert second.delivered == 3
    assert ids_to(producer, "y") == ["m100", "m101", "m102"]
    assert second.held == 12
    assert second.claim_ms == 99  # below x0, the earliest entry still pending
    assert [s.topic for s, _ in producer.queued] == ["x"] * 5  # x5.. wait behind x0..x4
    assert rig.value("kdelay_replica_targets_held") == 1
    assert rig.value("kdelay_replica_in_flight_messages") == 5


def test_a_silent_target_does_not_hold_up_the_round_for_others(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100, topic="slow")), (0, 1, msg(1, 101, topic="t"))], {0: 2})
    producer = FakeProducer(hold=lambda s: s.topic == "slow")
    rig = make(store, producer, round_ack_wait_ms=20)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    before = rig.clock.mono
    result = rig.fwd.forward_once(cps, gen)
    assert result.delivered == 1
    assert rig.clock.mono - before <= 0.025  # waited for "slow" no longer than round_ack_wait
    # Later rounds do not wait for it at all: the silent record is not sent again.
    store.apply([(0, 2, msg(2, rig.clock.now_ms, topic="t"))], {0: 3})
    before = rig.clock.mono
    result = rig.fwd.forward_once(cps, gen)
    assert (result.delivered, rig.clock.mono) == (1, before)
    assert ids_to(producer, "t") == ["m1", "m2"]
    assert cps.writes[-1][0] == 99  # the claim stays below the record in flight
    assert store.get("m0") is not None
    # Its report arrives later: the next round settles it.
    producer.hold = lambda _s: False
    rig.fwd.forward_once(cps, gen)
    assert store.pending == 0
    assert ids_to(producer, "slow") == ["m0"]


def test_a_target_with_records_in_flight_gets_nothing_new_until_they_are_settled(
    store: Store,
) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer(hold=lambda _s: True)
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    store.apply([(0, 1, msg(1, 50))], {0: 2})  # a late arrival for the same target
    rig.fwd.forward_once(cps, gen)
    assert [s.value for s, _ in producer.queued] == [b"v0"]  # m1 waits for m0's report
    producer.hold = lambda _s: False
    rig.fwd.forward_once(cps, gen)  # settles m0, then sends m1
    assert ids_to(producer, "t") == ["m0", "m1"]
    assert store.pending == 0


def test_a_timed_out_target_is_retried_in_key_order_after_its_backoff(store: Store) -> None:
    store.apply([(0, i, msg(i, 100 + i, topic="x")) for i in range(3)], {0: 3})
    down = True
    producer = FakeProducer(hold=lambda s: down and s.topic == "x")
    rig = make(store, producer, produce_timeout_ms=1_000)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    assert len(producer.queued) == 3
    rig.clock.advance_ms(32_000)  # message.timeout.ms + the margin: declared timed out
    result = rig.fwd.forward_once(cps, gen)  # settled; x backs off, nothing is resent yet
    assert (result.delivered, result.held) == (0, 3)
    assert rig.value("kdelay_replica_forward_errors_total", error="_MSG_TIMED_OUT") == 3
    producer.queued.clear()  # the timed-out producer was dropped with its queue
    down = False
    rig.clock.advance_ms(1)  # past the backoff
    rig.fwd.forward_once(cps, gen)
    assert ids_to(producer, "x") == ["m0", "m1", "m2"]
    assert store.pending == 0


def test_tombstones_are_written_early_when_many_are_queued(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kdelay.delay_service.store.tombstones.FLUSH_AT", 3)
    producer = FakeProducer()
    rig = make(store, producer, checkpoint_interval_ms=60_000)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.clock.advance_ms(60_000)
    rig.fwd.forward_once(cps, gen)  # the interval has passed: a checkpoint; it starts again
    assert len(cps.writes) == 1
    store.apply([(0, i, msg(i, 100 + i)) for i in range(3)], {0: 3})
    rig.fwd.forward_once(cps, gen)
    assert len(cps.writes) == 2  # the interval has not passed, but the queue is full
    assert len(producer.to("__kdelay_buffer")) == 3


def test_queued_tombstones_are_written_even_when_the_term_ends_fenced(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer()
    rig = make(store, producer, checkpoint_interval_ms=60_000)
    cps = FakeCheckpoints()
    delivered = threading.Event()
    original = producer.poll

    def poll(timeout: float = -1) -> int:
        done = original(timeout)
        if producer.to("t"):
            cps.fenced = True  # a newer master exists: the final checkpoint write fails
            delivered.set()
        return done

    producer.poll = poll  # type: ignore[method-assign]
    rig.fwd.control.activate(cps)
    thread = threading.Thread(target=rig.fwd.run)
    thread.start()
    try:
        assert delivered.wait(10)
        rig.fwd.control.deactivate("stepping down")
        assert rig.on_fenced.wait(10), "the rejected final write must be reported"
    finally:
        rig.fwd.control.shutdown()
        thread.join(10)
    assert not thread.is_alive()
    assert [s.key for s in producer.to("__kdelay_buffer")] == [b"m0"]


def test_an_entry_that_falls_due_during_a_round_is_owed_at_once(store: Store) -> None:
    """A round that takes 20 ms: an entry due 5 ms after it planned must wake the next round
    at once, not wait for the next due time or checkpoint refresh (it was ~1 s late)."""
    producer = FakeProducer()
    rig = make(store, producer)
    now = rig.clock.now_ms
    store.apply([(0, 0, msg(1, now)), (0, 1, msg(2, now + 5)), (0, 2, msg(3, now + 10**6))], {0: 3})
    cps = FakeCheckpoints()
    generation = rig.fwd.control.activate(cps)
    # The round's acknowledgements take 20 ms: m2 falls due while it runs.
    poll = producer.poll

    def slow_poll(timeout: float = -1) -> int:
        rig.clock.advance_ms(20)
        return poll(timeout)

    producer.poll = slow_poll  # type: ignore[method-assign]
    result = rig.fwd.forward_once(cps, generation)
    assert result.delivered == 1
    assert rig.clock.now_ms >= now + 20
    assert rig.fwd.next_wake_ms() <= now + 5  # the wake-up is the point
    assert rig.fwd.forward_once(cps, generation).delivered == 1
    assert [s.value for s in producer.to("t")] == [b"v1", b"v2"]


@pytest.mark.parametrize(
    ("failed_partition", "later_partition"),
    [(-1, 1), (1, -1)],
    ids=["placed-by-key-holds-explicit", "explicit-holds-placed-by-key"],
)
def test_a_held_target_holds_every_target_that_may_be_the_same_partition(
    store: Store, failed_partition: int, later_partition: int
) -> None:
    """A release without a partition (-1) lands where its key picks, which only the producer
    knows: a held (t, -1) holds (t, p) and a held (t, p) holds (t, -1), or a later-due
    message may overtake the held one in the partition they share."""
    store.apply([(0, 0, msg(0, 100, partition=failed_partition))], {0: 1})
    failing = {"m0"}

    producer = FakeProducer(fail=timing_out(failing))
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    assert store.get("m0") is not None  # failed: held for its backoff
    failing.clear()
    store.apply([(0, 1, msg(1, 101, partition=later_partition))], {0: 2})
    store.apply([(0, 2, msg(2, 102, topic="u", partition=later_partition))], {0: 3})
    result = rig.fwd.forward_once(cps, gen)  # m0's backoff is running: m1 waits behind it
    assert store.get("m1") is not None
    assert store.get("m2") is None  # another topic flows
    assert result.delivered == 1
    rig.clock.advance_ms(1)  # the backoff (1 ms) is over
    rig.fwd.forward_once(cps, gen)
    rig.fwd.forward_once(cps, gen)
    assert ids_to(producer, "t")[-2:] == ["m0", "m1"]
    assert store.pending == 0


def test_a_release_placed_by_key_held_behind_another_partition_holds_every_partition(
    store: Store,
) -> None:
    """Held as a possible same partition, a release placed by key holds its topic's others in
    turn: (t, 3) held holds m1 (t, -1), which may land in partition 0, so m2 (t, 0), due after
    it, waits too (the one-hour chaos run, seed 2026: three keyed messages overtaken by
    explicit-partition ones in partitions 0, 1 and 2 while partition 3 was held)."""
    store.apply([(0, 0, msg(0, 100, partition=3))], {0: 1})
    failing = {"m0"}
    producer = FakeProducer(fail=timing_out(failing))
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = rig.fwd.control.activate(cps)
    rig.fwd.forward_once(cps, gen)
    assert store.get("m0") is not None  # failed: (t, 3) held for its backoff
    failing.clear()
    store.apply([(0, 1, msg(1, 101, partition=-1)), (0, 2, msg(2, 102, partition=0))], {0: 3})
    rig.fwd.forward_once(cps, gen)  # m0's backoff is running
    assert store.get("m1") is not None
    assert store.get("m2") is not None  # behind m1, which may be its partition
    rig.clock.advance_ms(1)  # the backoff (1 ms) is over
    for _ in range(3):
        rig.fwd.forward_once(cps, gen)
    assert ids_to(producer, "t") == ["m0", "m1", "m2"]
