"""``take_batch``: ingest and the retry helper read what is queued without waiting for a full
batch.

The fake consumer behaves like librdkafka's: ``consume(n, timeout)`` returns early only with
``n`` records, otherwise after the whole timeout (the simulated clock advances by it), and
``poll(timeout)`` returns as soon as one record is there.
"""

from __future__ import annotations

from confluent_kafka import Message

from kdelay.consuming import take_batch
from tests.support.fakes import FakeConsumer


def _records(first: int, count: int) -> list[Message]:
    return [Message(topic="t", partition=0, offset=o) for o in range(first, first + count)]


def fake(queued: int = 0, arriving: int = 0) -> FakeConsumer:
    """``queued`` records there already (offsets from 0), ``arriving`` more while one waits."""
    return FakeConsumer(queued=_records(0, queued), arriving=_records(queued, arriving))


def _take(
    consumer: FakeConsumer, limit: int = 2000, wait_s: float = 0.1, linger_s: float = 0.005
) -> list[int | None]:
    return [m.offset() for m in take_batch(consumer, limit, wait_s, linger_s)]


def test_queued_records_are_taken_after_the_linger_at_most() -> None:
    consumer = fake(queued=5)
    assert _take(consumer, linger_s=0.005) == [0, 1, 2, 3, 4]
    assert consumer.waited_s == 0.005


def test_a_full_batch_does_not_linger() -> None:
    consumer = fake(queued=5)
    assert _take(consumer, limit=3) == [0, 1, 2]
    assert consumer.waited_s == 0
    assert _take(consumer, limit=3) == [3, 4]


def test_with_nothing_queued_the_first_arrival_ends_the_wait() -> None:
    consumer = fake(arriving=3)
    assert _take(consumer, linger_s=0) == [0, 1, 2]
    assert consumer.waited_s == 0


def test_the_linger_collects_what_arrives_meanwhile() -> None:
    consumer = fake(queued=1, arriving=4)
    assert _take(consumer, linger_s=0.005) == [0, 1, 2, 3, 4]
    assert consumer.waited_s == 0.005


def test_nothing_arrives_within_the_wait() -> None:
    consumer = fake()
    assert _take(consumer, wait_s=0.1) == []
    assert consumer.waited_s == 0.1
