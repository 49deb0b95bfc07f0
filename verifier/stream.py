"""The continuous verifier (``kdelay verify``): the streaming plan of :mod:`verifier.job`.

``run_continuous`` runs the streaming plan: per-message rows in append mode
into ``foreachBatch``, which summarises the rows each micro-batch finalised per window and
hands them to the sinks. A window's messages may be finalised over several micro-batches, so
a window result is per (batch, window): counts add up across batches, percentiles do not.
Cancels are not joined in the stream (see :class:`CancelRegistry`): a second small query keeps
the set of cancelled ids, seeded by a bounded read of the buffer topic at start-up.

Threading: ``run_continuous`` is called from one thread; it returns when ``stop`` is set or a
query fails (raising). Spark calls each ``foreachBatch`` function on a thread of its own.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom
from pyspark.sql.streaming.query import StreamingQuery

from kdelay import logs
from verifier.config import VerifierConfig
from verifier.job import (
    ALL_USER_TOPICS,
    VerifierError,
    lateness_values,
    match,
    only_topics,
    parse_buffer,
    parse_delivered,
    read_batch,
    read_stream,
    summarise,
    window_results,
    with_cancels,
)
from verifier.report import WindowResult

log = logs.get(__name__)

BatchHandler = Callable[[int, list[WindowResult], list[float]], None]


class CancelRegistry:
    """Ids with a cancel record, fed by a small streaming query over the buffer topic.

    Why not a join: a cancel may come any time before its message's due time, so a
    time-bounded stream-stream join would have to keep cancels (and hold back every result)
    for the longest delay in use. Cancels are rare; a set on the driver is cheap. Written by
    the cancels query's foreachBatch thread, read by the main query's: guarded by a lock.
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, ids: list[str]) -> None:
        with self._lock:
            self._ids.update(ids)

    def among(self, ids: list[str]) -> list[str]:
        with self._lock:
            return [i for i in ids if i in self._ids]


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
    registry.add([str(r["id"]) for r in snapshot.cancels.select("id").distinct().collect()])
    found = snapshot.schedules.select("topic").distinct().collect()
    topics = cfg.topic_list or sorted(str(r["topic"]) for r in found)
    source = {"subscribe": ",".join(topics)} if topics else {"subscribePattern": ALL_USER_TOPICS}
    log.info("verifier.stream_started", source=source, checkpoint=str(checkpoint))
    trigger = f"{cfg.trigger_ms} milliseconds"

    def each_cancels(batch: DataFrame, _batch_id: int) -> None:
        registry.add([str(r["id"]) for r in batch.select("id").distinct().collect()])

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
    per_id = match(
        only_topics(buffer.schedules, cfg.topic_list),
        deliveries,
        grace_ms=cfg.grace_ms,
        horizon_ms=cfg.early_horizon_ms,
    )

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            undelivered = [
                str(r["id"]) for r in batch.where(F.col("deliveries") == 0).select("id").collect()
            ]
            cancelled = registry.among(undelivered)
            ids = (
                spark.createDataFrame([(i,) for i in cancelled], "id STRING") if cancelled else None
            )
            marked = with_cancels(batch, ids)
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
