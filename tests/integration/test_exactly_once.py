"""Exactly-once release (``--delivery exactly-once``): a failover duplicates nothing for a
read_committed consumer — master SIGKILL, a frozen master (SIGSTOP past its ZooKeeper
session), and a crash inside a transaction. Real Kafka, ZooKeeper and replica processes.

What a read_uncommitted consumer sees is printed: it may see the aborted copies."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from dev.kafka_tools import consume_until
from dev.stack import wait_until
from kdelay.buffer import Scheduled
from kdelay.delay_service.release.txn_sender import PAUSE_BEFORE_COMMIT_ENV
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, delivered_ids, produce_buffer

EXACTLY_ONCE = ["--delivery", "exactly-once", "--txn-ack-wait-ms", "5000"]
COMMITTED = {"isolation.level": "read_committed"}
UNCOMMITTED = {"isolation.level": "read_uncommitted"}


def stream(topic: str, prefix: str, n: int, start_ms: int, every_ms: float) -> list[Scheduled]:
    return [
        Scheduled(f"{prefix}-{i}", topic, i % 4, None, b"x", start_ms + int(i * every_ms))
        for i in range(n)
    ]


def all_of(ids: set[str]) -> Callable[[list[Record]], bool]:
    return lambda records: ids <= set(delivered_ids(records))


def read(bootstrap: str, topic: str, ids: set[str], isolation: dict[str, str]) -> list[Record]:
    return consume_until(bootstrap, [topic], all_of(ids), timeout=120, config={**isolation})


def duplicates(records: list[Record]) -> int:
    return sum(c - 1 for c in delivered_ids(records).values())


def mid_stream(rs: ReplicaSet, start: int, after_ms: int) -> None:
    wait_until(
        lambda: (cp := rs.checkpoint()) is not None and cp.time_ms >= start + after_ms,
        timeout=60,
        what="the master to be mid-stream",
    )


def test_master_sigkill_twice_no_duplicate_read_committed(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("eos-kill")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    with ReplicaSet(
        tmp_path, kafka.bootstrap_servers, zookeeper.connect, extra_args=EXACTLY_ONCE
    ) as rs:
        rs.start_all()
        first = rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 2_000
        messages = stream(topic, "k", 6_000, start, every_ms=2)  # 500 a second for 12 s
        ids = {m.id for m in messages}
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        mid_stream(rs, start, 2_000)
        rs.kill(first)
        second = rs.wait_master(timeout=60, exclude=first)
        rs.start(first)  # back as a follower, as Kubernetes would restart it
        mid_stream(rs, start, 7_000)
        rs.kill(second)
        rs.wait_master(timeout=60, exclude=second)
        committed = read(kafka.bootstrap_servers, topic, ids, COMMITTED)
        uncommitted = read(kafka.bootstrap_servers, topic, ids, UNCOMMITTED)
    print(
        f"\nexactly-once, two master kills: read_committed {duplicates(committed)} duplicates; "
        f"read_uncommitted {duplicates(uncommitted)} extra copies (aborted transactions)"
    )
    assert set(delivered_ids(committed)) == ids
    assert duplicates(committed) == 0
    assert_not_early(committed)


def test_frozen_master_commits_nothing_after_a_new_master_took_over(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("eos-stop")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    # Each commit waits 0.3 s first, so the freeze most likely lands inside a transaction.
    env = {PAUSE_BEFORE_COMMIT_ENV: "0.3"}
    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=2,
        extra_args=EXACTLY_ONCE,
        wrap={"replica-1": ([], env), "replica-2": ([], env)},
    ) as rs:
        rs.start_all()
        old = rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 1_000
        messages = stream(topic, "f", 3_000, start, every_ms=3)
        ids = {m.id for m in messages}
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        mid_stream(rs, start, 1_000)
        proc = rs.replicas[old].proc
        assert proc is not None
        proc.signal(signal.SIGSTOP)  # a long GC pause, a frozen VM
        try:
            new = rs.wait_master(timeout=60, exclude=old)
            # The new master is releasing: it fenced the old one when its producer began.
            wait_until(
                lambda: (rs.metric(new, "kdelay_replica_forwarded_total") or 0) >= 1,
                timeout=60,
                what=f"{new} to release (kdelay_replica_forwarded_total)",
            )
        finally:
            proc.signal(signal.SIGCONT)
        wait_until(
            lambda: (rs.metric(old, "kdelay_replica_checkpoint_rejected_total") or 0) >= 1,
            timeout=30,
            what="the woken master to be fenced (kdelay_replica_checkpoint_rejected_total)",
        )
        committed = read(kafka.bootstrap_servers, topic, ids, COMMITTED)
        uncommitted = read(kafka.bootstrap_servers, topic, ids, UNCOMMITTED)
        fenced = [
            e
            for e in rs.replicas[old].log_events()
            if e["event"] == "forwarder.checkpoint_rejected"
        ]
    print(
        f"\nexactly-once, master frozen past its session: read_committed "
        f"{duplicates(committed)} duplicates; read_uncommitted {duplicates(uncommitted)} extra "
        f"copies; the woken master: {fenced[0].get('error') if fenced else '?'}"
    )
    assert set(delivered_ids(committed)) == ids
    assert duplicates(committed) == 0
    assert_not_early(committed)


def test_a_crash_inside_a_transaction_loses_nothing_and_its_records_stay_invisible(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    topic = unique_topic("eos-crash")
    create_target(kafka.bootstrap_servers, topic, partitions=4)
    env = {PAUSE_BEFORE_COMMIT_ENV: "3"}  # a transaction stays open 3 s before its commit
    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=2,
        extra_args=EXACTLY_ONCE,
        wrap={"replica-1": ([], env), "replica-2": ([], env)},
    ) as rs:
        rs.start_all()
        master = rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 1_000
        messages = stream(topic, "x", 200, start, every_ms=5)
        ids = {m.id for m in messages}
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        # The first transaction's records are written and not committed: visible only to a
        # read_uncommitted consumer. Kill the master then.
        seen = consume_until(
            kafka.bootstrap_servers,
            [topic],
            lambda records: len(records) > 0,
            timeout=60,
            config={**UNCOMMITTED},
        )
        rs.kill(master)
        aborted = set(delivered_ids(seen))
        rs.wait_master(timeout=60, exclude=master)
        committed = read(kafka.bootstrap_servers, topic, ids, COMMITTED)
        uncommitted = read(kafka.bootstrap_servers, topic, ids, UNCOMMITTED)
    copies = Counter(delivered_ids(uncommitted))
    print(
        f"\nexactly-once, crash inside a transaction: {len(aborted)} records written by the "
        f"killed master's open transaction; read_committed {duplicates(committed)} duplicates; "
        f"read_uncommitted {duplicates(uncommitted)} extra copies"
    )
    assert aborted
    assert set(delivered_ids(committed)) == ids
    assert duplicates(committed) == 0
    assert_not_early(committed)
    # The killed master's copies exist in the log but were aborted: read_uncommitted sees
    # them twice, read_committed once.
    assert all(copies[i] >= 2 for i in aborted), "the open transaction's records vanished"
