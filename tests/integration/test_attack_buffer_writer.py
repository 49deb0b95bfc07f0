"""WRITE on the buffer topic is a master key: a principal an administrator let write it forges a
record the replicas release to any topic as any owner.

The attack, on a real Kafka with SCRAM users and StandardAuthorizer (tests/support/
secure_kafka.py): mallory, who may not WRITE the victim topic, holds WRITE on the buffer topic
and writes, with kdelay's own encoder, a scheduled message for the victim topic due now, its
owner set to alice (who may write there, so the owner check before a release passes). Before the
replicas checked the buffer's writers, the master released it. After
(delay_service/release/buffer_writers.py): a replica refuses to start while such a binding
exists, naming it and the command that removes it; a binding added while it runs holds every
release until it is removed.

Waits are failure detection only (no speed is asserted).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from dev.stack import wait_until
from kdelay.buffer import Scheduled, encode
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import SecureKafka, secured_kafka

GAUGE = "kdelay_replica_buffer_foreign_writers"
#: The replicas' acl_cache_ms here: how often the master asks the buffer's bindings again.
ACL_CACHE_MS = 500


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("attack-writer"), "SASL_PLAINTEXT") as sk:
        sk.add_user("mallory")
        yield sk


@pytest.fixture
def victim(secure: SecureKafka) -> str:
    topic = unique_topic("victim")
    create_topic(secure.plain, topic, partitions=1)
    secure.grant("alice", topic, "WRITE", "DESCRIBE")
    return topic


def _replicas(secure: SecureKafka, zookeeper: ZooKeeperInfra, base: Path) -> ReplicaSet:
    """One replica on the open listener (a super user there) with its own buffer topic."""
    rs = ReplicaSet(
        base, secure.plain, zookeeper.connect, count=1, partitions=1,
        extra_args=["--acl-cache-ms", str(ACL_CACHE_MS)],
    )  # fmt: skip
    rs.create_buffer_topic()
    return rs


def _forge(secure: SecureKafka, buffer_topic: str, victim: str) -> str:
    """mallory writes a message for ``victim``, due now, owned by alice; its id."""
    msg_id = f"forged-{uuid.uuid4().hex[:8]}"
    forged = Scheduled(
        msg_id, victim, 0, None, b"forged", int(time.time() * 1000), owner="User:alice"
    )
    enc = encode(forged)
    producer = Producer(secure.client("mallory", **{"bootstrap.servers": secure.secure}))
    errors: list[object] = []
    producer.produce(
        buffer_topic, enc.value, enc.key, headers=list(enc.headers),
        on_delivery=lambda err, _m: errors.append(err),
    )  # fmt: skip
    producer.flush(30)
    assert errors == [None], f"mallory's write to the buffer failed: {errors}"
    return msg_id


def _delivered(secure: SecureKafka, victim: str, msg_id: str, wait_s: float) -> bool:
    def found(records: list[Record]) -> bool:
        return any(msg_id.encode() in (r.value or b"") or _has_id(r, msg_id) for r in records)

    try:
        consume_until(secure.plain, [victim], found, timeout=wait_s)
    except TimeoutError:
        return False
    return True


def _has_id(record: Record, msg_id: str) -> bool:
    return record.header("kdelay-id") == msg_id.encode()


def test_a_replica_refuses_to_start_while_another_principal_may_write_the_buffer(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path: Path, victim: str
) -> None:
    with _replicas(secure, zookeeper, tmp_path) as rs:
        secure.grant("mallory", rs.buffer_topic, "WRITE")
        msg_id = _forge(secure, rs.buffer_topic, victim)
        replica = rs.start("replica-1")
        wait_until(
            lambda: not replica.alive() or _delivered(secure, victim, msg_id, 0.5),
            timeout=90,
            what="the replica refusing to start, or releasing the forged record",
        )
        assert not _delivered(secure, victim, msg_id, 2.0), "mallory's forged record released"
        text = replica.log_text()
        assert f"WRITE {rs.buffer_topic}" in text, text[-3000:]
        assert "ALLOW WRITE on TOPIC" in text
        assert "for User:mallory" in text
        assert (
            "--remove --allow-principal User:mallory --allow-host '*' --operation Write "
            f"--topic {rs.buffer_topic}"
        ) in text
        secure.revoke("mallory", rs.buffer_topic, "WRITE")


def test_a_writer_added_while_running_holds_releases_until_it_is_removed(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path: Path, victim: str
) -> None:
    with _replicas(secure, zookeeper, tmp_path) as rs:
        rs.start_all()
        master = rs.wait_master(timeout=90)
        secure.grant("mallory", rs.buffer_topic, "WRITE")
        wait_until(
            lambda: rs.metric(master, GAUGE) == 1,
            timeout=30,
            what="the master seeing mallory's WRITE on the buffer",
        )
        msg_id = _forge(secure, rs.buffer_topic, victim)
        wait_until(
            lambda: rs.message(master, msg_id) is not None,
            timeout=30,
            what="the forged record ingested",
        )
        # The record is due: a master that releases would do it within a few rounds.
        assert not _delivered(secure, victim, msg_id, 3.0), "released while mallory may write"
        assert any(
            e.get("event") == "forwarder.buffer_writers_foreign"
            for e in rs.replicas[master].log_events()
        )
        secure.revoke("mallory", rs.buffer_topic, "WRITE")
        wait_until(lambda: rs.metric(master, GAUGE) == 0, timeout=30, what="the hold lifted")
        # The bound (docs/security.md): a record written while the door was open is released
        # once it is shut; the hold only covered the time the binding existed.
        assert _delivered(secure, victim, msg_id, 30.0)
