"""One batch of buffer records into the store, and the consumer ingest reads them with.

:class:`BufferConsumer` is the part of confluent-kafka's ``Consumer`` ingest uses (manual
assignment, watermarks, positions, reading); ingest is typed against it and unit tests pass a
fake of it. :class:`IngestBatch` decodes a batch and applies it to the store *together with*
the next offsets, in one WriteBatch, so a restart resumes exactly where the store ends. A
record this replica cannot decode or store (*poison*: another version's, hand-written,
corrupt) never stops it: it is counted (``kdelay_replica_invalid_records_total{reason}``),
logged, and stored as an entry that releases it to the dead-letter topic (poison.py says why
there and not here). A failure to *write* the store is not the record's fault: :meth:`apply`
raises it, and the replica's supervisor restarts ingest or ends the process (threads.py).

Threads: :meth:`IngestBatch.apply` runs on the ingest thread only. ``on_new`` (earliest due
time of newly stored entries) and ``on_cancelled`` are set before that thread starts, called
from it, and must not block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    Message,
    TopicPartition,
)

from kdelay import logs
from kdelay.buffer import BufferRecord, Cancel, Scheduled, Tombstone, decode
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import UnstorableError
from kdelay.delay_service.ingest.poison import UNDECODABLE, UNSTORABLE, dead_letter_entry
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.entry import check_storable
from kdelay.delay_service.store.store import ApplyResult, Incoming, Store
from kdelay.delay_service.store.tombstones import Retired
from kdelay.errors import BufferFormatError

log = logs.get(__name__)


class TopicMetadata(Protocol):
    """One topic of a metadata answer: its partitions (by id) or its error."""

    @property
    def partitions(self) -> Mapping[int, object]: ...

    @property
    def error(self) -> KafkaError | None: ...


class ClusterMetadata(Protocol):
    """A metadata answer: the topics asked for."""

    @property
    def topics(self) -> Mapping[str, TopicMetadata]: ...


class BufferConsumer(Protocol):
    """What ingest asks of its Kafka consumer (confluent_kafka.Consumer; a fake in tests)."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...

    def poll(self, timeout: float = -1) -> Message | None: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]: ...

    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...

    def close(self) -> None: ...


def _append_time(msg: Message) -> int | None:
    """The record's timestamp (the buffer's LogAppendTime), None when it has none: the open
    cancels' window counts in it (cancels.py), never in a replica's clock."""
    kind, timestamp = msg.timestamp()
    return timestamp if kind != TIMESTAMP_NOT_AVAILABLE and timestamp >= 0 else None


