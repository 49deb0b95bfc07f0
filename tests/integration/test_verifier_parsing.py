"""The verifier's parsing of delivered records (verifier/source.py), in Spark's local mode.

Header lookups are by position in the array of header keys, which Spark compiles, not by a
``filter`` lambda, which it interprets row by row: the same values (first header of a name,
null value, no header, a due time that is not a number), at a fraction of the CPU per record.
No Kafka.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay import headers as h
from kdelay.verifier.source import LOG_APPEND_TIME, parse_delivered
from tests.support.spark_local import local_spark

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

RAW = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP, timestampType INT"
AT = dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC)
RECEIVED = dt.datetime(2026, 12, 7, 12, 0, 5, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("kdelay-parsing-test") as session:
        yield session


def _raw(spark: SparkSession) -> DataFrame:
    def hdrs(*pairs: tuple[str, bytes | None]) -> list[tuple[str, bytes | None]]:
        return list(pairs)

    rows = [
        (hdrs((h.ID, b"a"), (h.DELIVER_AT, b"1000")), AT, LOG_APPEND_TIME),
        (hdrs(("x", b"1"), (h.ID, b"b"), (h.ID, b"c"), (h.DELIVER_AT, b"soon")), AT, 0),
        (hdrs((h.DELIVER_AT, b"2000"), (h.ID, b"d"), (h.DELIVER_AT, b"3000")), AT, 1),
        (hdrs((h.ID, None), (h.ID, b"e")), AT, 1),  # the first is null: no id
        (hdrs(("other", b"z")), AT, 1),
        (hdrs(), AT, 1),
        (None, AT, 1),
    ]
    return spark.createDataFrame(rows, RAW)


def _lambda_header(name: str) -> Column:
    """The former lookup, a ``filter`` lambda: the reference the new one must equal."""
    found = F.filter(F.col("headers"), lambda hdr: hdr.getField("key") == name)
    return F.try_element_at(found, F.lit(1)).getField("value").cast("string")


def test_delivered_records_are_the_first_header_of_each_name(spark: SparkSession) -> None:
    raw = _raw(spark)
    parsed = parse_delivered(raw, F.lit(RECEIVED))
    got = parsed.select("id", "due_ms", F.unix_millis("at"), "receipt").collect()
    at_ms, received_ms = (int(t.timestamp() * 1000) for t in (AT, RECEIVED))
    assert [tuple(r) for r in got] == [
        ("a", 1000, at_ms, False),
        ("b", None, received_ms, True),
        ("d", 2000, at_ms, False),
    ]
    reference = raw.select(
        _lambda_header(h.ID).alias("id"),
        _lambda_header(h.DELIVER_AT).try_cast("bigint").alias("due_ms"),
    ).where(F.col("id").isNotNull())
    assert [tuple(r) for r in reference.collect()] == [(r["id"], r["due_ms"]) for r in got]


def test_header_lookups_are_no_higher_order_function(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    parse_delivered(_raw(spark)).explain("extended")
    plan = capsys.readouterr().out.lower()
    assert "kdelay-id" in plan
    assert "lambdafunction" not in plan
