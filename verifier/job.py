"""The Spark side of the verifier: read the topics, match deliveries to messages, aggregate.

One pipeline, two drivers (definitions of every count are in :mod:`verifier.report`):

1. ``parse_buffer`` / ``parse_delivered`` turn Kafka rows into *schedules* (id, due),
   *cancels* (id) and *deliveries* (id, record timestamp).
2. ``match`` joins schedules with deliveries by id (left outer, so a message nobody delivered
   still yields its row) and aggregates per message: deliveries, first delivery, early
   deliveries. Event time is the due time for schedules and the record timestamp for
   deliveries; both get a watermark of ``grace_ms``. In the streaming job the join is also
   bounded in time (a delivery matches when its timestamp is within [due - early_horizon,
   due + grace]) so Spark can drop old state; an unmatched message comes out (and counts
   missing) once the watermark has passed due + grace. ``with_cancels`` then marks messages
   with a cancel record.
3. ``summarise`` aggregates per-message rows per event-time window (over the due time) and
   overall, with Spark's exact ``percentile`` (linear interpolation, like numpy's default).

``run_once`` (``kdelay verify --once``) applies the same functions to a *batch* read of the
topics (offsets earliest..latest), not to ``trigger(availableNow=True)``: a streaming join only
emits an unmatched message after the watermark (max event time - grace) has passed it, and the
watermark never reaches the end of the input when the run stops, so messages due near the end
would be silently left out instead of being judged missing or pending against the run's end
instant. The batch plan also starts faster (no checkpoint, no state store) and aggregates the
whole input at once, so percentiles are exact for the whole run. In batch, ``withWatermark`` is
a no-op and the join is by id alone: no horizon limits what matches.

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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import headers as h
from kdelay import jars, logs
from kdelay.buffer import FORMAT_VERSION, OP_CANCEL, OP_SCHEDULE, ROUTE_HEADER, route_schema
from kdelay.errors import KdelayError
from verifier.config import VerifierConfig
from verifier.report import QUANTILES, SUMMARY_COLUMNS, Summary, WindowResult

log = logs.get(__name__)

#: The route fields the verifier needs (schedules and cancels); the rest are not parsed.
_ROUTE_SCHEMA = route_schema("v", "op", "t", "p", "d")
#: Topics the streaming job reads when none are named or known: all but internal ones.
ALL_USER_TOPICS = "^(?!__).+"
#: At most this many lateness values are collected for the histogram chart.
CHART_SAMPLE = 200_000

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
    """The (one) local SparkSession, with Spark's Kafka connector and small settings."""
    jar_dir = jars.jar_dir("spark-kafka")
    spark_jars = ",".join(sorted(str(p) for p in jar_dir.glob("*.jar")))
    log4j = Path(tempfile.gettempdir()) / "kdelay-verifier-log4j2.properties"
    log4j.write_text(_LOG4J2)
    spark = (
        SparkSession.builder.master(cfg.spark_master)
        .appName("kdelay-verifier")
        .config("spark.jars", spark_jars)
        .config("spark.driver.memory", cfg.driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- reading -------------------------------------------------------------------------------


def _kafka_options(cfg: VerifierConfig) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": cfg.bootstrap_servers,
        "includeHeaders": "true",
        # The buffer topic is compacted: offsets have gaps by design.
        "failOnDataLoss": "false",
    }


def read_batch(spark: SparkSession, cfg: VerifierConfig, **source: str) -> DataFrame:
    """A bounded read (earliest..latest) of ``subscribe=``/``subscribePattern=`` topics."""
    return (
        spark.read.format("kafka")
        .options(**_kafka_options(cfg))
        .options(startingOffsets="earliest", endingOffsets="latest", **source)
        .load()
    )


def read_stream(spark: SparkSession, cfg: VerifierConfig, **source: str) -> DataFrame:
    """An unbounded read of ``subscribe=``/``subscribePattern=`` topics."""
    return (
        spark.readStream.format("kafka")
        .options(**_kafka_options(cfg))
        .options(startingOffsets=cfg.starting_offsets, **source)
        .load()
    )


@dataclass(frozen=True)
class BufferRows:
    """The buffer topic, parsed: schedules (id, due, due_ms, topic) and cancels (id, ts)."""

    schedules: DataFrame
    cancels: DataFrame


def parse_buffer(raw: DataFrame) -> BufferRows:
    """Schedule and cancel records of the buffer-record contract (version 1); others dropped."""
    last = F.try_element_at(F.col("headers"), F.lit(-1))
    route = F.when(
        last.getField("key") == ROUTE_HEADER,
        F.from_json(last.getField("value").cast("string"), _ROUTE_SCHEMA),
    )
    parsed = raw.select(
        F.col("key").cast("string").alias("id"),
        route.alias("r"),
        F.col("timestamp").alias("ts"),
    ).where(F.col("id").isNotNull() & (F.col("r.v") == FORMAT_VERSION))
    schedules = parsed.where(
        (F.col("r.op") == OP_SCHEDULE) & F.col("r.d").isNotNull() & F.col("r.t").isNotNull()
    ).select(
        "id",
        F.timestamp_millis(F.col("r.d")).alias("due"),
        F.col("r.d").alias("due_ms"),
        F.col("r.t").alias("topic"),
    )
    cancels = parsed.where(F.col("r.op") == OP_CANCEL).select("id", "ts")
    return BufferRows(schedules, cancels)


def only_topics(schedules: DataFrame, topics: list[str]) -> DataFrame:
    """With ``--topics``, only messages bound for those topics are judged: the deliveries of
    any other topic are not read, so its messages would all look missing."""
    return schedules.where(F.col("topic").isin(topics)) if topics else schedules


def _header(name: str) -> Column:
    found = F.filter(F.col("headers"), lambda hdr: hdr.getField("key") == name)
    return F.try_element_at(found, F.lit(1)).getField("value").cast("string")


def parse_delivered(raw: DataFrame) -> DataFrame:
    """Deliveries (id, ts): target-topic records that carry a ``kdelay-id`` header."""
    return raw.select(_header(h.ID).alias("id"), F.col("timestamp").alias("ts")).where(
        F.col("id").isNotNull()
    )


# -- matching and aggregation ---------------------------------------------------------------


def match(
    schedules: DataFrame, deliveries: DataFrame, *, grace_ms: int, horizon_ms: int | None
) -> DataFrame:
    """Per-message rows: id, due, due_ms, deliveries, first_ms, early.

    ``horizon_ms`` None: match by id alone (batch). Otherwise the time-bounded streaming join
    described in the module docstring.
    """
    delay = f"{grace_ms} milliseconds"
    s = schedules.select("id", "due", "due_ms").withWatermark("due", delay)
    # A record written twice to the buffer (a producer retry) is one message.
    s = s.dropDuplicates(["id", "due"])
    d = deliveries.select(F.col("id").alias("did"), "ts").withWatermark("ts", delay)
    condition = "did = id"
    if horizon_ms is not None:
        condition += (
            f" AND ts >= due - INTERVAL {horizon_ms} MILLISECONDS"
            f" AND ts <= due + INTERVAL {grace_ms} MILLISECONDS"
        )
    joined = s.join(d, F.expr(condition), "leftOuter").select(
        "id",
        "due",
        "due_ms",
        # A new column (not ``ts`` itself) carries no event-time metadata, so the aggregation
        # below has exactly one event-time key: ``due``.
        F.unix_millis(F.col("ts")).alias("ts_ms"),
    )
    return joined.groupBy("id", "due", "due_ms").agg(
        F.count("ts_ms").alias("deliveries"),
        F.min("ts_ms").alias("first_ms"),
        F.count(F.when(F.col("ts_ms") < F.col("due_ms"), 1)).alias("early"),
    )


def with_cancels(per_id: DataFrame, cancelled_ids: DataFrame | None) -> DataFrame:
    """``per_id`` plus a ``cancelled`` column: a cancel record exists for the id."""
    if cancelled_ids is None:
        return per_id.withColumn("cancelled", F.lit(False))
    ids = cancelled_ids.select(F.col("id").alias("cid")).distinct()
    return (
        per_id.join(ids, per_id["id"] == ids["cid"], "left")
        .withColumn("cancelled", F.col("cid").isNotNull())
        .drop("cid")
    )


def summarise(
    per_id: DataFrame, *, grace_ms: int, end_ms: int | None, window_ms: int | None
) -> DataFrame:
    """Aggregate per-message rows overall (``window_ms`` None) or per window of the due time.

    Columns: :data:`verifier.report.SUMMARY_COLUMNS`, plus ``window_start_ms``/``window_end_ms``
    per window. ``end_ms`` None: every row is settled (the streaming job emits only those).
    """
    delivered = F.col("deliveries") > 0
    cancelled = ~delivered & F.col("cancelled")
    undecided = ~delivered & ~cancelled
    overdue = F.lit(True) if end_ms is None else (F.col("due_ms") + grace_ms < F.lit(end_ms))
    missing = undecided & overdue
    pending = undecided & ~overdue
    lateness = F.when(delivered, F.col("first_ms") - F.col("due_ms"))
    quantiles = F.percentile(lateness, list(QUANTILES))

    def count(flag: Column) -> Column:
        return F.sum(flag.cast("long"))

    aggs = [
        count(delivered | missing).alias("scheduled"),
        count(delivered).alias("delivered"),
        count(missing).alias("missing"),
        F.sum(F.when(delivered, F.col("deliveries") - 1).otherwise(0)).alias("duplicates"),
        F.sum(F.when(delivered, F.col("early")).otherwise(0)).alias("early"),
        quantiles.alias("q"),
        F.max(lateness).cast("double").alias("max"),
        count(pending).alias("pending"),
        count(cancelled).alias("cancelled"),
    ]
    q = [F.col("q")[i].alias(name) for i, name in enumerate(("p50", "p95", "p99"))]
    rest = [c for c in SUMMARY_COLUMNS if c not in ("p50", "p95", "p99")]
    if window_ms is None:
        return per_id.agg(*aggs).select(*rest, *q)
    windowed = per_id.groupBy(F.window("due", f"{window_ms} milliseconds").alias("w")).agg(*aggs)
    return windowed.select(
        F.unix_millis(F.col("w.start")).alias("window_start_ms"),
        F.unix_millis(F.col("w.end")).alias("window_end_ms"),
        *rest,
        *q,
    ).orderBy("window_start_ms")


def window_results(summary: DataFrame) -> list[WindowResult]:
    """Collect a per-window summary into WindowResults, oldest window first."""
    return [
        WindowResult(
            int(row["window_start_ms"]), int(row["window_end_ms"]), Summary.from_row(row.asDict())
        )
        for row in summary.collect()
    ]


def lateness_values(per_id: DataFrame, limit: int = CHART_SAMPLE) -> list[float]:
    """Lateness (ms) of delivered messages, at most ``limit`` of them (for charts)."""
    rows = (
        per_id.where(F.col("deliveries") > 0)
        .select((F.col("first_ms") - F.col("due_ms")).alias("l"))
        .limit(limit)
        .collect()
    )
    return [float(r["l"]) for r in rows]


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


def run_once(spark: SparkSession, cfg: VerifierConfig) -> OnceResult:
    """Verify what the topics hold now (see the module docstring for why this is a batch read)."""
    end_ms = cfg.end_ms if cfg.end_ms is not None else int(time.time() * 1000)
    # The buffer snapshot is taken (and pinned in memory) before the target topics are read,
    # so every delivery of a message in the snapshot that happened before it is seen.
    buffer = parse_buffer(read_batch(spark, cfg, subscribe=cfg.buffer_topic))
    schedules = only_topics(buffer.schedules, cfg.topic_list).persist()
    cancels = buffer.cancels.select("id").distinct().persist()
    cached = [schedules, cancels]
    try:
        found = sorted(str(r["topic"]) for r in schedules.select("topic").distinct().collect())
        cancels.count()
        topics = cfg.topic_list or found
        log.info("verifier.once_topics", topics=topics, end_ms=end_ms)
        if topics:
            deliveries = parse_delivered(read_batch(spark, cfg, subscribe=",".join(topics)))
        else:
            deliveries = spark.createDataFrame([], "id STRING, ts TIMESTAMP")
        deliveries = deliveries.persist()
        cached.append(deliveries)
        per_id = with_cancels(
            match(schedules, deliveries, grace_ms=cfg.grace_ms, horizon_ms=None), cancels
        ).persist()
        cached.append(per_id)
        overall = summarise(per_id, grace_ms=cfg.grace_ms, end_ms=end_ms, window_ms=None)
        row = overall.collect()[0].asDict()
        windows = window_results(
            summarise(per_id, grace_ms=cfg.grace_ms, end_ms=end_ms, window_ms=cfg.window_ms)
        )
        sample = lateness_values(per_id)
        unmatched = deliveries.join(schedules, "id", "left_anti").count()
    finally:
        for df in reversed(cached):
            df.unpersist()
    return OnceResult(Summary.from_row(row), windows, sample, end_ms, topics, unmatched)
