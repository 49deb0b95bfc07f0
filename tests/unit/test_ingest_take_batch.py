"""``take_batch``: ingest and the retry helper read what is queued without waiting for a full
batch (issue 13).

The fake consumer behaves like librdkafka's: ``consume(n, timeout)`` returns early only with
``n`` records, otherwise after the whole timeout (the simulated clock advances by it), and
``poll(timeout)`` returns as soon as one record is there.
"""

from __future__ import annotations

from collections import deque
from typing import Any, cast

from confluent_kafka import Consumer

from kdelay.consuming import take_batch


class FakeConsumer:
    def __init__(self, queued: int = 0, arriving: int = 0) -> None:
        self.queue: deque[int] = deque(range(queued))
        self.next = queued
        self.arriving = arriving  # records that arrive while a caller waits
        self.waited_s = 0.0

    def _arrive(self) -> None:
        self.queue.extend(range(self.next, self.next + self.arriving))
        self.next += self.arriving
        self.arriving = 0

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if len(self.queue) < num_messages:
            self.waited_s += timeout  # librdkafka waits for a full batch
            if timeout > 0:
                self._arrive()
        n = min(num_messages, len(self.queue))
        return [self.queue.popleft() for _ in range(n)]

    def poll(self, timeout: float) -> Any:
        if not self.queue:
            self._arrive()
        if not self.queue:
            self.waited_s += timeout
            return None
        return self.queue.popleft()


def _take(
    fake: FakeConsumer, limit: int = 2000, wait_s: float = 0.1, linger_s: float = 0.005
) -> list[Any]:
    return take_batch(cast(Consumer, fake), limit, wait_s, linger_s)


def test_queued_records_are_taken_after_the_linger_at_most() -> None:
    fake = FakeConsumer(queued=5)
    assert _take(fake, linger_s=0.005) == [0, 1, 2, 3, 4]
    assert fake.waited_s == 0.005


def test_a_full_batch_does_not_linger() -> None:
    fake = FakeConsumer(queued=5)
    assert _take(fake, limit=3) == [0, 1, 2]
    assert fake.waited_s == 0
    assert _take(fake, limit=3) == [3, 4]


def test_with_nothing_queued_the_first_arrival_ends_the_wait() -> None:
    fake = FakeConsumer(arriving=3)
    assert _take(fake, linger_s=0) == [0, 1, 2]
    assert fake.waited_s == 0


def test_the_linger_collects_what_arrives_meanwhile() -> None:
    fake = FakeConsumer(queued=1, arriving=4)
    assert _take(fake, linger_s=0.005) == [0, 1, 2, 3, 4]
    assert fake.waited_s == 0.005


def test_nothing_arrives_within_the_wait() -> None:
    fake = FakeConsumer()
    assert _take(fake, wait_s=0.1) == []
    assert fake.waited_s == 0.1
