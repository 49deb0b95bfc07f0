"""`kdelay up` supervises like the orchestrator it stands in for (CONTRACT.md v2).

A user trying HA runs `kdelay up`, finds the master with `kdelay status --json` and SIGKILLs
it, twice, while producing delayed messages through the proxy. `kdelay up` restarts each killed
replica (same name, same metrics port), which rejoins as a follower; every acknowledged message
is delivered, none before its due time by the broker's clock (LogAppendTime). A killed proxy
comes back on the same ports. SIGTERM then stops everything, with exit status 0.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from dev.stack.process import wait_until
from kdelay import headers as h
from tests.support.kafka_helpers import Record, create_topic, unique_topic
from tests.support.stream import DelayedStream
from tests.support.up import (
    UpProcess,
    children_of,
    cluster_status,
    kdelay_up,
    read_state,
    replica_pid,
    roles,
)

PARTITIONS = 4
FAILOVER_TIMEOUT = 180.0


class Deliveries:
    """Reads the target topic from the beginning, incrementally (read_committed)."""

    def __init__(self, kafka: str, topic: str, partitions: int = PARTITIONS) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": kafka, "group.id": "failover-check", "enable.auto.commit": False}
        )
        self.consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        self.records: list[Record] = []

    def ids(self) -> set[str]:
        for msg in self.consumer.consume(2000, timeout=0.5):
            if msg.error() is None:
                self.records.append(Record.of(msg))
        return {(r.header(h.ID) or b"").decode() for r in self.records}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with kdelay_up(tmp_path_factory.mktemp("up-failover"), "--replicas", "3") as running:
        yield running
    # Only SIGTERM stopped it: exit status 0, no child left, the state file gone.
    assert running.exit_code == 0, running.process.log_tail()
    assert children_of(running.process.pid) == []
    assert not running.state_file.exists()


def _master(zk: str) -> str | None:
    status = cluster_status(zk)
    master = status["master"]
    return str(master) if master is not None and roles(status).get(master) == "master" else None


def _kill_master_and_wait_for_failover(up: UpProcess, stream: DelayedStream) -> str:
    zk = str(up.state["zookeeper"])
    found: list[str] = []

    def has_master() -> bool:
        master = _master(zk)
        found.extend([master] if master else [])
        return master is not None

    wait_until(
        has_master, timeout=FAILOVER_TIMEOUT, what="a master in `kdelay status`", interval=0.5
    )
    victim = found[-1]
    old_pid = replica_pid(up, victim)
    os.kill(old_pid, signal.SIGKILL)
    wait_until(
        lambda: _master(zk) not in (None, victim),
        timeout=FAILOVER_TIMEOUT,
        what=f"a new master after {victim} was killed",
        interval=0.5,
        proc=up.process,
    )
    wait_until(
        lambda: (
            replica_pid(up, victim) != old_pid
            and roles(cluster_status(zk)).get(victim) == "follower"
        ),
        timeout=FAILOVER_TIMEOUT,
        what=f"{victim} to be restarted and rejoin as a follower",
        interval=0.5,
        proc=up.process,
    )
    new_pid = replica_pid(up, victim)
    assert f"kdelay: {victim} exited (signal SIGKILL); restarting in 1 s" in up.log
    assert f"kdelay: {victim} restarted (pid {new_pid})" in up.log
    # The stream goes on after the failover.
    after = stream.acked_count() + 100
    wait_until(
        lambda: stream.acked_count() >= after,
        timeout=FAILOVER_TIMEOUT,
        what="100 more acknowledgements",
    )
    return victim


def test_killing_the_master_twice_loses_nothing_and_the_replicas_rejoin(
    up: UpProcess,
) -> None:
    state = up.state
    kafka, zk = str(state["kafka"]), str(state["zookeeper"])
    first_pids = {r["name"]: r["pid"] for r in state["replicas"]}
    topic = unique_topic("failover")
    create_topic(kafka, topic, PARTITIONS, config={"message.timestamp.type": "LogAppendTime"})
    stream = DelayedStream(str(state["proxy"]), topic, prefix="fo", partitions=PARTITIONS)
    stream.start()
    try:
        wait_until(lambda: stream.acked_count() >= 100, timeout=120, what="the stream to flow")
        killed = [_kill_master_and_wait_for_failover(up, stream) for _ in range(2)]
    finally:
        stream.finish()
    assert len(set(killed)) == 2
    assert stream.failed == [], stream.failed[:5]

    deliveries = Deliveries(kafka, topic)
    try:
        wait_until(
            lambda: stream.acked <= deliveries.ids(),
            timeout=300,
            what=f"all {len(stream.acked)} acknowledged messages to be delivered",
            interval=0.5,
        )
    finally:
        deliveries.consumer.close()
    records = deliveries.records
    early = [r for r in records if r.timestamp_ms < int(r.header(h.DELIVER_AT) or b"0")]
    assert early == [], f"{len(early)} delivered before their due time, e.g. {early[:3]}"
    distinct = {r.header(h.ID) for r in records}
    print(
        f"failover: killed {killed}; {stream.sent} sent, {len(stream.acked)} acknowledged, "
        f"{len(distinct)} delivered, {len(records) - len(distinct)} duplicates"
    )

    # The killed replicas are back (new pids in the state file) and follow; kdelay up runs on.
    wait_until(
        lambda: all(roles(cluster_status(zk)).get(name) == "follower" for name in killed),
        timeout=FAILOVER_TIMEOUT,
        what=f"{killed} to show as followers",
        interval=0.5,
    )
    now = read_state(up)
    for name in killed:
        [entry] = [r for r in now["replicas"] if r["name"] == name]
        assert entry["pid"] != first_pids[name]
        os.kill(entry["pid"], 0)
    assert [r["metrics"] for r in now["replicas"]] == [r["metrics"] for r in state["replicas"]]
    assert up.process.alive()


def test_a_killed_proxy_comes_back_on_the_same_ports(up: UpProcess) -> None:
    [proxy] = [m for m in children_of(up.process.pid) if " -m kdelay proxy " in m.cmdline]
    os.kill(proxy.pid, signal.SIGKILL)
    wait_until(
        lambda: "kdelay: proxy restarted (pid" in up.log,
        timeout=FAILOVER_TIMEOUT,
        what="`kdelay up` to restart the proxy",
        proc=up.process,
        interval=0.2,
    )
    assert "kdelay: proxy exited (signal SIGKILL); restarting in 1 s (restart 1)" in up.log

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{up.state['http']}/readyz", timeout=2) as resp:  # noqa: S310
                return bool(resp.status == 200)
        except OSError:
            return False

    wait_until(ready, timeout=FAILOVER_TIMEOUT, what="the restarted proxy's /readyz", interval=0.2)
    assert read_state(up)["proxy"] == up.state["proxy"]
    # A producer pointed at the same address gets through again.
    topic = unique_topic("after-proxy")
    log_append = {"message.timestamp.type": "LogAppendTime"}
    create_topic(str(up.state["kafka"]), topic, 1, config=log_append)
    producer = Producer({"bootstrap.servers": str(up.state["proxy"])})
    sent = int(time.time() * 1000)
    producer.produce(topic, b"v", b"k", headers=[(h.DELAY_MS, b"200"), (h.ID, b"after-proxy")])
    assert producer.flush(60) == 0
    deliveries = Deliveries(str(up.state["kafka"]), topic, partitions=1)
    try:
        wait_until(
            lambda: "after-proxy" in deliveries.ids(),
            timeout=FAILOVER_TIMEOUT,
            what="the message sent through the restarted proxy",
        )
    finally:
        deliveries.consumer.close()
    assert deliveries.records[0].timestamp_ms >= sent + 200
