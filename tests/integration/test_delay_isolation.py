"""Per-target isolation on a 3-broker cluster: one target topic's only broker stops while a second
target topic keeps flowing. The healthy topic gets every message, none early, in due order,
while the failing one is held; the failing one gets every message once its broker is back. The
same holds when the held topic has more due messages than one scan passes over
(``--scan-skip-limit``), all due before the healthy topic's.

Lateness is not asserted here (``bench/isolation.py`` measures it); "early" is judged by the
broker's clock: both targets use ``message.timestamp.type=LogAppendTime``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from dev.stack import wait_until
from kdelay.buffer import Scheduled
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import (
    assert_delivered_once,
    assert_not_early,
    delivered_ids,
    produce_buffer,
)

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
FAILING_NODE = 2  # index into LocalKafka.nodes: broker id 3


def create(admin: AdminClient, topic: NewTopic) -> None:
    admin.create_topics([topic], operation_timeout=30)[topic.topic].result(timeout=30)
    wait_until(
        lambda: (
            (meta := admin.list_topics(topic.topic, timeout=5).topics.get(topic.topic)) is not None
            and meta.error is None
            and all(p.leader >= 0 for p in meta.partitions.values())
        ),
        timeout=30,
        what=f"topic {topic.topic} to have leaders",
    )


def stream(
    topic: str, prefix: str, n: int, start_ms: int, *, spread_ms: int, partitions: int
) -> list[Scheduled]:
    return [
        Scheduled(f"{prefix}-{i}", topic, i % partitions, None, b"x", start_ms + i * spread_ms // n)
        for i in range(n)
    ]


def test_a_leaderless_target_delays_only_its_own_messages(
    kafka_cluster: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    cluster = kafka_cluster.require_local("stopping a broker")
    bs = kafka_cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bs})
    failing, healthy = unique_topic("iso-x"), unique_topic("iso-y")
    broker_id = cluster.nodes[FAILING_NODE].node_id
    # librdkafka wants the partition count beside an explicit assignment.
    create(admin, NewTopic(failing, 1, replica_assignment=[[broker_id]], config=LOG_APPEND_TIME))
    create(admin, NewTopic(healthy, 2, 3, config=LOG_APPEND_TIME))
    args = [
        "--buffer-replication",
        "3",
        "--produce-timeout-ms",
        "5000",
        "--retry-backoff-ms",
        "200",
    ]
    try:
        with ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, extra_args=args) as rs:
            rs.start_all()
            rs.wait_master(timeout=90)
            cluster.stop_node(FAILING_NODE)  # the failing topic's only replica: leaderless
            start = int(time.time() * 1000) + 2_000
            bad = stream(failing, "x", 200, start, spread_ms=1_000, partitions=1)
            good = stream(healthy, "y", 600, start, spread_ms=4_000, partitions=2)
            produce_buffer(bs, rs.buffer_topic, rs.partitions, [*bad, *good])
            records = consume_until(
                bs, [healthy], lambda r: {m.id for m in good} <= set(delivered_ids(r)), timeout=90
            )
            # Everything for the healthy topic arrived while the failing one is still down;
            # the failing one's records time out (produce timeout 5 s) and it is held.
            wait_until(
                lambda: any(
                    e["event"] == "forwarder.target_held" and e["topic"] == failing
                    for e in rs.replicas["replica-1"].log_events()
                ),
                timeout=60,
                what="the failing target to be reported as held",
            )
            cluster.start_node(FAILING_NODE)
            cluster.wait_ready(3)
            late = consume_until(
                bs, [failing], lambda r: {m.id for m in bad} <= set(delivered_ids(r)), timeout=120
            )
    finally:
        node = cluster.nodes[FAILING_NODE]
        if node.process is None or not node.process.alive():
            cluster.start_node(FAILING_NODE)
        cluster.wait_ready(3)
    assert_delivered_once(good, records)
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.offset):
        by_partition[r.partition].append(r)
    for partition, recs in by_partition.items():
        due = [int(r.header("kdelay-deliver-at") or b"0") for r in recs]
        assert due == sorted(due), f"{healthy}/{partition} out of due order"
    # The failing target's messages: none lost, none early (a duplicate is allowed: records
    # whose acknowledgement timed out may have been written after all).
    assert set(delivered_ids(late)) == {m.id for m in bad}
    assert_not_early(late)


def assert_due_order(topic: str, records: list[Record]) -> None:
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.offset):
        by_partition[r.partition].append(r)
    for partition, recs in by_partition.items():
        due = [int(r.header("kdelay-deliver-at") or b"0") for r in recs]
        assert due == sorted(due), f"{topic}/{partition} out of due order"


#: How each release mode keeps the failing target held for longer than the test runs: records
#: in flight for 10 minutes (at-least-once), or a 10-minute backoff after the aborted round.
HELD_FOR_LONG = {
    "at-least-once": ["--delivery", "at-least-once", "--produce-timeout-ms", "600000"],
    "exactly-once": ["--retry-backoff-ms", "600000", "--retry-backoff-max-ms", "600000"],
}


@pytest.mark.parametrize("delivery", sorted(HELD_FOR_LONG))
def test_more_held_messages_than_a_scan_passes_over_delay_no_other_target(
    kafka_cluster: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, delivery: str
) -> None:
    """300 messages of a leaderless topic, due before 100 of a healthy one, against a scan
    that passes over at most 20: the rounds go on from where the last scan stopped, so the
    healthy ones are delivered while the failing topic is still down (before, every round
    stopped at the same 20 held entries and nothing due after them left until the failing
    target recovered); the held ones are all delivered once it is back."""
    cluster = kafka_cluster.require_local("stopping a broker")
    bs = kafka_cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bs})
    failing, healthy = unique_topic("iso-many-x"), unique_topic("iso-many-y")
    broker_id = cluster.nodes[FAILING_NODE].node_id
    create(admin, NewTopic(failing, 1, replica_assignment=[[broker_id]], config=LOG_APPEND_TIME))
    create(admin, NewTopic(healthy, 2, 3, config=LOG_APPEND_TIME))
    args = ["--buffer-replication", "3", "--scan-skip-limit", "20", *HELD_FOR_LONG[delivery]]
    try:
        with ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, extra_args=args) as rs:
            rs.start_all()
            rs.wait_master(timeout=90)
            cluster.stop_node(FAILING_NODE)  # the failing topic's only replica: leaderless
            start = int(time.time() * 1000) + 2_000
            bad = stream(failing, "x", 300, start, spread_ms=300, partitions=1)
            good = stream(healthy, "y", 100, start + 1_000, spread_ms=2_000, partitions=2)
            produce_buffer(bs, rs.buffer_topic, rs.partitions, [*bad, *good])
            records = consume_until(
                bs, [healthy], lambda r: {m.id for m in good} <= set(delivered_ids(r)), timeout=90
            )
            node = cluster.nodes[FAILING_NODE]
            assert node.process is None or not node.process.alive()  # still down meanwhile
            cluster.start_node(FAILING_NODE)
            cluster.wait_ready(3)
            if delivery == "exactly-once":  # a new term retries at once, not after 10 minutes
                rs.stop("replica-1")
                rs.start("replica-1")
                rs.wait_master(timeout=90)
            late = consume_until(
                bs, [failing], lambda r: {m.id for m in bad} <= set(delivered_ids(r)), timeout=120
            )
    finally:
        node = cluster.nodes[FAILING_NODE]
        if node.process is None or not node.process.alive():
            cluster.start_node(FAILING_NODE)
        cluster.wait_ready(3)
    assert_delivered_once(good, records)
    assert_due_order(healthy, records)
    # None of the held ones was lost: the checkpoint never passed one still pending.
    assert set(delivered_ids(late)) == {m.id for m in bad}
    assert_not_early(late)
