"""The Kafka behaviours later components rely on, proven against a real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from dev.stack import LocalKafka
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    HeaderList,
    consume_until,
    create_topic,
    produce_all,
    unique_topic,
)


def test_headers_round_trip_through_a_committing_consumer_group(kafka: KafkaInfra) -> None:
    topic = unique_topic("headers")
    create_topic(kafka.bootstrap_servers, topic, partitions=3)
    sent: list[tuple[bytes | None, bytes | None, HeaderList]] = [
        (f"k{i}".encode(), f"v{i}".encode(), [("h-a", f"{i}".encode()), ("h-b", b"")])
        for i in range(30)
    ]
    produce_all(kafka.bootstrap_servers, topic, sent)
    group = f"g-{uuid.uuid4().hex[:8]}"
    got = consume_until(kafka.bootstrap_servers, [topic], lambda r: len(r) >= 30, group=group)
    assert sorted((r.key, r.value, r.headers) for r in got) == sorted(
        (k, v, tuple(h)) for k, v, h in sent
    )
    # The group committed: a second member of the same group starts after what was read.
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
        group
    ].result(timeout=30)
    assert sum(tp.offset for tp in offsets.topic_partitions if tp.topic == topic) == 30


def test_admin_creates_a_six_partition_topic_and_a_compacted_topic(kafka: KafkaInfra) -> None:
    plain, compacted = unique_topic("six"), unique_topic("compact")
    create_topic(kafka.bootstrap_servers, plain, partitions=6)
    create_topic(
        kafka.bootstrap_servers, compacted, partitions=2, config={"cleanup.policy": "compact"}
    )
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topics = admin.list_topics(timeout=10).topics
    assert len(topics[plain].partitions) == 6
    resource = ConfigResource(ConfigResource.Type.TOPIC, compacted)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["cleanup.policy"].value == "compact"


def test_aborted_transaction_is_invisible_to_read_committed(kafka: KafkaInfra) -> None:
    topic = unique_topic("txn")
    create_topic(kafka.bootstrap_servers, topic)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted-1")
    producer.produce(topic, b"aborted-2")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)

    committed = consume_until(
        kafka.bootstrap_servers,
        [topic],
        lambda r: any(x.value == b"committed" for x in r),
        config={"isolation.level": "read_committed"},
    )
    assert [r.value for r in committed] == [b"committed"]
    # read_uncommitted sees the aborted records too, so the test above can fail for real.
    everything = consume_until(
        kafka.bootstrap_servers,
        [topic],
        lambda r: any(x.value == b"committed" for x in r),
        config={"isolation.level": "read_uncommitted"},
    )
    assert [r.value for r in everything] == [b"aborted-1", b"aborted-2", b"committed"]


def test_storage_formats_with_a_cluster_id_beginning_with_a_dash(tmp_path: Path) -> None:
    # 1 in 64 random base64 ids begins with '-'; a data directory may hold one already.
    launcher = LocalKafka(tmp_path / "kafka")
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "cluster-id").write_text("-AAAAAAAAAAAAAAAAAAAAA\n")
    node = launcher.nodes[0]
    launcher.prepare(node)  # formats the storage; starts no broker
    meta = (node.data_dir / "logs" / "meta.properties").read_text().splitlines()
    assert "cluster.id=-AAAAAAAAAAAAAAAAAAAAA" in meta
