"""Recurring messages (``kdelay-repeat``) through a real proxy to real replicas (on the proxy's
buffer topic, ``__kdelay_buffer``, like test_cancel_readme.py): a series is delivered exactly
as many times as it asks, in order, never early (by the broker's clock: the targets are
LogAppendTime), across a master SIGKILL between occurrences and across a SIGKILL of every
replica (an occurrence due while none runs is delivered late, not lost); a cancel stops an
endless series and a cron series. (A bad value is refused naming the header:
test_proxy_errors.py.)"""

from __future__ import annotations

import itertools
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from dev.kafka_tools import consume_until
from dev.stack import wait_until
from kdelay.buffer import BUFFER_TOPIC
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

EXACTLY_ONCE = ["--delivery", "exactly-once", "--txn-ack-wait-ms", "5000"]
AT_LEAST_ONCE = ["--delivery", "at-least-once"]
Headers = list[tuple[str, str | bytes | None]]
COMMITTED: dict[str, str | int | bool] = {"isolation.level": "read_committed"}


def produce(port: int, topic: str, headers: Headers, value: bytes = b"tick") -> None:
    """One record through the proxy; raises with the proxy's error if it refused it."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    p.produce(topic, value, key=b"k", headers=headers, on_delivery=on_delivery)
    assert p.flush(60) == 0
    if errors:
        raise KafkaException(errors[0])


def of(records: list[Record], msg_id: str) -> list[Record]:
    return [r for r in records if r.header("kdelay-id") == msg_id.encode()]


def occurrences(records: list[Record]) -> list[int]:
    return [int(r.header("kdelay-occurrence") or b"0") for r in records]


def series(msg_id: str, repeat: bytes, *timing: tuple[str, str | bytes | None]) -> Headers:
    return [*timing, ("kdelay-repeat", repeat), ("kdelay-id", msg_id.encode())]


def read_until(bs: str, topic: str, done: Callable[[list[Record]], bool]) -> list[Record]:
    return consume_until(bs, [topic], done, timeout=150, config=COMMITTED)


def test_series_delivered_exactly_as_asked_across_a_master_kill_and_stopped_by_cancels(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    """Four ``R5/PT3S`` series, 5 occurrences each, with a master SIGKILL between occurrences
    2 and 3; an unbounded ``R/PT1S`` series cancelled after 3 occurrences; a cron series
    (every minute, in Berlin) cancelled after its first: the master reports its second
    occurrence cancelled (its history), so the next minute is not waited for."""
    bs = kafka.bootstrap_servers
    topic = unique_topic("repeat")
    create_target(bs, topic, partitions=2)
    run = uuid.uuid4().hex[:8]
    fives = [f"five-{run}-{n}" for n in range(4)]
    endless, cron = f"endless-{run}", f"cron-{run}"
    with ReplicaSet(
        tmp_path, bs, zookeeper.connect, count=3, extra_args=EXACTLY_ONCE, buffer_topic=BUFFER_TOPIC
    ) as rs:
        rs.start_all()
        first = rs.wait_master(timeout=90)
        proxy, port = proxy_process(bs, tmp_path / "proxy.log")
        proxy.start()
        try:
            wait_accepting(port)
            for msg_id in fives:  # the first 1 s from now, then every 3 s
                produce(port, topic, series(msg_id, b"R5/PT3S", ("kdelay-delay-ms", b"1000")))
            produce(port, topic, series(endless, b"R/PT1S"))  # at once, then every second
            produce(port, topic, series(cron, b"cron:CRON_TZ=Europe/Berlin * * * * *"))
            two = read_until(bs, topic, lambda r: all(len(of(r, s)) >= 2 for s in fives))
            assert all(len(of(two, s)) == 2 for s in fives), "more than 2 occurrences already"
            rs.kill(first)
            rs.wait_master(timeout=60, exclude=first)
            read_until(bs, topic, lambda r: len(of(r, endless)) >= 3)
            produce(port, topic, [("kdelay-cancel", endless.encode())])
            cancelled_ms = time.time() * 1000  # acknowledged: appended before this
            one = read_until(bs, topic, lambda r: len(of(r, cron)) >= 1)
            produce(port, topic, [("kdelay-cancel", cron.encode())])
        finally:
            proxy.stop()
        cron_due = int(of(one, cron)[0].header("kdelay-deliver-at") or b"0")
        # The cron series' second occurrence, due a minute after its first, was cancelled: the
        # master says so (rather than waiting out the minute).
        master = rs.master()
        assert master is not None

        def cron_cancelled() -> bool:
            doc = rs.message(master, cron) or {}
            return (doc.get("state"), doc.get("deliver_at"), doc.get("occurrence")) == (
                "cancelled",
                cron_due + 60_000,
                2,
            )

        wait_until(cron_cancelled, timeout=60, what="the cron series' occurrence 2 cancelled")
        records = read_until(bs, topic, lambda r: all(len(of(r, s)) >= 5 for s in fives))
        # sleep: an absence is the thing tested: a sixth occurrence would be due 3 s after the fifth
        time.sleep(4)
        records = read_until(bs, topic, lambda r: len(r) >= len(records))
    assert_not_early(records)
    for msg_id in fives:
        mine = sorted(of(records, msg_id), key=lambda r: (r.partition, r.offset))
        assert occurrences(mine) == [1, 2, 3, 4, 5], (msg_id, occurrences(mine))
        due = [int(r.header("kdelay-deliver-at") or b"0") for r in mine]
        assert [b - a for a, b in itertools.pairwise(due)] == [3000] * 4
        assert {r.value for r in mine} == {b"tick"}
        assert len({r.partition for r in mine}) == 1  # by key, like the first
    # Cancelled after at least 3 occurrences: at most the one in flight when the replicas read
    # the cancel is written after it (by the broker's clock), then nothing.
    endless_seen = of(records, endless)
    assert occurrences(endless_seen) == list(range(1, len(endless_seen) + 1))
    after = [r.timestamp_ms - cancelled_ms for r in endless_seen if r.timestamp_ms > cancelled_ms]
    assert len(endless_seen) >= 3
    assert len(after) <= 1, after
    assert occurrences(of(records, cron)) == [1]
    assert cron_due % 60_000 == 0  # a cron match is a whole minute


@pytest.mark.parametrize(
    ("delivery", "wipe"),
    [(EXACTLY_ONCE, False), (AT_LEAST_ONCE, False), (EXACTLY_ONCE, True)],
    ids=["exactly-once", "at-least-once", "exactly-once-store-wiped"],
)
def test_a_series_survives_a_restart_of_every_replica(
    kafka: KafkaInfra,
    zookeeper: ZooKeeperInfra,
    tmp_path: Path,
    delivery: list[str],
    wipe: bool,
) -> None:
    """An ``R4/PT3S`` and an ``exp:3s,2,4s,4`` series (gaps 3, 4, 4 s); after occurrence 1
    both replicas are SIGKILLed and none runs until past occurrence 2's due time, then both
    start again from their data dirs (``wipe``: replica-2's removed, and it starts alone, so
    the master is one that rebuilt its store from the buffer topic). Each series: 4
    deliveries, in order, none early (LogAppendTime), the gaps from the due times (lateness
    does not accumulate), occurrence 2 delivered after the restart."""
    bs = kafka.bootstrap_servers
    topic = unique_topic("repeat-restart")
    create_target(bs, topic)
    run = uuid.uuid4().hex[:8]
    gaps = {
        f"r4-{run}": (b"R4/PT3S", [3000] * 3),
        f"exp-{run}": (b"exp:3s,2,4s,4", [3000, 4000, 4000]),
    }
    with ReplicaSet(
        tmp_path, bs, zookeeper.connect, count=2, extra_args=delivery, buffer_topic=BUFFER_TOPIC
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        proxy, port = proxy_process(bs, tmp_path / "proxy.log")
        proxy.start()
        try:
            wait_accepting(port)
            for msg_id, (repeat, _) in gaps.items():  # the first 1 s from now
                produce(port, topic, series(msg_id, repeat, ("kdelay-delay-ms", b"1000")))
        finally:
            proxy.stop()
        one = read_until(bs, topic, lambda r: all(len(of(r, s)) >= 1 for s in gaps))
        first_due = max(int(of(one, s)[0].header("kdelay-deliver-at") or b"0") for s in gaps)

        def first_checkpointed() -> bool:
            checkpoint = rs.checkpoint()
            return checkpoint is not None and checkpoint.time_ms >= first_due

        # Occurrence 1's retirement checkpointed (every 100 ms; 2 is 3 s away): a restart must
        # not release it again.
        wait_until(first_checkpointed, timeout=30, what="a checkpoint covering occurrence 1")
        for name in rs.replicas:
            rs.kill(name)
        assert not any(r.alive() for r in rs.replicas.values())
        second_due = first_due + 3000
        wait_until(
            lambda: time.time() * 1000 > second_due + 1000,
            timeout=30,
            what="occurrence 2 to fall due while every replica is down",
        )
        restarted_ms = time.time() * 1000
        if wipe:
            shutil.rmtree(rs.replicas["replica-2"].data_dir)
            rs.start("replica-2")
            assert rs.wait_master(timeout=90) == "replica-2"
            rs.start("replica-1")
        else:
            rs.start_all()
        records = read_until(bs, topic, lambda r: all(len(of(r, s)) >= 4 for s in gaps))
        time.sleep(5)  # sleep: an absence: a fifth occurrence, or a copy, would be written by now
        records = read_until(bs, topic, lambda r: len(r) >= len(records))
    assert_not_early(records)
    for msg_id, (_, expected_gaps) in gaps.items():
        mine = sorted(of(records, msg_id), key=lambda r: r.offset)
        assert occurrences(mine) == [1, 2, 3, 4], (msg_id, occurrences(mine))
        due = [int(r.header("kdelay-deliver-at") or b"0") for r in mine]
        assert [b - a for a, b in itertools.pairwise(due)] == expected_gaps, msg_id
        assert mine[0].timestamp_ms < restarted_ms, msg_id  # before the kill
        assert mine[1].timestamp_ms >= restarted_ms, msg_id  # due while down: late, not lost
