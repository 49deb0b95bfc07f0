"""Shards: each shard's replicas ingest and release only their own buffer partitions;
``kdelay reshard`` changes the shard count of a stopped delay set without losing or releasing
anything twice; a replica of another layout refuses to start.

Judged by the broker's clock: the targets are LogAppendTime topics (``create_target``)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions
from kazoo.client import KazooClient

from dev.stack import KDELAY, wait_until
from kdelay.buffer import Cancel, Scheduled
from kdelay.shards import owns
from kdelay.zk import Paths
from kdelay.zk.layout import delay_set_status
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import (
    assert_delivered_once,
    buffer_partition,
    create_target,
    produce_buffer,
)
from tests.support.shards import sharded

PARTITIONS = 6


def _messages(topic: str, count: int, start_ms: int, spread_ms: int) -> list[Scheduled]:
    return [
        Scheduled(
            f"m{i}-{uuid.uuid4().hex[:8]}",
            topic,
            i % 2,
            f"k{i}".encode(),
            f"v{i}".encode(),
            start_ms + (i * spread_ms) // count,
        )
        for i in range(count)
    ]


def _ids(records: list[Record]) -> set[str]:
    return {(r.header("kdelay-id") or b"").decode() for r in records}


def test_two_shards_divide_the_partitions_and_release_everything_once(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("sharded")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    with sharded(
        tmp_path, bs, zk, shards=2, root=root, buffer_topic=buffer_topic, per_shard=2
    ) as sets:
        now = int(time.time() * 1000)
        messages = _messages(topic, 300, now + 2_000, 3_000)
        produce_buffer(bs, buffer_topic, PARTITIONS, messages)
        records = consume_until(bs, [topic], lambda r: len(r) >= len(messages), timeout=90)
        time.sleep(1.0)  # sleep: an absence: anything released twice would arrive now
        records = consume_until(bs, [topic], lambda r: len(r) >= len(messages), timeout=30)
        assert_delivered_once(messages, records)

        client = KazooClient(hosts=zk, timeout=10.0)
        client.start(timeout=15)
        try:
            status = delay_set_status(client, Paths(root))
        finally:
            client.stop()
            client.close()
        assert [s["shard"] for s in status["shards"]] == [0, 1]
        assert status["master"] is not None
        assert status["master"] == status["shards"][0]["master"]
        assert {r["name"] for r in status["replicas"]} == {
            r["name"] for s in status["shards"] for r in s["replicas"]
        }
        for shard in status["shards"]:
            assert shard["master"] is not None, f"shard {shard['shard']} has no master"
            assert len(shard["replicas"]) == 2
            for replica in shard["replicas"]:
                offsets = {int(p) for p in replica["offsets"]}
                assert offsets == {p for p in range(PARTITIONS) if owns(p, shard["shard"], 2)}, (
                    f"{replica['name']} of shard {shard['shard']} ingested {sorted(offsets)}"
                )
        # Each shard released the messages of its own partitions only.
        for i, rs in enumerate(sets):
            master = rs.master()
            assert master is not None
            released = rs.metric(master, "kdelay_replica_forwarded_total")
            mine = sum(1 for m in messages if owns(buffer_partition(m.id, PARTITIONS), i, 2))
            assert released == mine, f"shard {i} released {released}, owns {mine}"


def _reshard(zk: str, root: str, shards: int) -> str:
    done = subprocess.run(
        [KDELAY, "reshard", "--zk-connect", zk, "--zk-root", root, "--shards", str(shards)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reshard_loses_and_duplicates_nothing(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    """1 -> 3 -> 2 shards while messages fall due: each layout is stopped gracefully in the
    middle of the stream, resharded, and started again on the same data directories (each
    replica's store is rebuilt for its new shard)."""
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("reshard")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    now = int(time.time() * 1000)
    messages = _messages(topic, 600, now + 3_000, 45_000)
    seen: set[str] = set()
    for step, shards in enumerate((1, 3, 2)):
        if step:
            out = _reshard(zk, root, shards)
            assert f"-> {shards} shard(s)" in out, out
        with sharded(tmp_path, bs, zk, shards=shards, root=root, buffer_topic=buffer_topic):
            if step == 0:
                produce_buffer(bs, buffer_topic, PARTITIONS, messages)
            if step < 2:
                # Run until some more messages are out, then stop this layout gracefully.
                wanted = len(messages) * (step + 1) // 3

                def enough(r: list[Record], w: int = wanted) -> bool:
                    return len(r) >= w

                records = consume_until(bs, [topic], enough, timeout=90)
                assert len(_ids(records)) > len(seen), "nothing released by this layout"
                seen = _ids(records)
            else:
                records = consume_until(bs, [topic], lambda r: len(r) >= len(messages), timeout=120)
                time.sleep(2.0)  # sleep: an absence: anything released twice would arrive now
    records = consume_until(bs, [topic], lambda r: len(r) >= len(messages), timeout=30)
    assert_delivered_once(messages, records)


def test_a_replica_of_another_layout_refuses_to_start(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    with sharded(tmp_path, bs, zk, shards=2, root=root, buffer_topic=buffer_topic):
        stray = ReplicaSet(
            tmp_path / "stray",
            bs,
            zk,
            count=1,
            partitions=PARTITIONS,
            root=root,
            buffer_topic=buffer_topic,
            shards=3,
            shard=1,
        )
        try:
            replica = stray.start("replica-1")
            wait_until(lambda: not replica.alive(), timeout=60, what="the stray replica to exit")
            assert replica.proc is not None
            assert replica.proc.returncode() == 2
            text = replica.log_text()
            assert "this replica has --shards 3, but the delay set" in text, text
            assert "kdelay reshard" in text
            # It changed nothing: no store, and the layout is still 2 shards.
            assert not (stray.replicas["replica-1"].data_dir / "store").exists()
            assert "already" in _reshard(zk, root, 2)
        finally:
            stray.close()


def test_doubling_the_buffer_partitions_keeps_every_id_in_its_shard(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md "Adding buffer partitions": with the shard count dividing the old
    partition count and the new count a multiple of it, an id's new partition belongs to the
    same shard as its old one. So a cancel written after the growth (to the id's partition under
    the new count) reaches the shard that holds the message, and the new partitions are picked
    up by the shards that own them: nothing cancelled is released, nothing else is lost."""
    monkeypatch.setenv("KDELAY_REPLICA_METADATA_INTERVAL_MS", "200")
    bs, zk = kafka.bootstrap_servers, zookeeper.connect
    topic = unique_topic("grow-sharded")
    create_target(bs, topic, partitions=2)
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bs})
    with sharded(tmp_path, bs, zk, shards=2, root=root, buffer_topic=buffer_topic) as sets:
        now = int(time.time() * 1000)
        before = _messages(topic, 200, now + 15_000, 2_000)
        produce_buffer(bs, buffer_topic, PARTITIONS, before)
        grown = 2 * PARTITIONS
        admin.create_partitions([NewPartitions(buffer_topic, grown)])[buffer_topic].result(30)
        # Each shard's replica takes the new partitions it owns, and no others.
        for rs in sets:
            name = next(iter(rs.replicas))
            want = {p for p in range(grown) if owns(p, rs.shard, 2)}
            wait_until(
                _ingesting(rs, name, want),
                timeout=60,
                what=f"shard {rs.shard} to ingest partitions {sorted(want)}",
            )
        moved = [
            m for m in before if buffer_partition(m.id, grown) != buffer_partition(m.id, PARTITIONS)
        ]
        assert moved, "no id changed partition: the test would prove nothing"
        cancelled = before[::2]
        produce_buffer(bs, buffer_topic, grown, [Cancel(m.id) for m in cancelled])
        after = _messages(topic, 200, now + 15_000, 2_000)
        produce_buffer(bs, buffer_topic, grown, after)
        kept = [m for m in before if m not in cancelled] + after
        records = consume_until(bs, [topic], lambda r: len(r) >= len(kept), timeout=120)
        # sleep: an absence: a cancelled message released late, or a duplicate, would arrive now
        time.sleep(3.0)
        records = consume_until(bs, [topic], lambda r: len(r) >= len(kept), timeout=30)
    assert_delivered_once(kept, records)
    assert any(buffer_partition(m.id, grown) >= PARTITIONS for m in after)


def _ingesting(rs: ReplicaSet, name: str, want: set[int]) -> Callable[[], bool]:
    """Whether replica ``name`` assigned itself exactly the partitions ``want`` (its log)."""

    def assigned() -> bool:
        found: set[int] = set()
        for event in rs.replicas[name].log_events():
            if event.get("event") == "ingest.partitions_assigned":
                found.update(int(p) for p in event["partitions"])
        assert found <= want, f"{name} of shard {rs.shard} took {sorted(found - want)}"
        return found == want

    return assigned
