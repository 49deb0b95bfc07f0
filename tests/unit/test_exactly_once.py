"""Exactly-once rounds with in-process fakes: what one transaction holds, what an abort leaves,
which checkpoint a new term starts from. The real thing: tests/integration/test_exactly_once.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from kdelay.checkpoint import Checkpoint, CheckpointRecord
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release import exactly_once
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.store import Store
from kdelay.topics import CHECKPOINT_TOPIC
from kdelay.zk.errors import FencedError
from tests.support.fakes import FakeClock, Sent
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, FakeTxnProducer, msg


@dataclass
class Rig:
    fwd: ExactlyOnceForwarder
    producer: FakeTxnProducer
    metrics: Metrics
    clock: FakeClock
    sender: TxnSender  # the forwarder's, as injected

    def value(self, name: str, **labels: str) -> float:
        found = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def make(store: Store, producer: FakeTxnProducer, **settings: object) -> Rig:
    cfg = ReplicaConfig(
        name="r1",
        delivery="exactly-once",
        checkpoint_interval_ms=1,
        dead_letter_after=settings.pop("dead_letter_after", 3),  # type: ignore[arg-type]
        retry_backoff_ms=1,
        retry_backoff_max_ms=1,
        txn_ack_wait_ms=10,
        **settings,  # type: ignore[arg-type]
    )
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer.clock = clock
    metrics = Metrics()
    sender = TxnSender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=cfg.produce_timeout_ms,
        checkpoint_key="set",
        clock=clock,
    )
    fwd = ExactlyOnceForwarder(
        cfg, store, FakeIngest(), metrics, sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    return Rig(fwd, producer, metrics, clock, sender)


def ids(sent: list[Sent]) -> list[bytes | str | None]:
    return [dict(s.headers).get("kdelay-id") for s in sent]


def start(rig: Rig, cps: FakeCheckpoints) -> int:
    gen = rig.fwd.control.activate(cps)
    rig.sender.start()  # what _serve does first: init_transactions
    return gen


def not_leader_for(failing: set[bytes]) -> Callable[[Sent], KafkaError | None]:
    """A delivery report that fails the releases of the ids in ``failing`` (as it is then)."""
    return lambda s: (
        KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
        if dict(s.headers).get("kdelay-id") in failing
        else None
    )


def test_a_round_commits_releases_tombstones_and_its_checkpoint_together(store: Store) -> None:
    store.apply([(0, 0, msg(1, 100)), (1, 0, msg(2, 200)), (0, 1, msg(3, 10**15))], {0: 2, 1: 1})
    rig = make(store, FakeTxnProducer())
    cps = FakeCheckpoints()
    result = rig.fwd.forward_once(cps, start(rig, cps))
    assert result.delivered == 2
    p = rig.producer
    assert (p.inits, p.commits, p.aborts) == (1, 1, 0)
    assert ids(p.visible("t")) == [b"m1", b"m2"]
    assert sorted(s.key or b"" for s in p.visible("__kdelay_buffer")) == [b"m1", b"m2"]
    [cp] = p.visible(CHECKPOINT_TOPIC)
    record = CheckpointRecord.decode(cp.value or b"")
    assert (record.time_ms, dict(record.offsets)) == (rig.clock.now_ms, {0: 2, 1: 1})
    assert cp.key == b"set"
    assert store.pending == 1
    assert cps.writes[-1][0] == rig.clock.now_ms  # ZooKeeper's copy, after the commit
    assert rig.value("kdelay_replica_transactions_total", outcome="committed") == 1
    for phase in ("send", "acks", "commit"):  # where the round's time went, one each
        assert rig.value("kdelay_replica_round_phase_seconds_count", phase=phase) == 1


def test_a_failing_target_aborts_the_round_and_only_it_is_held(store: Store) -> None:
    store.apply([(0, 0, msg(1, 100, topic="bad")), (0, 1, msg(2, 100, topic="good"))], {0: 2})
    failing = {"bad"}
    producer = FakeTxnProducer(
        fail=lambda s: (
            KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION) if s.topic in failing else None
        )
    )
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    first = rig.fwd.forward_once(cps, gen)
    assert first.delivered == 0
    assert (producer.commits, producer.aborts) == (0, 1)
    assert producer.committed == []  # nothing of the aborted round is visible
    assert store.pending == 2
    assert rig.value("kdelay_replica_round_phase_seconds_count", phase="acks") == 1
    assert rig.value("kdelay_replica_round_phase_seconds_count", phase="commit") == 0
    second = rig.fwd.forward_once(cps, gen)  # "bad" waits out its backoff; "good" goes alone
    assert second.delivered == 1
    assert ids(producer.visible("good")) == [b"m2"]
    [cp] = producer.visible(CHECKPOINT_TOPIC)
    assert CheckpointRecord.decode(cp.value or b"").time_ms == 99  # below "bad"'s due time
    # Its backoff over, "bad" is first asked for by metadata: still leaderless, so it joins
    # no transaction (none is aborted) and waits another backoff.
    producer.leaderless.add("bad")
    rig.clock.advance_ms(2)
    store.apply([(0, 2, msg(3, 101, topic="good"))], {0: 3})
    third = rig.fwd.forward_once(cps, gen)
    assert (third.delivered, producer.probes) == (1, ["bad"])
    assert (producer.commits, producer.aborts) == (2, 1)
    producer.leaderless.clear()
    failing.clear()
    rig.clock.advance_ms(2)
    rig.fwd.forward_once(cps, gen)
    assert ids(producer.visible("bad")) == [b"m1"]
    assert store.pending == 0
    assert rig.value("kdelay_replica_transactions_total", outcome="aborted") == 1


def test_a_permanent_error_dead_letters_in_the_transaction_of_its_checkpoint(
    store: Store,
) -> None:
    store.apply([(0, 0, msg(1, 100, topic="gone"))], {0: 1})
    producer = FakeTxnProducer(
        fail=lambda s: KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if s.topic == "gone" else None
    )
    rig = make(store, producer, dead_letter_after=2)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    for _ in range(3):
        rig.fwd.forward_once(cps, gen)
        rig.clock.advance_ms(2)
    [dead] = producer.visible("__kdelay_dead_letter")
    error = dict(dead.headers)["kdelay-error"]
    assert isinstance(error, bytes)
    assert error.startswith(b"UNKNOWN_TOPIC_OR_PART")
    assert len(producer.visible(CHECKPOINT_TOPIC)) == 1  # committed with it
    assert store.pending == 0
    assert rig.value("kdelay_replica_dead_lettered_total", reason="UNKNOWN_TOPIC_OR_PART") == 1


@pytest.mark.parametrize("arrival", ["failing target", "target held behind a retry"])
def test_an_entry_already_due_when_it_arrives_is_never_covered_while_pending(
    store: Store, arrival: str
) -> None:
    """Found by CI (messages due at once to a bad target vanished: neither released nor
    dead-lettered). A round committed the claim (T, O); then an entry due before T arrives
    (a delay of 0, a deliver-at in the past) at an offset past O[p]. A later round that cannot
    release it must not claim T with the new offsets: that covers it, and the checkpoint drops
    it from every store. The claim keeps its old offsets until its time can pass the entry."""
    producer = FakeTxnProducer(
        fail=lambda s: KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if s.topic == "gone" else None
    )
    # After its first failure, the metadata probe says so too (a permanent error).
    producer.invalid["gone"] = KafkaError(KafkaError.TOPIC_EXCEPTION)
    rig = make(store, producer, dead_letter_after=3)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    now = rig.clock.now_ms
    store.apply([(0, 0, msg(1, now - 10, topic="good"))], {0: 1})
    rig.fwd.forward_once(cps, gen)
    assert ids(producer.visible("good")) == [b"m1"]  # claim (now, {0: 1}) committed
    rig.clock.advance_ms(5)
    if arrival == "failing target":
        late = [(0, 1, msg(2, now - 5, topic="gone"))]
    else:  # an earlier entry of its target fails first and holds it
        late = [(0, 1, msg(2, now - 8, topic="gone")), (1, 0, msg(3, now - 5, topic="gone"))]
    store.apply(late, {0: 2, 1: 1} if len(late) == 2 else {0: 2})
    dead_ids: list[bytes | str | None] = []
    for _ in range(12):
        rig.fwd.forward_once(cps, gen)
        rig.clock.advance_ms(2)
        dead_ids = ids(producer.visible("__kdelay_dead_letter"))
        for cp in producer.visible(CHECKPOINT_TOPIC):
            record = CheckpointRecord.decode(cp.value or b"")
            claim = Checkpoint(record.time_ms, record.offsets)
            for partition, offset, m in late:
                if claim.covers(partition, offset, m.deliver_at_ms):
                    assert m.id.encode() in dead_ids, f"{m.id} covered, never dead-lettered"
    assert sorted(i or b"" for i in dead_ids) == sorted(m.id.encode() for _, _, m in late)
    assert store.pending == 0


def test_a_fenced_commit_stops_the_master_and_keeps_the_entries(store: Store) -> None:
    store.apply([(0, 0, msg(1, 100))], {0: 1})
    producer = FakeTxnProducer(fence_at_commit=True)
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    with pytest.raises(FencedError):
        rig.fwd.forward_once(cps, gen)
    assert producer.committed == []
    assert store.pending == 1  # the next master releases it
    with pytest.raises(Exception, match="new term"):
        rig.sender.begin()  # no lazy producer after a fence


@dataclass
class FencedAtPoll(FakeTxnProducer):
    """librdkafka raising the fatal error from poll(), as a stalled master saw on waking."""

    def poll(self, timeout: float = -1) -> int:
        if self.queued:
            raise KafkaException(
                KafkaError(
                    KafkaError._FENCED, "Failed to add partitions to transaction", fatal=True
                )
            )
        return super().poll(timeout)


def test_a_fence_raised_by_poll_stops_the_master_like_any_other(store: Store) -> None:
    store.apply([(0, 0, msg(1, 100))], {0: 1})
    producer = FencedAtPoll()
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    with pytest.raises(FencedError, match="poll fenced"):
        rig.fwd.forward_once(cps, gen)
    assert producer.committed == []
    assert store.pending == 1  # the next master releases it


@pytest.mark.parametrize(
    ("kafka_epoch", "zk_epoch", "expected"),
    [
        (3, 3, "kafka"),
        (2, 3, "zookeeper"),
        (4, 3, "kafka"),
        (None, 3, "zookeeper"),
        (3, None, "kafka"),
    ],
)
def test_a_new_term_starts_from_the_newer_checkpoint_kafka_on_a_tie(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    kafka_epoch: int | None,
    zk_epoch: int | None,
    expected: str,
) -> None:
    def doc(epoch: int | None, time_ms: int) -> bytes | None:
        return None if epoch is None else CheckpointRecord(time_ms, {0: 1}, epoch, "w").encode()

    kafka_doc, zk_doc = doc(kafka_epoch, 111), doc(zk_epoch, 222)
    monkeypatch.setattr(exactly_once, "load_checkpoint", lambda _cfg: kafka_doc)

    class Checkpoints(FakeCheckpoints):
        def load(self) -> bytes | None:
            return zk_doc

    rig = make(store, FakeTxnProducer())
    loaded = rig.fwd.load_checkpoint(Checkpoints())
    assert loaded == (kafka_doc if expected == "kafka" else zk_doc)


def test_the_forwarder_thread_runs_a_term_and_stops(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.apply([(0, 0, msg(1, 100))], {0: 1})
    producer = FakeTxnProducer()
    rig = make(store, producer)
    monkeypatch.setattr(exactly_once, "load_checkpoint", lambda _cfg: None)  # no Kafka copy
    cps = FakeCheckpoints()
    thread = threading.Thread(target=rig.fwd.run)
    thread.start()
    rig.fwd.control.activate(cps)
    assert rig.fwd.active.wait(5)
    for _ in range(100):
        if producer.visible("t"):
            break
        rig.clock.advance_ms(1)
        threading.Event().wait(0.01)
    rig.fwd.control.shutdown()
    thread.join(10)
    assert ids(producer.visible("t")) == [b"m1"]
    assert producer.inits == 1


def test_a_broker_slow_for_everyone_still_gets_rounds_committed(store: Store) -> None:
    """Acknowledgements that take longer than txn_ack_wait_ms for every target: the first
    round aborts, the next waits twice as long (and so on): no livelock of aborts."""
    store.apply([(0, i, msg(i, 100, topic="t", partition=i % 2)) for i in range(4)], {0: 4})
    producer = FakeTxnProducer()
    clock_of = producer  # acknowledgements come 25 ms after the transaction began
    producer.hold = lambda _s: (
        clock_of.clock is not None and clock_of.clock.mono - clock_of.begun < 0.025
    )
    rig = make(store, producer)  # txn_ack_wait_ms=10
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    delivered = 0
    for _ in range(6):
        delivered += rig.fwd.forward_once(cps, gen).delivered
        rig.clock.advance_ms(2)
        if delivered == 4:
            break
    assert delivered == 4
    assert producer.aborts >= 1  # the first wait was too short
    assert ids(producer.visible("t")) == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.parametrize(
    ("failed_partition", "later_partition"),
    [(-1, 1), (1, -1)],
    ids=["placed-by-key-holds-explicit", "explicit-holds-placed-by-key"],
)
def test_an_aborted_release_holds_every_target_that_may_be_its_partition(
    store: Store, failed_partition: int, later_partition: int
) -> None:
    """After an aborted round, a later-due release that may share the failed one's partition
    (one placed by key, -1, the other explicit) waits behind it: it never commits first."""
    store.apply([(0, 0, msg(0, 100, partition=failed_partition))], {0: 1})
    failing = {b"m0"}
    producer = FakeTxnProducer(fail=not_leader_for(failing))
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    rig.fwd.forward_once(cps, gen)
    assert producer.aborts == 1
    failing.clear()
    store.apply([(0, 1, msg(1, 101, partition=later_partition))], {0: 2})
    store.apply([(0, 2, msg(2, 102, topic="u", partition=later_partition))], {0: 3})
    second = rig.fwd.forward_once(cps, gen)  # m0 waits out its backoff, and m1 behind it
    assert second.delivered == 1
    assert ids(producer.visible("u")) == [b"m2"]
    assert producer.visible("t") == []
    rig.clock.advance_ms(2)
    rig.fwd.forward_once(cps, gen)
    rig.fwd.forward_once(cps, gen)
    assert ids(producer.visible("t")) == [b"m0", b"m1"]
    assert store.pending == 0


@pytest.mark.parametrize("later", [[-1], [-1, 0]], ids=["keyed", "keyed-then-partition-0"])
def test_a_release_that_may_share_a_leaderless_partition_waits_behind_it(
    store: Store, later: list[int]
) -> None:
    """A target that failed and still has no leader is left out of the round by a metadata
    probe: a later-due release placed by key in its topic waits behind it, though the topic
    has a partition with a leader; and, left out in turn, it holds a release to (t, 0) due
    after it, which may be its partition."""
    store.apply([(0, 0, msg(0, 100, partition=1))], {0: 1})
    failing = {b"m0"}
    producer = FakeTxnProducer(fail=not_leader_for(failing))
    rig = make(store, producer)
    cps = FakeCheckpoints()
    gen = start(rig, cps)
    rig.fwd.forward_once(cps, gen)  # m0 fails: (t, 1) held
    failing.clear()
    producer.leaderless_partitions.add(("t", 1))
    n = len(later)
    store.apply([(0, i, msg(i, 100 + i, partition=p)) for i, p in enumerate(later, 1)], {0: n + 1})
    rig.clock.advance_ms(2)  # m0's backoff is over: the probe finds (t, 1) leaderless
    rig.fwd.forward_once(cps, gen)
    assert producer.probes == ["t"]
    assert producer.visible("t") == []  # none of them overtook m0
    producer.leaderless_partitions.clear()
    rig.clock.advance_ms(2)
    for _ in range(n + 1):
        rig.fwd.forward_once(cps, gen)
    assert ids(producer.visible("t")) == [f"m{i}".encode() for i in range(n + 1)]
