"""Matching deliveries to messages by (id, due time), and marking the messages a cancel record
cancels: the per-message rows (:data:`PER_MESSAGE`) both drivers summarise; the pipeline is
described in :mod:`verifier.job`. Cancels are judged by the verifier's own reading of the
contract (:mod:`verifier.cancel_contract`, here as Spark columns), never the replicas' rule.

Plain functions building DataFrames and columns; nothing runs until an action.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay.verifier.cancel_contract import (
    OCCURRENCE_SEPARATOR,
    SENT_WITH_MS,
    SEQUENCE_MODULUS,
    WINDOW_MS,
)

#: A producer-sequence stamp (``kdelay.buffer.sequences.parse_stamp``'s format) as a Java
#: regex: ``\z``, not ``$``, which also matches before a final line break.
STAMP_PATTERN = r"^(\d{1,19})/(\d{1,5})/(\d{1,10})/(\d{1,10})/([^/]{1,255})\z"
#: A bulk cancel id of one copy per buffer partition (``kdelay.buffer.bulk_ids.bulk_copies``
#: is not None): Python's ``\d`` in a str pattern is any Unicode decimal digit, Java's
#: ``\p{Nd}``.
BULK_COPIES_PATTERN = r"^bulk\.p\p{Nd}{1,9}\."

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
    of that record's series (:func:`verifier.cancel_contract.series_key`); ``q`` is that
    record's producer-sequence stamp.
    """
    first_pos = F.struct("bpart", "boff")
    first = (
        schedules.groupBy("dkey")
        .agg(
            F.min_by(
                F.struct("id", "due_ms", "topic", "bpart", "boff", "bts", "bacc", "dkey", "q"),
                first_pos,
            ).alias("m")
        )
        .select("m.*")
    )
    last = F.max(F.struct("bpart", "boff", "topic", "bts", "bacc", "dkey", "q")).alias("last")
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
            F.col("last.q").alias("q"),
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


def stamp_columns(q: Column) -> tuple[Column, Column]:
    """``kdelay.buffer.sequences.parse_stamp`` of a stamp column: (producer stream, sequence),
    both null for a missing or malformed stamp."""
    seq = F.regexp_extract(q, STAMP_PATTERN, 4).try_cast("long")
    valid = q.rlike(STAMP_PATTERN) & (seq < SEQUENCE_MODULUS)
    # Producer id, epoch and partition as int() reads them (no leading zeros), then the topic.
    parts = [
        F.regexp_replace(F.regexp_extract(q, STAMP_PATTERN, i), "^0+(?=.)", "") for i in (1, 2, 3)
    ]
    stream = F.concat_ws("/", *parts, F.regexp_extract(q, STAMP_PATTERN, 5))
    return F.when(valid, stream), F.when(valid, seq)


def produced_before_column(cancel_q: Column, message_q: Column) -> Column:
    """:func:`verifier.cancel_contract.produced_before` as a column: null when the stamps are
    not comparable."""
    c_stream, c_seq = stamp_columns(cancel_q)
    m_stream, m_seq = stamp_columns(message_q)
    ahead = F.pmod(c_seq - m_seq, F.lit(SEQUENCE_MODULUS))
    return F.when(
        c_stream.isNotNull() & (c_stream == m_stream),
        (ahead > 0) & (ahead < SEQUENCE_MODULUS // 2),
    )


def cancels_column(cancel: str, message: str) -> Column:
    """:func:`verifier.cancel_contract.cancels` as a column: whether the row aliased ``cancel``
    (bpart, boff, bts, rkey, q) cancels the row aliased ``message`` (its last schedule record's
    bpart, boff, bts, bacc, skey and q), of the same id and buffer partition."""
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
    order = produced_before_column(F.col(f"{cancel}.q"), F.col(f"{message}.q"))
    in_window = (off < c_off) | (
        (off > c_off) & (c_ms.isNull() | t_ms.isNull() | (t_ms - c_ms <= WINDOW_MS))
    )
    decided = F.when(order.isNotNull(), order & in_window).otherwise((off < c_off) | sent_with_it)
    return ~F.coalesce(own_series, F.lit(False)) & decided


def cancelled_positions(msgs: DataFrame, cancels: DataFrame) -> DataFrame:
    """The positions (id, bpart, boff) of the messages ``msgs`` (:func:`messages`) a cancel or
    a replace cancels."""
    m = msgs.select("id", "bpart", "boff", "bts", "bacc", "skey", "q").alias("m")
    c = cancels.select("id", "bpart", "boff", "bts", "rkey", "q").alias("c")
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
    delay_service/store/bulk_cancels.py's rule (owners aside): an id starting with its prefix, for
    its topic when it names one, accepted no later than its append time plus SENT_WITH_MS
    (appended no later than it when the acceptance time is unknown), and appended at most
    WINDOW_MS after it; a copy (id ``bulk.p<N>.<hex>``, ``kdelay.buffer.bulk_ids``) only in
    its own buffer partition. Bulk cancels are few: broadcast."""
    m = msgs.select("id", "topic", "bpart", "boff", "bts", "bacc").alias("m")
    b = F.broadcast(bulk.alias("b"))
    b_ms, accepted, appended = F.col("b.bts"), F.col("m.bacc"), F.col("m.bts")
    before = F.when(accepted.isNotNull(), accepted <= b_ms + SENT_WITH_MS).otherwise(
        appended <= b_ms
    )
    copy = F.col("b.i").rlike(BULK_COPIES_PATTERN)
    on = (
        F.col("m.id").startswith(F.col("b.px"))
        & (F.col("b.t").isNull() | (F.col("b.t") == F.col("m.topic")))
        & (~copy | (F.col("b.bpart") == F.col("m.bpart")))
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
