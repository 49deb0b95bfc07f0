"""The verifier's exact percentiles (verifier/quantiles.py) are Spark's ``percentile``, to the bit.

The report's p50/p95/p99 were Spark's ``percentile`` aggregate, which gathers every distinct
value of a group in one task; ``exact_percentiles`` computes them from distributed counts instead.
Held here to ``percentile`` itself on data that reaches every branch of its interpolation: ties,
one value, two values, negative lateness (early), many distinct values, per group and overall.
Spark in local mode, no Kafka.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay.verifier.quantiles import exact_percentiles
from kdelay.verifier.report import QUANTILES
from tests.support.spark_local import local_spark

# PySpark's collect() leaves its result socket to the garbage collector; a collection during a
# test reports it as unraisable (as in test_verifier_once.py).
pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

NAMES = ("p50", "p95", "p99")
NONE: tuple[float | None, ...] = (None, None, None)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("kdelay-quantiles-test", shuffle_partitions=4) as session:
        yield session


def _sparks(df: DataFrame, keys: list[str]) -> dict[tuple[object, ...], tuple[float | None, ...]]:
    got = df.groupBy(*keys).agg(F.percentile("l", list(QUANTILES)).alias("q")).collect()
    return {tuple(r[k] for k in keys): tuple(r["q"] or NONE) for r in got}


def _ours(df: DataFrame, keys: list[str]) -> dict[tuple[object, ...], tuple[float | None, ...]]:
    got = exact_percentiles(df, "l", keys, QUANTILES, NAMES).collect()
    return {tuple(r[k] for k in keys): tuple(r[n] for n in NAMES) for r in got}


def _groups(seed: int) -> list[tuple[int, int | None]]:
    rnd = random.Random(seed)
    rows: list[tuple[int, int | None]] = [(0, 7)]  # one value
    rows += [(1, 3), (1, 10)]  # two values: every quantile interpolates
    rows += [(2, 5)] * 50  # all ties
    rows += [(3, None), (3, None)]  # no value: no row
    rows += [(4, None), (4, -20), (4, 4)]
    rows += [(5, rnd.randint(-500, 500)) for _ in range(997)]  # early and late, with ties
    rows += [(6, rnd.randint(0, 10**12)) for _ in range(2_003)]  # distinct, large
    rows += [(7, rnd.choice((1, 2, 2, 3, 1_000))) for _ in range(101)]
    rnd.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_group_and_overall_they_are_sparks_percentile_to_the_bit(
    spark: SparkSession, seed: int
) -> None:
    df = spark.createDataFrame(_groups(seed), "g int, l long")
    ours, sparks = _ours(df, ["g"]), _sparks(df, ["g"])
    assert set(ours) == {(0,), (1,), (2,), (4,), (5,), (6,), (7,)}  # a group of nulls has no row
    assert sparks.pop((3,)) == NONE
    for key, expected in sparks.items():
        assert ours[key] == expected, f"group {key}"  # exact equality: the same doubles
    assert _ours(df, []) == _sparks(df, [])


def test_with_no_value_at_all_overall_is_one_row_of_nulls(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, None)], "g int, l long")
    assert _ours(df, []) == {(): NONE} == _sparks(df, [])
