"""A replica away longer than the buffer topic's delete.retention.ms rebuilds its store
(delay_service/away.py): meanwhile the master cancelled a message the replica holds, and the
cleaner removed the message, the cancel and their tombstones. Resuming from its stored offsets,
the replica would never read the cancel and would keep the message pending (and deliver it
once master); it rebuilds from the topic instead.

The buffer topic here compacts as soon as it can and keeps tombstones one second.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from dev.stack import wait_until
from kdelay.buffer import Cancel, Scheduled
from kdelay.topics import BUFFER_TOPIC_CONFIG
from tests.support.buffer_writes import now_ms, read_for, write_buffer_records
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target

FAST_CLEANER = {
    **BUFFER_TOPIC_CONFIG,
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "1000",
}


def test_a_replica_away_longer_than_the_tombstones_are_kept_rebuilds(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    target = unique_topic("away")
    create_target(bs, target)
    run = uuid.uuid4().hex[:8]
    with ReplicaSet(tmp_path, bs, zookeeper.connect, count=2, partitions=1) as rs:
        create_topic(bs, rs.buffer_topic, 1, config=FAST_CLEANER)
        rs.start_all()
        master = rs.wait_master(timeout=90)
        away = next(n for n in rs.replicas if n != master)
        due = int(time.time() * 1000) + 3_600_000
        msg = Scheduled(f"m-{run}", target, 0, None, b"v", due, uid=f"s-{run}")
        write_buffer_records(bs, rs.buffer_topic, [(msg, now_ms())])
        stamp = rs.replicas[away].data_dir / "synced.json"
        wait_until(
            lambda: rs.message(away, msg.id) is not None and stamp.exists(),
            timeout=60,
            what=f"{away} to hold the message and stamp its store",
        )
        rs.stop(away)
        cancel = Cancel(msg.id, f"c-{run}")
        write_buffer_records(bs, rs.buffer_topic, [(cancel, now_ms())])
        gone = {msg.uid.encode(), cancel.uid.encode()}
        filler = 0

        def cleaned() -> bool:
            """Nothing of the message or its cancel is left, tombstones included."""
            nonlocal filler  # appends roll the active segment, so the cleaner can take it
            filler += 1
            write_buffer_records(
                bs, rs.buffer_topic, [(Cancel(f"filler-{run}", f"f-{run}-{filler}"), now_ms())]
            )
            return not {r.key for r in read_for(bs, rs.buffer_topic, 1.0)} & gone

        wait_until(cleaned, timeout=120, what="the cleaner to remove the records", interval=0.5)
        rs.start(away)
        wait_until(
            lambda: rs.roles().get(away) == "follower", timeout=90, what=f"{away} to catch up"
        )
        events = [e["event"] for e in rs.replicas[away].log_events()]
        assert "replica.store_rebuilt" in events
        assert rs.message(away, msg.id) is None  # not pending: it cannot come back
        status = {r["name"]: r for r in rs.status()["replicas"]}
        assert status[away]["pending"] == 0
