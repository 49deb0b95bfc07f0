"""Release smoothing (``delay_service/release/smoothing.py``): the token bucket, the round's quota,
and rounds of both forwarders against fakes: a burst of one rate-limited topic leaves at its rate,
in order per partition, while another topic's messages due at the same time leave at once."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kdelay.buffer import Scheduled
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.smoothing import BACKLOG_S, BURST_S, Smoothing, TokenBucket
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store import scans as store_scans
from kdelay.delay_service.store.due_scan import DueScan
from kdelay.delay_service.store.entry import Entry, decode_entry
from kdelay.delay_service.store.store import Store
from tests.support.fakes import FakeClock, FakeProducer, Sent
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, FakeTxnProducer, msg

RATE = 100.0  # messages per second on topic "a": a burst of 10, then 10 per 100 ms
BURST = int(RATE * BURST_S)
A_COUNT = 40
B_COUNT = 5


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


# -- the token bucket ----------------------------------------------------------------------


def test_a_bucket_starts_full_with_its_burst_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(RATE, 10.0)
    assert bucket.available(10.0) == BURST
    bucket.take(BURST, 10.0)
    assert bucket.available(10.0) == 0
    assert bucket.available(10.05) == 5  # 50 ms at 100/s
    assert bucket.available(20.0) == BURST  # idle: no more than its burst


def test_a_bucket_with_a_backlog_keeps_what_it_was_owed_for_a_while() -> None:
    bucket = TokenBucket(RATE, 10.0)
    bucket.take(BURST, 10.0)
    bucket.waiting_at = 10.5
    assert bucket.available(10.5) == 50  # a long pass owed it half a second: it keeps it
    assert bucket.available(15.0) == 500  # ... and five seconds, for a pass that long
    bucket.waiting_at = 30.0  # still waiting
    assert bucket.available(30.0) == RATE * BACKLOG_S  # at most BACKLOG_S worth
    assert bucket.available(40.5) == BURST  # nothing waiting for BACKLOG_S: back to the burst


def test_a_bucket_in_debt_waits_it_out_and_says_when_it_is_ready() -> None:
    bucket = TokenBucket(RATE, 10.0)
    bucket.take(BURST + 5, 10.0)  # more than it held (a round's retry): a debt
    assert bucket.available(10.0) == 0
    assert bucket.ready_in_s(10.0) == pytest.approx(0.15)  # 5 owed + a batch of 10
    assert bucket.available(10.15) == 10


def test_a_slow_rate_still_sends_one_message_at_a_time() -> None:
    bucket = TokenBucket(0.5, 0.0)
    assert bucket.available(0.0) == 1
    bucket.take(1, 0.0)
    assert bucket.ready_in_s(0.0) == pytest.approx(2.0)


# -- the round's quota ---------------------------------------------------------------------


def test_the_quota_admits_a_limited_topic_up_to_its_budget_then_passes_it_over() -> None:
    clock = FakeClock(now_ms=1_000, mono=5.0)
    smoothing = Smoothing(None, {"a": 3.0 / BURST_S}, clock)
    quota = smoothing.skip({("held", 0)})
    assert ("held", 0) in quota
    assert [("a", i % 2) in quota for i in range(5)] == [False, False, False, True, True]
    assert ("b", 0) not in quota  # no limit: never passed over for its rate
    assert smoothing.planned(1_000, set())
    assert smoothing.ready_in_ms() is not None  # "a" waits: the forwarder wakes for it


def test_no_limit_means_no_quota_and_nothing_waits() -> None:
    smoothing = Smoothing(None, {}, FakeClock())
    held = {("x", 0)}
    assert smoothing.skip(held) is held
    assert not smoothing.planned(0, held)
    assert smoothing.ready_in_ms() is None


def test_a_topic_limit_overrides_the_default() -> None:
    smoothing = Smoothing(5.0, {"a": 50.0}, FakeClock())
    assert smoothing.rate_of("a") == 50.0
    assert smoothing.rate_of("other") == 5.0


def test_the_settings_are_validated_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KDELAY_REPLICA_RELEASE_RATE_LIMITS", '{"orders": 200, "audit": 0.5}')
    cfg = ReplicaConfig(name="r1")
    assert cfg.release_rate_limits == {"orders": 200.0, "audit": 0.5}
    assert cfg.release_rate_limit is None
    with pytest.raises(ValidationError, match="'orders': the rate must be a positive number"):
        ReplicaConfig(name="r1", release_rate_limits={"orders": 0})
    with pytest.raises(ValidationError, match="release_rate_limit"):
        ReplicaConfig(name="r1", release_rate_limit=-1)


# -- rounds of both forwarders ---------------------------------------------------------------


def burst() -> list[tuple[int, int, Scheduled]]:
    """A_COUNT entries of "a" (two partitions, due 100..), then B_COUNT of "b", due after."""
    a = [(0, i, msg(i, 100 + i, topic="a", partition=i % 2)) for i in range(A_COUNT)]
    b = [(1, i, msg(1000 + i, 100 + A_COUNT + i, topic="b")) for i in range(B_COUNT)]
    return [*a, *b]


def config(**settings: object) -> ReplicaConfig:
    return ReplicaConfig(
        name="r1",
        release_rate_limits={"a": RATE},
        **{"checkpoint_interval_ms": 1, **settings},  # type: ignore[arg-type]
    )


def at_least_once(
    store: Store, producer: FakeProducer, clock: FakeClock, metrics: Metrics | None = None
) -> Forwarder:
    cfg = config()
    producer.clock = clock
    sender = Sender(
        lambda: producer, buffer_topic=cfg.buffer_topic, produce_timeout_ms=30_000, clock=clock
    )
    return Forwarder(
        cfg,
        store,
        FakeIngest(),
        metrics or Metrics(),
        sender=sender,
        on_fenced=lambda _w: None,
        clock=clock,
    )


def exactly_once(
    store: Store, producer: FakeTxnProducer, clock: FakeClock, metrics: Metrics | None = None
) -> Forwarder:
    cfg = config(delivery="exactly-once", txn_ack_wait_ms=10)
    producer.clock = clock
    sender = TxnSender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=30_000,
        checkpoint_key="set",
        clock=clock,
    )
    fwd = ExactlyOnceForwarder(
        cfg,
        store,
        FakeIngest(),
        metrics or Metrics(),
        sender=sender,
        on_fenced=lambda _w: None,
        clock=clock,
    )
    sender.start()
    return fwd


def released(producer: FakeProducer, topic: str) -> list[Sent]:
    if isinstance(producer, FakeTxnProducer):
        return list(producer.visible(topic))
    return list(producer.to(topic))


def id_of(sent: Sent) -> str:
    found = dict(sent.headers)["kdelay-id"]
    return found.decode() if isinstance(found, bytes) else str(found)


def ids(sent: list[Sent]) -> list[str]:
    return [id_of(s) for s in sent]


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_burst_leaves_at_its_topic_rate_in_order_and_holds_no_other_topic(
    store: Store, mode: str
) -> None:
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    metrics = Metrics()
    producer: FakeProducer
    if mode == "exactly-once":
        producer = FakeTxnProducer()
        fwd = exactly_once(store, producer, clock, metrics)
    else:
        producer = FakeProducer()
        fwd = at_least_once(store, producer, clock, metrics)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    store.apply(burst(), {0: A_COUNT, 1: B_COUNT})
    fwd.forward_once(cps, gen)
    # The first round: a's burst, and every one of b's, though due after all of a's.
    assert len(released(producer, "a")) == BURST
    assert ids(released(producer, "b")) == [f"m{1000 + i}" for i in range(B_COUNT)]
    # The checkpoint stays below a's first entry still pending.
    assert cps.writes[-1][0] < 100 + BURST
    wake_in = fwd.next_wake_ms() - clock.wall_ms()
    assert 0 < wake_in <= 101  # a batch of tokens (100 ms at 100/s), not the next checkpoint
    rounds, per_round = 0, []
    while len(released(producer, "a")) < A_COUNT:
        before = len(released(producer, "a"))
        clock.advance_ms(fwd.next_wake_ms() - clock.wall_ms())
        fwd.forward_once(cps, gen)
        per_round.append(len(released(producer, "a")) - before)
        rounds += 1
        assert rounds < 100
    # Never more than the tokens that accrued: 10 per 100 ms wake-up.
    assert max(per_round) <= 10
    elapsed_s = clock.mono - 50.0
    assert elapsed_s >= (A_COUNT - BURST) / RATE - 0.001
    # Order per partition: each partition of "a" in due order, every message once.
    by_partition: dict[int, list[str]] = defaultdict(list)
    for s in released(producer, "a"):
        by_partition[s.partition].append(id_of(s))
    for partition, got in by_partition.items():
        assert got == [f"m{i}" for i in range(A_COUNT) if i % 2 == partition]
    assert store.pending == 0
    throttled = metrics.registry.get_sample_value(
        "kdelay_replica_release_throttled_total", {"topic": "a"}
    )
    assert throttled == A_COUNT - BURST  # every one after the burst was held back
    delay_sum = metrics.registry.get_sample_value(
        "kdelay_replica_release_smoothing_delay_seconds_sum", {"topic": "a"}
    )
    assert delay_sum is not None
    assert delay_sum > 0
    assert (
        metrics.registry.get_sample_value("kdelay_replica_release_throttled_total", {"topic": "b"})
        is None
    )
    assert (
        metrics.registry.get_sample_value("kdelay_replica_release_rate_limit", {"topic": "a"})
        == RATE
    )


def test_without_a_limit_the_burst_leaves_in_one_round(store: Store) -> None:
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer = FakeProducer()
    cfg = ReplicaConfig(name="r1", checkpoint_interval_ms=1)
    producer.clock = clock
    sender = Sender(lambda: producer, buffer_topic=cfg.buffer_topic, produce_timeout_ms=30_000)
    fwd = Forwarder(
        cfg, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    cps = FakeCheckpoints()
    store.apply(burst(), {0: A_COUNT, 1: B_COUNT})
    fwd.forward_once(cps, fwd.control.activate(cps))
    assert len(producer.to("a")) == A_COUNT


def test_a_throttled_backlog_larger_than_a_scan_passes_over_keeps_order_and_frees_others(
    store: Store,
) -> None:
    """More of a's entries wait than one scan passes over (``scan_skip_limit`` 5): the pass goes
    on from where each scan stopped, so b's entries, due after all of a's, leave within a few
    rounds, while a's leave at its rate and in order per partition even though its budget
    refills in the middle of a pass (the sweep keeps it passed over until the pass ends)."""
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer = FakeProducer()
    cfg = config(scan_skip_limit=5)
    producer.clock = clock
    sender = Sender(
        lambda: producer, buffer_topic=cfg.buffer_topic, produce_timeout_ms=30_000, clock=clock
    )
    fwd = Forwarder(
        cfg, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    store.apply(burst(), {0: A_COUNT, 1: B_COUNT})
    rounds = 0
    while len(released(producer, "b")) < B_COUNT:
        fwd.forward_once(cps, gen)
        clock.advance_ms(5)
        rounds += 1
        assert rounds <= (A_COUNT - BURST) // 5 + 2, "b waited for a's backlog"
    assert len(released(producer, "a")) < A_COUNT  # a is still being smoothed
    while len(released(producer, "a")) < A_COUNT:
        clock.advance_ms(max(1, fwd.next_wake_ms() - clock.wall_ms()))
        fwd.forward_once(cps, gen)
        rounds += 1
        assert rounds < 500
    for partition in (0, 1):
        got = [id_of(s) for s in released(producer, "a") if s.partition == partition]
        assert got == [f"m{i}" for i in range(A_COUNT) if i % 2 == partition]
    assert clock.mono - 50.0 >= (A_COUNT - BURST) / RATE - 0.001


@pytest.mark.parametrize("seed", range(5))
def test_rounds_at_any_pace_never_send_more_than_burst_plus_rate_times_time(seed: int) -> None:
    """Whatever the rounds' pace (sub-millisecond to a second apart), what a topic was sent by
    time t since its first release is at most its burst + rate * t (by the monotonic clock),
    though its bucket keeps up to BACKLOG_S worth while a backlog waits."""
    rng = random.Random(seed)
    clock = FakeClock(now_ms=0, mono=0.0)
    smoothing = Smoothing(None, {"a": RATE}, clock)
    entry = Entry(b"k", msg(0, 0, topic="a"), 0, 0)
    backlog, sent, first = 2_000, 0, None
    while backlog:
        quota = smoothing.skip(set())
        admitted = 0
        while admitted < backlog and ("a", admitted % 2) not in quota:
            admitted += 1
        smoothing.planned(clock.now_ms, set())
        smoothing.released([entry] * admitted, clock.now_ms)
        backlog -= admitted
        sent += admitted
        if first is None and admitted:
            first = clock.mono
        if first is not None:
            assert sent <= BURST + RATE * (clock.mono - first) + 1e-9
        clock.advance(rng.choice([0.0005, 0.005, 0.02, 0.1, 0.3, 1.2]))


def test_a_throttled_backlog_is_not_decoded_again_each_round(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries a scan passed over for their topic's rate stay in the sweep's cache: the next
    round decodes only those its budget admits, not the whole backlog again."""
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer = FakeProducer()
    fwd = at_least_once(store, producer, clock)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    store.apply(burst(), {0: A_COUNT, 1: B_COUNT})
    fwd.forward_once(cps, gen)
    assert len(released(producer, "a")) == BURST
    decoded = 0
    real = decode_entry

    def counting(data: bytes) -> Scheduled:
        nonlocal decoded
        decoded += 1
        return real(data)

    monkeypatch.setattr(store_scans, "decode_entry", counting)
    clock.advance_ms(100)  # 10 tokens at 100/s
    fwd.forward_once(cps, gen)
    assert len(released(producer, "a")) == 2 * BURST
    assert decoded == BURST  # the other 20 of a's backlog were passed over from the cache
    by_partition: dict[int, list[str]] = defaultdict(list)
    for s in released(producer, "a"):
        by_partition[s.partition].append(id_of(s))
    for partition, got in by_partition.items():
        assert got == [f"m{i}" for i in range(2 * BURST) if i % 2 == partition]


