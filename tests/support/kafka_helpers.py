"""Kafka helpers for tests; they live in :mod:`kdelay.local.kafka_tools` so benches share them."""

from __future__ import annotations

from kdelay.local.kafka_tools import (
    HeaderList,
    Record,
    consume_until,
    create_topic,
    produce_all,
    unique_topic,
)

__all__ = ["HeaderList", "Record", "consume_until", "create_topic", "produce_all", "unique_topic"]
