"""Edge delays (0 ms, past, 1 ms, 7 days), cancel before and after delivery, dead letters."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from dev.stack import wait_until
from kdelay.buffer import DEAD_LETTER_TOPIC, Cancel, Scheduled
from kdelay.delay_service.cli import status_command
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import (
    assert_delivered_once,
    create_target,
    delivered_ids,
    produce_buffer,
)

WEEK_MS = 7 * 24 * 3600 * 1000


def test_edge_delays_and_cancel(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("cancel")
    create_target(bs, topic, partitions=1)
    with ReplicaSet(tmp_path, bs, zookeeper.connect, count=1) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        now = int(time.time() * 1000)

        def m(name: str, at: int) -> Scheduled:
            return Scheduled(name, topic, 0, name.encode(), name.encode(), at)

        due = [m("zero", now), m("past", now - 3_600_000), m("one", now + 1)]
        week = m("week", now + WEEK_MS)
        doomed = m("doomed", now + 3_000)
        produce_buffer(bs, rs.buffer_topic, rs.partitions, [*due, week, doomed])
        produce_buffer(bs, rs.buffer_topic, rs.partitions, [Cancel("doomed")])
        records = consume_until(bs, [topic], lambda r: len(r) >= 3, timeout=60)
        # Cancel after delivery: a no-op.
        produce_buffer(bs, rs.buffer_topic, rs.partitions, [Cancel("zero")])
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > doomed.deliver_at_ms,
            timeout=30,
            what="the cancelled message's due time to be checkpointed",
        )
        records = consume_until(bs, [topic], lambda r: len(r) >= 3, timeout=30)
        assert_delivered_once(due, records)
        # The 7-day message survives a restart.
        rs.stop("replica-1")
        rs.start("replica-1")
        rs.wait_master(timeout=60)
        wait_until(
            lambda: rs.status()["replicas"][0]["pending"] == 1,
            timeout=30,
            what="one pending message after the restart",
        )
        args = ["--zk-connect", zookeeper.connect, "--zk-root", rs.root]
        as_json = CliRunner().invoke(status_command, [*args, "--json"])
        human = CliRunner().invoke(status_command, args)
    assert as_json.exit_code == 0, as_json.output
    status = json.loads(as_json.output)
    assert status["master"] == "replica-1"
    assert [(r["name"], r["role"], r["lag"], r["pending"]) for r in status["replicas"]] == [
        ("replica-1", "master", 0, 1)
    ]
    assert status["checkpoint"]["writer"] == "replica-1"
    assert "master: replica-1" in human.output


def test_bad_targets_are_dead_lettered_while_others_flow(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    good = unique_topic("good")
    create_target(bs, good, partitions=1)
    with ReplicaSet(
        tmp_path,
        bs,
        zookeeper.connect,
        count=1,
        extra_args=["--dead-letter-after", "3", "--retry-backoff-ms", "50"],
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        now = int(time.time() * 1000)
        # Due a minute ago: already behind the master's last claim time when they arrive, so
        # a claim that paired that time with newer offsets would drop them (1036a59); due
        # "now", it did only sometimes.
        past = now - 60_000
        bad = [
            Scheduled("no-partition", good, 99, None, b"x", past),  # no such partition
            Scheduled("bad-name", "not a valid topic!", 0, None, b"x", past),
        ]
        fine = [Scheduled(f"ok-{i}", good, 0, None, b"x", now + i) for i in range(200)]
        produce_buffer(bs, rs.buffer_topic, rs.partitions, [*bad, *fine])
        delivered = consume_until(bs, [good], lambda r: len(r) >= 200, timeout=60)
        dead = consume_until(
            bs,
            [DEAD_LETTER_TOPIC],
            lambda r: {"no-partition", "bad-name"} <= set(delivered_ids(r)),
            timeout=60,
        )
        events = rs.replicas["replica-1"].log_events()
    assert set(delivered_ids(delivered)) == {m.id for m in fine}
    mine = [r for r in dead if (r.header("kdelay-id") or b"") in (b"no-partition", b"bad-name")]
    assert len(mine) == 2
    for r in mine:
        assert r.header("kdelay-error"), "dead letter without the error"
    retried = [e for e in events if e["event"] == "forwarder.forward_failed"]
    assert {e["id"] for e in retried} == {"no-partition", "bad-name"}
    assert len(retried) >= 4  # 2 records x (3 - 1) retries
