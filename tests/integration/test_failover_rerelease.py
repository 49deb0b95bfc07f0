"""After a failover while the checkpoint time was held back, a new
exactly-once master whose ingest is behind the old master's committed tombstones does not
release again what the old master released.

The old master's checkpoint ``(T, O)`` does not always cover what it released: ``T`` stays below
the due time of every entry still pending (round.py ``claim_ms``: a held target, or a scan cut
at ``scan_batch``, whose last millisecond may hold more), so a release due after ``T`` is
retired only by its tombstone, committed in the same transaction, at an offset past ``O``
(``O`` is noted before the round's scan). A new master used to wait for its ingest to reach
``O`` only: a follower whose ingest was behind (a burst, a slow disk) still held such an entry
when it started, found it due and not covered, and released it again, a duplicate even for
read_committed consumers.

What holds now (``exactly_once.py``): after ``init_transactions()`` fenced the old master, the
new master notes the end of each of its shard's buffer partitions and releases nothing before
its ingest has read that far, past every tombstone the old masters committed.

In-process, on real Kafka: two forwarders of one delay set, each with its own store; the old
one's scan is cut at one entry (``scan_batch=1``), so its checkpoint stays a millisecond below
the entry it releases. The new one's ingest is held at ``O`` until the forwarder shows what it
does: release (the old behaviour) or wait for the buffer's end (the fix).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from dev.stack import wait_until
from kdelay.buffer import Scheduled
from kdelay.checkpoint import CheckpointRecord
from kdelay.clock import SYSTEM_CLOCK
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder, make_forwarder
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.store import Store
from kdelay.topics import BUFFER_TOPIC_CONFIG
from tests.support.forwarder_rigs import FakeCheckpoints
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.schedule import create_target, produce_buffer


def _config(bootstrap: str, root: str, buffer: str, name: str, **settings: object) -> ReplicaConfig:
    return ReplicaConfig(
        name=name,
        bootstrap_servers=bootstrap,
        zk_root=root,
        buffer_topic=buffer,
        buffer_partitions=1,
        delivery="exactly-once",
        checkpoint_interval_ms=50,
        **settings,  # type: ignore[arg-type]
    )


def _read_to_end(bootstrap: str, topic: str, stop_before: int | None = None) -> list[Message]:
    """Partition 0 of ``topic`` (read_committed) up to its end, or up to ``stop_before``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"reading {topic}: {err.str()}")
            if stop_before is not None and (msg.offset() or 0) >= stop_before:
                return out
            out.append(msg)
    finally:
        consumer.close()
    raise TimeoutError(f"{topic} not read to its end in 60 s")


def _copies(bootstrap: str, topic: str, msg_id: str) -> int:
    return sum(
        1
        for m in _read_to_end(bootstrap, topic)
        if dict(m.headers() or [])["kdelay-id"] == msg_id.encode()
    )


class HeldIngest:
    """The new master's ingest, seen by its forwarder: records what it was asked to wait for."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest
        self.asked: list[dict[int, int]] = []

    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool:
        self.asked.append(dict(offsets))
        return self.ingest.wait_ingested(offsets, timeout, stop)


def test_a_new_master_behind_the_tombstones_does_not_release_again(
    kafka: KafkaInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    buffer = f"buffer-{uuid.uuid4().hex[:10]}"
    target = unique_topic("rerelease")
    create_topic(bs, buffer, 1, config=dict(BUFFER_TOPIC_CONFIG))
    create_target(bs, target)
    message = Scheduled("once", target, 0, b"k", b"v", int(time.time() * 1000) - 1_000)
    produce_buffer(bs, buffer, 1, [message])

    # The old master ingests the message and releases it in a round cut at one entry: its
    # checkpoint (due - 1, {0: 1}) does not cover it; the tombstone at offset 1 does.
    old_cfg = _config(bs, root, buffer, "old", scan_batch=1)
    old_store = Store(tmp_path / "old")
    old_ingest, stop_old = Ingest(old_cfg, old_store, Metrics()), threading.Event()
    old_thread = threading.Thread(target=old_ingest.run, args=(stop_old,))
    old_thread.start()
    old_sender = TxnSender.for_replica(old_cfg)
    old = ExactlyOnceForwarder(
        old_cfg, old_store, old_ingest, Metrics(), sender=old_sender, on_fenced=lambda _w: None
    )
    old_zk = FakeCheckpoints()
    try:
        wait_until(lambda: old_store.pending == 1, timeout=60, what="the old master's ingest")
        generation = old.control.activate(old_zk)
        old_sender.start()
        wait_until(
            lambda: old.forward_once(old_zk, generation).delivered == 1,
            timeout=60,
            what="the old master's release",
        )
    finally:
        stop_old.set()
        old_thread.join(30)
        old_sender.close()  # the old master is gone (the new one fences it in any case)
        old_store.close()
    claim = old.claim
    assert claim.offsets == {0: 1}
    assert claim.time_ms == message.deliver_at_ms - 1, "the claim covers the release"
    assert _copies(bs, target, "once") == 1

    # The new master's store holds what lies below O: the message, not its tombstone.
    new_cfg = _config(bs, root, buffer, "new")
    new_store = Store(tmp_path / "new")
    ingest = Ingest(new_cfg, new_store, Metrics())
    ingest.apply(_read_to_end(bs, buffer, stop_before=claim.offsets[0]))
    assert new_store.pending == 1
    held = HeldIngest(ingest)
    new = make_forwarder(
        new_cfg,
        new_store,
        held,
        Metrics(),
        on_fenced=lambda _w: None,
        clock=SYSTEM_CLOCK,
        hold=lambda: None,
    )
    last = CheckpointRecord(claim.time_ms, claim.offsets, 1, "old").encode()

    class ZooKeeper(FakeCheckpoints):
        def claim_epoch(self) -> int:
            return 2

        def load(self) -> bytes | None:
            return last

    new_zk = ZooKeeper()
    stop_new = threading.Event()
    forwarder_thread = threading.Thread(target=new.run)
    ingest_thread = threading.Thread(target=ingest.run, args=(stop_new,))
    forwarder_thread.start()
    try:
        new.control.activate(new_zk)
        # Either it waits for its ingest to pass O (the fix), or it releases the message again.
        wait_until(
            lambda: (
                any(a.get(0, 0) > claim.offsets[0] for a in held.asked)
                or _copies(bs, target, "once") > 1
            ),
            timeout=60,
            what="the new master to wait for its ingest or to release",
        )
        ingest_thread.start()  # its ingest goes on: the tombstone, then the commit marker
        wait_until(
            lambda: any(r.epoch == 2 and r.time_ms > message.deliver_at_ms for r in new_zk.records),
            timeout=60,
            what="the new master to commit a checkpoint past the message's due time",
        )
    finally:
        new.control.shutdown()
        forwarder_thread.join(30)
        stop_new.set()
        if ingest_thread.is_alive():
            ingest_thread.join(30)
        new_store.close()
    copies = _copies(bs, target, "once")
    assert copies == 1, f"released {copies} times to read_committed consumers"
