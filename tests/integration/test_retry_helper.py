"""kdelay.retry against real Kafka, a real proxy and a real delay-service replica: retries come
back with their attempt and origin, the last attempt is dead-lettered, a consumer killed between
attempts loses nothing, and an offset is never committed before its retry was acknowledged."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import CollectorRegistry

from dev.kafka_tools import read_to_end
from dev.stack import ManagedProcess, wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from kdelay.retry import RetryingConsumer, RetryPolicy, RetryProduceError
from kdelay.retry.plan import ERROR
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, create_topic, produce_all, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet

ROOT = Path(__file__).resolve().parents[2]
#: Generous: a replica releases a due retry within a second or so; a slow machine takes longer.
WAIT = 120.0


@dataclass
class Stack:
    bootstrap: str
    proxy: ManagedProcess
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def stack(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A proxy and one replica in front of the session's Kafka (the proxy writes the default
    buffer topic, so the replica reads that one)."""
    base = tmp_path_factory.mktemp("retry-stack")
    bs = kafka.bootstrap_servers
    proxy, port = proxy_process(bs, base / "proxy.log")
    with ReplicaSet(base, bs, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC) as rs:
        proxy.start()
        try:
            rs.start_all()
            rs.wait_master(timeout=WAIT)
            wait_accepting(port)
            yield Stack(bs, proxy, port)
        finally:
            proxy.stop()


def consumer_config(stack: Stack, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": stack.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        **extra,
    }


def committed(bootstrap: str, group: str, parts: list[tuple[str, int]]) -> dict[str, int]:
    """The group's committed offset per ``topic`` of ``parts`` (-1001 when none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = c.committed([TopicPartition(t, p) for t, p in parts], timeout=10)
    finally:
        c.close()
    return {tp.topic: tp.offset for tp in found}


def poll_until(rc: RetryingConsumer, done: Any, what: str) -> None:
    wait_until(lambda: rc.poll_once(0.2) >= 0 and done(), timeout=WAIT, what=what, interval=0)


def main_topic(stack: Stack, value: bytes) -> tuple[str, int]:
    """A fresh one-partition topic holding one record; the topic and the record's offset."""
    topic = unique_topic("retry-main")
    create_topic(stack.bootstrap, topic, 1)
    produce_all(stack.bootstrap, topic, [(b"order-7", value, [("app", b"1")])])
    [record] = read_to_end(stack.bootstrap, [topic])
    return topic, record.offset


def test_fails_twice_then_succeeds_three_deliveries_attempts_1_to_3(stack: Stack) -> None:
    topic, offset = main_topic(stack, b"pay")
    group = unique_topic("g")
    seen: list[tuple[Record, int]] = []
    registry = CollectorRegistry()

    def handle(msg: Message) -> None:
        seen.append((Record.of(msg), rc.attempt(msg)))
        if len(seen) <= 2:
            raise RuntimeError(f"boom {len(seen)}")

    policy = RetryPolicy(delays_ms=[500, 500])
    with RetryingConsumer(
        consumer_config(stack, group), stack.address, [topic], handle, policy=policy,
        registry=registry,
    ) as rc:  # fmt: skip
        retry_topic = rc.retry_topic
        poll_until(
            rc,
            lambda: (
                len(seen) >= 3
                and committed(stack.bootstrap, group, [(retry_topic, 0)])[retry_topic] >= 0
            ),
            "three deliveries and a commit on the retry topic",
        )
    retries = read_to_end(stack.bootstrap, [retry_topic])
    assert len(retries) == 2  # so the handler can have seen no more than 1 + 2 deliveries
    assert [attempt for _, attempt in seen] == [1, 2, 3]
    first, second, third = (r for r, _ in seen)
    assert (first.topic, first.offset, first.header(h.ATTEMPT)) == (topic, offset, None)
    for n, r in ((2, second), (3, third)):
        assert r.topic == retry_topic
        assert (r.key, r.value, r.header("app")) == (b"order-7", b"pay", b"1")
        assert r.header(h.ATTEMPT) == str(n).encode()
        assert r.header(h.ORIGINAL_TOPIC) == topic.encode()
        assert r.header(h.ORIGINAL_PARTITION) == b"0"
        assert r.header(h.ORIGINAL_OFFSET) == str(offset).encode()
        assert r.header(ERROR) == f"RuntimeError: boom {n - 1}".encode()
        assert (r.header(h.ID) or b"").startswith(b"retry-")
    assert second.header(h.ID) != third.header(h.ID)
    offsets = committed(stack.bootstrap, group, [(topic, 0), (retry_topic, 0)])
    assert offsets[topic] == offset + 1
    assert offsets[retry_topic] > max(r.offset for r in retries)
    sample = registry.get_sample_value
    assert sample("kdelay_retry_retried_total", {"group": group}) == 2
    assert sample("kdelay_retry_handled_total", {"group": group, "outcome": "ok"}) == 1


