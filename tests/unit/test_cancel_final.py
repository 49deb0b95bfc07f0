"""A confirmed cancel is final (CONTRACT.md v4), with in-process fakes.

The race: a round hands message M to the producer (inside a transaction, or as a plain
produce at-least-once); ingest reads M's cancel before the round removes M. The cancel must
then wait for the round's outcome: the round commits (or the release is acknowledged) -> the
cancel's answer is 409 ``already_delivered``; the round aborts (or the broker refused the
record) -> the cancel applies, 200. The proxy's decision (``proxy.http.cancel_wait.decide``) is
computed from the master's status document, as the HTTP path does. The real thing:
tests/integration/test_cancel_final.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kdelay.buffer import DEAD_LETTER_TOPIC, Cancel, Scheduled, decode
from kdelay.checkpoint import CheckpointRecord
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.queries.message_status import message_status
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.sender import Sender
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.store import Store
from kdelay.proxy.http.cancel_wait import decide
from kdelay.zk.replica_api import ReplicaAnswer
from tests.support.fakes import FakeClock, FakeProducer, Sent

T0 = 1_000_000


@dataclass
class Checkpoints:
    """ZooKeeper's checkpoint store, as the forwarder uses it."""

    records: list[CheckpointRecord] = field(default_factory=list)

    def claim_epoch(self) -> int:
        return 1

    def load(self) -> bytes | None:
        return None

    def write(self, data: bytes) -> object:
        self.records.append(CheckpointRecord.decode(data))
        return None


class Ingest:
    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool:
        return True


@dataclass
class TxnProducer(FakeProducer):
    """Records become ``committed`` at commit_transaction; abort drops them."""

    committed: list[Sent] = field(default_factory=list)
    open: bool = False

    def init_transactions(self, timeout: float = -1) -> None:
        pass

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        raise AssertionError("no target failed before: nothing to probe")

    def begin_transaction(self) -> None:
        self.open = True
        self.sent = []

    def commit_transaction(self, timeout: float = -1) -> None:
        self.poll(0)
        self.committed += self.sent
        self.open = False

    def abort_transaction(self, timeout: float = -1) -> None:
        self.queued, self.sent, self.open = [], [], False


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def message(i: int, due: int = T0 - 10) -> Scheduled:
    return Scheduled(f"m{i}", "t", 0, b"k", f"v{i}".encode(), due, uid=f"u{i}")


def cfg(**settings: Any) -> ReplicaConfig:
    return ReplicaConfig(
        name="r1",
        checkpoint_interval_ms=1,
        retry_backoff_ms=1,
        retry_backoff_max_ms=1,
        **settings,
    )


