"""One skewed clock does not stall a shard: a master whose wall clock is
beyond ``--max-clock-skew-ms`` from the broker's holds its releases, and after
``--skew-step-down-ms`` of that it steps down for a replica with a good clock; a replica whose
clock is off stands for election only when nobody else does (someone must hold the mastership).

The skewed replica runs with its wall clock ahead under Debian's libfaketime (as
test_clock_skew.py does), or behind through bench's Python shim, which shifts only what Python
reads (time.time, time.time_ns: where kdelay reads the wall clock): libfaketime 0.9.10 breaks
librdkafka in a process whose clock runs behind (see test_clock_skew.FAKETIME_BEHIND_BROKEN).
Target topics use LogAppendTime, so "early" is judged by the broker's clock.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from bench.harness.clock_skew import SHIM
from dev.stack import wait_until
from dev.stack.process import MARKER
from kdelay.buffer import Scheduled
from kdelay.zk import Election, Paths
from tests.support.faketime import faketime
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, produce_buffer

SKEW_S = 5
#: Below SKEW_S, so the skewed replica is past it; far above two local processes' skew.
LIMIT_MS = 2_000
STEP_DOWN_MS = 3_000
#: Given by environment, not flag: a replica without the setting ignores it and still starts
#: (the test then fails on what it observes, not on a command line).
ENV = {"KDELAY_REPLICA_SKEW_STEP_DOWN_MS": str(STEP_DOWN_MS)}

Wrap = tuple[list[str], dict[str, str]]


def python_skew(seconds: int) -> Wrap:
    """Run the replica's ``kdelay ARGS`` with only Python's wall clock shifted by ``seconds``
    (bench/harness/clock_skew.py's SHIM, after dropping the ``kdelay`` script's path)."""
    shim = f"import sys\ndel sys.argv[1]\nexec({SHIM!r})"
    prefix = [sys.executable, "-X", f"{MARKER}={os.getpid()}", "-c", shim]
    return prefix, {"KDELAY_BENCH_SKEW_S": str(seconds)}


def skewed(skew_s: int) -> Wrap:
    if skew_s > 0:
        prefix, env = faketime(f"+{skew_s}s")
    else:
        prefix, env = python_skew(skew_s)
    return prefix, {**env, **ENV}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def messages(target: str, tag: str, count: int, start_ms: int) -> list[Scheduled]:
    return [
        Scheduled(f"{tag}-{i}", target, i % 2, None, b"x", start_ms + i * 5, uid=f"{tag}-u{i}")
        for i in range(count)
    ]


def candidate(rs: ReplicaSet, name: str) -> Any:
    """The election node ``name`` last published in its status (None: it does not stand)."""
    for r in rs.status()["replicas"]:
        if r["name"] == name:
            return r.get("candidate", "no status field")
    return "not registered"


def events(rs: ReplicaSet, name: str, event: str) -> list[dict[str, Any]]:
    return [e for e in rs.replicas[name].log_events() if e.get("event") == event]


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_a_skewed_master_steps_down_for_a_replica_with_a_good_clock(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, skew_s: int
) -> None:
    target = unique_topic("skew-step-down")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=2,
        extra_args=["--max-clock-skew-ms", str(LIMIT_MS)],
        wrap={"replica-1": skewed(skew_s), "replica-2": ([], ENV)},
    ) as rs:
        rs.start("replica-1")  # alone: nobody else stands, so the skewed replica is master
        assert rs.wait_master(timeout=90) == "replica-1"
        wait_until(
            lambda: rs.metric("replica-1", "kdelay_replica_release_held") == 1,
            timeout=60,
            what="the skewed master to hold its releases",
        )
        skew = rs.metric("replica-1", "kdelay_clock_skew_seconds")
        before = messages(target, "before", 200, now_ms() + 500)
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, before)
        rs.start("replica-2")
        # Before the fix the skewed master held the mastership (and every release) forever.
        took_over = rs.wait_master(timeout=90, exclude="replica-1")
        after = messages(target, "after", 200, now_ms() + 500)
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, after)
        records = consume_until(
            kafka.bootstrap_servers,
            [target],
            lambda rs_: len(rs_) >= len(before) + len(after),
            timeout=90,
        )
        # Its clock still off, the replica that stepped down stays out of the election.
        standing = candidate(rs, "replica-1")
        step_downs = events(rs, "replica-1", "replica.stepping_down")
    print(f"\nskewed replica {skew} s; {took_over} took over")
    assert took_over == "replica-2"
    assert skew is not None
    assert abs(skew) > LIMIT_MS / 1000
    assert [e.get("why") for e in step_downs] == ["clock skew"]
    assert standing is None
    delivered = {(r.header("kdelay-id") or b"").decode() for r in records}
    assert delivered == {m.id for m in before + after}
    assert_not_early(records)  # by the broker's LogAppendTime


def test_a_skewed_replica_stands_only_when_nobody_else_does(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=2,
        extra_args=["--max-clock-skew-ms", str(LIMIT_MS)],
        wrap={"replica-1": skewed(SKEW_S), "replica-2": ([], ENV)},
    ) as rs:
        rs.start("replica-2")
        assert rs.wait_master(timeout=90) == "replica-2"
        rs.start("replica-1")
        # Caught up, its clock known to be off: it keeps out of the election (before the fix it
        # stood as any follower does, and would have won, and held, had the master gone).
        wait_until(
            lambda: bool(events(rs, "replica-1", "replica.election_withheld")),
            timeout=90,
            what="the skewed replica to keep out of the election",
        )
        assert candidate(rs, "replica-1") is None
        assert events(rs, "replica-1", "replica.election_joined") == []
        # Every replica left is skewed: one of them must still hold the mastership.
        rs.kill("replica-2")
        assert rs.wait_master(timeout=90, exclude="replica-2") == "replica-1"
        wait_until(
            lambda: rs.metric("replica-1", "kdelay_replica_release_held") == 1,
            timeout=60,
            what="the skewed master to hold its releases",
        )


def test_rivals_counts_the_other_candidates_only(zookeeper: ZooKeeperInfra) -> None:
    paths = Paths(f"/kdelay-test/{uuid.uuid4().hex[:10]}")
    clients = [KazooClient(hosts=zookeeper.connect, timeout=3.0) for _ in range(2)]
    for c in clients:
        c.start(timeout=15)
    try:
        a = Election(clients[0], paths, "a", lambda _leader: None)
        b = Election(clients[1], paths, "b", lambda _leader: None)
        assert a.rivals() == 0  # no election node yet
        a.join()
        assert (a.rivals(), b.rivals()) == (0, 1)
        b.join()
        assert (a.rivals(), b.rivals()) == (1, 1)
        # A node of a's own session that a leave could not delete is no rival of a's.
        clients[0].create(f"{paths.election}/n_", b"a", ephemeral=True, sequence=True)
        assert (a.rivals(), b.rivals()) == (1, 2)
        a.leave()
        assert b.rivals() == 1  # the leftover node, until a's next join or its session ends
    finally:
        for c in clients:
            c.stop()
            c.close()
