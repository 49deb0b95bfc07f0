"""The internal topics on a 3-broker cluster: replicated by default, weaker ones reported."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from dev.stack import wait_until
from kdelay.buffer import BUFFER_TOPIC, DEAD_LETTER_TOPIC
from kdelay.topics import (
    CHECKPOINT_TOPIC,
    Durability,
    WeakTopic,
    ensure_buffer_topic,
    ensure_internal_topics,
)
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import create_topic, unique_topic


def _durability(bootstrap: str, topic: str) -> tuple[set[int], str]:
    """The replication factors of ``topic``'s partitions and its min.insync.replicas, once every
    broker knows the topic (a new one reaches the brokers' metadata a moment after creation)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    found: list[tuple[set[int], str]] = []

    def read() -> bool:
        try:
            meta = admin.list_topics(timeout=10).topics.get(topic)  # no name: no auto-create
            config = admin.describe_configs([resource])[resource].result(timeout=10)
        except KafkaException:
            return False
        if meta is None or not meta.partitions:
            return False
        rfs = {len(p.replicas) for p in meta.partitions.values()}
        found.append((rfs, str(config["min.insync.replicas"].value)))
        return True

    wait_until(read, timeout=30, what=f"{topic} in every broker's metadata", interval=0.2)
    return found[-1]


def test_internal_topics_are_created_with_rf_3_and_min_insync_2(kafka_cluster: KafkaInfra) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    ensure_internal_topics(bootstrap, partitions=3)
    for topic in (BUFFER_TOPIC, DEAD_LETTER_TOPIC, CHECKPOINT_TOPIC):
        assert _durability(bootstrap, topic) == ({3}, "2"), topic
    # A shard's own buffer topic, certainly created here, gets the same.
    shard = unique_topic("__kdelay_buffer_shard")
    assert ensure_buffer_topic(bootstrap, shard, partitions=2) == []
    assert _durability(bootstrap, shard) == ({3}, "2")


def test_a_weaker_existing_topic_is_left_alone_and_reported(kafka_cluster: KafkaInfra) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    shard = unique_topic("__kdelay_buffer_weak")
    create_topic(bootstrap, shard, 2, replication=1, config={"min.insync.replicas": "1"})
    weak = ensure_buffer_topic(bootstrap, shard, partitions=2)
    assert weak == [WeakTopic(shard, 1, 1, Durability(3, 2))]
    assert _durability(bootstrap, shard) == ({1}, "1")  # reported, not changed
    # Asked for explicitly, the same topic is what was wanted.
    assert ensure_buffer_topic(bootstrap, shard, partitions=2, replication=1, min_insync=1) == []
