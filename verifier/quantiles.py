"""Exact percentiles of lateness, per group, without gathering a group's values in one task.

Spark's ``percentile`` aggregate keeps a map of every distinct value to its count and merges the
maps in one task per group: overall, 10M distinct lateness values had to fit in one executor's
heap. Here the counts per value are a distributed ``groupBy``; the running count up to each value
comes from a window ordered by the value (sorted and spilled to disk by Spark, never held in a
map); and the two values each percentile interpolates between are found by a plain aggregate:
the smallest value whose running count reaches the rank.

The arithmetic is Spark's ``Percentile.getPercentile``, operation for operation, so each figure
is the same double as ``percentile`` gives, to the bit (tests/integration/test_verifier_quantiles
.py holds it to Spark's own): with ``n`` values, ``position = (n - 1) * p``, ``lower =
floor(position)``, ``higher = ceil(position)``; the values at 0-based ranks ``lower`` and
``higher`` are ``lo`` and ``hi``; the percentile is ``lo`` when ``higher == lower`` or ``lo ==
hi``, else ``(higher - position) * lo + (position - lower) * hi``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom


def exact_percentiles(
    values: DataFrame,
    value: str,
    keys: Sequence[str],
    quantiles: Sequence[float],
    names: Sequence[str],
) -> DataFrame:
    """Per group of ``keys`` (one group overall when empty), the ``quantiles`` of the non-null
    ``value`` column as double columns ``names``. A group without a value has no row; overall
    (no keys) there is always one row, of nulls when there is no value."""
    rows = values.where(F.col(value).isNotNull()).select(*keys, F.col(value).alias("v"))
    counts = rows.groupBy(*keys, "v").agg(F.count(F.lit(1)).alias("c"))
    running = Window.partitionBy(*keys).orderBy("v").rowsBetween(Window.unboundedPreceding, 0)
    cumulative = counts.withColumn("upto", F.sum("c").over(running))
    totals = counts.groupBy(*keys).agg(F.sum("c").alias("n"))
    joined = cumulative.join(totals, list(keys)) if keys else cumulative.crossJoin(totals)
    positions = {
        name: (F.col("n") - 1).cast("double") * F.lit(float(q))
        for name, q in zip(names, quantiles, strict=True)
    }
    ranked = joined.select(
        *keys,
        "v",
        "upto",
        *(position.alias(f"{name}_pos") for name, position in positions.items()),
    )

    def value_at(rank: Column) -> Column:
        # The value at a 0-based rank: the smallest whose running count exceeds it (Spark's
        # binarySearchCount for rank + 1).
        return F.min(F.when(F.col("upto") >= rank + 1, F.col("v")))

    aggregated = ranked.groupBy(*keys).agg(
        *(F.first(f"{name}_pos").alias(f"{name}_pos") for name in names),
        *(value_at(F.floor(f"{name}_pos")).alias(f"{name}_lo") for name in names),
        *(value_at(F.ceil(f"{name}_pos")).alias(f"{name}_hi") for name in names),
    )
    return aggregated.select(*keys, *(_interpolate(name).alias(name) for name in names))


def _interpolate(name: str) -> Column:
    position = F.col(f"{name}_pos")
    lower, higher = F.floor(position), F.ceil(position)
    lo, hi = F.col(f"{name}_lo").cast("double"), F.col(f"{name}_hi").cast("double")
    between = (higher.cast("double") - position) * lo + (position - lower.cast("double")) * hi
    return F.when((higher == lower) | (lo == hi), lo).otherwise(between)
