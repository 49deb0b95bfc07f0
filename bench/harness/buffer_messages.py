"""Buffer records as confluent-kafka ``Message`` objects, in ingest's batches, without Kafka.

What ``bench.ingest_cpu`` and ``bench.follower_removal`` feed the real ingest
(``Ingest.apply``) with: ``records`` buffer records over :data:`PARTITIONS` buffer partitions,
schedules first (100 B values, a header, due an hour after :data:`NOW_MS`), then the master's
tombstone of each of the first half, with its outcome, as a release writes it. Every record
has the broker's append time :data:`NOW_MS` (``LogAppendTime``), as the buffer topic's do.
"""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from kdelay.buffer import Fate, Scheduled, Tombstone, encode
from kdelay.delay_service.ingest.ingest import _BATCH

#: Buffer partitions the records are spread over (``i % PARTITIONS``).
PARTITIONS = 4
#: The records' append time (epoch ms).
NOW_MS = 1_800_000_000_000


def _message(partition: int, offset: int, record: Scheduled | Tombstone) -> Message:
    enc = encode(record)
    return Message(
        topic="buffer",
        partition=partition,
        offset=offset,
        key=enc.key,
        value=enc.value,
        headers=list(enc.headers),
        timestamp=(TIMESTAMP_LOG_APPEND_TIME, NOW_MS),
    )


def batches(items: list[Message]) -> list[list[Message]]:
    """``items`` in ingest's batches."""
    return [items[i : i + _BATCH] for i in range(0, len(items), _BATCH)]


def messages(records: int) -> list[list[Message]]:
    """:func:`buffer_records` in ingest's batches."""
    return batches(buffer_records(records))


def buffer_records(records: int) -> list[Message]:
    """``records`` buffer records: schedules (100 B values, a header, due in an hour), then one
    tombstone for each of the first half, as a master writes it."""
    schedules = records - records // 2
    out: list[Message] = []
    for i in range(schedules):
        m = Scheduled(
            f"id-{i}", "target", i % 6, f"k{i}".encode(), b"v" * 100, NOW_MS + 3_600_000,
            (("h", b"x"),), uid=f"u-{i}",
        )  # fmt: skip
        out.append(_message(i % PARTITIONS, i // PARTITIONS, m))
    for i in range(records // 2):
        fate = Fate("delivered", "target", i % 6, i, NOW_MS + 3_600_001, NOW_MS + 3_600_000)
        t = Tombstone(f"id-{i}", i // PARTITIONS, f"u-{i}", fate)
        out.append(_message(i % PARTITIONS, schedules // PARTITIONS + 1 + i, t))
    return out
