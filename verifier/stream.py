"""The continuous verifier (``kdelay verify``): the streaming plan of :mod:`verifier.job`.

``run_continuous`` runs the streaming plan: per-message rows in append mode (the time-bounded
join of ``match_stream``, and one row per early delivery from ``early_deliveries``, as soon as
it is read) into ``foreachBatch``, which summarises the rows each micro-batch finalised per
window and hands them to the sinks. A window's messages may be finalised over several
micro-batches, so a window result is per (batch, window): counts add up across batches,
percentiles do not. Cancels are not joined in the stream (see :class:`CancelRegistry`): a
second small query keeps the cancel records' positions and times, seeded by a bounded read of
the buffer topic at start-up.

Threading: ``run_continuous`` is called from one thread; it returns when ``stop`` is set or a
query fails (raising). Spark calls each ``foreachBatch`` function on a thread of its own.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom
from pyspark.sql.streaming.query import StreamingQuery

from kdelay import logs
from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.verifier import cancel_contract as contract
from kdelay.verifier.aggregates import lateness_values, summarise, window_results
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.job import ALL_USER_TOPICS, VerifierError
from kdelay.verifier.matching import per_message, series_key_column, with_cancels
from kdelay.verifier.report import WindowResult
from kdelay.verifier.source import (
    only_topics,
    parse_buffer,
    parse_delivered,
    read_batch,
    read_stream,
)

log = logs.get(__name__)

BatchHandler = Callable[[int, list[WindowResult], list[float]], None]
#: A buffer record's place: (id, buffer partition, offset).
Position = tuple[str, int, int]
#: A cancel record: its place and append time (ms), a replace's own buffer key (None for a
#: cancel), and its producer-sequence stamp (route field ``q``; None: unstamped).
CancelAt = tuple[str, int, int, int | None, str | None, str | None]
#: A bulk cancel record: its id prefix, target topic (None: every topic), append time (ms),
#: its own id (``bulk.p<N>.<hex>``: a copy, for its buffer partition only) and buffer partition.
BulkAt = tuple[str, str | None, int | None, str, int]
#: A message's (last) schedule record: its place, append time and acceptance time (ms), its
#: target topic, the buffer key of occurrence 1 of its series (None: unknown), and its
#: producer-sequence stamp (None: unstamped).
ScheduleAt = tuple[str, int, int, int | None, int | None, str | None, str | None, str | None]
_POSITIONS_DDL = "id STRING, bpart INT, boff BIGINT"


def match_stream(
    schedules: DataFrame, deliveries: DataFrame, *, grace_ms: int, horizon_ms: int
) -> DataFrame:
    """Streaming: :data:`verifier.matching.PER_MESSAGE` rows of scheduled messages, by the
    time-bounded join of :mod:`verifier.job`'s docstring (``early`` is 0 here:
    :func:`early_deliveries` counts every early delivery, matched or not, so none is counted
    twice)."""
    delay = f"{grace_ms} milliseconds"
    s = (
        schedules.select(
            "id", "due", "due_ms", "topic", "bpart", "boff", "bts", "bacc", "dkey", "q"
        )
        .withWatermark("due", delay)
        # Copies of one buffer record (a client's retried produce) are one message; then one
        # row per (id, due), so that no delivery is joined twice.
        .dropDuplicatesWithinWatermark(["dkey"])
        .dropDuplicates(["id", "due"])
        .withColumn("skey", series_key_column(F.col("dkey")))
    )
    d = deliveries.select(
        F.col("id").alias("did"), F.col("due_ms").alias("ddue"), "at", "receipt"
    ).withWatermark("at", delay)
    condition = (
        "did = id AND ddue = due_ms"
        f" AND at >= due - INTERVAL {horizon_ms} MILLISECONDS"
        f" AND at <= due + INTERVAL {grace_ms} MILLISECONDS"
    )
    joined = s.join(d, F.expr(condition), "leftOuter").select(
        "id",
        "due",
        "due_ms",
        "topic",
        "bpart",
        "boff",
        "bts",
        "bacc",
        "skey",
        "q",
        # A new column (not ``at`` itself) carries no event-time metadata, so the aggregation
        # below has exactly one event-time key: ``due``.
        F.unix_millis(F.col("at")).alias("at_ms"),
        "receipt",
    )
    keys = ["id", "due", "due_ms", "topic", "bpart", "boff", "bts", "bacc", "skey", "q"]
    per = per_message(joined, keys)
    return per.select(
        "id",
        "due",
        "due_ms",
        F.lit(True).alias("has_schedule"),
        "topic",
        "bpart",
        "boff",
        "bts",
        "bacc",
        "deliveries",
        "first_ms",
        F.lit(0).cast("long").alias("early"),
        "receipt",
        "skey",
        "q",
    )


def early_deliveries(deliveries: DataFrame) -> DataFrame:
    """Streaming: one :data:`verifier.matching.PER_MESSAGE` row per early delivery (``early`` 1,
    ``has_schedule`` false, no deliveries), stateless, so it is counted as soon as it is read."""
    due = F.timestamp_millis(F.col("due_ms"))
    return deliveries.where(F.col("at") < due).select(
        "id",
        due.alias("due"),
        "due_ms",
        F.lit(False).alias("has_schedule"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("bpart"),
        F.lit(None).cast("long").alias("boff"),
        F.lit(None).cast("long").alias("bts"),
        F.lit(None).cast("long").alias("bacc"),
        F.lit(0).cast("long").alias("deliveries"),
        F.lit(None).cast("long").alias("first_ms"),
        F.lit(1).cast("long").alias("early"),
        "receipt",
        F.lit(None).cast("string").alias("skey"),
        F.lit(None).cast("string").alias("q"),
    )


class CancelRegistry:
    """Every cancel record of each (id, buffer partition), and every bulk cancel record (its
    prefix, topic, append time, id and buffer partition), fed by a small streaming query over
    the buffer topic.

    Why not a join: a cancel may come any time before its message's due time, so a
    time-bounded stream-stream join would have to keep cancels (and hold back every result)
    for the longest delay in use. Cancels are rare; a map on the driver is cheap. Written by
    the cancels query's foreachBatch thread, read by the main query's: guarded by a lock.
    """

    def __init__(self) -> None:
        self._cancels: dict[tuple[str, int], dict[int, contract.CancelAt]] = {}
        self._bulk: set[BulkAt] = set()
        self._lock = threading.Lock()

    def add(self, cancels: Iterable[CancelAt], bulk: Iterable[BulkAt] = ()) -> None:
        with self._lock:
            for msg_id, part, off, ts, replace_key, stamp in cancels:
                at = contract.CancelAt(msg_id, part, off, ts, replace_key, stamp)
                self._cancels.setdefault((msg_id, part), {})[off] = at
            self._bulk.update(bulk)

    def cancelled(self, schedules: Iterable[ScheduleAt]) -> list[Position]:
        """The positions of the ``schedules`` a cancel or a replace cancels
        (:func:`verifier.cancel_contract.cancels`: one before it in its partition, or one after
        it that was sent with it, or, for one producer's stamped pair, one it sent before the
        cancel; never a replace's own series), or a bulk cancel does (:func:`bulk_cancels`)."""
        with self._lock:
            out = []
            for msg_id, part, off, ts, accepted, topic, skey, stamp in schedules:
                message = contract.MessageAt(msg_id, part, off, ts, accepted, skey or "", stamp)
                if any(
                    contract.cancels(c, message)
                    for c in self._cancels.get((msg_id, part), {}).values()
                ) or any(
                    bulk_cancels(b, msg_id, topic, ts, accepted, partition=part) for b in self._bulk
                ):
                    out.append((msg_id, part, off))
            return out


def bulk_cancels(
    bulk: BulkAt,
    msg_id: str,
    topic: str | None,
    appended: int | None,
    accepted: int | None,
    *,
    partition: int,
) -> bool:
    """Whether bulk cancel record ``bulk`` cancels a message of buffer partition ``partition``
    (delay_service/store/bulk_cancels.py's rule, owners aside;
    :func:`verifier.matching.bulk_cancelled_positions` in the batch job): an id with its prefix,
    on its topic when it names one, accepted no later than its append time plus SENT_WITH_MS
    (appended no later than it when the acceptance time is unknown), and appended at most
    WINDOW_MS after it (:mod:`verifier.cancel_contract`); a copy (id ``bulk.p<N>.<hex>``,
    ``kdelay.buffer.bulk_ids``) only in its own buffer partition."""
    prefix, bulk_topic, bulk_ms, bulk_id, bulk_partition = bulk
    if not msg_id.startswith(prefix) or (bulk_topic is not None and bulk_topic != topic):
        return False
    if bulk_copies(bulk_id) is not None and bulk_partition != partition:
        return False
    if bulk_ms is None or appended is None:
        return False
    if accepted is not None:
        before = accepted <= bulk_ms + contract.SENT_WITH_MS
    else:
        before = appended <= bulk_ms
    return before and appended - bulk_ms <= contract.WINDOW_MS


def cancel_rows(df: DataFrame) -> tuple[list[CancelAt], list[BulkAt]]:
    """The cancels (every cancel record, by id) and bulk cancels of rows of
    :attr:`verifier.source.BufferRows.cancels` (a side batch, or the bounded read at start)."""
    cancels: list[CancelAt] = []
    bulk: list[BulkAt] = []
    for r in df.collect():
        part = int(r["bpart"])
        cancels.append((str(r["id"]), part, int(r["boff"]), r["bts"], r["rkey"], r["q"]))
        if r["px"] is not None:
            bulk.append((str(r["px"]), r["t"], r["bts"], str(r["id"]), part))
    return cancels, bulk


def schedule_rows(df: DataFrame) -> list[ScheduleAt]:
    """The :data:`ScheduleAt` of per-message rows (:func:`match_stream`'s, or
    :func:`verifier.matching.messages`'), for :meth:`CancelRegistry.cancelled`."""
    rows = df.select("id", "bpart", "boff", "bts", "bacc", "topic", "skey", "q").collect()
    return [
        (
            str(r["id"]),
            int(r["bpart"]),
            int(r["boff"]),
            r["bts"],
            r["bacc"],
            r["topic"],
            r["skey"],
            r["q"],
        )
        for r in rows
    ]


def start_continuous(
    spark: SparkSession,
    cfg: VerifierConfig,
    handle: BatchHandler,
    checkpoint: Path,
) -> list[StreamingQuery]:
    """Start the cancels query, then the main query; ``handle`` gets each batch's windows."""
    # A bounded read of the buffer first: the target topics, and the cancels already there,
    # so that no message is judged before the cancels query has caught up.
    snapshot = parse_buffer(read_batch(spark, cfg, subscribe=cfg.buffer_topic))
    registry = CancelRegistry()
    registry.add(*cancel_rows(snapshot.cancels))
    found = snapshot.schedules.select("topic").distinct().collect()
    topics = cfg.topic_list or sorted(str(r["topic"]) for r in found)
    source = {"subscribe": ",".join(topics)} if topics else {"subscribePattern": ALL_USER_TOPICS}
    log.info("verifier.stream_started", source=source, checkpoint=str(checkpoint))
    trigger = f"{cfg.trigger_ms} milliseconds"

    def each_cancels(batch: DataFrame, _batch_id: int) -> None:
        registry.add(*cancel_rows(batch))

    # From the earliest offset, without a checkpoint: the set lives in memory only.
    cancels_cfg = cfg.model_copy(update={"starting_offsets": "earliest"})
    cancels = parse_buffer(read_stream(spark, cancels_cfg, subscribe=cfg.buffer_topic)).cancels
    cancels_query = (
        cancels.writeStream.foreachBatch(each_cancels)
        .trigger(processingTime=trigger)
        .queryName("kdelay-verifier-cancels")
        .start()
    )

    buffer = parse_buffer(read_stream(spark, cfg, subscribe=cfg.buffer_topic))
    deliveries = parse_delivered(read_stream(spark, cfg, **source))
    per_id = match_stream(
        only_topics(buffer.schedules, cfg.topic_list),
        deliveries,
        grace_ms=cfg.grace_ms,
        horizon_ms=cfg.early_horizon_ms,
    ).unionByName(early_deliveries(deliveries))

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            undelivered = batch.where(F.col("has_schedule") & (F.col("deliveries") == 0))
            hit = registry.cancelled(schedule_rows(undelivered))
            marked = with_cancels(
                batch, spark.createDataFrame(hit, _POSITIONS_DDL) if hit else None
            )
            windows = window_results(
                summarise(marked, grace_ms=cfg.grace_ms, end_ms=None, window_ms=cfg.window_ms)
            )
            if windows:
                handle(batch_id, windows, lateness_values(batch))
        finally:
            batch.unpersist()

    try:
        main_query = (
            per_id.writeStream.outputMode("append")
            .foreachBatch(each_batch)
            .trigger(processingTime=trigger)
            .option("checkpointLocation", str(checkpoint))
            .queryName("kdelay-verifier")
            .start()
        )
    except Exception:
        cancels_query.stop()
        raise
    return [cancels_query, main_query]


def run_continuous(
    spark: SparkSession,
    cfg: VerifierConfig,
    handle: BatchHandler,
    stop: threading.Event,
) -> None:
    """Run the streaming verifier until ``stop`` is set; a failed query raises VerifierError."""
    with tempfile.TemporaryDirectory(prefix="kdelay-verifier-") as tmp:
        checkpoint = cfg.checkpoint_dir or Path(tmp) / "checkpoint"
        queries = start_continuous(spark, cfg, handle, checkpoint)
        try:
            while not stop.is_set() and all(q.isActive for q in queries):
                queries[-1].awaitTermination(1)
        finally:
            for q in queries:
                q.stop()
        for q in queries:
            error = q.exception()
            if error is not None:
                raise VerifierError(f"the streaming query {q.name} failed: {error}")
