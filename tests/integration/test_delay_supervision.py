"""A master whose forwarder fails steps down; another replica delivers; nothing is lost.

The fault is real, not injected: replica-1's store holds an entry this build cannot read (entry
format version 9, as if a newer kdelay had written it before a downgrade). It sits in a buffer
partition the topic does not have, so no checkpoint ever covers it and only the forwarder ever
decodes it: every round replica-1 runs as master raises StoreError. Once, that ended
the forwarder thread and left a master holding the election and forwarding nothing.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from rocksdict import Rdict

from dev.stack import wait_until
from kdelay.buffer import Scheduled
from kdelay.delay_service.store import rocks
from kdelay.delay_service.store.entry import entry_key
from kdelay.delay_service.store.store import Store
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, delivered_ids, produce_buffer

N = 500


def plant_unreadable_entry(store_dir: Path) -> None:
    Store(store_dir).close()  # a store's column families, as a replica opens it
    # The store has no API to write a bad entry, rightly; RocksDB underneath does.
    opts, cfs = rocks.options()
    db = Rdict(str(store_dir), opts, column_families=cfs)
    try:
        db[entry_key(0, 999, 0)] = b"\x09written by a newer kdelay"
    finally:
        db.close()


def test_a_failing_forwarder_steps_down_and_a_new_master_delivers(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    target = unique_topic("supervised")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    # Enough patience that replica-1 keeps retrying (and stepping down) until the others join.
    extra = ["--max-component-failures", "100", "--restart-backoff-max-ms", "2000"]
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect, extra_args=extra) as rs:
        bad = rs.replicas["replica-1"]
        plant_unreadable_entry(bad.data_dir / "store")
        rs.start("replica-1")

        def failures() -> list[dict[str, object]]:
            return [
                e
                for e in bad.log_events()
                if e["event"] == "supervisor.component_failed" and e["component"] == "forwarder"
            ]

        wait_until(lambda: bool(failures()), timeout=90, what="replica-1's forwarder to fail")
        rs.start("replica-2")
        rs.start("replica-3")
        master = rs.wait_master(timeout=90, exclude="replica-1")
        start = int(time.time() * 1000) + 1_000
        messages = [Scheduled(f"s-{i}", target, i % 2, None, b"x", start + i * 4) for i in range(N)]
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
        records = consume_until(
            kafka.bootstrap_servers,
            [target],
            lambda rs_: {m.id for m in messages} <= set(delivered_ids(rs_)),
            timeout=120,
        )
        assert bad.alive(), "replica-1 exited although it could step down"
        assert rs.master() != "replica-1"
        assert rs.metric("replica-1", "kdelay_replica_is_master") == 0
        url = str(next(r["metrics"] for r in rs.status()["replicas"] if r["name"] == "replica-1"))
        health = url.removesuffix("/metrics") + "/healthz"
        with urllib.request.urlopen(health, timeout=5) as resp:  # noqa: S310 - loopback
            assert json.loads(resp.read()) == {"status": "ok", "reason": ""}
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        events = bad.log_events()
    assert set(delivered_ids(records)) == {m.id for m in messages}, "messages were lost"
    assert_not_early(records)
    failed = [
        e
        for e in events
        if e["event"] == "supervisor.component_failed" and e["component"] == "forwarder"
    ]
    assert failed
    assert "StoreError" in str(failed[0].get("exception")), "no traceback in the log"
    assert any(e["event"] == "replica.stepping_down" for e in events)
    count = [
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith('kdelay_component_failures_total{component="forwarder"}')
    ]
    assert count
    assert count[0] >= 1
    print(f"\nreplica-1's forwarder failed {count[0]:.0f} times; {master} took over")
