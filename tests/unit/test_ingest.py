"""Ingest's partition assignment and catch-up with an in-process fake consumer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from delay_service.config import ReplicaConfig
from delay_service.ingest import Ingest
from delay_service.metrics import Metrics
from delay_service.store import Store
from kdelay.buffer import BUFFER_TOPIC


@dataclass
class FakeTopic:
    partitions: dict[int, object]
    error: KafkaError | None = None


@dataclass
class FakeMetadata:
    topics: dict[str, FakeTopic]


@dataclass
class FakeConsumer:
    """A consumer over a buffer topic whose partitions' leaders appear one check at a time.

    Like librdkafka, assigning a partition twice is a ``_CONFLICT``.
    """

    high: dict[int, int]
    #: Partitions whose watermark query still fails ("leader not available").
    leaderless: set[int] = field(default_factory=set)
    assigned: dict[int, int] = field(default_factory=dict)

    def list_topics(self, topic: str, timeout: float) -> FakeMetadata:
        return FakeMetadata({topic: FakeTopic({p: object() for p in self.high})})

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        if tp.partition in self.leaderless:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return 0, self.high[tp.partition]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            if tp.partition in self.assigned:
                raise KafkaException(KafkaError(KafkaError._CONFLICT))
            self.assigned[tp.partition] = tp.offset

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def test_a_partition_without_a_leader_yet_is_retried_not_wedged(store: Store) -> None:
    ingest = Ingest(ReplicaConfig(name="r"), store, Metrics())
    consumer = FakeConsumer(high={0: 0, 1: 0, 2: 0}, leaderless={2})

    assert ingest._assign_new(consumer) is False  # type: ignore[arg-type]
    assert sorted(consumer.assigned) == [0, 1]
    ingest._check_caught_up(consumer)  # type: ignore[arg-type]
    assert not ingest.caught_up.is_set(), "caught up while a partition was never read"

    consumer.leaderless.clear()
    assert ingest._assign_new(consumer) is True  # type: ignore[arg-type]
    assert consumer.assigned == {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING, 2: OFFSET_BEGINNING}
    ingest._check_caught_up(consumer)  # type: ignore[arg-type]
    assert ingest.caught_up.is_set()
    assert ingest._assign_new(consumer) is True  # type: ignore[arg-type]


def test_catch_up_waits_for_the_end_of_every_partition(store: Store) -> None:
    ingest = Ingest(ReplicaConfig(name="r", buffer_topic=BUFFER_TOPIC), store, Metrics())
    consumer = FakeConsumer(high={0: 3, 1: 0})

    assert ingest._assign_new(consumer) is True  # type: ignore[arg-type]
    ingest._check_caught_up(consumer)  # type: ignore[arg-type]
    assert not ingest.caught_up.is_set()

    store.apply([(0, 0, None), (0, 1, None), (0, 2, None)], {0: 3})
    ingest._check_caught_up(consumer)  # type: ignore[arg-type]
    assert ingest.caught_up.is_set()
