"""With several shards, a new exactly-once master loads its set's newest
committed checkpoint, even while another shard holds a transaction open on
``__kdelay_checkpoint``.

Every shard's master commits its checkpoints to the one partition of ``__kdelay_checkpoint``
(keyed by its set). A read_committed consumer reads a partition only up to its last stable
offset (LSO): the first offset of the oldest transaction still open there. So while shard 1's
master is inside a commit (its checkpoint written, the commit markers not yet), or dead there
until its successor's ``init_transactions()`` or the broker's ``transaction.timeout.ms`` aborts
it, shard 0's checkpoints committed *after* that transaction began are invisible: a new shard-0
master that read "to the end" stopped at the LSO and took the last checkpoint before it, older
than the ZooKeeper copy, which ties with it on the epoch (the same old master wrote both) and so
lost to it ("Kafka's on a tie"). The old master's later releases were then covered by neither
the loaded checkpoint nor (when its ingest was behind) their tombstones.

What holds now (``txn_sender.load_checkpoint``): the loader notes the partition's high watermark
after ``init_transactions()`` fenced the set's previous master, and reads (read_committed) until
its position passes it, i.e. until every transaction open at the fence has ended; what the set
committed before the fence is then all visible. Real Kafka; ZooKeeper's copy is a fake here (the
choice between the two is tests/unit/test_exactly_once.py's).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kdelay.checkpoint import CheckpointRecord
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.txn_sender import TxnSender, make_txn_producer, set_key
from kdelay.delay_service.store.store import Store
from kdelay.topics import CHECKPOINT_TOPIC, CHECKPOINT_TOPIC_CONFIG
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import create_topic


def _config(bootstrap: str, root: str, shard: int) -> ReplicaConfig:
    return ReplicaConfig(
        name=f"shard{shard}-new",
        bootstrap_servers=bootstrap,
        zk_root=root,
        shards=2,
        shard=shard,
        delivery="exactly-once",
        buffer_topic=f"buffer-{root.rsplit('/', 1)[-1]}",
    )


def _ensure_checkpoint_topic(bootstrap: str) -> None:
    """``__kdelay_checkpoint`` as a replica creates it (one partition), unless it exists."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if CHECKPOINT_TOPIC not in admin.list_topics(timeout=10).topics:
        create_topic(bootstrap, CHECKPOINT_TOPIC, 1, config=dict(CHECKPOINT_TOPIC_CONFIG))


def _record(time_ms: int, epoch: int) -> bytes:
    return CheckpointRecord(time_ms, {0: time_ms // 100}, epoch, "old-master", time_ms).encode()


def _commit(producer: Producer, key: str, record: bytes) -> None:
    producer.begin_transaction()
    producer.produce(CHECKPOINT_TOPIC, value=record, key=key.encode())
    producer.commit_transaction(30)


class ZooKeeperCopy(FakeCheckpoints):
    """The checkpoint znode: the copy the old master wrote after its last commit."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = data

    def load(self) -> bytes | None:
        return self._data


def test_a_new_master_loads_the_newest_checkpoint_past_another_shards_open_transaction(
    kafka: KafkaInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    root = f"/kdelay-test/{uuid.uuid4().hex[:10]}"
    mine, other = _config(bs, root, 0), _config(bs, root, 1)
    _ensure_checkpoint_topic(bs)

    # Shard 0's old master commits a checkpoint ...
    old = make_txn_producer(mine)
    old.init_transactions(30)
    older, newest = _record(1_000, epoch=7), _record(2_000, epoch=7)
    _commit(old, set_key(mine), older)
    # ... shard 1's master opens a transaction on the same partition (its checkpoint is
    # written; its commit has not happened: it is inside commit_transaction, or died there) ...
    other_master = make_txn_producer(other)
    other_master.init_transactions(30)
    other_master.begin_transaction()
    other_master.produce(CHECKPOINT_TOPIC, value=_record(5_000, epoch=3), key=set_key(other))
    assert other_master.flush(30) == 0
    # ... and shard 0's old master commits a newer one, copies it to ZooKeeper, and dies.
    _commit(old, set_key(mine), newest)

    # Shard 0's new master: init_transactions() fences the old one, then it loads.
    store = Store(tmp_path / "store")
    sender = TxnSender.for_replica(mine)
    forwarder = ExactlyOnceForwarder(
        mine, store, FakeIngest(), Metrics(), sender=sender, on_fenced=lambda _why: None
    )
    loaded: list[bytes | None] = []
    try:
        sender.start()
        loader = threading.Thread(
            target=lambda: loaded.append(forwarder.load_checkpoint(ZooKeeperCopy(newest)))
        )
        loader.start()
        # Give the loader its chance while shard 1's transaction is open (without a fix it
        # returns at once), then let shard 1's successor fence that transaction, as its own
        # takeover does: the LSO moves past it.
        loader.join(10)
        if loader.is_alive():
            successor = make_txn_producer(other)
            successor.init_transactions(30)
        loader.join(60)
        assert not loader.is_alive(), "the checkpoint was not loaded"
    finally:
        sender.close()
        store.close()
    assert loaded, "the loader raised (see the log)"
    got = CheckpointRecord.decode(loaded[0] or b"{}")
    assert got.time_ms == 2_000, (
        f"loaded the checkpoint of time {got.time_ms} (epoch {got.epoch}), not the newest "
        f"committed one (2000): the read stopped at shard 1's open transaction"
    )
