"""A bulk cancel reaches every shard whatever the layout: one written while the replicas are
stopped for a reshard 1 -> 2 (when the layout still said one shard) cancels the matching
messages on both new shards, and the proxy's wait then answers their sum (the counts were
recomputed by the rebuilt stores); one written by a proxy without ZooKeeper reaches both shards
of a two-shard set. Real proxy, real replicas, real Kafka and ZooKeeper; the buffer topic is the
shared ``__kdelay_buffer``, so the prefixes and target topics are this module's own."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from dev.stack import KDELAY, wait_until
from kdelay import buffer
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import running_proxy
from kdelay.proxy.http.cancel_wait import bulk_count
from kdelay.shards import shard_of
from kdelay.zk.replica_api import ReplicaApi
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target
from tests.support.shards import sharded

MESSAGES = 24


def _ids(tag: str) -> tuple[str, list[str], str]:
    prefix = f"{tag}-{uuid.uuid4().hex[:8]}-"
    return prefix, [f"{prefix}{i}" for i in range(MESSAGES)], f"{tag}kept-{uuid.uuid4().hex[:8]}"


def _partitions(bootstrap: str) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(BUFFER_TOPIC, timeout=30)
    return len(meta.topics[BUFFER_TOPIC].partitions)


def _send(http: httpx.Client, topic: str, ids: list[str]) -> None:
    due = (int(time.time() * 1000) // 1000 + 3600) * 1000
    for msg_id in ids:
        body = {"topic": topic, "value": "v", "id": msg_id, "deliver_at": due}
        assert http.post("/v1/messages", json=body).status_code == 202


def _state(sets: list[ReplicaSet], msg_id: str, partitions: int) -> str | None:
    """The state of ``msg_id`` as the master of the shard owning its buffer partition says."""
    rs = sets[shard_of(buffer.partition_for(msg_id, partitions), len(sets))]
    master = rs.master()
    doc = None if master is None else rs.message(master, msg_id)
    return None if doc is None else str(doc["state"])


def _spread(ids: list[str], partitions: int, shards: int) -> list[int]:
    per_shard = [0] * shards
    for msg_id in ids:
        per_shard[shard_of(buffer.partition_for(msg_id, partitions), shards)] += 1
    assert all(per_shard), f"every shard has some of the messages: {per_shard}"
    return per_shard


def test_a_bulk_cancel_sent_while_stopped_for_a_reshard_reaches_both_new_shards(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("bulkreshard")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    prefix, ids, kept = _ids("rsbulk")
    with running_proxy(loopback_config(bs, zk_connect=zk, zk_root=root)) as proxy:
        assert proxy.addresses is not None
        with httpx.Client(base_url=proxy.addresses.http, timeout=60) as http:
            with sharded(tmp_path, bs, zk, shards=1, root=root, buffer_topic=BUFFER_TOPIC) as one:
                _send(http, topic, [*ids, kept])
                partitions = _partitions(bs)
                wait_until(
                    lambda: all(_state(one, i, partitions) == "pending" for i in [*ids, kept]),
                    timeout=60,
                    what="every message pending on the one shard",
                )
            _spread(ids, partitions, 2)
            # Every replica stopped, the layout still one shard: the bulk cancel is durable.
            resp = http.delete("/v1/messages", params={"id_prefix": prefix})
            assert resp.status_code == 202, resp.text
            bulk_id = str(resp.json()["id"])
            done = subprocess.run(
                [KDELAY, "reshard", "--zk-connect", zk, "--zk-root", root, "--shards", "2"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            with sharded(tmp_path, bs, zk, shards=2, root=root, buffer_topic=BUFFER_TOPIC) as two:
                wait_until(
                    lambda: all(_state(two, i, partitions) == "cancelled" for i in ids),
                    timeout=30,
                    what="every message cancelled, on both new shards",
                )
                assert _state(two, kept, partitions) == "pending"
                # The proxy's wait for that bulk cancel, against the new layout and the
                # rebuilt stores: their counts summed.
                replicas = ReplicaApi(zk, root)
                try:
                    decision = asyncio.run(bulk_count(replicas, bulk_id, 30.0))
                finally:
                    replicas.close()
                assert decision.status == 200, decision.body
                assert decision.body == {"id": bulk_id, "cancelled": MESSAGES, "refused": 0}


def test_a_bulk_cancel_from_a_proxy_without_zookeeper_reaches_every_shard(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("bulknozk")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    prefix, ids, kept = _ids("nozkbulk")
    with (
        sharded(tmp_path, bs, zk, shards=2, root=root, buffer_topic=BUFFER_TOPIC) as sets,
        running_proxy(loopback_config(bs)) as proxy,
    ):
        assert proxy.addresses is not None
        with httpx.Client(base_url=proxy.addresses.http, timeout=60) as http:
            _send(http, topic, [*ids, kept])
            partitions = _partitions(bs)
            _spread(ids, partitions, 2)
            wait_until(
                lambda: all(_state(sets, i, partitions) == "pending" for i in [*ids, kept]),
                timeout=60,
                what="every message pending",
            )
            resp = http.delete("/v1/messages", params={"id_prefix": prefix})
            assert resp.status_code == 202, resp.text
            wait_until(
                lambda: all(_state(sets, i, partitions) == "cancelled" for i in ids),
                timeout=30,
                what="every message cancelled, on both shards",
            )
            assert _state(sets, kept, partitions) == "pending"
