"""The 3-broker cluster survives one broker down for acks=all, min.insync.replicas=2."""

from __future__ import annotations

from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import consume_until, create_topic, produce_all, unique_topic


def test_acks_all_survives_one_broker_down(kafka_cluster: KafkaInfra) -> None:
    local = kafka_cluster.require_local("stopping a broker")
    topic = unique_topic("rf3")
    bootstrap = kafka_cluster.bootstrap_servers
    create_topic(bootstrap, topic, partitions=3, replication=3, config={"min.insync.replicas": "2"})

    stopped = 2
    local.stop_node(stopped)
    try:
        nodes = local.bootstrap_servers.split(",")  # in node order, on either backend
        survivors = ",".join(b for i, b in enumerate(nodes) if i != stopped)
        produce_all(
            survivors,
            topic,
            [(None, f"v{i}".encode(), []) for i in range(300)],
            **{"enable.idempotence": True, "message.timeout.ms": 60000},
        )
        got = consume_until(survivors, [topic], lambda r: len(r) >= 300, timeout=60)
        assert sorted(r.value or b"" for r in got) == sorted(f"v{i}".encode() for i in range(300))
    finally:
        local.start_node(stopped)
        local.wait_ready(expected=3)
