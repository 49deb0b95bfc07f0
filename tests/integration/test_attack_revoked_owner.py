"""A revoked user stops writing: messages and a series' occurrences of a principal whose ACLs
were deleted are not released once the replicas' ACL cache has expired; they go to the
dead-letter topic with a reason naming the missing WRITE (CONTRACT.md v4 "Revocation").

The attack, on a real Kafka with SCRAM users and StandardAuthorizer (tests/support/
owners_stack.py): alice, who may WRITE the target topic, schedules an ``R/PT1S`` series and a
one-shot message through the secured proxy (HTTP Basic checked against Kafka); once the series
delivers, an administrator deletes every ACL of alice's with Kafka's admin API. Before the
replicas checked owners, the series went on delivering every second and the one-shot was
released on time: nothing in kdelay asked Kafka again after the proxy accepted them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import cast

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBindingFilter, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from dev.kafka_tools import Record
from dev.stack import wait_until
from kdelay import buffer
from kdelay import headers as h
from tests.support.infra import ZooKeeperInfra
from tests.support.owners_stack import OwnersStack, owners_stack

#: The replicas' acl_cache_ms (their default, the proxy's): how long a verdict is reused.
ACL_CACHE_MS = 5_000
#: What the bound allows on top: Kafka applying the deletion, a round in progress.
MARGIN_MS = 2_000


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra
) -> Iterator[OwnersStack]:
    base = tmp_path_factory.mktemp("revoked")
    with owners_stack(base, zookeeper.connect, "revoked") as s:
        yield s


def _schedule(stack: OwnersStack, body: dict[str, object]) -> None:
    resp = httpx.post(
        f"{stack.http}/v1/messages",
        json={"topic": stack.topic, "value": "v", **body},
        headers=stack.auth("alice"),
        timeout=30,
    )
    assert resp.status_code == 202, resp.text


def _delete_all_acls(stack: OwnersStack, user: str) -> None:
    """Every ACL of ``user``, on any resource, deleted by the administrator."""
    admin = AdminClient({"bootstrap.servers": stack.secure.plain})
    everything = AclBindingFilter(
        ResourceType.ANY,
        cast("str", None),  # any resource name (confluent-kafka's type hints want a str)
        ResourcePatternType.ANY,
        f"User:{user}",
        cast("str", None),  # any host
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    for future in admin.delete_acls([everything]).values():
        assert future.result(timeout=30), f"{user} had no ACL to delete"


def _deliveries(stack: OwnersStack, topic: str, ids: set[str]) -> list[Record]:
    """What ``topic`` holds (read_committed, to the end of every partition) for ``ids``."""
    consumer = Consumer(
        {
            "bootstrap.servers": stack.secure.plain,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    records: list[Record] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(partitions) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.2):
                err = msg.error()
                if err is None:
                    records.append(Record.of(msg))
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()
    return [r for r in records if (r.header(h.ID) or b"").decode() in ids]


def _due_ms(record: Record) -> int:
    return int(record.header(h.DELIVER_AT) or b"0")


def test_a_revoked_owner_is_released_nothing_and_dead_lettered_with_the_reason(
    stack: OwnersStack,
) -> None:
    run = uuid.uuid4().hex[:8]
    series, single = f"rv-series-{run}", f"rv-single-{run}"
    _schedule(stack, {"id": series, "repeat": "R/PT1S", "delay_ms": 1_000})
    _schedule(stack, {"id": single, "delay_ms": 20_000})
    wait_until(
        lambda: len(_deliveries(stack, stack.topic, {series})) >= 2,
        timeout=60,
        what="alice's series delivering while she may WRITE",
    )
    revoked_ms = int(time.time() * 1000)
    _delete_all_acls(stack, "alice")
    bound_ms = revoked_ms + ACL_CACHE_MS + MARGIN_MS

    def dead_letters() -> list[Record]:
        return _deliveries(stack, buffer.DEAD_LETTER_TOPIC, {series, single})

    def ids(records: list[Record]) -> set[str]:
        return {(r.header(h.ID) or b"").decode() for r in records}

    # The one-shot message is due well after the bound: wait until it went somewhere.
    wait_until(
        lambda: single in ids(dead_letters()) | ids(_deliveries(stack, stack.topic, {single})),
        timeout=60,
        what="the one-shot message released or dead-lettered",
    )
    delivered = _deliveries(stack, stack.topic, {series, single})
    late = [(r.header(h.ID), _due_ms(r) - revoked_ms) for r in delivered if _due_ms(r) > bound_ms]
    assert late == [], (
        f"delivered after the revocation + acl_cache_ms (id, due - revoked ms): {late}"
    )
    assert ids(dead_letters()) == {series, single}
    for record in dead_letters():
        reason = (record.header("kdelay-error") or b"").decode()
        assert "WRITE" in reason, reason
        assert "User:alice" in reason, reason
        assert record.header("kdelay-target") is not None
    # The series ended with its refused occurrence: nothing more is pending or released.
    count = len(_deliveries(stack, stack.topic, {series}))
    time.sleep(3)  # sleep: that no further occurrence is released is what is tested
    assert len(_deliveries(stack, stack.topic, {series})) == count
