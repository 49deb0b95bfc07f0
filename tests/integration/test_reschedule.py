"""A reschedule is never lost and a message can be replaced by id,
through a real proxy to a real replica,
with the proxy's wall clock right, 5 s behind and 5 s ahead of the broker's (``faketime`` on the
proxy alone).

- **After the cancel's acknowledgement**: cancel an id, wait for the cancel's delivery report,
  send the id again at once: the new message is delivered (before: cancelled on arrival, since
  the proxy's acceptance time was within 1 s of the cancel's append time, or, with the proxy's
  clock behind, within 1 s plus the skew).
- **Sent with it**: a keyed message and its keyless cancel in one request (one ``flush``): the
  message is cancelled, whichever the proxy's clock (before: with the clock ahead, the ones
  whose cancel reached the buffer first escaped).

A control message without a cancel is delivered; nothing is early by the broker's clock.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import running_proxy
from tests.support.faketime import faketime
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.proxies import loopback_config, proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

IDS = 20
DELAY_MS = 2_000
Headers = list[tuple[str, str | bytes | None]]


def _values(records: list[Record]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for r in records:
        msg_id = (r.header(h.ID) or b"").decode()
        out.setdefault(msg_id, []).append(r.value or b"")
    return out


class _Client:
    """An idempotent producer through the proxy that fails the test on any delivery error."""

    def __init__(self, port: int) -> None:
        self.failures: list[KafkaError] = []
        self.producer = Producer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True}
        )

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err)

    def send(self, topic: str, value: bytes, headers: Headers, key: bytes | None = None) -> None:
        self.producer.produce(topic, value, key, headers=headers, on_delivery=self._report)

    def flush(self) -> None:
        assert self.producer.flush(60) == 0
        assert self.failures == [], self.failures[:3]


@pytest.mark.parametrize("skew", [None, "-5s", "+5s"], ids=["right", "behind", "ahead"])
def test_a_reschedule_right_after_the_cancel_ack_is_delivered_and_one_sent_with_it_is_not(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, skew: str | None
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("reschedule")
    create_target(bs, topic, partitions=3)
    run = uuid.uuid4().hex[:8]
    moved = [f"moved-{run}-{i}" for i in range(IDS)]  # cancelled, acknowledged, sent again
    together = [f"together-{run}-{i}" for i in range(IDS)]  # message and cancel in one flush
    control = f"control-{run}"
    prefix, env = faketime(skew) if skew else ([], {})
    proxy, port = proxy_process(bs, tmp_path / "proxy.log", prefix=prefix, env=env)
    delay = str(DELAY_MS).encode()
    with ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC) as rs:
        proxy.start()
        try:
            rs.start_all()
            rs.wait_master(timeout=90)
            wait_accepting(port)
            client = _Client(port)
            # Long enough to be pending still when its cancel is sent (each cancel's answer is
            # held ~0.1 s: proxy/routing/cancel_acks.py).
            first_delay = str(10 * DELAY_MS).encode()
            for msg_id in moved:
                client.send(topic, b"first", [(h.DELAY_MS, first_delay), (h.ID, msg_id.encode())])
            client.flush()
            for msg_id in moved:
                client.send(topic, b"", [(h.CANCEL, msg_id.encode())])
                client.flush()  # the cancel's delivery report: acknowledged
                client.send(topic, b"second", [(h.DELAY_MS, delay), (h.ID, msg_id.encode())])
            for i, msg_id in enumerate(together):
                # Keyed messages and keyless cancels part ways: the request lists their
                # partitions in some order, so many cancels reach the buffer first.
                headers: Headers = [(h.DELAY_MS, delay), (h.ID, msg_id.encode())]
                client.send(topic, b"gone", headers, key=f"order-{i}".encode())
                client.send(topic, b"", [(h.CANCEL, msg_id.encode())])
            client.send(topic, b"control", [(h.DELAY_MS, delay), (h.ID, control.encode())])
            client.flush()
            records = consume_until(bs, [topic], lambda rs_: control in _values(rs_), timeout=90)
            # Everything sent was due by the firsts' due time; let the master pass it.
            checkpoint_at = max(r.timestamp_ms for r in records) + 10 * DELAY_MS
            wait_until(
                lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > checkpoint_at,
                timeout=60,
                what="the master's checkpoint to pass every due time",
            )
            records = consume_until(bs, [topic], lambda rs_: control in _values(rs_), timeout=30)
        finally:
            proxy.stop()
    got = _values(records)
    lost = [i for i in moved if got.get(i) != [b"second"]]
    leaked = [i for i in together if i in got]
    print(f"\nproxy clock {skew or 'right'}: {IDS - len(lost)} of {IDS} reschedules delivered, "
          f"{len(leaked)} of {IDS} messages sent with their cancel delivered")  # fmt: skip
    assert not lost, f"{len(lost)} of {IDS} reschedules lost: {[got.get(i) for i in lost[:5]]}"
    assert not leaked, f"{len(leaked)} of {IDS} messages sent with their cancel delivered"
    assert got[control] == [b"control"]
    assert_not_early(records)


def test_replace_by_id_over_kafka_and_http_delivers_only_the_replacement(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    """``kdelay-replace: true`` and ``PUT /v1/messages/{id}``: the pending message with that id
    is replaced (due time, value, target partition), when it was pending already and when it
    is in flight with the replace (one flush); with nothing pending, a replace schedules."""
    bs = kafka.bootstrap_servers
    topic = unique_topic("replace")
    create_target(bs, topic, partitions=2)
    run = uuid.uuid4().hex[:8]
    pending_id, in_flight_id, fresh_id = (f"{n}-{run}" for n in ("pending", "flight", "fresh"))
    http_id, http_fresh_id = f"http-{run}", f"http-fresh-{run}"
    old = str(4 * DELAY_MS).encode()  # the replaced ones would be due last
    new = str(DELAY_MS // 2).encode()
    true = (h.REPLACE, b"true")
    with (
        ReplicaSet(tmp_path, bs, zookeeper.connect, count=1, buffer_topic=BUFFER_TOPIC) as rs,
        running_proxy(loopback_config(bs, buffer_partitions=4)) as proxy,
    ):
        rs.start_all()
        rs.wait_master(timeout=90)
        assert proxy.addresses is not None
        client = _Client(int(proxy.addresses.kafka.rsplit(":", 1)[1]))
        with httpx.Client(base_url=proxy.addresses.http, timeout=30) as web:
            client.send(topic, b"old", [(h.DELAY_MS, old), (h.ID, pending_id.encode())])
            body = {"topic": topic, "partition": 0, "value": "old", "delay_ms": int(old)}
            assert web.post("/v1/messages", json={**body, "id": http_id}).status_code == 202
            client.flush()
            client.send(topic, b"new", [(h.DELAY_MS, new), (h.ID, pending_id.encode()), true])
            client.send(topic, b"old", [(h.DELAY_MS, old), (h.ID, in_flight_id.encode())])
            client.send(topic, b"new", [(h.DELAY_MS, new), (h.ID, in_flight_id.encode()), true])
            client.send(topic, b"new", [(h.DELAY_MS, new), (h.ID, fresh_id.encode()), true])
            client.flush()
            put = {"topic": topic, "partition": 1, "value": "new", "delay_ms": int(new)}
            answer = web.put(f"/v1/messages/{http_id}", json=put)
            assert answer.status_code == 202, answer.text
            assert answer.json()["id"] == http_id
            assert web.put(f"/v1/messages/{http_fresh_id}", json=put).status_code == 202
            mismatch = web.put(f"/v1/messages/{http_id}", json={**put, "id": "other"})
            assert mismatch.status_code == 400
            assert mismatch.json()["field"] == "id", mismatch.text
        ids = {pending_id, in_flight_id, fresh_id, http_id, http_fresh_id}
        records = consume_until(bs, [topic], lambda rs_: ids <= set(_values(rs_)), timeout=90)
        last_old_due = max(r.timestamp_ms for r in records) + 4 * DELAY_MS
        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > last_old_due,
            timeout=60,
            what="the master's checkpoint to pass the replaced messages' due times",
        )
        records = consume_until(bs, [topic], lambda rs_: ids <= set(_values(rs_)), timeout=30)
    got = _values(records)
    assert {i: got.get(i) for i in ids} == {i: [b"new"] for i in ids}
    by_id = {(r.header(h.ID) or b"").decode(): r for r in records}
    assert by_id[http_id].partition == 1  # the target changed with the replace
    assert_not_early(records)
