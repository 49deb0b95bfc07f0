"""`kdelay up --shards N` (CONTRACT.md v2): every shard has a master and its own partitions, the
state file and `kdelay status --json` name each replica's shard, the HTTP API finds a message in
whichever shard holds it, and `kdelay up` run again with another `--shards` on the same data
directory reshards what is still pending without losing or repeating any of it."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from dev.stack import KDELAY, wait_until
from kdelay import headers as h
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.schedule import assert_not_early, create_target
from tests.support.up import kdelay_up

COUNT = 60


def _status(zk: str) -> dict[str, Any]:
    done = subprocess.run(
        [KDELAY, "status", "--zk-connect", zk, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _send(proxy: str, topic: str, ids: list[str], delay_ms: int) -> None:
    producer = Producer({"bootstrap.servers": proxy, "linger.ms": 5})
    for i, msg_id in enumerate(ids):
        producer.produce(
            topic,
            f"v-{msg_id}".encode(),
            f"k{i}".encode(),
            headers=[(h.DELAY_MS, str(delay_ms).encode()), (h.ID, msg_id.encode())],
        )
    assert producer.flush(30) == 0


def _ids(records: list[Record]) -> list[str]:
    return [(r.header(h.ID) or b"").decode() for r in records]


def test_up_with_shards_then_resharded(tmp_path_factory: pytest.TempPathFactory) -> None:
    workdir = tmp_path_factory.mktemp("up-shards")
    soon = [f"soon-{i}" for i in range(COUNT)]
    later = [f"later-{i}" for i in range(COUNT)]
    with kdelay_up(workdir, "--shards", "2", "--replicas", "1", "--buffer-partitions", "4") as up:
        state = up.state
        assert [(r["name"], r["shard"]) for r in state["replicas"]] == [
            ("shard0-replica-1", 0),
            ("shard1-replica-1", 1),
        ]
        bootstrap, zk = str(state["kafka"]), str(state["zookeeper"])
        topic = unique_topic("up-shards")
        create_target(bootstrap, topic, partitions=2)
        _send(str(state["proxy"]), topic, soon, 500)
        _send(str(state["proxy"]), topic, later, 25_000)  # still pending when this stack stops
        records = consume_until(bootstrap, [topic], lambda r: len(r) >= COUNT, timeout=60)
        assert sorted(_ids(records)) == sorted(soon)

        # The replicas publish their status every second: wait for one after the releases.
        wait_until(
            lambda: sum(r["pending"] for r in _status(zk)["replicas"]) == COUNT,
            timeout=30,
            what="the replicas to publish their pending counts",
        )
        status = _status(zk)
        shards = status["shards"]
        assert isinstance(shards, list)
        assert [s["shard"] for s in shards] == [0, 1]
        assert all(s["master"] for s in shards), shards
        assert status["master"] == shards[0]["master"]
        owned = [sorted(int(p) for p in s["replicas"][0]["offsets"]) for s in shards]
        assert owned == [[0, 2], [1, 3]]
        pending = [s["replicas"][0]["pending"] for s in shards]
        assert all(n > 0 for n in pending), f"the ids all went to one shard: {pending}"

        with httpx.Client(base_url=str(state["http"]), timeout=30) as http:
            shard_of = set()
            for msg_id in later[:10]:
                doc = http.get(f"/v1/messages/{msg_id}").json()
                assert doc["state"] == "pending", doc
                shard_of.add(doc["answered_by"])
            assert len(shard_of) == 2, f"every id answered by {shard_of}"
            timeline = http.get("/v1/pending", params={"horizon": "1h"}).json()
            assert timeline["pending"] == COUNT
            assert timeline["topics"] == {topic: COUNT}
    assert up.exit_code == 0, up.process.log_tail()

    # The same data directory with 3 shards: kdelay up reshards before the replicas start.
    with kdelay_up(workdir, "--shards", "3", "--replicas", "1", "--buffer-partitions", "4") as up:
        assert "2 -> 3 shard(s)" in up.log, up.log
        bootstrap = str(up.state["kafka"])
        records = consume_until(bootstrap, [topic], lambda r: len(r) >= 2 * COUNT, timeout=90)
        time.sleep(2.0)  # sleep: an absence: anything released twice would arrive now
        records = consume_until(bootstrap, [topic], lambda r: len(r) >= 2 * COUNT, timeout=30)
        ids = _ids(records)
        assert sorted(ids) == sorted(soon + later), "lost or repeated across the reshard"
        assert_not_early(records)
        assert len(_status(str(up.state["zookeeper"]))["shards"]) == 3
    assert up.exit_code == 0, up.process.log_tail()
