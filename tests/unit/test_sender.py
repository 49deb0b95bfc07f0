"""The sender with a fake producer and a fake clock: acknowledgements, errors, the producer,
records in flight per target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import EllipsisType

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from kdelay.buffer import DEAD_LETTER_TOPIC, Scheduled, decode
from kdelay.delay_service.release.in_flight import Completion
from kdelay.delay_service.release.producer import is_permanent
from kdelay.delay_service.release.sender import ERROR_HEADER, TARGET_HEADER, Sender
from kdelay.delay_service.store.entry import Entry, entry_key
from kdelay.delay_service.store.tombstones import Retired

Callback = Callable[[KafkaError | None, Message], None]
Headers = list[tuple[str, str | bytes | None]]


@dataclass
class Clock:
    now_ms: int = 5_000
    mono: float = 0.0

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return self.mono


@dataclass
class Producer:
    """Acknowledges at poll() with ``answer(topic)``; ``...`` leaves a record unacknowledged.

    poll(timeout) moves the clock by ``timeout``, as a real poll would wait.
    """

    clock: Clock
    answer: Callable[[str], KafkaError | EllipsisType | None] = lambda _t: None
    full: int = 0  # produce() raises BufferError this many times first
    sync: KafkaError | None = None
    produced: list[tuple[str, bytes | None, int, int, Headers]] = field(default_factory=list)
    queued: list[tuple[str, Callback | None]] = field(default_factory=list)
    polls: int = 0

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callback | None = None,
        on_delivery: Callback | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
    ) -> None:
        assert not isinstance(key, str)
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        if self.sync is not None:
            raise KafkaException(self.sync)
        self.produced.append((topic, key, partition, timestamp, list(headers or [])))
        self.queued.append((topic, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        self.clock.mono += max(timeout, 0)
        keep: list[tuple[str, Callback | None]] = []
        done: list[tuple[str, Callback | None]] = []
        for topic, cb in self.queued:
            (keep if self.answer(topic) is ... else done).append((topic, cb))
        self.queued = keep
        self.polls += 1
        for topic, cb in done:
            err = self.answer(topic)
            if cb is not None:
                cb(err, None)  # type: ignore[arg-type]
        return len(done)

    def flush(self, timeout: float = -1) -> int:
        return len(self.queued)


@dataclass
class Rig:
    clock: Clock
    producers: list[Producer]
    sender: Sender


def rig(**producer: object) -> Rig:
    clock = Clock()
    made: list[Producer] = []

    def factory() -> Producer:
        made.append(Producer(clock, **producer))  # type: ignore[arg-type]
        return made[-1]

    return Rig(
        clock, made, Sender(factory, buffer_topic="buf", produce_timeout_ms=1000, clock=clock)
    )


def entry(i: int, topic: str = "t", partition: int = 3) -> Entry:
    msg = Scheduled(f"m{i}", topic, partition, f"k{i}".encode(), b"v", 100 + i)
    return Entry(entry_key(100 + i, 0, i), msg, 0, i)


def settle(sender: Sender, entries: list[Entry]) -> list[Completion]:
    """Wait (on the fake clock) until every entry's record completed; completions in order."""
    sender.wait([e.key for e in entries], deadline=float("inf"))
    done = {c.entry.key: c for c in sender.take_completed()}
    return [done[e.key] for e in entries]


def send(sender: Sender, entries: list[Entry]) -> list[Completion]:
    sender.submit(entries)
    return settle(sender, entries)


def test_send_waits_for_every_acknowledgement_in_order() -> None:
    r = rig(answer=lambda t: KafkaError(KafkaError._MSG_TIMED_OUT) if t == "bad" else None)
    outcomes = send(r.sender, [entry(0), entry(1, topic="bad"), entry(2)])
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert (outcomes[0].error, outcomes[0].timestamp_ms, outcomes[0].dead_letter) == (
        None,
        5_000,
        False,
    )
    produced = r.producers[0].produced
    assert [(t, k, p, ts) for t, k, p, ts, _ in produced] == [
        ("t", b"k0", 3, 5_000),
        ("bad", b"k1", 3, 5_000),
        ("t", b"k2", 3, 5_000),
    ]
    assert len(r.producers) == 1  # a plain error keeps the producer


def test_nothing_to_send_creates_no_producer() -> None:
    r = rig()
    r.sender.submit([])
    r.sender.submit_dead_letters([])
    r.sender.pump(0)
    assert r.sender.take_completed() == []
    assert r.producers == []


def test_a_full_queue_is_waited_out_and_a_synchronous_error_returned() -> None:
    r = rig(full=2)
    assert send(r.sender, [entry(0)])[0].error is None
    r.producers[0].sync = KafkaError(KafkaError._UNKNOWN_PARTITION)
    (outcome,) = send(r.sender, [entry(1)])
    assert outcome.error is not None
    assert outcome.error.code() == KafkaError._UNKNOWN_PARTITION
    assert is_permanent(outcome.error)


def test_missing_acknowledgements_time_out_and_replace_the_producer() -> None:
    r = rig(answer=lambda _t: ...)
    (outcome,) = send(r.sender, [entry(0)])
    assert outcome.error is not None
    assert outcome.error.code() == KafkaError._MSG_TIMED_OUT
    assert r.clock.mono >= 1 + 30  # message.timeout.ms plus the margin
    r.sender.submit([entry(1)])
    assert len(r.producers) == 2


def test_a_fatal_error_replaces_the_producer() -> None:
    r = rig(answer=lambda _t: KafkaError(KafkaError._FATAL, fatal=True))
    send(r.sender, [entry(0)])
    r.sender.submit([entry(1)])
    assert len(r.producers) == 2
    assert not is_permanent(KafkaError(KafkaError._FATAL, fatal=True))


