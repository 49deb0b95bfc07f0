"""Failures of the master: SIGKILL, an expired ZooKeeper session, a stalled (deposed) master."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from dev.stack import wait_until
from kdelay.buffer import Scheduled
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, delivered_ids, produce_buffer

INTERVAL_MS = 100


def stream(
    topic: str, prefix: str, n: int, start_ms: int, every_ms: float = 1.0
) -> list[Scheduled]:
    return [
        Scheduled(f"{prefix}-{i}", topic, i % 4, None, b"x", start_ms + int(i * every_ms))
        for i in range(n)
    ]


def all_delivered(ids: set[str]) -> Callable[[list[Record]], bool]:
    def done(records: list[Record]) -> bool:
        return ids <= set(delivered_ids(records))

    return done


def ts_of(event: dict[str, object]) -> str:
    return str(event["timestamp"])


def test_master_sigkill_loses_nothing_and_bounds_duplicates(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("crash")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect) as rs:
        rs.start_all()
        master = rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 2_000
        messages = stream(topic, "c", 8_000, start)  # one due every millisecond for 8 s
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms >= start + 3_000,
            timeout=60,
            what="the master to be mid-stream",
        )
        rs.kill(master)
        killed_ms = int(time.time() * 1000)
        new_master = rs.wait_master(timeout=60, exclude=master)
        records = consume_until(
            kafka.bootstrap_servers, [topic], all_delivered({m.id for m in messages}), timeout=120
        )
    counts = delivered_ids(records)
    dupes = sum(c - 1 for c in counts.values())
    after = [r.timestamp_ms for r in records if r.timestamp_ms > killed_ms]
    gap = (min(after) - killed_ms) / 1000 if after else float("nan")
    print(
        f"\nmaster crash: {master} killed, {new_master} took over; first delivery "
        f"{gap:.2f} s after the kill; {dupes} duplicates"
    )
    assert set(counts) == {m.id for m in messages}
    assert_not_early(records)
    # Only what the dead master released after its last checkpoint may repeat: at one message
    # per millisecond that is about one checkpoint interval's worth (plus one round in flight).
    assert dupes <= 3 * INTERVAL_MS


def test_expired_session_master_stops_before_a_new_master_starts(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("expire")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect) as rs:
        rs.start_all()
        old = rs.wait_master(timeout=90)
        old_epoch = rs.checkpoint().epoch  # type: ignore[union-attr]
        start = int(time.time() * 1000) + 1_000
        messages = stream(topic, "e", 3_000, start, every_ms=2)
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms >= start + 1_000,
            timeout=60,
            what="the master to be mid-stream",
        )
        rs.expire_session(old)
        new = rs.wait_master(timeout=60, exclude=old)
        records = consume_until(
            kafka.bootstrap_servers, [topic], all_delivered({m.id for m in messages}), timeout=120
        )
        wait_until(
            lambda: any(e["event"] == "replica.zookeeper_state" and e["state"] == "lost"
                        for e in rs.replicas[old].log_events()),
            timeout=30,
            what="the old master to see its session lost",
        )  # fmt: skip
        final = rs.checkpoint()
    assert final is not None
    assert final.epoch > old_epoch
    assert final.writer != old or final.epoch != old_epoch
    old_events = rs.replicas[old].log_events()
    stopped = [
        ts_of(e) for e in old_events if e["event"] in ("forwarder.paused", "forwarder.stopped")
    ]
    started = [ts_of(e) for e in rs.replicas[new].log_events() if e["event"] == "forwarder.started"]
    assert stopped, "the old master never stopped forwarding"
    assert started
    # The deposed master stopped before the new one first forwarded (log clocks: one machine).
    assert min(stopped) <= min(started), (stopped, started)
    assert set(delivered_ids(records)) == {m.id for m in messages}
    assert_not_early(records)


def test_stalled_master_is_fenced_when_it_wakes(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("stall")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect, count=2) as rs:
        rs.start_all()
        old = rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 1_000
        messages = stream(topic, "s", 4_000, start, every_ms=3)
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms >= start + 500,
            timeout=60,
            what="the master to be mid-stream",
        )
        proc = rs.replicas[old].proc
        assert proc is not None
        # Its own /metrics, which stays while its session lapses and it registers again.
        old_metrics = rs.metrics_url(old)
        proc.signal(signal.SIGSTOP)  # a long GC pause / a frozen VM
        try:
            rs.wait_master(timeout=60, exclude=old)
        finally:
            proc.signal(signal.SIGCONT)
        wait_until(
            lambda: any(e["event"] == "forwarder.checkpoint_rejected"
                        for e in rs.replicas[old].log_events()),
            timeout=30,
            what="the stalled master's late checkpoint write to be rejected",
        )  # fmt: skip
        wait_until(
            lambda: (
                (rs.metric(old, "kdelay_replica_checkpoint_rejected_total", old_metrics) or 0) >= 1
            ),
            timeout=30,
            what="kdelay_replica_checkpoint_rejected_total >= 1 on the fenced replica",
        )
        records = consume_until(
            kafka.bootstrap_servers, [topic], all_delivered({m.id for m in messages}), timeout=120
        )
    assert set(delivered_ids(records)) == {m.id for m in messages}
    assert_not_early(records)
