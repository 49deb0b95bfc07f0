"""Buffer partitions added while replicas run are picked up (periodic metadata check)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from dev.stack import wait_until
from kdelay.buffer import Scheduled, encode
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import HeaderList, consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target


def test_new_buffer_partitions_are_picked_up(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDELAY_REPLICA_METADATA_INTERVAL_MS", "200")
    bootstrap = kafka.bootstrap_servers
    topic = unique_topic("grow")
    create_target(bootstrap, topic, partitions=2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with ReplicaSet(tmp_path, bootstrap, zookeeper.connect, count=1, partitions=2) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        admin.create_partitions([NewPartitions(rs.buffer_topic, 4)])[rs.buffer_topic].result(30)
        wait_until(
            lambda: (
                len(
                    admin.list_topics(rs.buffer_topic, timeout=5).topics[rs.buffer_topic].partitions
                )
                == 4
            ),
            timeout=30,
            what="the buffer topic to show 4 partitions",
        )
        enc = encode(Scheduled("grown-1", topic, 1, b"k", b"v", int(time.time() * 1000)))
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        headers: HeaderList = list(enc.headers)
        producer.produce(rs.buffer_topic, enc.value, enc.key, partition=3, headers=headers)
        assert producer.flush(30) == 0
        [record] = consume_until(bootstrap, [topic], lambda r: len(r) >= 1, timeout=60)
    assert (record.partition, record.key, record.value) == (1, b"k", b"v")
    assert record.header("kdelay-id") == b"grown-1"
