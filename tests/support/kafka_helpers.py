"""Kafka helpers for tests; they live in :mod:`dev.kafka_tools` so benches share them."""

from __future__ import annotations

from dev.kafka_tools import (
    HeaderList,
    Record,
    consume_until,
    create_topic,
    produce_all,
    unique_topic,
)
from kdelay import buffer
from kdelay.errors import BufferFormatError

__all__ = [
    "HeaderList",
    "Record",
    "about",
    "consume_until",
    "create_topic",
    "decode_buffer",
    "produce_all",
    "unique_topic",
]


def decode_buffer(record: Record) -> buffer.BufferRecord | None:
    """A consumed buffer-topic record decoded (a delay counts from its timestamp), or None."""
    try:
        return buffer.decode(record.key, record.value, list(record.headers), record.timestamp_ms)
    except BufferFormatError:
        return None


def about(records: list[Record], msg_id: str) -> list[buffer.BufferRecord]:
    """The buffer records about message ``msg_id`` (buffer keys are not ids), in order."""
    decoded = (decode_buffer(r) for r in records)
    return [d for d in decoded if d is not None and d.id == msg_id]
