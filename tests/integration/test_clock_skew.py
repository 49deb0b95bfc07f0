"""Kafka's clock is the authority: a master whose wall clock runs ahead, and a
proxy whose clock runs behind, deliver nothing early by the *broker's* clock.

The skewed processes run under Debian's libfaketime (``apt-get install faketime``, which
``make install`` does) with only the wall clock shifted (``FAKETIME_DONT_FAKE_MONOTONIC=1``).
Target topics use LogAppendTime, so a delivered record's timestamp is the broker's clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from dev.stack import wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC, Scheduled
from tests.support.faketime import faketime
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, produce_buffer

SKEW_S = 5


def now_ms() -> int:
    return time.time_ns() // 1_000_000


#: libfaketime 0.9.10 (Debian 12) mis-shifts librdkafka's timed waits in a process whose wall
#: clock runs *behind* (wolfcw/libfaketime#503, fixed after 0.9.10): the replica's Kafka clients
#: time out (watermark queries, 1 s probe round trips) and it hangs on SIGTERM. The harness
#: fails, not kdelay; bench/reliability.py's master-clock-ahead-py case shifts the clock inside
#: Python instead. Left in place, not run: each run only waited out its timeouts (87 s of CI).
#: With a fixed libfaketime, run it with ``pytest --runxfail``.
FAKETIME_BEHIND_BROKEN = pytest.mark.xfail(
    reason="libfaketime 0.9.10 breaks librdkafka in a process whose clock runs behind (#503); "
    "not run (pytest --runxfail runs it)",
    strict=False,
    run=False,
)


@pytest.mark.parametrize(
    "skew_s",
    [SKEW_S, pytest.param(-SKEW_S, marks=FAKETIME_BEHIND_BROKEN)],
    ids=["ahead", "behind"],
)
def test_a_master_with_a_skewed_clock_releases_by_the_brokers(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, skew_s: int
) -> None:
    target = unique_topic("skew-master")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    with ReplicaSet(
        tmp_path,
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=2,
        wrap={"replica-1": faketime(f"{skew_s:+d}s")},
    ) as rs:
        rs.start("replica-1")  # alone, so the skewed replica is the master
        assert rs.wait_master(timeout=90) == "replica-1"
        rs.start("replica-2")
        wait_until(
            lambda: (
                (rs.metric("replica-1", "kdelay_clock_skew_seconds") or 0) > SKEW_S - 1
                and rs.metric("replica-2", "kdelay_clock_skew_seconds") is not None
            ),
            timeout=60,
            what="both replicas to show their skew in kdelay_clock_skew_seconds",
        )
        skew = rs.metric("replica-1", "kdelay_clock_skew_seconds")
        normal = rs.metric("replica-2", "kdelay_clock_skew_seconds")
        start = now_ms() + 1_000
        messages = [
            Scheduled(f"m-{i}", target, i % 2, None, b"x", start + i * 5, uid=f"u-{i}")
            for i in range(600)  # due over 3 s: all within a master's 5 s lead
        ]
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        records = consume_until(
            kafka.bootstrap_servers, [target], lambda rs_: len(rs_) >= len(messages), timeout=90
        )
    print(f"\nmaster skew {skew} s, follower skew {normal} s")
    assert skew is not None
    assert normal is not None
    assert {(r.header("kdelay-id") or b"").decode() for r in records} == {m.id for m in messages}
    assert_not_early(records)  # by the broker's LogAppendTime, not the master's stamp


@pytest.mark.parametrize("skew_s", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
def test_a_proxy_with_a_skewed_clock_delays_from_the_broker_append_time(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, skew_s: int
) -> None:
    target = unique_topic("skew-proxy")
    create_target(kafka.bootstrap_servers, target)
    prefix, env = faketime(f"{skew_s:+d}s")
    proxy, port = proxy_process(
        kafka.bootstrap_servers, tmp_path / "proxy.log", prefix=prefix, env=env
    )
    delay_ms = 2_000
    with ReplicaSet(
        tmp_path, kafka.bootstrap_servers, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC
    ) as rs:
        proxy.start()
        try:
            rs.start_all()
            rs.wait_master(timeout=90)
            wait_accepting(port)
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5})
            sent_ms = now_ms()  # this process's clock is not skewed
            for i in range(300):
                producer.produce(
                    target, f"v-{i}".encode(), headers=[(h.DELAY_MS, str(delay_ms).encode())]
                )
            assert producer.flush(60) == 0
            records = consume_until(
                kafka.bootstrap_servers, [target], lambda rs_: len(rs_) >= 300, timeout=90
            )
        finally:
            proxy.stop()
    # Had the delay counted from a proxy clock 5 s behind, everything would have been released
    # about 3 s before it was even sent (and 5 s late with the clock ahead).
    first, last = min(r.timestamp_ms for r in records), max(r.timestamp_ms for r in records)
    assert first >= sent_ms + delay_ms, f"released {sent_ms + delay_ms - first} ms early"
    print(
        f"\nproxy clock {skew_s:+d} s: released {first - sent_ms}..{last - sent_ms} ms after send"
    )
    assert_not_early(records)
