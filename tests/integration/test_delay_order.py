"""Order (README "Guarantees"): per target partition by due time, and messages due in the same
millisecond in the order the proxy accepted them: for one producer, production order.

Before buffer format 2 the tie was broken by buffer partition and offset, and the buffer
partition came from a random id, so a batch sent with one delay came out shuffled.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer

from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

N = 2_000


def test_messages_due_together_leave_in_production_order(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    target = unique_topic("order")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    proxy, port = proxy_process(kafka.bootstrap_servers, tmp_path / "proxy.log")
    with ReplicaSet(
        tmp_path, kafka.bootstrap_servers, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC
    ) as rs:
        proxy.start()
        try:
            rs.start_all()
            rs.wait_master(timeout=90)
            wait_accepting(port)
            # One producer; the same absolute due time for all (a tie for every message),
            # and a relative delay for the second half (ties within each batch).
            producer = Producer(
                {"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 20, "acks": "all"}
            )
            due = str(time.time_ns() // 1_000_000 + 3_000).encode()
            for i in range(N):
                timing = (h.DELIVER_AT, due) if i < N // 2 else (h.DELAY_MS, b"4000")
                producer.produce(target, f"{i:05d}".encode(), partition=i % 2, headers=[timing])
                producer.poll(0)
            assert producer.flush(60) == 0
            records = consume_until(
                kafka.bootstrap_servers, [target], lambda rs_: len(rs_) >= N, timeout=120
            )
        finally:
            proxy.stop()
    assert_not_early(records)
    for partition in (0, 1):
        mine = [r for r in records if r.partition == partition]
        values = [int(r.value or b"-1") for r in mine]
        assert values == sorted(values), f"partition {partition}: not in production order"
        dues = [int(r.header("kdelay-deliver-at") or b"0") for r in mine]
        assert dues == sorted(dues), f"partition {partition}: not in due order"
