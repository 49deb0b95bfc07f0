"""A replace with ``repeat`` keeps its whole series, through a real proxy (its
HTTP ``PUT /v1/messages/{id}`` and its Kafka listener with ``kdelay-replace: true``) to a real
replica on the proxy's buffer topic.

Reported from outside: ``PUT`` with ``"repeat": "R5/PT1S"`` over a pending message delivered
occurrence 1 and nothing more (the replace's own cancel part cancelled occurrence 2 on arrival:
it carries occurrence 1's acceptance stamp, inside the replace's 100 ms). Here each
replacement, by HTTP and by header, is delivered 5 times, occurrences 1 to 5 in order, never
early by the broker's clock, and the replaced message never; an endless series put over a
pending message still stops at a plain cancel sent after it. And the verifier, which judges
cancels by its own reading of the contract, reports the bug's history as a missing
occurrence (before: as cancelled, by the replicas' rule it shared)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay import buffer
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import running_proxy
from kdelay.verifier.cli import verify_once
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.report import Slo
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

OLD_DELAY_MS = 8_000  # the replaced messages: due after every occurrence of the replacements
NEW_DELAY_MS = 1_000


def _of(records: list[Record], msg_id: str) -> list[Record]:
    mine = [r for r in records if r.header(h.ID) == msg_id.encode()]
    return sorted(mine, key=lambda r: (r.partition, r.offset))


def _occurrences(records: list[Record]) -> list[int]:
    return [int(r.header(h.OCCURRENCE) or b"0") for r in records]


def _produce(
    port: int, topic: str, value: bytes, headers: list[tuple[str, str | bytes | None]]
) -> None:
    """One record through the proxy's Kafka listener, acknowledged without error."""
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    p.produce(topic, value, key=b"k", headers=headers, on_delivery=on_delivery)
    assert p.flush(60) == 0
    assert errors == [], errors


def test_a_replacement_with_repeat_delivers_every_occurrence_by_http_and_by_header(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("replace-series")
    create_target(bs, topic, partitions=2)
    run = uuid.uuid4().hex[:8]
    http_id, header_id, stopped_id = (f"{n}-{run}" for n in ("http", "header", "stopped"))
    five = [http_id, header_id]
    old = {"topic": topic, "partition": 0, "value": "old", "delay_ms": OLD_DELAY_MS}
    new = {"topic": topic, "partition": 0, "value": "new", "delay_ms": NEW_DELAY_MS}
    with (
        ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC) as rs,
        running_proxy(loopback_config(bs, buffer_partitions=4)) as proxy,
    ):
        rs.start_all()
        rs.wait_master(timeout=90)
        assert proxy.addresses is not None
        port = int(proxy.addresses.kafka.rsplit(":", 1)[1])
        with httpx.Client(base_url=proxy.addresses.http, timeout=30) as web:
            for msg_id in (http_id, stopped_id):
                assert web.post("/v1/messages", json={**old, "id": msg_id}).status_code == 202
            old_headers: list[tuple[str, str | bytes | None]] = [
                (h.DELAY_MS, str(OLD_DELAY_MS).encode()),
                (h.ID, header_id.encode()),
            ]
            _produce(port, topic, b"old", old_headers)
            put = web.put(f"/v1/messages/{http_id}", json={**new, "repeat": "R5/PT1S"})
            assert put.status_code == 202, put.text
            _produce(
                port,
                topic,
                b"new",
                [
                    (h.DELAY_MS, str(NEW_DELAY_MS).encode()),
                    (h.ID, header_id.encode()),
                    (h.REPEAT, b"R5/PT1S"),
                    (h.REPLACE, b"true"),
                ],
            )
            endless = web.put(f"/v1/messages/{stopped_id}", json={**new, "repeat": "R/PT1S"})
            assert endless.status_code == 202, endless.text
            consume_until(bs, [topic], lambda r: len(_of(r, stopped_id)) >= 3, timeout=60)
            assert web.delete(f"/v1/messages/{stopped_id}").status_code == 202
            cancelled_ms = time.time() * 1000  # the cancel was appended before this
        records = consume_until(
            bs, [topic], lambda r: all(len(_of(r, i)) >= 5 for i in five), timeout=60
        )
        # Past the replaced messages' due time (and a sixth occurrence's), by the master's
        # checkpoint: whatever was to be delivered by then has been.
        passed = max(r.timestamp_ms for r in records) + OLD_DELAY_MS
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > passed,
            timeout=60,
            what="the master's checkpoint to pass the replaced messages' due times",
        )
        records = consume_until(bs, [topic], lambda r: len(r) >= len(records), timeout=30)
    for msg_id in five:
        mine = _of(records, msg_id)
        assert _occurrences(mine) == [1, 2, 3, 4, 5], (msg_id, _occurrences(mine))
        assert {r.value for r in mine} == {b"new"}, msg_id  # the replaced message: never
    stopped = _of(records, stopped_id)
    assert {r.value for r in stopped} == {b"new"}
    assert _occurrences(stopped) == list(range(1, len(stopped) + 1))
    # At most the occurrence in flight when the replica read the cancel is written after it.
    after = [r for r in stopped if r.timestamp_ms > cancelled_ms]
    assert len(stopped) >= 3
    assert len(after) <= 1, _occurrences(stopped)
    assert_not_early(records)