def exactly_once(store: Store, producer: TxnProducer) -> tuple[ExactlyOnceForwarder, int]:
    config = cfg(delivery="exactly-once", txn_ack_wait_ms=10)
    clock = FakeClock(now_ms=T0, mono=50.0)
    producer.clock = clock
    sender = TxnSender(
        lambda: producer,
        buffer_topic=config.buffer_topic,
        produce_timeout_ms=config.produce_timeout_ms,
        checkpoint_key="set",
        clock=clock,
    )
    fwd = ExactlyOnceForwarder(
        config, store, Ingest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    gen = fwd.control.activate(Checkpoints())
    sender.start()
    return fwd, gen


def at_least_once(store: Store, producer: FakeProducer) -> tuple[Forwarder, int]:
    config = cfg()
    clock = FakeClock(now_ms=T0, mono=50.0)
    producer.clock = clock
    sender = Sender(
        lambda: producer,
        buffer_topic=config.buffer_topic,
        produce_timeout_ms=config.produce_timeout_ms,
        clock=clock,
    )
    fwd = Forwarder(
        config, store, Ingest(), Metrics(), sender=sender, on_fenced=lambda _w: None, clock=clock
    )
    return fwd, fwd.control.activate(Checkpoints())


def cancel(store: Store, i: int, offset: int) -> None:
    """Ingest reads the cancel of ``m<i>`` at buffer partition 0, ``offset``."""
    store.apply([(0, offset, Cancel(f"m{i}", f"c{i}"), T0)], {0: offset + 1})


def answer(store: Store, i: int, offset: int) -> tuple[int, dict[str, Any]] | None:
    """What the proxy answers the confirmed cancel of ``m<i>`` appended at ``offset``, asking
    this store as the master's (None: not decided yet, it keeps asking)."""
    doc = message_status(store, f"m{i}")
    status = 404 if doc is None else 200
    body = {
        **(doc or {"error": "unknown"}),
        "role": "master",
        "ingested_offsets": {str(p): o for p, o in store.offsets().items()},
    }
    decision = decide(f"m{i}", ReplicaAnswer(status, body, "r1"), 0, offset)
    return None if decision is None else (decision.status, decision.body)


def values(sent: list[Sent]) -> list[bytes | None]:
    return [s.value for s in sent if s.topic == "t"]


# -- exactly-once ----------------------------------------------------------------------------


def test_a_cancel_read_while_its_transaction_is_open_answers_delivered_once_it_commits(
    store: Store,
) -> None:
    store.apply([(0, 0, message(1))], {0: 1})
    producer = TxnProducer()
    fwd, gen = exactly_once(store, producer)
    producer.actions.put(lambda: cancel(store, 1, 1))  # read while the round's records fly
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == [b"v1"]  # the commit made it visible
    decided = answer(store, 1, 1)
    assert decided is not None
    assert decided[0] == 409, decided
    assert decided[1]["state"] == "already_delivered"
    assert decided[1]["delivered_at"] is not None
    assert store.pending == 0


def test_a_cancel_read_while_its_transaction_is_open_applies_when_it_aborts(
    store: Store,
) -> None:
    store.apply([(0, 0, message(1))], {0: 1})
    producer = TxnProducer(fail=lambda s: KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    fwd, gen = exactly_once(store, producer)
    producer.actions.put(lambda: cancel(store, 1, 1))
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == []
    assert answer(store, 1, 1) == (200, {"id": "m1", "state": "cancelled"})
    assert store.pending == 0
    # The next rounds never release it.
    producer.fail = lambda s: None
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == []


def test_a_cancel_read_between_the_scan_and_the_send_keeps_it_from_the_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.apply([(0, 0, message(1)), (0, 1, message(2))], {0: 2})
    producer = TxnProducer()
    fwd, gen = exactly_once(store, producer)
    scan = store.due_skipping

    def scan_then_cancel(*args: Any, **kwargs: Any) -> Any:
        found = scan(*args, **kwargs)
        cancel(store, 1, 2)  # the cancel wins the race: m1 must not leave
        return found

    monkeypatch.setattr(store, "due_skipping", scan_then_cancel)
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == [b"v2"]
    assert answer(store, 1, 2) == (200, {"id": "m1", "state": "cancelled"})


# -- at-least-once ---------------------------------------------------------------------------


def test_a_cancel_of_a_release_in_flight_waits_for_it_and_answers_delivered(
    store: Store,
) -> None:
    store.apply([(0, 0, message(1))], {0: 1})
    producer = FakeProducer(hold=lambda s: s.topic == "t")  # no acknowledgement yet
    fwd, gen = at_least_once(store, producer)
    fwd.forward_once(Checkpoints(), gen)
    assert [s.value for s, _ in producer.queued if s.topic == "t"] == [b"v1"]
    cancel(store, 1, 1)
    assert answer(store, 1, 1) is None  # the release's outcome is not known: no answer yet
    producer.hold = lambda s: False
    fwd.forward_once(Checkpoints(), gen)
    decided = answer(store, 1, 1)
    assert decided is not None
    assert decided[0] == 409, decided
    assert decided[1]["state"] == "already_delivered"
    assert store.pending == 0


def test_a_cancel_of_a_release_the_broker_refused_applies_and_sends_no_dead_letter(
    store: Store,
) -> None:
    store.apply([(0, 0, message(1))], {0: 1})
    producer = FakeProducer(hold=lambda s: s.topic == "t")
    fwd, gen = at_least_once(store, producer)
    fwd.forward_once(Checkpoints(), gen)
    cancel(store, 1, 1)
    assert answer(store, 1, 1) is None
    producer.hold = lambda s: False
    producer.fail = lambda s: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)  # surely not written
    for _ in range(4):
        fwd.forward_once(Checkpoints(), gen)
    assert answer(store, 1, 1) == (200, {"id": "m1", "state": "cancelled"})
    assert all(s.topic != DEAD_LETTER_TOPIC for s in producer.produced)
    assert store.pending == 0


def test_a_term_that_ends_with_a_cancel_waiting_applies_it_in_this_store(store: Store) -> None:
    store.apply([(0, 0, message(1))], {0: 1})
    producer = FakeProducer(hold=lambda s: s.topic == "t")
    fwd, gen = at_least_once(store, producer)
    fwd.forward_once(Checkpoints(), gen)
    cancel(store, 1, 1)
    fwd.control.deactivate("test")
    fwd.end_term()  # what _serve's finally does
    # This replica converges with its followers (they applied the cancel); it is no longer
    # master, so no proxy takes its answer (README "Guarantees": at-least-once failover).
    doc = message_status(store, "m1")
    assert doc is not None
    assert doc["state"] == "cancelled"
    assert store.pending == 0


# -- a series: the cancel stops it, whatever the occurrence it met ---------------------------

ACCEPTED_MS = T0 - 5_000  # when a proxy accepted occurrence 1 (its order field's ms part)


def series(repeat: str = "R3/PT1S", occurrence: int = 1) -> Scheduled:
    return Scheduled(
        "m1",
        "t",
        0,
        b"k",
        b"v1",
        T0 - 10,
        uid="u1",
        seq=ACCEPTED_MS << 20,
        repeat=repeat,
        occurrence=occurrence,
    )


def read_next_occurrence(store: Store, sent: list[Sent], offset: int) -> None:
    """Ingest reads the buffer record the release wrote for the next occurrence, appended at
    ``offset`` a few ms after the cancel (``cancel`` reads it at T0)."""
    (nxt,) = [s for s in sent if s.topic == cfg().buffer_topic and s.value is not None]
    headers = [(k, v.encode() if isinstance(v, str) else v) for k, v in nxt.headers]
    record = decode(nxt.key, nxt.value, headers, T0 + 5)
    store.apply([(0, offset, record, T0 + 5)], {0: offset + 1})


def test_a_cancel_that_met_a_series_occurrence_in_release_stops_the_series_and_says_so(
    store: Store,
) -> None:
    store.apply([(0, 0, series())], {0: 1})
    producer = TxnProducer()
    fwd, gen = exactly_once(store, producer)
    producer.actions.put(lambda: cancel(store, 1, 1))  # read while occurrence 1 flies
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == [b"v1"]  # occurrence 1 was delivered
    # Occurrence 2 was written with it; until the store reads it, the answer is not known.
    assert answer(store, 1, 1) is None
    read_next_occurrence(store, producer.committed, 2)
    assert answer(store, 1, 1) == (200, {"id": "m1", "state": "cancelled"})
    assert store.pending == 0  # occurrence 2 was cancelled on arrival: the series stopped


def test_a_cancel_that_met_a_series_occurrence_in_flight_stops_the_series_at_least_once(
    store: Store,
) -> None:
    store.apply([(0, 0, series())], {0: 1})
    producer = FakeProducer(hold=lambda s: s.topic == "t")
    fwd, gen = at_least_once(store, producer)
    fwd.forward_once(Checkpoints(), gen)
    cancel(store, 1, 1)
    producer.hold = lambda s: False
    fwd.forward_once(Checkpoints(), gen)
    assert answer(store, 1, 1) is None
    read_next_occurrence(store, producer.produced, 2)
    assert answer(store, 1, 1) == (200, {"id": "m1", "state": "cancelled"})
    assert store.pending == 0


def test_a_cancel_that_met_a_series_last_occurrence_answers_delivered(store: Store) -> None:
    store.apply([(0, 0, series("R2/PT1S", occurrence=2))], {0: 1})
    producer = TxnProducer()
    fwd, gen = exactly_once(store, producer)
    producer.actions.put(lambda: cancel(store, 1, 1))
    fwd.forward_once(Checkpoints(), gen)
    assert [s for s in producer.committed if s.topic == cfg().buffer_topic and s.value] == []
    decided = answer(store, 1, 1)
    assert decided is not None
    assert decided[0] == 409, decided  # nothing left to stop
    assert decided[1]["state"] == "already_delivered"


def test_a_series_next_occurrence_read_before_its_release_settles_still_answers_cancelled(
    store: Store,
) -> None:
    store.apply([(0, 0, series())], {0: 1})

    @dataclass
    class ReadAtCommit(TxnProducer):
        """Ingest reads what the commit made visible before the forwarder settles it."""

        def commit_transaction(self, timeout: float = -1) -> None:
            super().commit_transaction(timeout)
            read_next_occurrence(store, self.committed, 2)

    producer = ReadAtCommit()
    fwd, gen = exactly_once(store, producer)
    producer.actions.put(lambda: cancel(store, 1, 1))
    fwd.forward_once(Checkpoints(), gen)
    assert values(producer.committed) == [b"v1"]
    assert answer(store, 1, 1) == (200, {"id": "m1", "state": "cancelled"})
    assert store.pending == 0
