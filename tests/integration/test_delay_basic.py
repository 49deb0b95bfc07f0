"""Basic delivery through 3 replicas: exactly once, never early, in due order per partition."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

from dev.stack import wait_until
from kdelay.buffer import Scheduled
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_delivered_once, create_target, produce_buffer

N = 20_000
SPREAD_MS = 10_000


def test_three_replicas_deliver_every_message_once_in_due_order(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topics = [unique_topic("basic") for _ in range(3)]
    for t in topics:
        create_target(kafka.bootstrap_servers, t, partitions=4)
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect) as rs:
        start = int(time.time() * 1000) + 3_000
        messages = [
            Scheduled(
                id=f"b-{i}",
                topic=topics[i % 3],
                partition=(i // 3) % 4,
                key=f"k{i}".encode(),
                value=f"v{i}".encode(),
                deliver_at_ms=start + i * SPREAD_MS // N,
                headers=(("n", str(i).encode()),),
            )
            for i in range(N)
        ]
        # Everything is in the buffer before any replica starts, and a replica becomes master
        # only once it has read it all: no entry can arrive after a later-due one was released
        # (a late arrival, which the design releases at once), however slow the machine is.
        rs.create_buffer_topic()
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        rs.start_all()
        rs.wait_master(timeout=90)
        records = consume_until(
            kafka.bootstrap_servers,
            topics,
            lambda rs_: len(rs_) >= N,
            timeout=120,
        )
        # Wait until the checkpoint covers everything, then re-read: no late duplicates.
        wait_until(
            lambda: (
                (cp := rs.checkpoint()) is not None and cp.time_ms >= messages[-1].deliver_at_ms
            ),
            timeout=60,
            what="a checkpoint past the last due time",
        )
        records = consume_until(
            kafka.bootstrap_servers, topics, lambda rs_: len(rs_) >= N, timeout=60
        )
    assert_delivered_once(messages, records)
    by_partition: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in records:
        by_partition[(r.topic, r.partition)].append(r)
    for key, recs in by_partition.items():
        due = [
            int(r.header("kdelay-deliver-at") or b"0") for r in sorted(recs, key=lambda r: r.offset)
        ]
        assert due == sorted(due), f"{key} out of due order"
    assert Counter(r.topic for r in records) == {
        t: N // 3 + (1 if i < N % 3 else 0) for i, t in enumerate(topics)
    }
