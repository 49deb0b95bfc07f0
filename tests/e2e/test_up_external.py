"""`kdelay up --bootstrap-servers --zk-connect`: uses existing servers and leaves them running."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from kdelay import headers as h
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.schedule import create_target
from tests.support.up import kdelay_up


def test_up_with_external_servers_delivers_and_leaves_them_running(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with kdelay_up(
        tmp_path_factory.mktemp("up-external"),
        "--replicas",
        "1",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--zk-connect",
        zookeeper.connect,
    ) as up:
        state = up.state
        assert state["kafka"] == kafka.bootstrap_servers
        assert state["zookeeper"] == zookeeper.connect
        assert "starting Kafka" not in up.log
        assert "starting ZooKeeper" not in up.log

        topic = unique_topic("up-ext")
        create_target(kafka.bootstrap_servers, topic, partitions=2)
        sent_ms = int(time.time() * 1000)
        producer = Producer({"bootstrap.servers": state["proxy"]})
        producer.produce(
            topic, b"later", b"k", partition=1, headers=[(h.DELAY_MS, b"300"), (h.ID, b"ext-1")]
        )
        assert producer.flush(30) == 0
        [record] = consume_until(kafka.bootstrap_servers, [topic], lambda r: len(r) >= 1)
        assert (record.partition, record.key, record.value) == (1, b"k", b"later")
        assert record.header(h.ID) == b"ext-1"
        assert record.timestamp_ms >= sent_ms + 300
    assert up.exit_code == 0, up.process.log_tail()
    # The servers kdelay up did not start are still there.
    metadata = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    assert metadata.brokers, "the external Kafka no longer answers with its brokers"
    assert topic in metadata.topics
    zk = KazooClient(hosts=zookeeper.connect)
    zk.start(timeout=10)
    try:
        assert zk.exists("/") is not None
    finally:
        zk.stop()
        zk.close()
