"""A record or POST with other content is never taken for a retry of an acknowledged one
, through real proxies in front of real Kafka and a real replica;
a true retry (the same batch resent, the same POST body sent again) is still kept once.

- Kafka listener: a buffer key derives from the producer's identity, the record's sequence
  number *and its content*, so the record after a sequence wrap (sequence s + 2**31 on the
  wire is s again) and a record a restarted proxy sees at a (producer id, epoch, sequence) it
  forgot are new messages, while the same batch resent through a restarted proxy is kept once.
- HTTP: a POST's buffer key derives from every field of its body, so the same body with
  another ``repeat`` is a new series, not a retry of a delivered one.

Records here carry no ``kdelay-id`` unless said (their ids are pinned to the target partition's
buffer partition, so they are ingested in the order sent) and go to a one-partition target: a
sentinel sent last and due last is delivered after anything else that was kept, so once it is
there the counts are final.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.proxies import loopback_config
from tests.support.raw_client import RawClient, produce_request, record_batch
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

SEQUENCES = 2**31  # Kafka's sequence numbers wrap at int32 (KIP-98)
#: Far enough ahead that each record is pending when the next one with its key would arrive.
DUE_IN_MS = 20_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def replicas(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReplicaSet]:
    """One replica on the proxies' buffer topic (``__kdelay_buffer``, 3 partitions)."""
    with ReplicaSet(
        tmp_path_factory.mktemp("identity"),
        kafka.bootstrap_servers,
        zookeeper.connect,
        count=1,
        partitions=3,
        buffer_topic=buffer.BUFFER_TOPIC,
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        yield rs


def produce(
    kafka: KafkaInfra,
    topic: str,
    batch: bytes,
) -> None:
    """``batch`` to ``topic``/0 through a proxy of its own (started for it, then stopped: a
    proxy with no state for the batch's producer, as after a restart or idempotence-state
    eviction), which must acknowledge it."""
    with running_proxy(loopback_config(kafka.bootstrap_servers)) as px:
        assert px.addresses is not None
        with RawClient(px.addresses.kafka) as client:
            produced = client.request(produce_request(topic, 0, batch))
    answer = produced.responses[0].partition_responses[0]
    assert answer.error_code == 0, answer


def delayed(
    value: bytes, due_ms: int, *, pid: int, seq: int, ts: int, extra: list[Any] | None = None
) -> bytes:
    """A one-record batch of producer ``pid`` (epoch 0) at sequence ``seq``, delayed to
    ``due_ms``; ``ts``: the record's timestamp as the producer set it."""
    headers = [(h.DELIVER_AT, str(due_ms).encode()), *(extra or [])]
    return record_batch(
        [(b"k", value, headers)], producer_id=pid, epoch=0, base_sequence=seq, timestamp_ms=ts
    )


def delivered_after(kafka: KafkaInfra, topic: str, due_ms: int) -> Counter[bytes]:
    """Send the sentinel (due after ``due_ms``), wait for it, and count the delivered values."""
    sentinel = record_batch([(b"k", b"sentinel", [(h.DELIVER_AT, str(due_ms + 1000).encode())])])
    produce(kafka, topic, sentinel)
    records = consume_until(
        kafka.bootstrap_servers,
        [topic],
        lambda rs: any(r.value == b"sentinel" for r in rs),
        timeout=120,
    )
    assert_not_early(records)
    return Counter(r.value or b"" for r in records)


def test_a_record_after_a_sequence_wrap_is_a_new_message(
    kafka: KafkaInfra, replicas: ReplicaSet
) -> None:
    """Sequence s, then 2**31 records later sequence s + 2**31, which is s on the wire: the
    second is another record, and both are delivered. (The records between are not sent: the
    second proxy adopts the producer at 2**31 - 1, as after 2**31 records through one.)"""
    topic = unique_topic("id-wrap")
    create_target(kafka.bootstrap_servers, topic)
    pid, ts = secrets.randbelow(2**40) + 1, now_ms()
    due = now_ms() + DUE_IN_MS
    produce(kafka, topic, delayed(b"seq 0", due, pid=pid, seq=0, ts=ts))
    with running_proxy(loopback_config(kafka.bootstrap_servers)) as px:
        assert px.addresses is not None
        with RawClient(px.addresses.kafka) as client:
            for value, seq in ((b"seq 2**31-1", SEQUENCES - 1), (b"seq 2**31", 0)):
                batch = delayed(value, due, pid=pid, seq=seq, ts=ts)
                answer = client.request(produce_request(topic, 0, batch))
                assert answer.responses[0].partition_responses[0].error_code == 0
    got = delivered_after(kafka, topic, due)
    assert got == Counter({b"seq 0": 1, b"seq 2**31-1": 1, b"seq 2**31": 1, b"sentinel": 1})


def test_a_restarted_proxy_keeps_a_retry_once_and_other_content_as_new_messages(
    kafka: KafkaInfra, replicas: ReplicaSet
) -> None:
    """A proxy that forgot a producer (a restart) sees (producer id, epoch, sequence) again:
    the batch resent byte for byte is a retry, kept once; a record with another value, or
    only another null-versus-empty header value, or only another timestamp, is a new
    message."""
    topic = unique_topic("id-restart")
    create_target(kafka.bootstrap_servers, topic)
    pid, ts = secrets.randbelow(2**40) + 1, now_ms()
    due = now_ms() + DUE_IN_MS
    first = delayed(b"one", due, pid=pid, seq=7, ts=ts, extra=[("trace", None)])
    produce(kafka, topic, first)
    produce(kafka, topic, first)  # the client's retry, through a restarted proxy
    for other in (
        delayed(b"two", due, pid=pid, seq=7, ts=ts, extra=[("trace", None)]),
        delayed(b"one", due, pid=pid, seq=7, ts=ts, extra=[("trace", b"")]),
        delayed(b"one", due, pid=pid, seq=7, ts=ts + 1, extra=[("trace", None)]),
    ):
        produce(kafka, topic, other)
    got = delivered_after(kafka, topic, due)
    assert got == Counter({b"one": 3, b"two": 1, b"sentinel": 1})


def _occurrences(records: list[Record], msg_id: str) -> Counter[int]:
    return Counter(
        int(r.header(h.OCCURRENCE) or b"0") for r in records if r.header(h.ID) == msg_id.encode()
    )


def test_a_post_with_another_repeat_is_a_new_series(
    kafka: KafkaInfra, replicas: ReplicaSet
) -> None:
    """POST a series ``R2/PT1S`` with an id, let both occurrences go, then the same body with
    ``R3/PT1S`` (twice: a client's retry): a new series of three occurrences, delivered once."""
    topic = unique_topic("id-http-repeat")
    create_target(kafka.bootstrap_servers, topic)
    msg_id = f"series-{uuid.uuid4().hex}"
    body = {"topic": topic, "value": "tick", "id": msg_id, "repeat": "R2/PT1S"}
    with running_proxy(loopback_config(kafka.bootstrap_servers)) as px:
        assert px.addresses is not None
        with httpx.Client(base_url=px.addresses.http, timeout=60) as http:
            assert http.post("/v1/messages", json=body).status_code == 202
            consume_until(
                kafka.bootstrap_servers,
                [topic],
                lambda rs: _occurrences(rs, msg_id)[2] == 1,
                timeout=120,
            )
            again = {**body, "repeat": "R3/PT1S"}
            answers = [http.post("/v1/messages", json=again) for _ in range(2)]
            assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
            # Same id (same buffer partition), due after the series' last occurrence.
            sentinel = {**body, "value": "sentinel", "repeat": None, "delay_ms": 5_000}
            assert http.post("/v1/messages", json=sentinel).status_code == 202
    records = consume_until(
        kafka.bootstrap_servers,
        [topic],
        lambda rs: any(r.value == b"sentinel" for r in rs),
        timeout=120,
    )
    assert_not_early(records)
    ticks = [r for r in records if r.value == b"tick"]
    assert _occurrences(ticks, msg_id) == Counter({1: 2, 2: 2, 3: 1})
