"""Ingest: the shard's buffer partitions into the store, by manual assignment (no consumer group).

A replica of shard ``i`` of ``n`` reads only the partitions its shard owns (``kdelay/shards.py``:
``p % n == i``; all of them with one shard). New buffer partitions are picked up by a periodic
metadata check; a partition is assigned once its catch-up target (high watermark) is known.

Each read's records go to the store through ingest/batch.py (one WriteBatch with the next
offsets; poison records become dead-letter entries; a store failure ends :meth:`Ingest.run`).
The consumer is anything of ingest/batch.py's :class:`BufferConsumer` (confluent-kafka's, or a
fake in tests, through ``consumer_factory``).

Threads: :meth:`Ingest.run` is the body of the ingest thread and the only user of the Kafka
consumer (:meth:`Ingest.assign_new`, :meth:`Ingest.check_caught_up` and :meth:`Ingest.apply`
are its steps, public for tests that drive them one at a time); after a failure the supervisor
runs it again (a new consumer, resuming from the store's offsets), never two at once. Other
threads read :attr:`caught_up`, :meth:`lag`, :meth:`last_progress` and call
:meth:`wait_ingested`; ``on_new`` (earliest due time of newly stored entries) and
``on_cancelled`` are set before the thread starts, called from the ingest thread, and must not
block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from kdelay import logs
from kdelay.consuming import take_batch
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.batch import BufferConsumer, IngestBatch
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.tombstones import Retired
from kdelay.shards import owned

log = logs.get(__name__)

_BATCH = 2000
#: Longest one read waits for the next buffer record when none is queued.
_WAIT_S = 0.1
#: How long a read that found fewer than a batch waits for more: the most it adds to a record's
#: way into the store, and what keeps batches (and their fixed cost) large under steady load.
_LINGER_S = 0.005
#: The same for a follower, which releases nothing: a record reaches its store up to 50 ms
#: later (its status answers and a takeover's catch-up wait that long at most), in batches ten
#: times larger. 3 replicas at 3,000 msg/s: follower CPU 68-73 -> 58-60 µs a message, and the
#: master's 115-120 -> 108-115 with less beside it (bench.delay_service, four run pairs).
_FOLLOWER_LINGER_S = 0.05
#: Seconds before a metadata check that left partitions unassigned is retried.
_RETRY_S = 0.5


class Ingest:
    """Reads the buffer topic into ``store``."""

    def __init__(
        self,
        cfg: ReplicaConfig,
        store: Store,
        metrics: Metrics,
        *,
        consumer_factory: Callable[[dict[str, object]], BufferConsumer] | None = None,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._metrics = metrics
        self._consumer_factory = consumer_factory or Consumer
        self._batch = IngestBatch(cfg, store, metrics, self._applied)
        #: Whether this replica releases now (the master): it reads with the short linger.
        self.leading: Callable[[], bool] = lambda: True
        self.caught_up = threading.Event()
        #: Called (on the ingest thread) when every partition was read to its end.
        self.on_synced: Callable[[], None] = lambda: None
        self._progress = threading.Condition()
        self._lag = 0
        self._targets: dict[int, int] = {}  # catch-up target per partition
        self._partitions: set[int] = set()
        self._unassigned = 0  # partitions in the metadata not assigned yet (retried)
        self._partition_count = 0  # the buffer's partitions at the last metadata check
        self._positions: dict[int, int] = {}
        self._last_progress = time.monotonic()

    @property
    def on_new(self) -> Callable[[int], None]:
        """Called with the earliest due time of newly stored entries (set before :meth:`run`
        starts; called from the ingest thread, must not block)."""
        return self._batch.on_new

    @on_new.setter
    def on_new(self, callback: Callable[[int], None]) -> None:
        self._batch.on_new = callback

    @property
    def on_cancelled(self) -> Callable[[list[Retired]], None]:
        """Called with the entries cancels retired (set before :meth:`run` starts)."""
        return self._batch.on_cancelled

    @on_cancelled.setter
    def on_cancelled(self, callback: Callable[[list[Retired]], None]) -> None:
        self._batch.on_cancelled = callback

    def lag(self) -> int:
        """Buffer records not yet ingested, summed over partitions (refreshed every second)."""
        with self._progress:
            return self._lag

    def last_progress(self) -> float:
        """``time.monotonic()`` when ingest last applied records or found itself at the end."""
        with self._progress:
            return self._last_progress

    def _progressed(self) -> None:
        with self._progress:
            self._last_progress = time.monotonic()

    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool:
        """Block until the store holds everything below ``offsets`` (or timeout/stop). The
        consumer's position counts too: past a transaction marker, which takes an offset and is
        never a record (a buffer partition's end is often one: takeover.py waits for it)."""
        deadline = time.monotonic() + timeout
        with self._progress:
            while not stop.is_set():
                have = self._store.offsets()
                read = self._positions
                if all(
                    max(have.get(p, 0), read.get(p, 0)) >= o for p, o in offsets.items() if o > 0
                ):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(min(remaining, 0.5))
        return False

    def _consumer(self) -> BufferConsumer:
        return self._consumer_factory(
            {
                **self._cfg.kafka_connection(self._cfg.bootstrap_servers),
                # Required by librdkafka, never joined: partitions are assigned manually and
                # offsets live in the store, not in Kafka.
                "group.id": f"kdelay-replica-{self._cfg.name}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                # Exactly-once release writes tombstones inside its transactions: an aborted
                # one must never remove an entry (no effect on non-transactional records).
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 50,
                "client.id": f"kdelay-replica-{self._cfg.name}-ingest",
            }
        )

    def assign_new(self, consumer: BufferConsumer) -> bool:
        """Assign buffer partitions not assigned yet; False when some must be retried."""
        meta = consumer.list_topics(self._cfg.buffer_topic, timeout=10)
        topic = meta.topics.get(self._cfg.buffer_topic)
        if topic is None or topic.error is not None:
            log.warning("ingest.metadata_unavailable", error=str(topic and topic.error))
            return False
        cfg = self._cfg
        self._check_layout(len(topic.partitions))
        new = owned(set(topic.partitions) - self._partitions, cfg.shard, cfg.shards)
        if not new:
            return True
        # The catch-up target of a partition is read *before* it is assigned: a partition
        # whose leader is not known yet (a topic created a moment ago) is simply left for
        # the next check. Assigning first would make that retry a _CONFLICT, forever.
        ready: list[int] = []
        for p in new:
            if not self.caught_up.is_set():
                try:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(self._cfg.buffer_topic, p), timeout=10, cached=False
                    )
                except KafkaException as exc:
                    log.info("ingest.partition_not_ready", partition=p, error=str(exc))
                    continue
                self._targets[p] = high
            ready.append(p)
        if ready:
            self._assign(consumer, ready)
        self._unassigned = len(new) - len(ready)
        return self._unassigned == 0

    def _check_layout(self, count: int) -> None:
        """Say so when the buffer's partitions do not suit the shards (docs/operations.md,
        Shards): a shard that owns none of them never catches up, and a growth that is not to a
        multiple of a count the shards divide can separate a cancel from its message."""
        cfg, seen = self._cfg, self._partition_count
        self._partition_count = count
        if cfg.shards == 1 or count == seen:
            return
        if cfg.shard >= count:
            log.error(
                "ingest.shard_owns_no_partition",
                shard=cfg.shard,
                shards=cfg.shards,
                partitions=count,
                setting="shards",
                consequence="this replica never catches up; use at most as many shards as "
                "buffer partitions",
            )
        if seen and (count % seen or seen % cfg.shards):
            log.error(
                "ingest.unsafe_partition_growth",
                before=seen,
                after=count,
                shards=cfg.shards,
                consequence="a cancel may reach another shard than its message; grow to a "
                "multiple of a count the shard count divides",
            )

    def _assign(self, consumer: BufferConsumer, ready: list[int]) -> None:
        stored = self._store.offsets()
        consumer.incremental_assign(
            [
                TopicPartition(self._cfg.buffer_topic, p, stored.get(p, OFFSET_BEGINNING))
                for p in ready
            ]
        )
        self._partitions.update(ready)
        log.info(
            "ingest.partitions_assigned",
            partitions=ready,
            resume={p: stored.get(p) for p in ready},
        )

    def _refresh_lag(self, consumer: BufferConsumer) -> None:
        stored = self._store.offsets()
        # The consumer's position, not only the stored offsets: it moves past transaction
        # markers (exactly-once release writes tombstones in transactions), which take an
        # offset each and are never handed over as records.
        for tp in consumer.position(
            [TopicPartition(self._cfg.buffer_topic, p) for p in self._partitions]
        ):
            if tp.offset >= 0:
                self._positions[tp.partition] = tp.offset
        total = 0
        for p in self._partitions:
            tp = TopicPartition(self._cfg.buffer_topic, p)
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                _, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
            total += max(0, high - max(stored.get(p, 0), self._positions.get(p, 0), low))
        with self._progress:
            self._lag = total
            if total == 0:
                self._last_progress = time.monotonic()
        self._metrics.buffer_lag.set(total)
        if total == 0 and self._partitions and not self._unassigned and self.caught_up.is_set():
            self.on_synced()  # read to the end of every partition: delay_service/away.py

    def check_caught_up(self, consumer: BufferConsumer) -> None:
        """Set :attr:`caught_up` once every assigned partition reached its target."""
        if self.caught_up.is_set() or not self._partitions or self._unassigned:
            return
        stored = self._store.offsets()
        for tp in consumer.position(
            [TopicPartition(self._cfg.buffer_topic, p) for p in self._partitions]
        ):
            if tp.offset >= 0:
                self._positions[tp.partition] = tp.offset
        behind = {
            p: t
            for p, t in self._targets.items()
            if max(stored.get(p, 0), self._positions.get(p, 0)) < t
        }
        if not behind:
            log.info("ingest.caught_up", offsets=stored, pending=self._store.pending)
            self.caught_up.set()

    def run(self, stop: threading.Event) -> None:
        """The ingest thread: poll, decode, apply, until ``stop`` is set.

        Raises what it cannot handle (a store write failed): the caller supervises.
        """
        consumer = self._consumer()
        # A run after a failure starts with a new consumer: every partition is assigned afresh,
        # from the store's offsets.
        self._partitions = set()
        self._unassigned = 0
        next_meta = 0.0
        next_lag = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_meta:
                    try:
                        complete = self.assign_new(consumer)
                    except KafkaException as exc:
                        log.warning("ingest.metadata_check_failed", error=str(exc))
                        complete = False
                    interval = self._cfg.metadata_interval_ms / 1000
                    next_meta = now + (interval if complete else min(interval, _RETRY_S))
                linger = _LINGER_S if self.leading() else _FOLLOWER_LINGER_S
                messages = take_batch(consumer, _BATCH, _WAIT_S, linger)
                if messages:
                    self.apply(messages)
                now = time.monotonic()
                if now >= next_lag or not self.caught_up.is_set():
                    try:
                        self.check_caught_up(consumer)
                        if now >= next_lag:
                            self._refresh_lag(consumer)
                            next_lag = now + 1.0
                    except KafkaException as exc:
                        log.warning("ingest.position_check_failed", error=str(exc))
        finally:
            consumer.close()

    def apply(self, messages: list[Message]) -> None:
        """One read's records into the store (ingest/batch.py); raises a store failure."""
        self._batch.apply(messages)

    def _applied(self, offsets: dict[int, int]) -> None:
        with self._progress:
            self._positions.update(offsets)
            self._last_progress = time.monotonic()
            self._progress.notify_all()
