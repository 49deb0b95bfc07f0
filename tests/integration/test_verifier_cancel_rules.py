"""The verifier's reading of two cancel rules, in Spark's local mode, by both of its drivers: the
batch job's columns (verifier/matching.py) and the streaming job's registry (verifier/stream.py),
from the same buffer records (docs/cancelling.md). No Kafka.

- A bulk cancel is one copy per buffer partition (id ``bulk.p<N>.<hex>``): the copy in
  partition q decides the messages of partition q only; an older ``bulk.<hex>`` applies to every
  partition.
- A message and a cancel of one idempotent producer to one topic-partition (route field ``q``)
  are ordered by its sequence numbers, not by the buffer's order or the 100 ms window.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import buffer
from kdelay.buffer.bulk_ids import bulk_copies
from kdelay.buffer.sequences import SEQUENCES, parse_stamp
from kdelay.verifier import cancel_contract as contract
from kdelay.verifier.matching import (
    BULK_COPIES_PATTERN,
    bulk_cancelled_positions,
    cancelled_positions,
    messages,
    produced_before_column,
    stamp_columns,
)
from kdelay.verifier.source import parse_buffer
from kdelay.verifier.stream import CancelRegistry, cancel_rows, schedule_rows
from tests.support.spark_local import local_spark

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

RAW = (
    "key BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP, "
    "partition INT, offset BIGINT"
)
T = int(dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC).timestamp() * 1000)
DUE = T + 600_000
MINUTE = 60_000


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("kdelay-cancel-rules-test") as session:
        yield session


Row = tuple[bytes, list[tuple[str, bytes | None]], dt.datetime, int, int]


def _row(record: buffer.BufferRecord, partition: int, offset: int, appended_ms: int) -> Row:
    encoded = buffer.encode(record)
    at = dt.datetime.fromtimestamp(appended_ms / 1000, tz=dt.UTC)
    return encoded.key, encoded.headers, at, partition, offset


def _schedule(msg_id: str, accepted_ms: int, stamp: str | None = None) -> buffer.Scheduled:
    return buffer.Scheduled(
        msg_id,
        "orders",
        -1,
        None,
        b"v",
        DUE,
        uid=uuid.uuid4().hex,
        seq=accepted_ms << contract.ORDER_SHIFT,
        producer_seq=stamp,
    )


def _cancel(msg_id: str, stamp: str | None = None, prefix: str | None = None) -> buffer.Cancel:
    return buffer.Cancel(msg_id, uuid.uuid4().hex, prefix=prefix, producer_seq=stamp)


def _stamp(sequence: int, producer: int = 7) -> str:
    return buffer.producer_seq(producer, 0, "orders", 3, sequence)


COPIES = "bulk.p2." + "ab" * 16  # one copy in each of buffer partitions 0 and 1
OLDER = "bulk." + "cd" * 16  # an older proxy's: applies to every partition

#: (record, buffer partition, offset, append time); the messages each rule should cancel below.
RECORDS: list[tuple[buffer.BufferRecord, int, int, int]] = [
    # (a) Partition 1's copy is appended at T, partition 0's at T + 10 s. "cust-1" (partition 1)
    # is accepted 5 s after its own partition's copy: a new message, though before partition
    # 0's copy. "cust-0" (partition 0) is accepted before its partition's copy: cancelled.
    (_cancel(COPIES, prefix="cust-"), 1, 0, T),
    (_schedule("cust-1", T + 5_000), 1, 1, T + 5_000),
    (_schedule("old-1", T + 5_000), 1, 2, T + 5_000),
    (_schedule("cust-0", T + 5_000), 0, 0, T + 5_000),
    (_cancel(COPIES, prefix="cust-"), 0, 1, T + 10_000),
    (_cancel(OLDER, prefix="old-"), 0, 2, T + 10_000),  # cancels "old-1" in partition 1
    # (b) One producer (7, epoch 0, orders/3). "k-after" was sent after its cancel (sequence
    # 101 > 100) but appended before it: kept. "k-before" was sent before its cancel (199 <
    # 200) but appended a minute after it, far beyond the 100 ms: cancelled.
    (_schedule("k-after", T, _stamp(101)), 2, 0, T),
    (_cancel("k-after", _stamp(100)), 2, 1, T + 1),
    (_cancel("k-before", _stamp(200)), 2, 2, T + 1_000),
    (_schedule("k-before", T + 1_000 + MINUTE, _stamp(199)), 2, 3, T + 1_000 + MINUTE),
    # Another producer's cancel: the window rule, a new message.
    (_cancel("k-other", _stamp(300, producer=8)), 2, 4, T + 2_000),
    (_schedule("k-other", T + 2_000 + MINUTE, _stamp(299)), 2, 5, T + 2_000 + MINUTE),
    # Sent before its cancel, but appended beyond the 5-minute window: kept.
    (_cancel("k-far", _stamp(400)), 2, 6, T + 3_000),
    (_schedule("k-far", T, _stamp(399)), 2, 7, T + 3_000 + contract.WINDOW_MS + 1),
    # The sequence wraps at 2**31: 2**31 - 2 precedes 5.
    (_cancel("k-wrap", _stamp(5)), 2, 8, T + 4_000),
    (_schedule("k-wrap", T + 4_000 + MINUTE, _stamp(SEQUENCES - 2)), 2, 9, T + 4_000 + MINUTE),
]
CANCELLED = {("cust-0", 0, 0), ("old-1", 1, 2), ("k-before", 2, 3), ("k-wrap", 2, 9)}


def _buffer(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([_row(*r) for r in RECORDS], RAW)


def test_the_batch_job_applies_bulk_copies_and_producer_sequences(spark: SparkSession) -> None:
    rows = parse_buffer(_buffer(spark))
    assert rows.bulk is not None
    msgs = messages(rows.schedules)
    cancelled = cancelled_positions(msgs, rows.cancels).unionByName(
        bulk_cancelled_positions(msgs, rows.bulk)
    )
    assert {(r["id"], r["bpart"], r["boff"]) for r in cancelled.collect()} == CANCELLED


def test_the_streaming_job_applies_bulk_copies_and_producer_sequences(
    spark: SparkSession,
) -> None:
    rows = parse_buffer(_buffer(spark))
    registry = CancelRegistry()
    registry.add(*cancel_rows(rows.cancels))
    assert set(registry.cancelled(schedule_rows(messages(rows.schedules)))) == CANCELLED


STAMPS = [
    "7/0/3/100/orders",
    "007/00/03/0100/orders",  # leading zeros: the same stream and sequence
    "0/0/0/0/t",
    f"1/2/3/{SEQUENCES - 1}/t",
    f"1/2/3/{SEQUENCES}/t",  # beyond int32: malformed
    "1/2/3/4/t\n",  # a trailing line break: malformed
    "1/2/3/4/a/b",
    "1/2/3/4/",
    "1/2/3/x/t",
    "12345678901234567890/0/0/0/t",  # 20 digits
    "1/2/3/4/é-topic",
    "",
    None,
]


def test_the_stamp_and_bulk_id_columns_read_as_kdelay_buffer_does(spark: SparkSession) -> None:
    df = spark.createDataFrame([(s,) for s in STAMPS], "q STRING")
    stream, seq = stamp_columns(F.col("q"))
    got = [(r["s"], r["n"]) for r in df.select(stream.alias("s"), seq.alias("n")).collect()]
    assert got == [parse_stamp(s) or (None, None) for s in STAMPS]
    ids = [
        COPIES,
        OLDER,
        "bulk.p.x",
        "bulk.p1234567890.x",
        "bulk.p\u0663.x",
        "xbulk.p2.",
        "bulk.p2",
    ]
    df = spark.createDataFrame([(i,) for i in ids], "i STRING")
    got_copies = [
        r["c"] for r in df.select(F.col("i").rlike(BULK_COPIES_PATTERN).alias("c")).collect()
    ]
    assert got_copies == [bulk_copies(i) is not None for i in ids]


def test_the_sequence_order_column_is_the_contracts(spark: SparkSession) -> None:
    """Wrap-aware, as the contract's produced_before and the replicas' rule."""
    half = SEQUENCES // 2
    pairs = [
        (_stamp(c), _stamp(m))
        for c, m in [(5, 4), (5, 5), (4, 5), (5, SEQUENCES - 2), (half + 5, 5), (half + 4, 5)]
    ] + [(_stamp(5), _stamp(4, producer=8)), (_stamp(5), None), ("junk", _stamp(4))]
    df = spark.createDataFrame(pairs, "c STRING, m STRING")
    got = [
        r["o"]
        for r in df.select(produced_before_column(F.col("c"), F.col("m")).alias("o")).collect()
    ]
    assert got == [contract.produced_before(c, m) for c, m in pairs]
    assert got == [buffer.produced_before(c, m) for c, m in pairs]
    assert got == [True, False, False, True, False, True, None, None, None]