@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)
def test_the_verifier_reports_the_bugs_history_as_a_missing_occurrence(kafka: KafkaInfra) -> None:
    """The buffer and target as the bug left them: a pending message, its replace with
    ``R5/PT1S`` (accepted and appended at one instant), occurrence 1 delivered, occurrence 2
    written at occurrence 1's release with occurrence 1's acceptance stamp, never delivered
    (and no later occurrence written). ``kdelay verify --once``: the replaced message is
    cancelled, occurrence 2 missing."""
    from kdelay.verifier import job

    bs = kafka.bootstrap_servers
    buffer_topic, target = unique_topic("vbuf-series"), unique_topic("vtgt-series")
    create_topic(bs, buffer_topic, partitions=1)
    create_target(bs, target)
    now = int(time.time() * 1000)
    put_ms = now - 50_000
    old = buffer.Scheduled(
        "x", target, -1, None, b"old", now - 10_000, uid=uuid.uuid4().hex,
        seq=(now - 60_000) << buffer.ORDER_SHIFT,
    )  # fmt: skip
    first = buffer.Scheduled(
        "x", target, -1, None, b"new", now - 30_000, uid=uuid.uuid4().hex,
        seq=put_ms << buffer.ORDER_SHIFT, repeat="R5/PT1S", replace=True,
    )  # fmt: skip
    second = first.next_occurrence(first.deliver_at_ms + 1_000, first.seq)
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bs, "acks": "all", "enable.idempotence": True})
    for record, written_ms in ((old, now - 60_000), (first, put_ms), (second, now - 29_998)):
        enc = buffer.encode(record)
        producer.produce(
            buffer_topic, enc.value, enc.key, partition=0, headers=list(enc.headers),
            timestamp=written_ms, on_delivery=on_delivery,
        )  # fmt: skip
    producer.produce(
        target, first.value, headers=list(first.delivered_headers()), on_delivery=on_delivery
    )
    assert producer.flush(60) == 0
    assert errors == []
    cfg = VerifierConfig(
        bootstrap_servers=bs, buffer_topic=buffer_topic, grace_ms=5_000, output_topic="",
        console=False, end_ms=int(time.time() * 1000),
    )  # fmt: skip
    spark = job.spark_session(VerifierConfig(bootstrap_servers=bs))
    try:
        outcome = verify_once(spark, cfg, Slo(), None)
    finally:
        spark.stop()
    counts = ("scheduled", "delivered", "missing")
    assert [outcome.report[k] for k in counts] == [2, 1, 1], outcome.report
    assert outcome.details["cancelled"] == 1  # the replaced message