def test_after_the_last_attempt_the_message_is_in_the_dead_letter_topic(stack: Stack) -> None:
    topic, offset = main_topic(stack, b"poison")
    group = unique_topic("g")
    registry = CollectorRegistry()
    attempts: list[int] = []

    def handle(msg: Message) -> None:
        attempts.append(rc.attempt(msg))
        raise ValueError("cannot parse the order")

    with RetryingConsumer(
        consumer_config(stack, group), stack.address, [topic], handle,
        policy=RetryPolicy(delays_ms=[300]), registry=registry,
    ) as rc:  # fmt: skip
        retry_topic, dlq = rc.retry_topic, rc.dead_letter_topic
        poll_until(
            rc,
            lambda: (
                registry.get_sample_value("kdelay_retry_dead_lettered_total", {"group": group}) == 1
            ),
            "the dead letter to be acknowledged",
        )
    assert attempts == [1, 2]
    [dead] = read_to_end(stack.bootstrap, [dlq])
    assert (dead.key, dead.value, dead.header("app")) == (b"order-7", b"poison", b"1")
    assert dead.header(ERROR) == b"ValueError: cannot parse the order"
    assert dead.header(h.ATTEMPT) == b"2"
    assert dead.header(h.ORIGINAL_TOPIC) == topic.encode()
    assert dead.header(h.ORIGINAL_OFFSET) == str(offset).encode()
    for control in (h.ID, h.DELIVER_AT, h.DELAY_MS, h.DELAY_LEVEL):
        assert dead.header(control) is None
    [retried] = read_to_end(stack.bootstrap, [retry_topic])
    offsets = committed(stack.bootstrap, group, [(topic, 0), (retry_topic, 0)])
    assert offsets[topic] == offset + 1
    assert offsets[retry_topic] > retried.offset


def _deliveries(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _consumer_process(
    stack: Stack, tmp_path: Path, name: str, topic: str, group: str, *extra: str
) -> tuple[ManagedProcess, Path]:
    log = tmp_path / f"{name}.jsonl"
    argv = [
        sys.executable, "-m", "tests.support.retry_consumer", "--bootstrap", stack.bootstrap,
        "--proxy", stack.address, "--topic", topic, "--group", group, "--log", str(log), *extra,
    ]  # fmt: skip
    proc = ManagedProcess(f"retry consumer {name}", argv, tmp_path / f"{name}.log", cwd=ROOT)
    proc.start()
    return proc, log


def test_a_consumer_killed_between_attempts_loses_nothing(stack: Stack, tmp_path: Path) -> None:
    topic = unique_topic("retry-main")
    create_topic(stack.bootstrap, topic, 1)
    group = unique_topic("g")
    retry_topic = f"{group}.retry"
    # The first retry is due 5 s after the proxy took it: A is killed well before that.
    a, a_log = _consumer_process(
        stack, tmp_path, "a", topic, group, "--delays-ms", "5000,500", "--fail-until", "1"
    )
    try:
        produce_all(stack.bootstrap, topic, [(b"order-9", b"refund", [])])
        # The main topic's offset is committed only once the retry was acknowledged.
        wait_until(
            lambda: committed(stack.bootstrap, group, [(topic, 0)])[topic] == 1,
            timeout=WAIT,
            what="consumer A to commit the message after producing its retry",
            proc=a,
        )
    finally:
        a.kill()
    assert [d["attempt"] for d in _deliveries(a_log)] == [1], "A was not killed between attempts"
    # Start B once the retry is in the retry topic, with auto.offset.reset=latest: the group has
    # no offset there (A never committed one), and the retry must not be skipped.
    wait_until(
        lambda: len(read_to_end(stack.bootstrap, [retry_topic])) == 1,
        timeout=WAIT,
        what="the retry to be released into the retry topic",
    )
    b, b_log = _consumer_process(
        stack, tmp_path, "b", topic, group, "--delays-ms", "5000,500", "--fail-until", "1",
        "--offset-reset", "latest",
    )  # fmt: skip
    try:
        wait_until(
            lambda: committed(stack.bootstrap, group, [(retry_topic, 0)])[retry_topic] >= 1,
            timeout=WAIT,
            what="consumer B to handle the retry and commit it",
            proc=b,
        )
    finally:
        b.stop()
    [delivery] = _deliveries(b_log)
    assert delivery["topic"] == retry_topic
    assert (delivery["key"], delivery["value"], delivery["attempt"]) == ("order-9", "refund", 2)
    assert delivery["headers"][h.ORIGINAL_TOPIC] == topic
    assert delivery["headers"][h.ORIGINAL_OFFSET] == "0"


def test_a_failed_produce_does_not_commit_the_offset(stack: Stack) -> None:
    topic, offset = main_topic(stack, b"ship")
    group = unique_topic("g")

    def fail(_msg: Message) -> None:
        raise RuntimeError("downstream unavailable")

    stack.proxy.stop()  # the proxy is down: the retry cannot be acknowledged
    try:
        with RetryingConsumer(
            consumer_config(stack, group), stack.address, [topic], fail,
            policy=RetryPolicy(delays_ms=[500]), producer_config={"message.timeout.ms": 3000},
            registry=CollectorRegistry(),
        ) as rc, pytest.raises(RetryProduceError) as info:  # fmt: skip
            poll_until(rc, lambda: False, "the retry's produce to fail")
        assert info.value.origin.offset == offset
        assert committed(stack.bootstrap, group, [(topic, 0)])[topic] < 0
    finally:
        stack.proxy.start()
        wait_accepting(stack.port)
    # A new consumer of the group is given the message again, and commits it once handled.
    again: list[tuple[str, int]] = []

    def handle(msg: Message) -> None:
        again.append((msg.topic() or "", msg.offset() or 0))

    with RetryingConsumer(
        consumer_config(stack, group), stack.address, [topic], handle,
        registry=CollectorRegistry(),
    ) as rc:  # fmt: skip
        poll_until(
            rc,
            lambda: committed(stack.bootstrap, group, [(topic, 0)])[topic] == offset + 1,
            "the message to be handled again and committed",
        )
    assert again == [(topic, offset)]
