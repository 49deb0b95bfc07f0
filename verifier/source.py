"""Reading the topics with Spark's Kafka source and parsing them into schedules and deliveries.

Schedules and cancels come from the buffer topic (:func:`parse_buffer`, format versions 1 and
2 of :mod:`kdelay.buffer`), deliveries from the target topics (:func:`parse_delivered`).

Delivery time, the clock every verdict about time uses: Kafka's record ``timestamp`` when its
``timestampType`` is LogAppendTime (the broker's clock), otherwise the verifier's *receipt
time*, because a CreateTime timestamp is whatever the releasing master's clock said. The
receipt time is an **upper bound** of the moment the broker appended the record (so it can
make a delivery look later, never earlier, than it was, given the verifier's own clock is
right):

- streaming: ``current_timestamp()``, which Spark fixes per micro-batch *after* it has read
  the end offsets of that batch, so every record in the batch was appended before it;
- ``--once``: the instant after the bounded read of the target topics was materialised
  (``run_once`` passes it in), for the same reason.

Every read uses the consumer isolation level ``isolation_level`` (``kafka.isolation.level``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import headers as h
from kdelay.acls import VERIFIER_GROUPS
from kdelay.buffer import (
    OP_CANCEL,
    OP_SCHEDULE,
    READ_VERSIONS,
    ROUTE_HEADER,
    route_schema,
)
from kdelay.verifier.cancel_contract import ORDER_SHIFT
from kdelay.verifier.config import VerifierConfig

#: The route fields the verifier needs (schedules and cancels); the rest are not parsed.
_ROUTE_SCHEMA = route_schema("v", "op", "i", "t", "d", "r", "s", "rx", "px", "q")
#: Spark's Kafka source ``timestampType``: 0 is CreateTime, 1 LogAppendTime.
LOG_APPEND_TIME = 1


def _kafka_options(cfg: VerifierConfig) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": cfg.bootstrap_servers,
        "kafka.isolation.level": cfg.isolation_level,
        "includeHeaders": "true",
        # The buffer topic is compacted: offsets have gaps by design.
        "failOnDataLoss": "false",
        # Group ids kdelay names, so one PREFIXED ACL covers them (kdelay/acls.py).
        "groupIdPrefix": VERIFIER_GROUPS,
        **kafka_security_options(cfg),
    }


#: The JAAS login module of each SASL mechanism (the Java client's sasl.jaas.config).
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    """A JAAS option value: double-quoted, backslash and quote escaped (Kafka's JaasConfig
    tokenizer reads them so)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kafka_security_options(cfg: VerifierConfig) -> dict[str, str]:
    """The verifier's Kafka security settings as options of Spark's Kafka source (the Java
    client's names with ``kafka.``): the CA's certificates as a PEM truststore (KIP-651), by
    value, so an executor needs no file of the driver's; SASL as a JAAS login. The JAAS value
    holds the password: Spark redacts an option whose key or value matches
    ``spark.redaction.regex`` (``password``) in plans and logs, and the Java client logs
    ``sasl.jaas.config`` as ``[hidden]``."""
    conf = cfg.kafka_client_config()
    out = {"kafka.security.protocol": conf["security.protocol"]}
    pem = cfg.kafka_ca_pem()
    if pem is not None:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.certificates"] = pem
    if cfg.kafka_sasl:
        mechanism = conf["sasl.mechanism"]
        out["kafka.sasl.mechanism"] = mechanism
        out["kafka.sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[mechanism]} required "
            f"username={_jaas_quoted(conf['sasl.username'])} "
            f"password={_jaas_quoted(conf['sasl.password'])};"
        )
    return out


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
    """The buffer topic, parsed.

    ``schedules``: id, due (timestamp), due_ms, topic, bpart, boff, bts (the record's buffer
    partition, offset and append time in ms), bacc (when a proxy accepted it, ms, from its
    order field; null if unknown) and dkey (what makes copies of one buffer record one
    message: the buffer key in version 2, id and due time in version 1, whose key is the id),
    q (its producer-sequence stamp, route field ``q``, as written; null without one).
    ``cancels``: id, bpart, boff, bts of each cancel and each replace (``"rx"``: a schedule
    that is also a cancel of its id at its own position), rkey (a replace's own buffer key,
    null for a cancel), q (its producer-sequence stamp; null for a bulk cancel), and a bulk
    cancel's px and t (null for the others; the streaming job's one side query reads both
    kinds from it). Which cancel cancels which schedule:
    :func:`verifier.cancel_contract.cancels`.
    ``bulk``: i (the bulk cancel's id: ``bulk.p<N>.<hex>`` for one copy per buffer partition,
    ``kdelay.buffer.bulk_ids``), bpart (the buffer partition of this record), px (the id
    prefix), t (the target topic or null) and bts of each bulk cancel record.
    """

    schedules: DataFrame
    cancels: DataFrame
    bulk: DataFrame | None = None


def _accepted_ms(order: Column) -> Column:
    """:func:`verifier.cancel_contract.accepted_ms` of an order field column."""
    ms = F.shiftright(F.coalesce(order, F.lit(0).cast("long")), ORDER_SHIFT)
    return F.when(ms > 0, ms)


def parse_buffer(raw: DataFrame) -> BufferRows:
    """Schedule and cancel records of buffer format versions 1 and 2; other records dropped.

    Version 1: id = the record key, due = ``d``. Version 2: id = ``i``, due = ``d`` or, for a
    relative delay, the record timestamp (LogAppendTime on the buffer topic) + ``r``.
    """
    return buffer_rows(buffer_records(raw))