def forwarder(
    mode: str, store: Store, clock: FakeClock, **settings: object
) -> tuple[Forwarder, FakeProducer]:
    """A forwarder of ``mode`` (at-least-once or exactly-once) on ``store``, and its producer."""
    if mode == "at-least-once":
        cfg = config(**settings)
        producer = FakeProducer(clock=clock)
        sender = Sender(
            lambda: producer, buffer_topic=cfg.buffer_topic, produce_timeout_ms=30_000, clock=clock
        )
        fwd = Forwarder(
            cfg,
            store,
            FakeIngest(),
            Metrics(),
            sender=sender,
            on_fenced=lambda _w: None,
            clock=clock,
        )
        return fwd, producer
    cfg = config(delivery="exactly-once", txn_ack_wait_ms=10, **settings)
    txn_producer = FakeTxnProducer(clock=clock)
    txn = TxnSender(
        lambda: txn_producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=30_000,
        checkpoint_key="set",
        clock=clock,
    )
    eo = ExactlyOnceForwarder(
        cfg, store, FakeIngest(), Metrics(), sender=txn, on_fenced=lambda _w: None, clock=clock
    )
    txn.start()
    return eo, txn_producer


#: What a scan costs per entry it examines, in simulated seconds: 500 entries take 250 ms, so a
#: pass over 10,000 takes 5 s (a replica passes over 100,000 in about as long as that, or more).
SCAN_COST_S = 0.0005


