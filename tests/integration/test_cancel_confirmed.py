"""Confirmed and bulk cancels (CONTRACT.md v3) through a real proxy, real replicas found in
ZooKeeper and a real Kafka: ``DELETE /v1/messages/{id}?wait=S`` answers the master's decision
(200 cancelled, 409 already delivered, 404 unknown), ``DELETE /v1/messages?id_prefix=P&wait=S``
the count the master cancelled, with one buffer record; ``kdelay cancel --wait`` and
``--prefix`` print the same and exit non-zero unless cancelled; the replicas count it all.

The replicas read the shared buffer topic ``__kdelay_buffer``: every id prefix and target topic
here is this module's own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from dev.stack import wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC, Cancel
from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.proxy import running_proxy
from kdelay.proxy.client import cancel_command
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import (
    HeaderList,
    Record,
    consume_until,
    decode_buffer,
    produce_all,
    unique_topic,
)
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target

WAIT = "30"


@dataclass
class Stack:
    rs: ReplicaSet
    http: httpx.Client
    http_url: str
    kafka: str  # the proxy's Kafka listener
    bootstrap: str  # Kafka's
    topic: str

    def post(self, **fields: Any) -> dict[str, Any]:
        resp = self.http.post("/v1/messages", json={"topic": self.topic, "value": "v", **fields})
        assert resp.status_code == 202, resp.text
        body: dict[str, Any] = resp.json()
        return body

    def state(self, msg_id: str) -> str | None:
        resp = self.http.get(f"/v1/messages/{msg_id}")
        return str(resp.json()["state"]) if resp.status_code == 200 else None

    def wait_state(self, msg_id: str, state: str) -> None:
        wait_until(
            lambda: self.state(msg_id) == state,
            timeout=120,
            what=f"message {msg_id} to be {state}",
            interval=0.1,
        )

    def metric(self, metric: str) -> float:
        master = self.rs.master()
        assert master is not None
        return self.rs.metric(master, metric) or 0.0


@pytest.fixture(scope="module")
def stack(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    bs = kafka.bootstrap_servers
    topic = unique_topic("cancelwait")
    create_target(bs, topic, partitions=2)
    with ReplicaSet(
        tmp_path_factory.mktemp("cancelwait"),
        bs,
        zookeeper.connect,
        count=2,
        buffer_topic=BUFFER_TOPIC,
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        rs.wait_roles(list(rs.replicas), {"master", "follower"}, timeout=90)
        cfg = loopback_config(bs, zk_connect=zookeeper.connect, zk_root=rs.root)
        with running_proxy(cfg) as proxy:
            assert proxy.addresses is not None
            url = proxy.addresses.http
            with httpx.Client(base_url=url, timeout=60) as http:
                yield Stack(rs, http, url, proxy.addresses.kafka, bs, topic)


def in_an_hour() -> int:
    return (int(time.time() * 1000) // 1000 + 3600) * 1000


def test_a_confirmed_cancel_of_a_pending_message_is_200(stack: Stack) -> None:
    msg_id = f"cw-{uuid.uuid4().hex}"
    stack.post(id=msg_id, deliver_at=in_an_hour())
    stack.wait_state(msg_id, "pending")
    before = stack.metric('kdelay_replica_cancel_outcomes_total{outcome="cancelled"}')
    resp = stack.http.delete(f"/v1/messages/{msg_id}", params={"wait": WAIT})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": msg_id, "state": "cancelled"}
    assert stack.state(msg_id) == "cancelled"
    after = stack.metric('kdelay_replica_cancel_outcomes_total{outcome="cancelled"}')
    assert after == before + 1


def test_a_confirmed_cancel_sent_with_its_message_not_ingested_yet_is_200(stack: Stack) -> None:
    # No waiting for the replicas to read the message: the answer waits for the master.
    msg_id = f"cw-{uuid.uuid4().hex}"
    stack.post(id=msg_id, deliver_at=in_an_hour())
    resp = stack.http.delete(f"/v1/messages/{msg_id}", params={"wait": WAIT})
    assert (resp.status_code, resp.json()) == (200, {"id": msg_id, "state": "cancelled"})


def test_a_confirmed_cancel_of_a_delivered_message_is_409(stack: Stack) -> None:
    msg_id = f"cw-{uuid.uuid4().hex}"
    stack.post(id=msg_id, delay_ms=0)
    stack.wait_state(msg_id, "delivered")
    before = stack.metric('kdelay_replica_cancel_outcomes_total{outcome="already_delivered"}')
    resp = stack.http.delete(f"/v1/messages/{msg_id}", params={"wait": WAIT})
    assert resp.status_code == 409, resp.text
    body = resp.json()
    assert (body["id"], body["state"]) == (msg_id, "already_delivered")
    assert isinstance(body["delivered_at"], int)
    after = stack.metric('kdelay_replica_cancel_outcomes_total{outcome="already_delivered"}')
    assert after == before + 1


def test_a_confirmed_cancel_of_an_unknown_id_is_404(stack: Stack) -> None:
    msg_id = f"cw-never-{uuid.uuid4().hex}"
    resp = stack.http.delete(f"/v1/messages/{msg_id}", params={"wait": WAIT})
    assert resp.status_code == 404, resp.text
    assert resp.json()["field"] == "id"


def test_without_wait_a_cancel_is_202_as_before(stack: Stack) -> None:
    msg_id = f"cw-{uuid.uuid4().hex}"
    resp = stack.http.delete(f"/v1/messages/{msg_id}")
    assert (resp.status_code, resp.json()) == (202, {"id": msg_id})


@pytest.mark.parametrize("wait", ["abc", "61", "-1", "nan"])
def test_a_bad_wait_is_400_naming_it(stack: Stack, wait: str) -> None:
    resp = stack.http.delete("/v1/messages/some-id", params={"wait": wait})
    assert resp.status_code == 400, resp.text
    assert resp.json()["field"] == "wait"
    bulk = stack.http.delete("/v1/messages", params={"id_prefix": "x-", "wait": wait})
    assert (bulk.status_code, bulk.json()["field"]) == (400, "wait")


def test_an_empty_or_missing_prefix_is_400(stack: Stack) -> None:
    for params in ({"id_prefix": ""}, {}, {"topic": stack.topic}):
        resp = stack.http.delete("/v1/messages", params=params)
        assert resp.status_code == 400, resp.text
        assert resp.json()["field"] == "id_prefix"


def test_kdelay_cancel_wait_prints_the_outcome_and_exits_0_only_when_cancelled(
    stack: Stack,
) -> None:
    pending, delivered = f"cli-{uuid.uuid4().hex}", f"cli-{uuid.uuid4().hex}"
    stack.post(id=pending, deliver_at=in_an_hour())
    stack.post(id=delivered, delay_ms=0)
    stack.wait_state(pending, "pending")
    stack.wait_state(delivered, "delivered")
    runner = CliRunner()
    base = ["--http", stack.http_url, "--wait", WAIT]
    ok = runner.invoke(cancel_command, [*base, pending])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output) == {"id": pending, "state": "cancelled"}
    late = runner.invoke(cancel_command, [*base, delivered])
    assert late.exit_code == 1, late.output
    assert json.loads(late.output)["state"] == "already_delivered"
    unknown = runner.invoke(cancel_command, [*base, f"cli-never-{uuid.uuid4().hex}"])
    assert unknown.exit_code == 1, unknown.output
    assert "error" in json.loads(unknown.output)
    usage = runner.invoke(cancel_command, ["--wait", "5", pending])
    assert usage.exit_code == 2
    assert "--http" in usage.output


def buffer_records_of(bootstrap: str, record_id: str) -> list[Cancel]:
    """The cancel records with id ``record_id`` in the whole buffer topic, read up to each
    partition's end (compaction and transaction markers leave gaps: positions decide)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    found: list[Cancel] = []
    try:
        meta = consumer.list_topics(BUFFER_TOPIC, timeout=10).topics[BUFFER_TOPIC]
        parts = [TopicPartition(BUFFER_TOPIC, p, OFFSET_BEGINNING) for p in meta.partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign(parts)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                raw = msg.headers() or []
                headers = raw.items() if isinstance(raw, dict) else raw
                record = Record(
                    BUFFER_TOPIC,
                    msg.partition() or 0,
                    msg.offset() or 0,
                    msg.key(),
                    msg.value(),
                    tuple((k, v.encode() if isinstance(v, str) else v) for k, v in headers),
                    msg.timestamp()[1],
                )
                decoded = decode_buffer(record)
                if isinstance(decoded, Cancel) and decoded.id == record_id:
                    found.append(decoded)
            positions = consumer.position([TopicPartition(BUFFER_TOPIC, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return found
        raise TimeoutError(f"{BUFFER_TOPIC} not read to its end in 120 s")
    finally:
        consumer.close()


def test_a_bulk_cancel_cancels_1000_of_2000_with_one_record_per_partition(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    prefix, other = f"cust-42-{run}-", f"cust-43-{run}-"
    topic = unique_topic("bulk")
    create_target(stack.bootstrap, topic, partitions=2)
    due = int(time.time() * 1000) + 25_000
    records: list[tuple[bytes | None, bytes | None, HeaderList]] = [
        (None, b"v", [(h.ID, f"{p}{i}".encode()), (h.DELIVER_AT, str(due).encode())])
        for i in range(1000)
        for p in (prefix, other)
    ]
    produce_all(stack.kafka, topic, records)
    # Every one pending at the master first, so the count is all of them (the rest would be
    # cancelled as they arrive, and counted then).
    wait_until(
        lambda: (
            stack.http.get("/v1/pending", params={"horizon": "1h"}).json()["topics"].get(topic)
            == 2000
        ),
        timeout=120,
        what="2,000 messages pending",
        interval=0.2,
    )
    bulks_before = stack.metric("kdelay_replica_bulk_cancels_total")
    cancelled_before = stack.metric("kdelay_replica_bulk_cancelled_messages_total")
    resp = stack.http.delete("/v1/messages", params={"id_prefix": prefix, "wait": WAIT})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["cancelled"], body["refused"]) == (1000, 0)
    assert body["id"].startswith("bulk.")
    assert stack.state(f"{prefix}7") == "cancelled"
    delivered = consume_until(stack.bootstrap, [topic], lambda rs: len(rs) >= 1000, timeout=120)
    time.sleep(2)  # sleep: an absence: anything more that would come arrives by now
    delivered = consume_until(stack.bootstrap, [topic], lambda rs: len(rs) >= 1000, timeout=60)
    ids = sorted(dict(r.headers)[h.ID].decode() for r in delivered)  # type: ignore[union-attr]
    assert ids == sorted(f"{other}{i}" for i in range(1000))
    copies = [c.prefix for c in buffer_records_of(stack.bootstrap, body["id"])]
    assert copies == [prefix] * (bulk_copies(body["id"]) or 0)
    assert stack.metric("kdelay_replica_bulk_cancels_total") == bulks_before + 1
    assert stack.metric("kdelay_replica_bulk_cancelled_messages_total") == cancelled_before + 1000


def test_a_bulk_cancel_limited_to_a_topic_and_kdelay_cancel_prefix(stack: Stack) -> None:
    run = uuid.uuid4().hex[:8]
    prefix = f"cust-44-{run}-"
    other_topic = unique_topic("bulkother")
    create_target(stack.bootstrap, other_topic)
    stack.post(id=f"{prefix}a", deliver_at=in_an_hour())
    stack.post(id=f"{prefix}b", deliver_at=in_an_hour(), topic=other_topic)
    stack.wait_state(f"{prefix}a", "pending")
    stack.wait_state(f"{prefix}b", "pending")
    result = CliRunner().invoke(
        cancel_command,
        ["--http", stack.http_url, "--prefix", prefix, "--topic", stack.topic, "--wait", WAIT],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cancelled"] == 1
    assert stack.state(f"{prefix}a") == "cancelled"
    assert stack.state(f"{prefix}b") == "pending"
    # Without --wait: accepted (202), exit 0; the other topic's goes too.
    quick = CliRunner().invoke(cancel_command, ["--http", stack.http_url, "--prefix", prefix])
    assert quick.exit_code == 0, quick.output
    assert json.loads(quick.output)["id"].startswith("bulk.")
    stack.wait_state(f"{prefix}b", "cancelled")
