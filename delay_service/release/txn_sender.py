"""The exactly-once sender: every record the master produces, inside one Kafka transaction.

A :class:`TxnSender` is a :class:`~delay_service.release.sender.Sender` whose producer is
transactional (``transactional.id`` = :func:`transactional_id`, stable for the delay set), so
what the base class produces — releases, dead letters, tombstones — becomes visible to
read_committed consumers only when :meth:`TxnSender.commit` succeeds, together with the
checkpoint record :meth:`TxnSender.checkpoint` added to the same transaction.

Fencing is Kafka's: :meth:`TxnSender.start` calls ``init_transactions()``, which completes or
aborts whatever the previous holder of the transactional id left open and bumps the producer
epoch, so a deposed or frozen master can no longer produce or commit; any fatal producer error
(``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``, ``_FENCED``) raises
:class:`zk.errors.FencedError`, as a rejected ZooKeeper checkpoint write does.

:func:`load_checkpoint` reads the last *committed* checkpoint of the set from
``__kdelay_checkpoint`` (read_committed) up to the high watermark it finds: call it after
:meth:`TxnSender.start`, when no older transaction of the set can still commit. Every shard
commits its checkpoints to that one partition, and a read_committed read stops at the oldest
transaction still open there (the last stable offset): another shard's master inside its
commit, or dead there. So the read waits for the transactions open when it began to end
(milliseconds; one whose master died: until its successor's ``init_transactions()``, at most
``transaction.timeout.ms``) rather than take an older checkpoint of its own set from before
them (tests/integration/test_checkpoint_load.py).

Threads: like the Sender, a TxnSender belongs to the forwarder thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from kdelay import logs
from kdelay.acls import kafka_acls_command, replica_acls
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.release.producer import ProducerLike
from kdelay.delay_service.release.sender import Sender
from kdelay.errors import InfrastructureError
from kdelay.topics import CHECKPOINT_TOPIC
from kdelay.zk.errors import FencedError

log = logs.get(__name__)

#: Fault injection for tests (tests/integration/test_exactly_once.py): seconds to sleep
#: between a transaction's last record and its commit, so a test can kill a master there.
PAUSE_BEFORE_COMMIT_ENV = "KDELAY_FAULT_PAUSE_BEFORE_COMMIT_S"

_FENCING = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}
)


class TxnProducerLike(ProducerLike, Protocol):
    """The transactional part of confluent_kafka.Producer (tests pass a fake)."""

    def init_transactions(self, timeout: float = ...) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float = ...) -> None: ...

    def abort_transaction(self, timeout: float = ...) -> None: ...

    def list_topics(self, topic: str | None = None, timeout: float = ...) -> Any: ...


_UNREACHABLE = KafkaError(KafkaError._TRANSPORT)
_UNKNOWN = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
_NO_LEADER = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)


def set_key(cfg: ReplicaConfig) -> str:
    """The replica set's name: its shard's ZooKeeper root and the buffer topic (one per shard;
    one shard keeps the set's root, as before shards existed)."""
    return f"{cfg.set_paths.root}|{cfg.buffer_topic}"


def transactional_id(cfg: ReplicaConfig) -> str:
    """The transactional id every master of the set shares: the next one fences the last."""
    return release_transactional_id(cfg.set_paths.root, cfg.buffer_topic)


def release_transactional_id(shard_root: str, buffer_topic: str) -> str:
    """The transactional id of the masters of the shard at ``shard_root`` (its ZooKeeper root)
    on ``buffer_topic``."""
    return f"kdelay-release:{shard_root}|{buffer_topic}"


def make_txn_producer(cfg: ReplicaConfig) -> Producer:
    """A transactional (hence idempotent, acks=all) producer for releases and checkpoints."""
    return Producer(
        {
            **cfg.kafka_connection(cfg.bootstrap_servers),
            "client.id": f"kdelay-replica-{cfg.name}",
            "transactional.id": transactional_id(cfg),
            "transaction.timeout.ms": cfg.transaction_timeout_ms,
            "linger.ms": 2,
            "message.timeout.ms": min(cfg.produce_timeout_ms, cfg.transaction_timeout_ms),
            "partitioner": "murmur2_random",
        }
    )


_TXN_DENIED = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def fenced(err: KafkaError) -> bool:
    """Whether ``err`` means another master holds the transactional id now."""
    return bool(err.fatal()) or err.code() in _FENCING


class TxnSender(Sender):
    """A Sender whose records commit or abort together, with the round's checkpoint."""

    def __init__(
        self,
        producer_factory: Callable[[], TxnProducerLike],
        *,
        buffer_topic: str,
        produce_timeout_ms: int,
        checkpoint_key: str,
        clock: Clock = SYSTEM_CLOCK,
        timeout_s: float = 30.0,
        principal: str | None = None,
    ) -> None:
        super().__init__(
            self._no_new_producer,
            buffer_topic=buffer_topic,
            produce_timeout_ms=produce_timeout_ms,
            clock=clock,
            on_poll_error=self._fenced_at_poll,
        )
        self._txn_factory = producer_factory
        self._checkpoint_key = checkpoint_key.encode()
        self._timeout_s = timeout_s
        self._principal = principal or "User:<the replica's user>"
        self._open = False
        self._pause_s = float(os.environ.get(PAUSE_BEFORE_COMMIT_ENV, "0") or 0)

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig, clock: Clock = SYSTEM_CLOCK) -> TxnSender:
        """A sender with a transactional producer for ``cfg``'s delay set."""
        return cls(
            lambda: make_txn_producer(cfg),
            buffer_topic=cfg.buffer_topic,
            produce_timeout_ms=cfg.produce_timeout_ms,
            checkpoint_key=set_key(cfg),
            clock=clock,
            principal=cfg.kafka_principal(),
        )

    @property
    def open(self) -> bool:
        """A transaction is open."""
        return self._open

    def start(self) -> None:
        """Create the producer and fence every earlier one with this transactional id."""
        self.abandon()
        self._drop()
        producer = self._txn_factory()
        self.flights.producer = producer
        self._call(lambda: producer.init_transactions(self._timeout_s), "init_transactions")
        log.info("sender.transactions_initialised")

    def reachable(self, topic: str, partition: int) -> KafkaError | None:
        """Whether ``topic``/``partition`` has a leader now (a metadata request): None, or the
        error to hold it with, so a target that failed once joins no transaction it would
        stall (see exactly_once.py)."""
        producer = self._get_producer()
        try:
            meta = producer.list_topics(topic, timeout=1.0)
        except KafkaException as exc:
            return exc.args[0] if isinstance(exc.args[0], KafkaError) else _UNREACHABLE
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            return found.error if found is not None and found.error else _UNKNOWN
        if partition >= 0:
            part = found.partitions.get(partition)
            if part is None:
                return KafkaError(KafkaError._UNKNOWN_PARTITION)
            return None if part.leader >= 0 else _NO_LEADER
        return None if any(p.leader >= 0 for p in found.partitions.values()) else _NO_LEADER

    def _fenced_at_poll(self, exc: KafkaException) -> None:
        """A fatal error raised by ``poll()``: fenced (a newer master's ``init_transactions``)
        is FencedError, as from any other transactional call (seen when a stalled master
        woke: "Failed to add partitions to transaction: ... fenced by a newer instance");
        any other, the records in flight handle (``in_flight.py``)."""
        err = exc.args[0]
        if isinstance(err, KafkaError) and fenced(err):
            self._drop()
            raise FencedError(f"poll fenced: {err.str()}") from None

    def begin(self) -> None:
        """Open the round's transaction."""
        producer = self._get_producer()
        self._call(producer.begin_transaction, "begin_transaction")
        self._open = True

    def checkpoint(self, record: bytes) -> None:
        """Add the checkpoint document to the open transaction (``__kdelay_checkpoint``)."""
        producer = self._get_producer()
        self._call(
            lambda: producer.produce(CHECKPOINT_TOPIC, value=record, key=self._checkpoint_key),
            "produce checkpoint",
        )

    def commit(self) -> KafkaError | None:
        """Commit the open transaction: None, or the (abortable) error that prevented it; the
        transaction is then aborted. Fencing raises FencedError."""
        if self._pause_s:
            time.sleep(self._pause_s)
        producer = self._get_producer()
        try:
            producer.commit_transaction(self._timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if fenced(err):
                self._drop()
                raise FencedError(f"commit_transaction fenced: {err.str()}") from None
            log.warning("sender.commit_failed", error=err.str(), abortable=err.txn_requires_abort())
            self.abort()
            return err  # type: ignore[no-any-return]
        self._open = False
        return None

    def abort(self) -> None:
        """Abort the open transaction: none of its records becomes visible to read_committed
        consumers; what is still queued is purged. Records in flight are forgotten."""
        self.abandon()
        if not self._open or self.flights.producer is None:
            return
        producer = self._get_producer()
        self._call(lambda: producer.abort_transaction(self._timeout_s), "abort_transaction")
        self._open = False

    def close(self) -> None:
        """Drop the producer; an open transaction is aborted by the next master's
        ``init_transactions()`` or by the broker after ``transaction.timeout.ms``."""
        self.abandon()
        self._drop()

    def _get_producer(self) -> TxnProducerLike:
        """The producer of this term (:meth:`_no_new_producer` when there is none)."""
        return cast("TxnProducerLike", self.flights.get_producer())

    @staticmethod
    def _no_new_producer() -> TxnProducerLike:
        """Never a producer created lazily, since a new one would fence the master that holds
        the transactional id now (see :meth:`start`)."""
        raise InfrastructureError("the transactional producer is gone: a new term must start")

    def _drop(self) -> None:
        self.flights.producer = None
        self._open = False

    def _call(self, op: Callable[[], object], what: str) -> None:
        """Run a producer call; fencing becomes FencedError, other errors InfrastructureError
        (the forwarder's supervisor restarts it with backoff)."""
        try:
            op()
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == _TXN_DENIED:
                # Not a fencing, though fatal: the one ACL start-up could not ask (acl_check.py).
                self._drop()
                acl = next(a for a in replica_acls() if a.resource == "TRANSACTIONAL_ID")
                raise InfrastructureError(
                    f"{what}: Kafka denies {self._principal} {acl.describe()} "
                    f"({err.str()}), which exactly-once releases need; grant it: "
                    f"{kafka_acls_command(self._principal, acl)}"
                ) from None
            if isinstance(err, KafkaError) and fenced(err):
                self._drop()
                raise FencedError(f"{what} fenced: {err.str()}") from None
            self._drop()
            raise InfrastructureError(f"{what} failed: {exc}") from None


def load_checkpoint(cfg: ReplicaConfig, timeout_s: float = 30.0) -> bytes | None:
    """The set's last committed checkpoint document in ``__kdelay_checkpoint``, or None: read
    until the position passes the partition's high watermark as it is now (see the module's
    docstring), not only to the end a read_committed consumer reports while a transaction is
    open there."""
    partition = TopicPartition(CHECKPOINT_TOPIC, 0)
    end = _high_watermark(cfg, partition, timeout_s)
    if end is None:
        return None
    consumer = Consumer(
        {
            **cfg.kafka_connection(cfg.bootstrap_servers),
            "group.id": f"kdelay-replica-{cfg.name}-checkpoint",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "client.id": f"kdelay-replica-{cfg.name}-checkpoint",
        }
    )
    key = set_key(cfg).encode()
    found: bytes | None = None
    deadline = time.monotonic() + timeout_s
    waited = False
    try:
        consumer.assign([TopicPartition(CHECKPOINT_TOPIC, 0, OFFSET_BEGINNING)])
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            err = None if msg is None else msg.error()
            if msg is not None and err is None:
                if msg.key() == key:
                    found = msg.value()  # None: a tombstone (the set was reset)
            elif err is not None and err.code() != KafkaError._PARTITION_EOF:
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    return None
                raise InfrastructureError(f"cannot read {CHECKPOINT_TOPIC}: {err.str()}")
            position = consumer.position([partition])[0].offset
            if msg is not None and err is not None:  # the end a read_committed read reached
                position = max(position, msg.offset() or 0)
            if position >= end:
                return found
            if err is not None and not waited:  # the end a read_committed consumer sees
                waited = True
                log.info("sender.checkpoint_waits_for_open_transactions", at=position, end=end)
    finally:
        consumer.close()
    raise InfrastructureError(
        f"{CHECKPOINT_TOPIC} not read to its end ({end}) in {timeout_s:.0f} s: a transaction "
        f"open there (another shard's master) has not ended"
    )


def _high_watermark(cfg: ReplicaConfig, partition: TopicPartition, timeout_s: float) -> int | None:
    """The end of ``partition`` counting open transactions' records (what a read_uncommitted
    consumer sees), or None when the topic does not exist."""
    probe = Consumer(
        {
            **cfg.kafka_connection(cfg.bootstrap_servers),
            "group.id": f"kdelay-replica-{cfg.name}-checkpoint",
            "isolation.level": "read_uncommitted",
            "client.id": f"kdelay-replica-{cfg.name}-checkpoint-end",
        }
    )
    try:
        _, high = probe.get_watermark_offsets(partition, timeout=timeout_s, cached=False)
    except KafkaException as exc:
        err = exc.args[0]
        if isinstance(err, KafkaError) and err.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
            KafkaError._UNKNOWN_PARTITION,
        ):
            return None
        raise InfrastructureError(f"cannot read the end of {CHECKPOINT_TOPIC}: {exc}") from None
    finally:
        probe.close()
    return int(high)
