"""Every cancel leaves the compacted buffer topic: a cancel of an unknown id gets a tombstone
once its window has passed, and a cancel that came before its message gets one right after the
message's, so compaction really removes them (the issue counted 9,997 that stayed).

The buffer topic here stamps records with the producer's time (CreateTime), so the test can
write a cancel that is already more than a window (5 minutes) old; the window is counted in
the records' own timestamps only, never in a replica's clock (delay_service/store/cancels.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from dev.stack import wait_until
from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.store.cancels import WINDOW_MS
from kdelay.topics import BUFFER_TOPIC_CONFIG
from tests.support.buffer_writes import now_ms, read_for, write_buffer_records
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target

#: Compaction as soon as possible (a segment rolls every 100 ms on the next append; any dirty
#: segment is cleaned; the test broker's cleaner looks every second), and producer timestamps.
EAGER_COMPACTION = {
    **BUFFER_TOPIC_CONFIG,
    "message.timestamp.type": "CreateTime",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "600000",
}


def test_cancels_matched_or_not_get_tombstones_and_compaction_removes_them(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    target = unique_topic("cancel-tomb")
    create_target(bs, target)
    run = uuid.uuid4().hex[:8]
    with ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, partitions=1) as rs:
        create_topic(bs, rs.buffer_topic, 1, config=EAGER_COMPACTION)
        rs.start_all()
        rs.wait_master(timeout=90)
        old = now_ms() - WINDOW_MS - 60_000  # a cancel whose window has passed
        unknown = Cancel(f"nobody-{run}", f"c-unknown-{run}")
        early = Cancel(f"late-{run}", f"c-early-{run}")
        # Sent with the cancel (accepted before its append time), appended after it; due in
        # an hour, so only the cancel keeps it from being delivered.
        late = Scheduled(
            f"late-{run}", target, 0, None, b"v", now_ms() + 3_600_000,
            uid=f"s-late-{run}", seq=(old - 5) << 20,
        )  # fmt: skip
        write_buffer_records(bs, rs.buffer_topic, [(unknown, old), (early, old), (late, old + 1)])
        # Nothing is owed for a cancel until a record of its partition is appended more than
        # a window after it; the master then retires the message, again, then each cancel.
        gone = {unknown.uid.encode(), early.uid.encode(), late.uid.encode()}
        write_buffer_records(
            bs, rs.buffer_topic, [(Cancel(f"filler-{run}", f"f-{run}-0"), now_ms())]
        )

        def tombstones(records: list[Record]) -> dict[bytes, int]:
            """Key -> offset of its last tombstone."""
            return {r.key: r.offset for r in records if r.value is None and r.key in gone}

        records = consume_until(
            bs, [rs.buffer_topic], lambda rs_: set(tombstones(rs_)) == gone, timeout=60
        )
        last = tombstones(records)
        assert last[late.uid.encode()] < last[early.uid.encode()]  # the message's first
        filler = 0

        def compacted() -> bool:
            nonlocal filler  # appends roll the active segment, so the cleaner can take it
            filler += 1
            write_buffer_records(
                bs, rs.buffer_topic, [(Cancel(f"filler-{run}", f"f-{run}-{filler}"), now_ms())]
            )
            live = {r.key for r in read_for(bs, rs.buffer_topic, 1.0) if r.value is not None}
            return not live & gone

        wait_until(compacted, timeout=90, what="compaction of the retired cancels", interval=0.5)
        assert rs.status()["replicas"][0]["pending"] == 0
    delivered = read_for(bs, target, 1.0)
    assert delivered == []