def test_dead_letters_carry_the_error_and_the_target() -> None:
    r = rig(answer=lambda t: KafkaError(KafkaError._MSG_TIMED_OUT) if t == "nope" else None)
    failures = [(entry(0, topic="gone", partition=-1), KafkaError(KafkaError._UNKNOWN_TOPIC))]
    r.sender.submit_dead_letters(failures)
    (done,) = settle(r.sender, [failures[0][0]])
    assert (done.dead_letter, done.error) == (True, None)
    assert done.cause is not None
    assert done.cause.code() == KafkaError._UNKNOWN_TOPIC
    topic, key, partition, _, headers = r.producers[0].produced[0]
    assert (topic, key, partition) == (DEAD_LETTER_TOPIC, b"k0", -1)
    found = dict(headers)
    error = found[ERROR_HEADER]
    assert isinstance(error, bytes)
    assert error.startswith(b"_UNKNOWN_TOPIC: ")
    assert found[TARGET_HEADER] == b"gone/-1"
    assert found["kdelay-id"] == b"m0"


def test_tombstones_are_not_waited_for() -> None:
    r = rig(answer=lambda _t: ...)
    r.sender.tombstones([Retired("a", "", 2, 7), Retired("b", "k" * 32, 0, 9)])
    assert [(t, k, p) for t, k, p, _, _ in r.producers[0].produced] == [
        ("buf", b"a", 2),
        ("buf", b"k" * 32, 0),
    ]
    assert r.clock.mono == 0  # no acknowledgement wait
    r.sender.close()


def test_a_silent_target_stays_in_flight_while_others_complete() -> None:
    r = rig(answer=lambda t: ... if t == "slow" else None)
    slow, fast = entry(0, topic="slow"), entry(1, topic="t")
    r.sender.submit([slow, fast])  # returns at once
    r.sender.wait([fast.key, slow.key], deadline=r.clock.mono + 0.2)
    assert r.clock.mono <= 0.25  # the wait ended at its deadline, not at the ack timeout
    assert [c.entry for c in r.sender.take_completed()] == [fast]
    assert r.sender.in_flight == 1
    assert r.sender.is_in_flight(slow.key)
    assert r.sender.in_flight_targets() == {("slow", 3)}
    # Past message.timeout.ms + 30 s the silent record is declared timed out, the producer goes.
    r.clock.mono += 31
    r.sender.pump(0)
    (done,) = r.sender.take_completed()
    assert done.entry == slow
    assert done.error is not None
    assert done.error.code() == KafkaError._MSG_TIMED_OUT
    assert r.sender.in_flight_targets() == set()
    r.sender.submit([entry(2)])
    assert len(r.producers) == 2


def test_abandoned_records_report_nothing() -> None:
    r = rig(answer=lambda _t: ...)
    r.sender.submit([entry(0)])
    r.sender.abandon()
    assert (r.sender.in_flight, r.sender.in_flight_targets()) == (0, set())
    r.producers[0].answer = lambda _t: None  # the report arrives after all
    r.producers[0].poll(0)
    assert r.sender.take_completed() == []
    r.sender.submit([entry(0)])  # the entry may be sent again (by a later term)
    assert r.sender.in_flight == 0
    assert [c.entry for c in r.sender.take_completed()] == [entry(0)]


def test_a_series_release_writes_the_next_occurrence_and_completes_when_both_are_acked() -> None:
    r = rig(answer=lambda topic: ... if topic == "buf" else None)
    seq = 123 << 20
    msg = Scheduled("s", "t", 0, None, b"v", 1000, (), "u" * 32, repeat="R3/PT1S")
    first = Entry(entry_key(1000, 2, 40, seq), msg, 2, 40)
    r.sender.submit([first])
    r.sender.pump(0.01)
    assert r.sender.take_completed() == []  # the release is acknowledged, the next one not yet
    (release, nxt) = r.producers[0].produced
    assert release[0] == "t"
    assert (nxt[0], nxt[2]) == ("buf", 2)  # the id's buffer partition, like occurrence 1
    hdrs = [(n, v.encode() if isinstance(v, str) else v) for n, v in nxt[4]]
    decoded = decode(nxt[1], b"v", hdrs, timestamp_ms=5)
    assert isinstance(decoded, Scheduled)
    assert (decoded.occurrence, decoded.deliver_at_ms, decoded.seq) == (2, 2000, seq)
    assert decoded.uid == "u" * 32 + "#2"
    r.producers[0].answer = lambda _t: None
    [done] = settle(r.sender, [first])
    assert done.error is None
    # The last occurrence writes nothing more.
    last = Entry(
        entry_key(3000, 2, 41, seq), replace(msg, uid="u" * 32 + "#3", occurrence=3), 2, 41
    )
    r.producers[0].produced.clear()
    send(r.sender, [last])
    assert [p[0] for p in r.producers[0].produced] == ["t"]


@pytest.mark.parametrize("repeat", ["R3/P1M", "not a repeat value"])
def test_a_series_value_that_cannot_be_followed_releases_and_ends_the_series(repeat: str) -> None:
    """A stored kdelay-repeat this version refuses (or cannot compute) must never stop the
    forwarder: the occurrence is released, the series ends there."""
    r = rig()
    msg = Scheduled("s", "t", 0, None, b"v", 1000, (), "u" * 32, repeat=repeat)
    entry = Entry(entry_key(1000, 2, 40), msg, 2, 40)
    [done] = send(r.sender, [entry])
    assert done.error is None
    assert [p[0] for p in r.producers[0].produced] == ["t"]
