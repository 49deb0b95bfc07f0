"""A confirmed cancel is final (CONTRACT.md v4), on real Kafka, real replicas
and a real proxy: 150 messages fall due at one instant, and 80 confirmed cancels
(``DELETE /v1/messages/{id}?wait=S``) are sent around that instant, many of them while the
master releases. Every 200 must be a message a read_committed consumer of the target never
sees; every 409 one it sees.

The race's window is short: exactly-once, from the round's produce to its tombstones joining
the transaction (ingest reads the buffer read_committed, so a cancel appended after those
tombstones is read only after the commit, when the message is already gone); at-least-once,
from the produce to the settle. So a run hits it only now and then (6 in 600 from outside);
the unit tests (tests/unit/test_cancel_final.py) drive each case deterministically.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from dev.kafka_tools import consume_until
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import running_proxy
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target, delivered_ids

MESSAGES = 150
CANCELS = 80
COMMITTED: dict[str, str | int | bool] = {"isolation.level": "read_committed"}


def _cancel(url: str, msg_id: str, at: float) -> tuple[str, int, dict[str, Any], float]:
    """Send the confirmed cancel of ``msg_id`` at wall time ``at``; (id, status, body, sent)."""
    delay = at - time.time()
    if delay > 0:
        threading.Event().wait(delay)  # a scheduled send time, not a synchronisation
    sent = time.time()
    with httpx.Client(base_url=url, timeout=60) as http:
        resp = http.delete(f"/v1/messages/{msg_id}", params={"wait": "30"})
    return msg_id, resp.status_code, resp.json(), sent


def _read_to_end(bootstrap: str, topic: str) -> list[Record]:
    """Every record of ``topic`` a read_committed consumer sees up to its end now."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"p-{uuid.uuid4().hex[:8]}"})
    try:
        parts = probe.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
        }
    finally:
        probe.close()

    def at_end(records: list[Record]) -> bool:
        last: dict[int, int] = {}
        for r in records:
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        # read_committed: transaction markers take offsets too, so "within 2 of the end"
        return all(end == 0 or last.get(p, -1) >= end - 2 for p, end in ends.items())

    return consume_until(bootstrap, [topic], at_end, timeout=120, config=COMMITTED)


@pytest.fixture(params=["exactly-once", "at-least-once"])
def delivery(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stack(
    kafka: KafkaInfra,
    zookeeper: ZooKeeperInfra,
    tmp_path_factory: pytest.TempPathFactory,
    delivery: str,
) -> Iterator[tuple[str, str, str]]:
    bs = kafka.bootstrap_servers
    topic = unique_topic("cancelfinal")
    create_target(bs, topic, partitions=2)
    args = ["--delivery", delivery]
    if delivery == "exactly-once":
        args += ["--txn-ack-wait-ms", "5000"]
    with ReplicaSet(
        tmp_path_factory.mktemp("cancelfinal"),
        bs,
        zookeeper.connect,
        count=1,
        buffer_topic=BUFFER_TOPIC,
        extra_args=args,
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        cfg = loopback_config(bs, zk_connect=zookeeper.connect, zk_root=rs.root)
        with running_proxy(cfg) as proxy:
            assert proxy.addresses is not None
            yield proxy.addresses.http, bs, topic


def test_a_confirmed_cancel_answers_200_only_for_a_message_never_delivered(
    stack: tuple[str, str, str], delivery: str
) -> None:
    url, bootstrap, topic = stack
    run = uuid.uuid4().hex[:8]
    ids = [f"cf-{run}-{i}" for i in range(MESSAGES)]
    due_ms = (int(time.time() * 1000) // 1000 + 25) * 1000
    with httpx.Client(base_url=url, timeout=60) as http:
        for msg_id in ids:
            resp = http.post(
                "/v1/messages",
                json={"topic": topic, "value": "v", "id": msg_id, "deliver_at": due_ms},
            )
            assert resp.status_code == 202, resp.text
    assert time.time() < due_ms / 1000 - 1, "posting took too long: the cancels would be late"
    # Cancels every 6 ms from 250 ms before the due instant to 200 ms after: the first ones
    # find their message pending, the last ones released, some meet it in the release.
    start = due_ms / 1000 - 0.25
    chosen = ids[::2][:CANCELS]
    with ThreadPoolExecutor(max_workers=CANCELS) as pool:
        answers = list(
            pool.map(lambda a: _cancel(url, a[1], start + a[0] * 0.006), enumerate(chosen))
        )
    cancelled = {i for i, status, _, _ in answers if status == 200}
    refused = {i for i, status, _, _ in answers if status == 409}
    assert {status for _, status, _, _ in answers} <= {200, 409}, answers
    for _, status, body, _ in answers:
        if status == 409:
            assert body["state"] == "already_delivered", body
            assert isinstance(body["delivered_at"], int), body
    expected = set(ids) - cancelled
    consume_until(
        bootstrap,
        [topic],
        lambda records: expected <= set(delivered_ids(records)),
        timeout=120,
        config=COMMITTED,
    )
    seen = set(delivered_ids(_read_to_end(bootstrap, topic)))
    after_200 = sorted(cancelled & seen)
    print(
        f"\n{delivery}: {len(cancelled)} answered 200, {len(refused)} answered 409; "
        f"delivered after a 200: {len(after_200)} {after_200[:10]}"
    )
    assert not after_200, f"{len(after_200)} messages answered 200 were delivered: {after_200}"
    assert refused <= seen, sorted(refused - seen)