def _backlog_run(
    store: Store, mode: str, monkeypatch: pytest.MonkeyPatch, seconds: int
) -> tuple[list[int], FakeProducer, dict[str, int]]:
    """A throttled backlog far larger than one scan passes over (10,000 of "a" against
    ``scan_skip_limit`` 500: a sweep pass of 20 rounds), with scans that take time (the clock
    moves with each entry a scan examines, ``SCAN_COST_S``), and b's messages due one every
    50 ms behind it, run for ``seconds``: how many of "a" had left at the end of each second,
    the producer, and b's due times by id. Asserts what holds whatever the rate: "a" never
    above its rate, in order per partition; b leaves as soon as a pass reaches it."""
    backlog, skip_limit = 10_000, 500
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    fwd, producer = forwarder(
        mode, store, clock, scan_skip_limit=skip_limit, checkpoint_interval_ms=100
    )
    scan = store.due_skipping

    def costly(*args: Any, **kwargs: Any) -> DueScan:
        found = scan(*args, **kwargs)
        clock.advance(SCAN_COST_S * (found.skipped + len(found.entries)))
        return found

    monkeypatch.setattr(store, "due_skipping", costly)
    cps = FakeCheckpoints()
    gen = fwd.control.activate(cps)
    a = [(0, i, msg(i, 100 + i % 7, topic="a", partition=i % 2)) for i in range(backlog)]
    b_due = {f"m{100_000 + i}": 1_000_100 + 50 * i for i in range(20 * seconds)}
    b = [(1, i, msg(100_000 + i, due, topic="b")) for i, due in enumerate(b_due.values())]
    store.apply([*a, *b], {0: backlog, 1: len(b)})
    sent_by_second: list[int] = []
    for second in range(seconds):
        while clock.now_ms < 1_000_000 + 1_000 * (second + 1):
            fwd.forward_once(cps, gen)
            clock.advance_ms(max(1, fwd.next_wake_ms() - clock.now_ms))
        sent_by_second.append(len(released(producer, "a")))
    assert sent_by_second[-1] <= BURST + RATE * (clock.mono - 50.0)  # never above its rate
    for partition in (0, 1):
        got = [id_of(s) for s in released(producer, "a") if s.partition == partition]
        want = sorted((i for i in range(backlog) if i % 2 == partition), key=lambda i: 100 + i % 7)
        assert got == [f"m{i}" for i in want[: len(got)]]
    pass_s = backlog * SCAN_COST_S
    late_b = [s.timestamp - b_due[id_of(s)] for s in released(producer, "b")]
    assert len(late_b) >= len(b_due) - 20 * (pass_s + 1)  # all but those due in the last pass
    assert max(late_b) <= 1_000 * (pass_s + 1), max(late_b)
    return sent_by_second, producer, b_due


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_backlog_many_scans_long_leaves_at_its_rate_over_its_passes(
    store: Store, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's measure: over four passes (20 s) "a" leaves at >= 0.9 of its rate. A pass
    meets it in its first round only (the sweep keeps what it passed over passed over), so
    its bucket keeps what it was owed while it waits (``BACKLOG_S``), and it leaves in one
    batch per pass; before, a waiting bucket kept one second's worth, 0.2 of the rate here."""
    sent_by_second, _, _ = _backlog_run(store, mode, monkeypatch, seconds=21)
    measured = sent_by_second[-1] - sent_by_second[0]  # after its first second
    assert measured >= 0.9 * RATE * 20, sent_by_second


@pytest.mark.xfail(
    strict=True,
    reason="a throttled backlog many scans long leaves in batches of what its bucket kept "
    "(BACKLOG_S) when a pass meets it, not in every round: a catch-up scan passed this test "
    "and reached 0.997 of the limit on real Kafka with 1M, but lengthened the other topic's "
    "p99 (8.9 s against 5.2 s), so it is not landed (docs/benchmarks.md, 'Release smoothing "
    "with a large backlog')",
)
@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_backlog_many_scans_long_leaves_at_its_rate_in_every_round_of_a_pass(
    store: Store, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As :func:`_backlog_run`, over 9 s: "a" leaves at >= 0.9 of its rate in any three
    seconds, in every round of a pass, not only in the first one of each pass."""
    sent_by_second, _, _ = _backlog_run(store, mode, monkeypatch, seconds=9)
    per_second = [n - m for m, n in itertools.pairwise(sent_by_second)]
    # Its rate, measured after its first second: in all, and over any three seconds (a
    # catch-up's releases may fall on either side of a second's end).
    assert sum(per_second) >= 0.9 * RATE * len(per_second), per_second
    threes = [sum(per_second[i : i + 3]) for i in range(len(per_second) - 2)]
    assert min(threes) >= 0.8 * 3 * RATE, per_second