def _headers(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


class IngestBatch:
    """Applies batches of buffer records to ``store``; ``progressed(offsets)`` is called once
    each batch is in the store, with the next offset of each of its partitions."""

    def __init__(
        self,
        cfg: ReplicaConfig,
        store: Store,
        metrics: Metrics,
        progressed: Callable[[dict[int, int]], None] = lambda _o: None,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._metrics = metrics
        self._progressed = progressed
        #: Set before the ingest thread starts; called from it, must not block.
        self.on_new: Callable[[int], None] = lambda _at: None
        self.on_cancelled: Callable[[list[Retired]], None] = lambda _r: None
        self._warned_create_time = False

    def _decode(self, msg: Message, partition: int, offset: int) -> tuple[BufferRecord, bool]:
        """The record to apply, and whether it is poison (then a dead-letter entry)."""
        headers = _headers(msg)
        try:
            kind, timestamp = msg.timestamp()
            if kind != TIMESTAMP_LOG_APPEND_TIME and not self._warned_create_time:
                self._warned_create_time = True
                log.warning(
                    "ingest.buffer_not_log_append_time",
                    topic=self._cfg.buffer_topic,
                    setting="message.timestamp.type",
                    consequence="delays count from the producing proxy's clock",
                )
            record = decode(msg.key(), msg.value(), headers, timestamp)
            if isinstance(record, Scheduled):
                check_storable(record)
        except BufferFormatError as exc:
            reason, error = UNDECODABLE, str(exc)
        except UnstorableError as exc:
            reason, error = UNSTORABLE, str(exc)
        except Exception as exc:  # a decoder bug must not stop every replica
            log.exception("ingest.decoder_failed", partition=partition, offset=offset)
            reason, error = UNDECODABLE, f"{type(exc).__name__}: {exc}"
        else:
            return record, False
        self._metrics.invalid_records.labels(reason).inc()
        log.warning(
            "ingest.invalid_record",
            partition=partition,
            offset=offset,
            reason=reason,
            error=error,
        )
        _, timestamp = msg.timestamp()
        poison = dead_letter_entry(
            self._cfg.buffer_topic,
            partition,
            offset,
            timestamp,
            msg.key(),
            msg.value(),
            headers,
            error,
        )
        return poison, True

    def _count_cancels(self, result: ApplyResult) -> None:
        """The cancel outcomes and bulk cancels of one applied batch, in the metrics."""
        for outcome, count in result.cancel_outcomes.items():
            self._metrics.cancel_outcomes.labels(outcome).inc(count)
        if result.bulk_cancels:
            self._metrics.bulk_cancels.inc(result.bulk_cancels)
            log.info(
                "ingest.bulk_cancel",
                bulk_cancels=result.bulk_cancels,
                cancelled=result.bulk_total,
                refused=result.bulk_refused,
            )
        if result.bulk_cancelled:
            self._metrics.bulk_cancelled.inc(result.bulk_cancelled)
        if result.bulk_refused:
            self._metrics.bulk_refused.inc(result.bulk_refused)

    def _bulk_steps(self, records: list[Incoming]) -> None:
        """Apply each bulk cancel among ``records`` in steps before the batch
        (``Store.bulk_step``, delay_service/store/bulk_cancels.py): the store's lock is free between
        them. What they cancel is counted and retired here; the batch does the rest."""
        for item in records:
            record = item[2]
            if not isinstance(record, Cancel) or record.prefix is None:
                continue
            at = (item[0], item[1], item[3] if len(item) == 4 else None)
            done = False
            while not done:
                retired, done = self._store.bulk_step(at, record)
                if retired:
                    self._metrics.cancelled.inc(len(retired))
                    self._metrics.bulk_cancelled.inc(len(retired))
                    self.on_cancelled(retired)

    def apply(self, messages: list[Message]) -> None:
        """Decode ``messages`` and apply them, with their next offsets, in one store write."""
        records: list[Incoming] = []
        offsets: dict[int, int] = {}
        invalid = 0  # poison records among them (stored as dead-letter entries)
        own = 0  # tombstones of this replica's own releases, skipped undecoded
        own_tombstone = self._store.own_tombstone
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("ingest.consume_error", error=str(err))
                continue
            partition = msg.partition() or 0
            offset = msg.offset() or 0
            if (
                msg.value() is None
                and (key := msg.key()) is not None
                and own_tombstone(partition, key)
            ):
                own += 1
                offsets[partition] = offset + 1
                continue
            record, poisoned = self._decode(msg, partition, offset)
            invalid += poisoned
            records.append((partition, offset, record, _append_time(msg)))
            offsets[partition] = offset + 1
        if not offsets:
            return
        self._bulk_steps(records)
        result = self._store.apply(records, offsets)
        self._progressed(offsets)
        m = self._metrics.ingested
        m.labels("schedule").inc(
            result.scheduled
            + result.duplicates
            + result.covered
            + result.cancelled_on_arrival
            - invalid
        )
        m.labels("cancel").inc(sum(1 for r in records if isinstance(r[2], Cancel)))
        m.labels("tombstone").inc(own + sum(1 for r in records if isinstance(r[2], Tombstone)))
        m.labels("invalid").inc(result.invalid + invalid)
        if result.cancelled:
            self._metrics.cancelled.inc(result.cancelled)
        self._count_cancels(result)
        if result.retired:
            self.on_cancelled(result.retired)
        if result.duplicates:
            log.info("ingest.duplicate_ids_ignored", count=result.duplicates)
        if result.cancelled_on_arrival:  # a cancel read before its message (cancels.py)
            log.info("ingest.cancelled_on_arrival", count=result.cancelled_on_arrival)
        if result.refused:  # another principal's message (cancels.py, "Owners")
            self._metrics.cancels_refused.inc(len(result.refused))
            for refused in result.refused:
                log.warning(
                    "ingest.cancel_refused",
                    id=refused.id,
                    owner=refused.owner,
                    principal=refused.principal,
                    buffer_partition=refused.partition,
                    buffer_offset=refused.offset,
                )
        self._metrics.pending.set(self._store.pending)
        if result.earliest_new_ms is not None:
            self.on_new(result.earliest_new_ms)