def buffer_records(raw: DataFrame) -> DataFrame:
    """The buffer topic's records of the versions read, each route header parsed once: bkey, r
    (the route fields), ts_ms, bpart, boff, id. :func:`buffer_rows` derives schedules and
    cancels from them (``--once`` pins them in memory in between, so the topic is read and its
    JSON parsed once)."""
    last = F.try_element_at(F.col("headers"), F.lit(-1))
    route = F.when(
        last.getField("key") == ROUTE_HEADER,
        F.from_json(last.getField("value").cast("string"), _ROUTE_SCHEMA),
    )
    key = F.col("key").cast("string")
    parsed = raw.select(
        key.alias("bkey"),
        route.alias("r"),
        F.unix_millis(F.col("timestamp")).alias("ts_ms"),
        F.col("partition").alias("bpart"),
        F.col("offset").alias("boff"),
    ).where(F.col("r.v").isin(list(READ_VERSIONS)))
    v1 = F.col("r.v") == 1
    return parsed.withColumn("id", F.when(v1, F.col("bkey")).otherwise(F.col("r.i"))).where(
        F.col("id").isNotNull()
    )


def buffer_rows(parsed: DataFrame) -> BufferRows:
    """Schedules, cancels and bulk cancels of :func:`buffer_records`' rows."""
    v1 = F.col("r.v") == 1
    due_ms = F.when(v1, F.col("r.d")).otherwise(
        F.coalesce(F.col("r.d"), F.col("ts_ms") + F.col("r.r"))
    )
    schedules = (
        parsed.where((F.col("r.op") == OP_SCHEDULE) & F.col("r.t").isNotNull())
        .withColumn("due_ms", due_ms)
        .where(F.col("due_ms").isNotNull())
        .select(
            "id",
            F.timestamp_millis(F.col("due_ms")).alias("due"),
            "due_ms",
            F.col("r.t").alias("topic"),
            "bpart",
            "boff",
            F.col("ts_ms").alias("bts"),
            _accepted_ms(F.col("r.s")).alias("bacc"),
            F.when(v1, F.concat_ws(" ", "id", F.col("due_ms").cast("string")))
            .otherwise(F.col("bkey"))
            .alias("dkey"),
            F.col("r.q").alias("q"),
        )
    )
    replaces = (F.col("r.op") == OP_SCHEDULE) & F.coalesce(F.col("r.rx"), F.lit(False))
    cancels = parsed.where((F.col("r.op") == OP_CANCEL) | replaces).select(
        "id",
        "bpart",
        "boff",
        F.col("ts_ms").alias("bts"),
        F.when(replaces, F.col("bkey")).alias("rkey"),
        F.when(F.col("r.px").isNull(), F.col("r.q")).alias("q"),
        F.when(F.col("r.op") == OP_CANCEL, F.col("r.px")).alias("px"),
        F.when(F.col("r.op") == OP_CANCEL, F.col("r.t")).alias("t"),
    )
    bulk = parsed.where((F.col("r.op") == OP_CANCEL) & F.col("r.px").isNotNull()).select(
        F.col("id").alias("i"),
        "bpart",
        F.col("r.px").alias("px"),
        F.col("r.t").alias("t"),
        F.col("ts_ms").alias("bts"),
    )
    return BufferRows(schedules, cancels, bulk)


def only_topics(schedules: DataFrame, topics: list[str]) -> DataFrame:
    """With ``--topics``, only messages bound for those topics are judged: the deliveries of
    any other topic are not read, so its messages would all look missing."""
    return schedules.where(F.col("topic").isin(topics)) if topics else schedules


def _header(name: str) -> Column:
    """The value of the first header ``name`` as a string (null without one). By position in
    the array of keys, not a ``filter`` lambda: Spark compiles this to Java, while a
    higher-order function is interpreted row by row (a few times the CPU per record)."""
    at = F.array_position(F.col("headers.key"), F.lit(name))
    return F.when(at > 0, F.get(F.col("headers.value"), (at - 1).cast("int"))).cast("string")


def parse_delivered(raw: DataFrame, received: Column | None = None) -> DataFrame:
    """Deliveries: target-topic records that carry a ``kdelay-id`` header.

    Columns: id; due_ms, their own ``kdelay-deliver-at`` (epoch ms; null when absent or not a
    number); at, the delivery time (module docstring); receipt, whether ``at`` is the receipt
    time ``received`` (default ``current_timestamp()``, the streaming batch's time).
    """
    return delivery_times(delivered_records(raw), received)


def delivered_records(raw: DataFrame) -> DataFrame:
    """The records of :func:`parse_delivered` before their delivery time is chosen: id, due_ms,
    timestamp, receipt (``--once`` pins them, then learns the receipt time)."""
    return raw.select(
        _header(h.ID).alias("id"),
        _header(h.DELIVER_AT).try_cast("bigint").alias("due_ms"),
        "timestamp",
        (F.col("timestampType") != LOG_APPEND_TIME).alias("receipt"),
    ).where(F.col("id").isNotNull())


def delivery_times(records: DataFrame, received: Column | None = None) -> DataFrame:
    """:func:`delivered_records` with the delivery time ``at`` (see :func:`parse_delivered`)."""
    receipt_time = F.current_timestamp() if received is None else received
    return records.select(
        "id",
        "due_ms",
        F.when(F.col("receipt"), receipt_time).otherwise(F.col("timestamp")).alias("at"),
        "receipt",
    )
