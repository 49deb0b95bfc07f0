"""The Spark side of the verifier: its session, and the ``--once`` driver that matches
deliveries to messages and aggregates.

One pipeline, two drivers (definitions of every count are in :mod:`verifier.report`; reading
and parsing the topics, and the delivery time, in :mod:`verifier.source`; matching and marking
cancels in :mod:`verifier.matching`; aggregating in :mod:`verifier.aggregates`):

1. ``parse_buffer`` / ``parse_delivered`` turn Kafka rows into *schedules* (id, due, buffer
   position), *cancels* (id, buffer position) and *deliveries* (id, their own due time,
   delivery time).
2. Deliveries are matched to messages by (id, due time), and aggregated per message:
   deliveries, first delivery, early deliveries. ``--once`` (``messages``, ``match_batch``):
   a full outer join, so a message nobody delivered still yields its row, and so does a
   delivery of no known message (it can still be early). Streaming (:mod:`verifier.stream`:
   ``match_stream``): a left
   outer join also bounded in time (a delivery matches when its delivery time is within
   [due - early_horizon, due + grace]) so Spark can drop old state; event time is the due time
   for schedules and the delivery time for deliveries, both with a watermark of ``grace_ms``;
   an unmatched message comes out (and counts missing) once the watermark has passed
   due + grace. There every early delivery is counted on its own, at once, by
   ``early_deliveries`` (one early delivery outside the horizon would otherwise be invisible).
   ``with_cancels`` then marks the messages a cancel record cancels (one that follows them in
   their buffer partition, or one sent with them, or one its producer sent after them by its
   sequence numbers; a replace never its own series; a bulk cancel's copy only in its own
   buffer partition), by the
   verifier's own reading of the contract (:mod:`verifier.cancel_contract`), never the
   replicas' rule.
3. ``summarise`` aggregates per-message rows per event-time window (over the due time) and
   overall, with Spark's exact ``percentile`` (linear interpolation, like numpy's default).

``run_once`` (``kdelay verify --once``) applies the same functions to a *batch* read of the
topics (offsets earliest..latest), not to ``trigger(availableNow=True)``: a streaming join only
emits an unmatched message after the watermark (max event time - grace) has passed it, and the
watermark never reaches the end of the input when the run stops, so messages due near the end
would be silently left out instead of being judged missing or pending against the run's end
instant. The batch plan also starts faster (no checkpoint, no state store) and aggregates the
whole input at once, so percentiles are exact for the whole run. In batch no horizon limits
what matches.

``run_continuous`` (``kdelay verify``, in :mod:`verifier.stream`) runs the streaming plan.

Target topics: ``--topics`` when given; otherwise the distinct "t" values of the schedule
records in the buffer topic (``--once``: from the snapshot it reads; streaming: from the
bounded read at start-up). A streaming job started before any message was scheduled falls
back to every topic not starting with ``__`` (``subscribePattern``), so it follows topics
created later; records without a ``kdelay-id`` header are dropped at once.

Threading: a SparkSession is shared; ``run_once`` and ``run_continuous`` are called from one
thread at a time.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import jars, logs
from kdelay.errors import KdelayError
from kdelay.verifier import shipping
from kdelay.verifier.aggregates import lateness_points, summarise, window_results
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.matching import (
    bulk_cancelled_positions,
    cancelled_positions,
    match_batch,
    messages,
    with_cancels,
)
from kdelay.verifier.report import Summary, WindowResult
from kdelay.verifier.source import (
    buffer_records,
    buffer_rows,
    delivered_records,
    delivery_times,
    only_topics,
    read_batch,
)

log = logs.get(__name__)

#: The columns run_once reads from target topics (and an empty read has).
_EMPTY_TARGET = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP, " + (
    "timestampType INT"
)
#: Topics the streaming job reads when none are named or known: all but internal ones.
ALL_USER_TOPICS = "^(?!__).+"

_LOG4J2 = """\
status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
rootLogger.level = error
rootLogger.appenderRef.err.ref = err
logger.kafka.name = org.apache.kafka
logger.kafka.level = error
# At the root level, Spark does not announce "Setting default log level" on start-up.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.pygw.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygw.level = error
"""


class VerifierError(KdelayError):
    """The verifier cannot run (no Kafka, a failed query, no target topics)."""


def spark_session(cfg: VerifierConfig) -> SparkSession:
    """The (one) SparkSession on ``cfg.spark_master`` (``local[N]``, ``spark://``, ``k8s://``),
    with Spark's Kafka connector and small settings; what executors need is shipped from this
    machine (:mod:`verifier.shipping`), the driver listens on ``cfg.driver_host`` only (127.0.0.1 by
    default); ``cfg.spark_conf`` is applied last."""
    executors = shipping.cluster_settings(
        cfg.spark_master,
        shipping.Executors(
            memory=cfg.executor_memory,
            cores=cfg.executor_cores,
            instances=cfg.executor_instances,
            kubernetes_image=cfg.kubernetes_image,
            kubernetes_namespace=cfg.kubernetes_namespace,
            kubernetes_driver_pod=cfg.kubernetes_driver_pod,
        ),
    )
    jar_dir = jars.jar_dir("spark-kafka")
    spark_jars = ",".join(sorted(str(p) for p in jar_dir.glob("*.jar")))
    log4j = Path(tempfile.gettempdir()) / "kdelay-verifier-log4j2.properties"
    log4j.write_text(_LOG4J2)
    builder = (
        SparkSession.builder.master(cfg.spark_master)
        .appName("kdelay-verifier")
        .config("spark.jars", spark_jars)
        .config("spark.driver.memory", cfg.driver_memory)
        .config("spark.driver.host", cfg.driver_host)
        .config("spark.driver.bindAddress", cfg.driver_host)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions))
        .config("spark.sql.streaming.minBatchesToRetain", str(cfg.checkpoint_batches_retained))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.sql.adaptive.enabled", "false")
        # Plans and logs show the Kafka source's options: the JAAS login holds the password
        # (Spark already redacts a value matching spark.redaction.regex, "password").
        .config("spark.sql.redaction.options.regex", "(?i)url|jaas|password")
    )
    for key, value in {**executors, **cfg.spark_conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(str(shipping.package_zip()))
    log.info(
        "verifier.spark_session",
        master=cfg.spark_master,
        kind=shipping.master_kind(cfg.spark_master),
        jars=len(spark_jars.split(",")),
    )
    return spark


# -- the two drivers -------------------------------------------------------------------------


@dataclass(frozen=True)
class OnceResult:
    """What a bounded run found."""

    summary: Summary
    windows: list[WindowResult]
    lateness_sample: list[float]
    end_ms: int
    topics: list[str]
    unmatched_deliveries: int
    #: (due, lateness) in ms of the messages in ``lateness_sample``, for the lateness chart.
    lateness_points: list[tuple[int, float]]


def _now_ms() -> int:
    return int(time.time() * 1000)


def run_once(spark: SparkSession, cfg: VerifierConfig) -> OnceResult:
    """Verify what the topics hold now (see the module docstring for why this is a batch read)."""
    end_ms = cfg.end_ms if cfg.end_ms is not None else _now_ms()
    # The buffer snapshot is taken (and pinned in memory) before the target topics are read,
    # so every delivery of a message in the snapshot that happened before it is seen. Each
    # topic is read once: its parsed rows are pinned, everything after reads them.
    records = buffer_records(read_batch(spark, cfg, subscribe=cfg.buffer_topic)).persist()
    cached = [records]
    try:
        records.count()
        buffer = buffer_rows(records)
        msgs = messages(only_topics(buffer.schedules, cfg.topic_list)).persist()
        cached.append(msgs)
        found = sorted(str(r["topic"]) for r in msgs.select("topic").distinct().collect())
        topics = cfg.topic_list or found
        log.info("verifier.once_topics", topics=topics, end_ms=end_ms)
        if topics:
            raw = read_batch(spark, cfg, subscribe=",".join(topics))
        else:
            raw = spark.createDataFrame([], _EMPTY_TARGET)
        # Read (and pinned) first: the instant after is the receipt time of every record in
        # it, an upper bound of its append time (verifier.source).
        delivered = delivered_records(raw.select("headers", "timestamp", "timestampType"))
        delivered = delivered.persist()
        cached.append(delivered)
        delivered.count()
        deliveries = delivery_times(delivered, F.timestamp_millis(F.lit(_now_ms())))
        matched = match_batch(msgs, deliveries)
        cancelled = cancelled_positions(msgs, buffer.cancels)
        if buffer.bulk is not None:
            cancelled = cancelled.unionByName(bulk_cancelled_positions(msgs, buffer.bulk))
        per_id = with_cancels(matched, cancelled).persist()
        cached.append(per_id)
        overall = summarise(per_id, grace_ms=cfg.grace_ms, end_ms=end_ms, window_ms=None)
        row = overall.collect()[0].asDict()
        windows = window_results(
            summarise(per_id, grace_ms=cfg.grace_ms, end_ms=end_ms, window_ms=cfg.window_ms)
        )
        points = lateness_points(per_id)
        unmatched = deliveries.join(msgs, ["id", "due_ms"], "left_anti").count()
    finally:
        for df in reversed(cached):
            df.unpersist()
    sample = [late for _, late in points]
    return OnceResult(Summary.from_row(row), windows, sample, end_ms, topics, unmatched, points)
