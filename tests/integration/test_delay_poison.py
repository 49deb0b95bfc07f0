"""Poison records in the buffer topic: every replica dead-letters them and keeps delivering.

Records written straight to the buffer topic, past the proxy: no route header, a route header
cut short, an unknown format version, a due time no store can hold, and 65,536 headers (which
entry format version 1 could not store). Once, any of these stopped every replica's
ingest for good; now each replica counts it and goes on, the master releases it once to the
dead-letter topic with the reason, and the messages around it are all delivered.
"""

from __future__ import annotations

import json
import time
import urllib.request
from functools import partial
from pathlib import Path

from confluent_kafka import Producer

from dev.stack import wait_until
from kdelay.buffer import DEAD_LETTER_TOPIC, ROUTE_HEADER, Scheduled, encode
from kdelay.delay_service.ingest.poison import ERROR_HEADER, SOURCE_HEADER
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import (
    HeaderList,
    Record,
    consume_until,
    unique_topic,
)
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_delivered_once, create_target, produce_buffer

N = 200


def route(**fields: object) -> tuple[str, bytes]:
    return ROUTE_HEADER, json.dumps(fields).encode()


def garbage(target: str) -> list[tuple[bytes, bytes | None, HeaderList]]:
    """(key, value, headers) of records no replica can use as they are."""
    good = json.loads(encode(Scheduled("g", target, 0, None, b"v", 1)).headers[-1][1] or b"")
    return [
        (b"no-route", b"value", [("h", b"1"), ("n", None)]),
        (b"cut-short", b"value", [(ROUTE_HEADER, b'{"v": 1, "op": "sched')]),
        (b"future", b"value", [route(v=7, op="schedule", t=target)]),
        (b"no-fields", b"value", [route(v=1, op="schedule")]),
        (b"far-future", b"value", [route(**{**good, "d": 2**70})]),
    ]


def replica_counter(rs: ReplicaSet, name: str, metric: str, labels: str) -> float:
    """A labelled sample from replica ``name``'s /metrics (0 when absent)."""
    urls = [str(r["metrics"]) for r in rs.status()["replicas"] if r["name"] == name]
    if not urls:
        return 0.0
    with urllib.request.urlopen(urls[0], timeout=5) as resp:  # noqa: S310 - loopback
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{metric}{{{labels}}} "):
                return float(line.split()[1])
    return 0.0


def counted_all(rs: ReplicaSet, name: str, expected: int) -> bool:
    return replica_counter(rs, name, "kdelay_replica_ingested_total", 'kind="invalid"') == expected


def test_every_replica_dead_letters_poison_and_delivers_everything_around_it(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    target = unique_topic("poison")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    with ReplicaSet(tmp_path, kafka.bootstrap_servers, zookeeper.connect, partitions=2) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        start = int(time.time() * 1000) + 1_000

        def batch(prefix: str) -> list[Scheduled]:
            return [
                Scheduled(f"{prefix}-{i}", target, i % 2, None, b"x", start + i) for i in range(N)
            ]

        before, after = batch("before"), batch("after")
        many = Scheduled("many", target, 0, None, b"m", start, (("", b""),) * 65_536)
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, before)
        bad = garbage(target)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
        for p in range(rs.partitions):  # every partition gets every kind of garbage
            for key, value, headers in bad:
                producer.produce(rs.buffer_topic, value, key, partition=p, headers=headers)
        assert producer.flush(30) == 0
        produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, [*after, many])
        messages = [*before, *after, many]

        delivered = consume_until(
            kafka.bootstrap_servers,
            [target],
            lambda rs_: len(rs_) >= len(messages),
            timeout=120,
        )
        expected = len(bad) * rs.partitions
        prefix = f"{rs.buffer_topic}/".encode()

        def ours(records: list[Record]) -> list[Record]:
            return [r for r in records if (r.header(SOURCE_HEADER) or b"").startswith(prefix)]

        dead = ours(
            consume_until(
                kafka.bootstrap_servers,
                [DEAD_LETTER_TOPIC],
                lambda rs_: len(ours(rs_)) >= expected,
                timeout=120,
            )
        )
        for name in rs.replicas:
            wait_until(
                partial(counted_all, rs, name, expected),
                timeout=60,
                what=f"{name} to count every poison record",
            )
        events = {n: r.log_events() for n, r in rs.replicas.items()}
    assert_delivered_once(messages, delivered)
    assert len(dead) == expected, "each poison record is dead-lettered exactly once"
    sources = sorted((r.header(SOURCE_HEADER) or b"").decode() for r in dead)
    assert len(set(sources)) == expected
    by_key = {r.key: r for r in dead}
    for key, value, headers in bad:
        record = by_key[key]
        assert record.value == value
        error = (record.header(ERROR_HEADER) or b"").decode()
        assert error.startswith("invalid_buffer_record: "), error
        assert list(record.headers[: len(headers)]) == [(n, v or b"") for n, v in headers]
    assert "format version 7" in (by_key[b"future"].header(ERROR_HEADER) or b"").decode()
    for name, evs in events.items():
        invalid = [e for e in evs if e["event"] == "ingest.invalid_record"]
        assert len(invalid) == expected, name
        failed = [e for e in evs if e["event"] == "supervisor.component_failed"]
        assert failed == [], f"{name}: {failed[:1]}"
