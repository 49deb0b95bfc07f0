"""``kdelay reshard`` to fewer shards fences the removed shards' masters: a master of
``shard-2`` frozen during a 3 -> 2 reshard, its transaction open, can no longer commit a release
once it wakes (its transactional id was never used again, so nothing else would fence it)."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from confluent_kafka import KafkaException, Producer

from dev.stack import KDELAY
from kdelay.delay_service.release.txn_sender import release_transactional_id
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, create_topic, unique_topic


def _reshard(zk: str, root: str, shards: int, *extra: str) -> str:
    done = subprocess.run(
        [KDELAY, "reshard", "--zk-connect", zk, "--zk-root", root, "--shards", str(shards), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_frozen_master_of_a_removed_shard_cannot_commit_after_the_reshard(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    target = unique_topic("fenced")
    create_topic(bs, target, 1)
    _reshard(zk, root, 3)
    # shard-2's master, frozen in the middle of a release (SIGSTOP, a long GC pause).
    frozen = Producer(
        {
            "bootstrap.servers": bs,
            "transactional.id": release_transactional_id(f"{root}/shard-2", buffer_topic),
        }
    )
    frozen.init_transactions(30)
    frozen.begin_transaction()
    frozen.produce(target, b"released by a removed shard's master")
    frozen.flush(30)

    out = _reshard(zk, root, 2, "--bootstrap-servers", bs, "--buffer-topic", buffer_topic)
    assert f"fenced: {root}/shard-2" in out, out

    # It wakes up and commits: Kafka refuses, and nothing it sent becomes visible.
    with pytest.raises(KafkaException):
        frozen.commit_transaction(30)
    marker = Producer({"bootstrap.servers": bs})
    marker.produce(target, b"marker")
    marker.flush(30)
    records = consume_until(
        bs,
        [target],
        lambda r: any(x.value == b"marker" for x in r),
        timeout=60,
        config={"isolation.level": "read_committed"},
    )
    assert [x.value for x in records] == [b"marker"]
