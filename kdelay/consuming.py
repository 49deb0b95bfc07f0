"""Reading a batch from a confluent-kafka consumer without waiting for a full one.

``consume(limit, timeout)`` alone returns only when ``limit`` records are there or the timeout
passed (librdkafka 2.16 fills the batch until then: one record queued, ``consume(100, 2.0)``
returned it after 2.0 s), so below ``limit / timeout`` records a second every record waits up
to the whole timeout. :func:`take_batch` returns what is queued at once, or the first record to
arrive, then lingers only as long as its caller asks.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import Message


class Batches(Protocol):
    """The two reads of a confluent-kafka ``Consumer`` :func:`take_batch` uses."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...

    def poll(self, timeout: float = -1) -> Message | None: ...


def take_batch(
    consumer: Batches, limit: int, wait_s: float, linger_s: float = 0.0
) -> list[Message]:
    """Up to ``limit`` records: what ``consumer`` has queued, or else the first to arrive within
    ``wait_s``; then, short of ``limit``, what else arrives within ``linger_s`` (0: only what
    is queued by then). The linger keeps batches large when records stream in steadily (each of
    the delay service's batches is one store write)."""
    messages = consumer.consume(limit, timeout=0)
    if not messages:
        first = consumer.poll(wait_s)
        if first is None:
            return []
        messages = [first]
    if len(messages) < limit:
        messages.extend(consumer.consume(limit - len(messages), timeout=linger_s))
    return messages
