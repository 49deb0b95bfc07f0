"""A bulk cancel on a sharded delay set: the proxy writes one bulk record per buffer partition
(delay_service/store/bulk_cancels.py, "Copies"), each shard's master cancels the messages of
its own partitions, and ``DELETE /v1/messages?id_prefix=P&wait=S`` answers their sum. Through
a real proxy, two shards of real replicas and a real Kafka; the buffer topic is the shared
``__kdelay_buffer``, so the prefix and target topic are this test's own."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from dev.stack import wait_until
from kdelay import buffer
from kdelay.buffer import BUFFER_TOPIC, Cancel
from kdelay.proxy import running_proxy
from kdelay.shards import shard_of
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, decode_buffer, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target
from tests.support.shards import sharded

SHARDS = 2
MESSAGES = 40


def test_a_bulk_cancel_on_two_shards_cancels_each_shards_own_and_answers_the_sum(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("bulkshards")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    prefix = f"shardbulk-{uuid.uuid4().hex[:8]}-"
    ids = [f"{prefix}{i}" for i in range(MESSAGES)]
    kept = f"shardkept-{uuid.uuid4().hex[:8]}"
    due = (int(time.time() * 1000) // 1000 + 3600) * 1000
    with (
        sharded(tmp_path, bs, zk, shards=SHARDS, root=root, buffer_topic=BUFFER_TOPIC) as sets,
        running_proxy(loopback_config(bs, zk_connect=zk, zk_root=root)) as proxy,
    ):
        assert proxy.addresses is not None
        with httpx.Client(base_url=proxy.addresses.http, timeout=60) as http:
            for msg_id in [*ids, kept]:
                body = {"topic": topic, "value": "v", "id": msg_id, "deliver_at": due}
                assert http.post("/v1/messages", json=body).status_code == 202

            def state(msg_id: str) -> str | None:
                resp = http.get(f"/v1/messages/{msg_id}")
                return str(resp.json()["state"]) if resp.status_code == 200 else None

            wait_until(
                lambda: all(state(i) == "pending" for i in [*ids, kept]),
                timeout=120,
                what="every message pending",
            )
            partitions = _buffer_partitions(bs)
            per_shard = [0] * SHARDS
            for msg_id in ids:
                per_shard[shard_of(buffer.partition_for(msg_id, partitions), SHARDS)] += 1
            assert all(per_shard), f"every shard has some of the messages: {per_shard}"
            before = [_bulk_cancelled(rs) for rs in sets]

            resp = http.delete("/v1/messages", params={"id_prefix": prefix, "wait": "60"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["cancelled"] == MESSAGES
            assert all(state(i) == "cancelled" for i in ids)
            assert state(kept) == "pending"
        # Each shard's master cancelled its own.
        assert [_bulk_cancelled(rs) - b for rs, b in zip(sets, before, strict=True)] == per_shard
    # One bulk record per buffer partition: every shard reads those of its own partitions.
    records = consume_until(
        bs,
        [BUFFER_TOPIC],
        lambda rs: len(_bulk_records(rs, prefix)) >= partitions,
        timeout=60,
    )
    assert sorted(_bulk_records(records, prefix)) == list(range(partitions))


def _buffer_partitions(bootstrap: str) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(BUFFER_TOPIC, timeout=30)
    return len(meta.topics[BUFFER_TOPIC].partitions)


def _bulk_records(records: list[Record], prefix: str) -> list[int]:
    """The buffer partitions of the bulk cancels of ``prefix`` among ``records``."""
    out = []
    for r in records:
        decoded = decode_buffer(r)
        if isinstance(decoded, Cancel) and decoded.prefix == prefix:
            out.append(r.partition)
    return out


def _bulk_cancelled(rs: ReplicaSet) -> float:
    master = rs.master()
    assert master is not None
    return rs.metric(master, "kdelay_replica_bulk_cancelled_messages_total") or 0.0
