"""The forwarder's round logic with in-process fakes: order, retry, dead letter, checkpoint."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from prometheus_client import Counter

from delay_service.config import ReplicaConfig
from delay_service.forwarder import ERROR_HEADER, Forwarder
from delay_service.metrics import Metrics
from delay_service.store import Store
from kdelay.buffer import DEAD_LETTER_TOPIC, Cancel, Scheduled, decode
from zk.errors import FencedError

Callback = Callable[[KafkaError | None, Message], None]


@dataclass
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int
    timestamp: int
    headers: list[tuple[str, str | bytes | None]]


@dataclass
class FakeProducer:
    """Acknowledges at poll(); ``fail`` decides an error per record (None: success)."""

    fail: Callable[[Sent], KafkaError | None] = lambda _s: None
    sync_fail: Callable[[Sent], KafkaError | None] = lambda _s: None
    sent: list[Sent] = field(default_factory=list)
    queued: list[tuple[Sent, Callback | None]] = field(default_factory=list)

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callback | None = None,
        on_delivery: Callback | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        assert not isinstance(value, str)
        assert not isinstance(key, str)
        sent = Sent(topic, key, value, partition, timestamp, list(headers or []))
        err = self.sync_fail(sent)
        if err is not None:
            raise KafkaException(err)
        self.queued.append((sent, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        done, self.queued = self.queued, []
        for sent, cb in done:
            err = self.fail(sent)
            if err is None:
                self.sent.append(sent)
            if cb is not None:
                cb(err, None)  # type: ignore[arg-type]
        return len(done)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def to(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]


@dataclass
class FakeCheckpoints:
    epoch: int | None = None
    writes: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    fenced: bool = False

    def claim_epoch(self) -> int:
        self.epoch = 1
        return 1

    def load(self) -> None:
        return None

    def write(self, time_ms: int, offsets: Mapping[int, int]) -> object:
        if self.fenced:
            raise FencedError("newer epoch")
        self.writes.append((time_ms, dict(offsets)))
        return None


class FakeIngest:
    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool:
        return True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def make(
    store: Store, producer: FakeProducer, **settings: object
) -> tuple[Forwarder, Metrics, list[str]]:
    cfg = ReplicaConfig(
        name="r1",
        checkpoint_interval_ms=settings.pop("checkpoint_interval_ms", 1),  # type: ignore[arg-type]
        dead_letter_after=settings.pop("dead_letter_after", 3),  # type: ignore[arg-type]
        retry_backoff_ms=1,
        retry_backoff_max_ms=1,
        **settings,  # type: ignore[arg-type]
    )
    metrics = Metrics()
    fenced: list[str] = []
    fwd = Forwarder(
        cfg,
        store,
        FakeIngest(),
        metrics,
        producer_factory=lambda: producer,
        on_fenced=fenced.append,
    )
    return fwd, metrics, fenced


def msg(i: int, at: int, topic: str = "t", partition: int = 0) -> Scheduled:
    return Scheduled(
        f"m{i}", topic, partition, f"k{i}".encode(), f"v{i}".encode(), at, (("h", b"x"),)
    )


def activate(fwd: Forwarder, cps: FakeCheckpoints) -> int:
    """Activate and return the generation (what run() would do before its loop)."""
    fwd.activate(cps)
    cps.claim_epoch()
    return fwd._generation


def value(metric: Counter, *labels: str) -> float:
    m = metric.labels(*labels) if labels else metric
    return float(m._value.get())


def test_releases_due_entries_in_key_order_with_delivered_format(store: Store) -> None:
    store.apply([(0, 0, msg(2, 200)), (1, 0, msg(1, 100)), (0, 1, msg(3, 10**15))], {0: 2, 1: 1})
    producer = FakeProducer()
    fwd, metrics, _ = make(store, producer)
    cps = FakeCheckpoints()
    result = fwd.forward_once(cps, activate(fwd, cps))
    assert result.delivered == 2
    assert [s.value for s in producer.to("t")] == [b"v1", b"v2"]
    first = producer.to("t")[0]
    assert first.key == b"k1"
    assert first.partition == 0
    assert first.headers == [("h", b"x"), ("kdelay-id", b"m1"), ("kdelay-deliver-at", b"100")]
    assert first.timestamp >= 100
    assert store.pending == 1
    assert value(metrics.forwarded) == 2
    # The checkpoint claims "now" and the offsets noted before the scan.
    assert len(cps.writes) == 1
    claim_time, claim_offsets = cps.writes[0]
    assert claim_offsets == {0: 2, 1: 1}
    assert 200 <= claim_time < 10**15
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

    def fail(s: Sent) -> KafkaError | None:
        ident = dict(s.headers).get("kdelay-id")
        if ident is not None and ident.decode() in failing:  # type: ignore[union-attr]
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None

    producer = FakeProducer(fail=fail)
    fwd, metrics, _ = make(store, producer)
    cps = FakeCheckpoints()
    gen = activate(fwd, cps)
    fwd.forward_once(cps, gen)
    # m1, m2 (same target as m0) were sent in the same round (cannot be recalled) ...
    assert [dict(s.headers)["kdelay-id"] for s in producer.to("t")] == [b"m1", b"m2", b"m3", b"m4"]
    # ... m0 is held, and the claim stays below its due time.
    assert store.get("m0") is not None
    assert cps.writes[-1][0] == 99
    assert value(metrics.forward_errors, "_MSG_TIMED_OUT") == 1
    failing.clear()
    store.apply([(0, 5, msg(5, 101, partition=0))], {0: 6})
    store.apply([(0, 6, msg(6, 102, partition=1))], {0: 7})
    # While m0 waits out its backoff, m5 (same target) waits behind it; m6 flows.
    fwd._retries[next(iter(fwd._retries))].next_at = float("inf")
    fwd.forward_once(cps, gen)
    assert store.get("m5") is not None
    assert store.get("m6") is None
    fwd._retries[next(iter(fwd._retries))].next_at = 0.0
    fwd.forward_once(cps, gen)
    ids = [dict(s.headers)["kdelay-id"] for s in producer.to("t")]
    assert ids[-3:] == [b"m6", b"m0", b"m5"]
    assert store.pending == 0


def test_permanent_failure_goes_to_dead_letter_after_n_attempts(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100, topic="gone")), (0, 1, msg(1, 101, topic="ok"))], {0: 2})

    def sync_fail(s: Sent) -> KafkaError | None:
        return KafkaError(KafkaError._UNKNOWN_PARTITION) if s.topic == "gone" else None

    producer = FakeProducer(sync_fail=sync_fail)
    fwd, metrics, _ = make(store, producer, dead_letter_after=3)
    cps = FakeCheckpoints()
    gen = activate(fwd, cps)
    for _ in range(2):
        fwd.forward_once(cps, gen)
        for r in fwd._retries.values():
            r.next_at = 0.0
        assert store.get("m0") is not None
    assert [s.value for s in producer.to("ok")] == [b"v1"]  # the good target kept flowing
    assert producer.to(DEAD_LETTER_TOPIC) == []
    fwd.forward_once(cps, gen)
    dead = producer.to(DEAD_LETTER_TOPIC)
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert headers["kdelay-id"] == b"m0"
    assert headers[ERROR_HEADER] is not None
    assert bytes(headers[ERROR_HEADER]).startswith(b"_UNKNOWN_PARTITION")  # type: ignore[arg-type]
    assert headers["kdelay-target"] == b"gone/0"
    assert store.pending == 0
    assert value(metrics.dead_lettered, "_UNKNOWN_PARTITION") == 1
    assert value(metrics.forward_errors, "_UNKNOWN_PARTITION") == 3


def test_transient_errors_are_never_dead_lettered(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer(fail=lambda _s: KafkaError(KafkaError._TRANSPORT))
    fwd, _, _ = make(store, producer, dead_letter_after=1)
    cps = FakeCheckpoints()
    gen = activate(fwd, cps)
    for _ in range(4):
        fwd.forward_once(cps, gen)
        for r in fwd._retries.values():
            r.next_at = 0.0
    assert producer.to(DEAD_LETTER_TOPIC) == []
    assert store.get("m0") is not None


def test_claim_never_moves_backwards(store: Store) -> None:
    producer = FakeProducer()
    fwd, _, _ = make(store, producer)
    cps = FakeCheckpoints()
    gen = activate(fwd, cps)
    fwd.forward_once(cps, gen)
    first = cps.writes[-1][0]
    store.apply([(0, 0, msg(0, 5, topic="gone"))], {0: 1})  # a failing late arrival
    producer.sync_fail = lambda _s: KafkaError(KafkaError._TRANSPORT)
    fwd.forward_once(cps, gen)
    assert cps.writes[-1][0] >= first


def test_fenced_write_deactivates_and_reports(store: Store) -> None:
    store.apply([(0, 0, msg(0, 100))], {0: 1})
    producer = FakeProducer()
    fwd, _, fenced = make(store, producer)
    cps = FakeCheckpoints(fenced=True)
    fwd.activate(cps)
    thread = threading.Thread(target=fwd.run)
    thread.start()
    try:
        deadline = threading.Event()
        for _ in range(100):
            if fenced:
                break
            deadline.wait(0.05)
        assert fenced, "a rejected checkpoint write must call on_fenced"
        assert not fwd.active.is_set()
        assert producer.to("t") == []  # the initial (fenced) write came before any record
    finally:
        fwd.shutdown()
        thread.join(10)
    assert not thread.is_alive()


def test_cancelled_ids_get_tombstones_only_on_the_master(store: Store) -> None:
    producer = FakeProducer()
    fwd, _, _ = make(store, producer)
    fwd.add_tombstones([("x", 3, 7)])  # not master: ignored
    cps = FakeCheckpoints()
    gen = activate(fwd, cps)
    fwd.add_tombstones([("y", 2, 9)])
    store.apply([(2, 9, Cancel("y"))], {2: 10})
    fwd.forward_once(cps, gen)
    tombs = producer.to("__kdelay_buffer")
    assert [(s.key, s.partition) for s in tombs] == [(b"y", 2)]
