"""Aggregating the verifier's per-message rows (:data:`verifier.matching.PER_MESSAGE`) per
event-time window (over the due time) and overall, with exact percentiles (Spark's
``percentile``, linear interpolation like numpy's default, computed without gathering a
window's values in one task: :mod:`verifier.quantiles`); the definitions of every count are in
:mod:`verifier.report`. Both drivers use it (``job.py`` ``--once``, ``stream.py``).

Plain functions building DataFrames; ``window_results`` and ``lateness_points`` collect.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay.verifier.quantiles import exact_percentiles
from kdelay.verifier.report import QUANTILES, SUMMARY_COLUMNS, Summary, WindowResult

#: At most this many lateness values are collected for the histogram chart.
CHART_SAMPLE = 200_000


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

    def count(flag: Column) -> Column:
        return F.sum(flag.cast("long"))

    aggs = [
        count(delivered | missing).alias("scheduled"),
        count(delivered).alias("delivered"),
        count(missing).alias("missing"),
        F.sum(F.when(delivered, F.col("deliveries") - 1).otherwise(0)).alias("duplicates"),
        F.sum("early").alias("early"),
        F.max(lateness).cast("double").alias("max"),
        count(pending).alias("pending"),
        count(cancelled).alias("cancelled"),
        F.max(F.col("receipt") & ((F.col("deliveries") > 0) | (F.col("early") > 0))).alias(
            "receipt"
        ),
    ]
    names = ("p50", "p95", "p99")
    rest = [c for c in SUMMARY_COLUMNS if c not in names]
    keys = [] if window_ms is None else ["window_start_ms", "window_end_ms"]
    rows = per_id.withColumn("lateness", lateness)
    if window_ms is not None:
        w = F.window("due", f"{window_ms} milliseconds")
        rows = rows.withColumn("w", w).select(
            "*",
            F.unix_millis(F.col("w.start")).alias("window_start_ms"),
            F.unix_millis(F.col("w.end")).alias("window_end_ms"),
        )
    counted = rows.groupBy(*keys).agg(*aggs)
    quantiles = exact_percentiles(rows, "lateness", keys, QUANTILES, names)
    if not keys:  # one row overall, with null percentiles when nothing was delivered
        return counted.join(quantiles, how="left").select(*rest, *names)
    summary = counted.join(quantiles, keys, "left")
    return summary.select(*keys, *rest, *names).orderBy("window_start_ms")


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
