"""Release smoothing on a real replica (``delay_service/release/smoothing.py``): 600 messages of
topic A, limited to 200/s (``KDELAY_REPLICA_RELEASE_RATE_LIMITS``), and 50 of topic B (no limit)
fall due within the same 300 ms, B's just after all of A's (behind A's backlog in key order).

Judged by the records' own timestamps: A's (CreateTime) are the release times the master stamps
(a LogAppendTime append of the first records waits for the new topic's metadata, which would
shorten the spread), B's (LogAppendTime) the broker's. A's releases spread
over at least what its rate allows after the first burst, each of A's partitions in due order,
every message once, none early; B's lateness is that of an unthrottled release, not A's
backlog's: its p99 is below A's median. The replica's metrics show A's throttled releases.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from kdelay.buffer import Scheduled
from kdelay.delay_service.release.smoothing import BURST_S
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import (
    assert_delivered_once,
    assert_not_early,
    create_target,
    delivered_ids,
    produce_buffer,
)

RATE = 200.0
A_COUNT = 600
B_COUNT = 50
A_PARTITIONS = 3


def lateness_ms(record: Record) -> int:
    return record.timestamp_ms - int(record.header("kdelay-deliver-at") or b"0")


def sample(rs: ReplicaSet, series: str) -> float | None:
    """The value of ``series`` (name and labels, as exported) on replica-1's /metrics."""
    url = next(str(r["metrics"]) for r in rs.status()["replicas"] if r["name"] == "replica-1")
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{series} "):
            return float(line.split()[1])
    return None


def quantile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_a_throttled_burst_leaves_at_its_rate_and_holds_no_other_topic_back(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, delivery: str
) -> None:
    bs = kafka.bootstrap_servers
    topic_a, topic_b = unique_topic("smooth-a"), unique_topic("smooth-b")
    create_topic(bs, topic_a, A_PARTITIONS)  # CreateTime: each record's release time
    create_target(bs, topic_b, 2)
    env = {"KDELAY_REPLICA_RELEASE_RATE_LIMITS": json.dumps({topic_a: RATE})}
    with ReplicaSet(
        tmp_path,
        bs,
        zookeeper.connect,
        count=1,
        extra_args=["--delivery", delivery],
        wrap={"replica-1": ([], env)},
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        due = int(time.time() * 1000) + 3_000
        # A: two a millisecond (300 ms, each partition's strictly increasing); B: after them.
        a = [
            Scheduled(f"a-{i}", topic_a, i % A_PARTITIONS, None, b"x", due + i // 2)
            for i in range(A_COUNT)
        ]
        b_due = due + A_COUNT // 2
        b = [Scheduled(f"b-{i}", topic_b, i % 2, None, b"y", b_due) for i in range(B_COUNT)]
        produce_buffer(bs, rs.buffer_topic, rs.partitions, [*a, *b])
        wanted = {m.id for m in [*a, *b]}
        records = consume_until(
            bs,
            [topic_a, topic_b],
            lambda r: wanted <= set(delivered_ids(r)),
            timeout=120,
            config={"isolation.level": "read_committed"},
        )
        throttled = sample(rs, f'kdelay_replica_release_throttled_total{{topic="{topic_a}"}}')
    got_a = [r for r in records if r.topic == topic_a]
    got_b = [r for r in records if r.topic == topic_b]
    assert_delivered_once(a, got_a)
    assert_delivered_once(b, got_b)
    assert_not_early(records)
    # A's rate: after the first burst (a tenth of a second's worth), RATE a second at most.
    stamps = sorted(r.timestamp_ms for r in got_a)
    spread_s = (stamps[-1] - stamps[0]) / 1000
    floor_s = (A_COUNT - RATE * BURST_S) / RATE
    print(f"\n{delivery}: A spread {spread_s:.2f} s (rate floor {floor_s:.2f} s)")
    assert spread_s >= floor_s * 0.98, (spread_s, floor_s)
    # Order per partition: no throttled message is overtaken by a later one of its partition.
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for r in sorted(got_a, key=lambda r: r.offset):
        by_partition[r.partition].append(r)
    assert len(by_partition) == A_PARTITIONS
    for partition, recs in by_partition.items():
        dues = [int(r.header("kdelay-deliver-at") or b"0") for r in recs]
        assert dues == sorted(dues), f"{topic_a}/{partition} out of due order"
    # B is not behind A's backlog: its p99 lateness is below A's median.
    late_a = [lateness_ms(r) for r in got_a]
    late_b = [lateness_ms(r) for r in got_b]
    p50_a, p99_a, p99_b = quantile(late_a, 0.5), quantile(late_a, 0.99), quantile(late_b, 0.99)
    print(f"{delivery}: lateness A p50 {p50_a} ms p99 {p99_a} ms; B p99 {p99_b} ms")
    assert p99_b < p50_a, (p99_b, p50_a)
    assert max(r.timestamp_ms for r in got_b) < stamps[len(stamps) // 2]
    assert throttled is not None
    # Counted: those due when a round found A out of budget (nearly all after the burst).
    assert A_COUNT * 0.9 <= throttled <= A_COUNT - RATE * BURST_S
