"""The Spark side of the verifier: match deliveries to messages, aggregate.

One pipeline, two drivers (definitions of every count are in :mod:`verifier.report`; reading
and parsing the topics, and the delivery time, in :mod:`verifier.source`):

1. ``parse_buffer`` / ``parse_delivered`` turn Kafka rows into *schedules* (id, due, buffer
   position), *cancels* (id, buffer position) and *deliveries* (id, their own due time,
   delivery time).
2. Deliveries are matched to messages by (id, due time), and aggregated per message:
   deliveries, first delivery, early deliveries. ``--once`` (here: ``messages``, ``match_batch``):
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
   their buffer partition, or one sent with them; a replace never its own series), by the
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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import jars, logs
from kdelay.errors import KdelayError
from verifier import shipping
from verifier.cancel_contract import OCCURRENCE_SEPARATOR, SENT_WITH_MS, WINDOW_MS
from verifier.config import VerifierConfig
from verifier.report import QUANTILES, SUMMARY_COLUMNS, Summary, WindowResult
from verifier.source import only_topics, parse_buffer, parse_delivered, read_batch

log = logs.get(__name__)

#: The columns run_once reads from target topics (and an empty read has).
_EMPTY_TARGET = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP, " + (
    "timestampType INT"
)
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


# -- matching and aggregation ---------------------------------------------------------------

#: The per-message rows both drivers summarise.
PER_MESSAGE = (
    "id",
    "due",
    "due_ms",
    "has_schedule",
    "bpart",
    "boff",
    "bts",
    "bacc",
    "deliveries",
    "first_ms",
    "early",
    "receipt",
)


def messages(schedules: DataFrame) -> DataFrame:
    """Batch: one row per message (id, due_ms), from schedule rows (see parse_buffer).

    Copies of one buffer record (same ``dkey``) are the first copy; then the schedule records
    with the same id and due time are one message, at the position (bpart, boff, bts, bacc) of
    the last of them: a cancel is judged against that record
    (:func:`verifier.cancel_contract.cancels`), and ``skey`` is the buffer key of occurrence 1
    of that record's series (:func:`verifier.cancel_contract.series_key`).
    """
    first_pos = F.struct("bpart", "boff")
    first = (
        schedules.groupBy("dkey")
        .agg(
            F.min_by(
                F.struct("id", "due_ms", "topic", "bpart", "boff", "bts", "bacc", "dkey"),
                first_pos,
            ).alias("m")
        )
        .select("m.*")
    )
    last = F.max(F.struct("bpart", "boff", "topic", "bts", "bacc", "dkey")).alias("last")
    return (
        first.groupBy("id", "due_ms")
        .agg(last)
        .select(
            "id",
            F.timestamp_millis(F.col("due_ms")).alias("due"),
            "due_ms",
            F.col("last.topic").alias("topic"),
            F.col("last.bpart").alias("bpart"),
            F.col("last.boff").alias("boff"),
            F.col("last.bts").alias("bts"),
            F.col("last.bacc").alias("bacc"),
            series_key_column(F.col("last.dkey")).alias("skey"),
        )
    )


def series_key_column(dkey: Column) -> Column:
    """:func:`verifier.cancel_contract.series_key` of a buffer key column."""
    return F.substring_index(dkey, OCCURRENCE_SEPARATOR, 1)


def per_message(joined: DataFrame, keys: list[str]) -> DataFrame:
    """Group (message, delivery) pairs by ``keys``: deliveries, first_ms, early, receipt."""
    at_ms = F.col("at_ms")
    return joined.groupBy(*keys).agg(
        F.count(at_ms).alias("deliveries"),
        F.min(at_ms).alias("first_ms"),
        F.count(F.when(at_ms < F.col("due_ms"), 1)).alias("early"),
        F.coalesce(F.max("receipt"), F.lit(False)).alias("receipt"),
    )


def match_batch(msgs: DataFrame, deliveries: DataFrame) -> DataFrame:
    """Batch: :data:`PER_MESSAGE` rows, one per message and one per (id, due) delivered but
    never scheduled (``has_schedule`` false; it counts only as early). A full outer join on
    (id, due_ms); deliveries without a due time match nothing and are left out."""
    d = deliveries.where(F.col("due_ms").isNotNull()).select(
        F.col("id").alias("did"),
        F.col("due_ms").alias("ddue"),
        F.unix_millis(F.col("at")).alias("at_ms"),
        "receipt",
    )
    s = msgs.select("id", "due_ms", "bpart", "boff", "bts", "bacc")
    on = (s["id"] == d["did"]) & (s["due_ms"] == d["ddue"])
    joined = s.join(d, on, "full_outer").select(
        F.coalesce("id", "did").alias("id"),
        F.coalesce("due_ms", "ddue").alias("due_ms"),
        F.col("id").isNotNull().alias("has_schedule"),
        "bpart",
        "boff",
        "bts",
        "bacc",
        "at_ms",
        "receipt",
    )
    per = per_message(joined, ["id", "due_ms", "has_schedule", "bpart", "boff", "bts", "bacc"])
    return per.withColumn("due", F.timestamp_millis(F.col("due_ms"))).select(*PER_MESSAGE)


def cancels_column(cancel: str, message: str) -> Column:
    """:func:`verifier.cancel_contract.cancels` as a column: whether the row aliased ``cancel``
    (bpart, boff, bts, rkey) cancels the row aliased ``message`` (its last schedule record's
    bpart, boff, bts, bacc, and skey), of the same id and buffer partition."""
    c_off, c_ms, c_key = (F.col(f"{cancel}.{name}") for name in ("boff", "bts", "rkey"))
    off, t_ms, accepted = (F.col(f"{message}.{name}") for name in ("boff", "bts", "bacc"))
    own_series = c_key.isNotNull() & (F.col(f"{message}.skey") == c_key)
    sent_with_it = (
        (off > c_off)
        & c_ms.isNotNull()
        & accepted.isNotNull()
        & (accepted <= c_ms + SENT_WITH_MS)
        & (t_ms.isNull() | (t_ms - c_ms <= WINDOW_MS))
    )
    return ~F.coalesce(own_series, F.lit(False)) & ((off < c_off) | sent_with_it)


def cancelled_positions(msgs: DataFrame, cancels: DataFrame) -> DataFrame:
    """The positions (id, bpart, boff) of the messages ``msgs`` (:func:`messages`) a cancel or
    a replace cancels."""
    m = msgs.select("id", "bpart", "boff", "bts", "bacc", "skey").alias("m")
    c = cancels.select("id", "bpart", "boff", "bts", "rkey").alias("c")
    on = (F.col("m.id") == F.col("c.id")) & (F.col("m.bpart") == F.col("c.bpart"))
    return (
        m.join(c, on)
        .where(cancels_column("c", "m"))
        .select(
            F.col("m.id").alias("id"),
            F.col("m.bpart").alias("bpart"),
            F.col("m.boff").alias("boff"),
        )
        .distinct()
    )


def bulk_cancelled_positions(msgs: DataFrame, bulk: DataFrame) -> DataFrame:
    """The positions (id, bpart, boff) of the messages of ``msgs`` a bulk cancel cancels, by
    delay_service/bulk_cancels.py's rule (owners aside): an id starting with its prefix, for
    its topic when it names one, accepted no later than its append time plus SENT_WITH_MS
    (appended no later than it when the acceptance time is unknown), and appended at most
    WINDOW_MS after it. Bulk cancels are few: broadcast."""
    m = msgs.select("id", "topic", "bpart", "boff", "bts", "bacc").alias("m")
    b = F.broadcast(bulk.alias("b"))
    b_ms, accepted, appended = F.col("b.bts"), F.col("m.bacc"), F.col("m.bts")
    before = F.when(accepted.isNotNull(), accepted <= b_ms + SENT_WITH_MS).otherwise(
        appended <= b_ms
    )
    on = F.col("m.id").startswith(F.col("b.px")) & (
        F.col("b.t").isNull() | (F.col("b.t") == F.col("m.topic"))
    )
    return (
        m.join(b, on)
        .where(before & (appended - b_ms <= WINDOW_MS))
        .select(
            F.col("m.id").alias("id"),
            F.col("m.bpart").alias("bpart"),
            F.col("m.boff").alias("boff"),
        )
        .distinct()
    )


def with_cancels(per_id: DataFrame, cancelled: DataFrame | None) -> DataFrame:
    """``per_id`` plus a ``cancelled`` column: the message's position is among ``cancelled``
    (id, bpart, boff: :func:`cancelled_positions`, or the streaming job's registry)."""
    if cancelled is None:
        return per_id.withColumn("cancelled", F.lit(False))
    flagged = cancelled.select("id", "bpart", "boff").distinct().withColumn("hit", F.lit(True))
    return (
        per_id.join(flagged, ["id", "bpart", "boff"], "left")
        .withColumn("cancelled", F.coalesce(F.col("hit"), F.lit(False)))
        .drop("hit")
    )


def summarise(
    per_id: DataFrame, *, grace_ms: int, end_ms: int | None, window_ms: int | None
) -> DataFrame:
    """Aggregate per-message rows overall (``window_ms`` None) or per window of the due time.

    Columns: :data:`verifier.report.SUMMARY_COLUMNS`, plus ``window_start_ms``/``window_end_ms``
    per window. ``end_ms`` None: every row is settled (the streaming job emits only those).
    """
    known = F.col("has_schedule")
    delivered = known & (F.col("deliveries") > 0)
    cancelled = known & ~delivered & F.col("cancelled")
    undecided = known & ~delivered & ~cancelled
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
        F.sum("early").alias("early"),
        quantiles.alias("q"),
        F.max(lateness).cast("double").alias("max"),
        count(pending).alias("pending"),
        count(cancelled).alias("cancelled"),
        F.max(F.col("receipt") & ((F.col("deliveries") > 0) | (F.col("early") > 0))).alias(
            "receipt"
        ),
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


def lateness_points(per_id: DataFrame, limit: int = CHART_SAMPLE) -> list[tuple[int, float]]:
    """(due time, lateness) in ms of delivered messages, at most ``limit`` of them (charts)."""
    rows = (
        per_id.where(F.col("has_schedule") & (F.col("deliveries") > 0))
        .select("due_ms", (F.col("first_ms") - F.col("due_ms")).alias("l"))
        .limit(limit)
        .collect()
    )
    return [(int(r["due_ms"]), float(r["l"])) for r in rows]


def lateness_values(per_id: DataFrame, limit: int = CHART_SAMPLE) -> list[float]:
    """Lateness (ms) of delivered messages, at most ``limit`` of them (metrics, histograms)."""
    return [late for _, late in lateness_points(per_id, limit)]


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
    # so every delivery of a message in the snapshot that happened before it is seen.
    buffer = parse_buffer(read_batch(spark, cfg, subscribe=cfg.buffer_topic))
    msgs = messages(only_topics(buffer.schedules, cfg.topic_list)).persist()
    cancels = buffer.cancels.persist()
    cached = [msgs, cancels]
    try:
        found = sorted(str(r["topic"]) for r in msgs.select("topic").distinct().collect())
        cancels.count()
        topics = cfg.topic_list or found
        log.info("verifier.once_topics", topics=topics, end_ms=end_ms)
        if topics:
            raw = read_batch(spark, cfg, subscribe=",".join(topics))
        else:
            raw = spark.createDataFrame([], _EMPTY_TARGET)
        # Read (and pinned) first: the instant after is the receipt time of every record in
        # it, an upper bound of its append time (verifier.source).
        raw = raw.select("headers", "timestamp", "timestampType").persist()
        cached.append(raw)
        raw.count()
        received = F.timestamp_millis(F.lit(_now_ms()))
        deliveries = parse_delivered(raw, received).persist()
        cached.append(deliveries)
        matched = match_batch(msgs, deliveries).persist()
        cached.append(matched)
        cancelled = cancelled_positions(msgs, cancels)
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
