"""The verifier's exact percentiles over many distinct lateness values, in a small heap.

    .venv/bin/python -m bench.verifier_percentiles [--values 10000000] [--memory 1g]
        [--with-spark-percentile] [--json FILE]

Spark in local mode (``local[2]``: the driver is the executor, its heap ``--memory``) computes
p50/p95/p99 of ``--values`` distinct values (a permutation, so every value is distinct) with the
verifier's ``exact_percentiles`` (distributed counts, verifier/quantiles.py), overall and in 10
groups. The baseline, in the same run: Spark's ``percentile`` aggregate, what the report used
before, which gathers every distinct value of a group in one task (``--with-spark-percentile``;
in a small heap it may fail with OutOfMemoryError, which is the finding, printed as such). Both
results are printed, with their seconds, and whether they are equal to the bit. Not part of
``make test``.

On 2026-12-07 (``--values 10000000 --memory 1g --with-spark-percentile``, the machine shared
with other work): exact_percentiles 43.6 s overall and 33.8 s per group; Spark's percentile
39.8 s per group (equal to the bit) and OutOfMemoryError overall after 10.1 s.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark idiom

from kdelay.verifier.quantiles import exact_percentiles
from kdelay.verifier.report import QUANTILES

NAMES = ("p50", "p95", "p99")


def _session(memory: str) -> SparkSession:
    return (
        SparkSession.builder.master("local[2]")
        .appName("kdelay-bench-percentiles")
        .config("spark.driver.memory", memory)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )


def _values(spark: SparkSession, n: int) -> DataFrame:
    # A permutation of 0..n-1 (multiplication by an odd number modulo a power of two), spread
    # over 10 groups: every value distinct.
    size = 1 << max(n - 1, 1).bit_length()
    value = (F.col("id") * F.lit(2_654_435_761) % F.lit(size)).alias("l")
    return spark.range(n).select((F.col("id") % 10).alias("g"), value)


Rows = list[tuple[object, ...]]


def _timed(what: str, run: Callable[[], Rows]) -> tuple[float, Rows | None]:
    start = time.monotonic()
    try:
        result = run()
    except Exception as exc:  # noqa: BLE001 - the baseline failing is a finding, printed
        print(f"{what}: failed after {time.monotonic() - start:.1f} s: {str(exc)[:300]}")
        return time.monotonic() - start, None
    seconds = time.monotonic() - start
    print(f"{what}: {seconds:.1f} s")
    return seconds, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", type=int, default=10_000_000)
    parser.add_argument("--memory", default="1g", help="the driver's heap (= the executor's)")
    parser.add_argument("--with-spark-percentile", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spark = _session(args.memory)
    df = _values(spark, args.values)
    out: dict[str, object] = {"values": args.values, "memory": args.memory}
    cases: list[tuple[list[str], str]] = [([], "overall"), (["g"], "per group")]
    results: dict[str, Rows | None] = {}
    for keys, label in cases:

        def ours(keys: list[str] = keys) -> Rows:
            rows = exact_percentiles(df, "l", keys, QUANTILES, NAMES).collect()
            return sorted(tuple(r) for r in rows)

        seconds, got = _timed(f"exact_percentiles, {label}", ours)
        out[f"exact_{label.replace(' ', '_')}_s"] = round(seconds, 1)
        results[label] = got
        print(f"  {got if got is None or len(got) < 3 else got[:3]}")
    # The baseline last: an OutOfMemoryError in local mode ends the JVM, and the session with it.
    for keys, label in cases[::-1] if args.with_spark_percentile else []:

        def sparks(keys: list[str] = keys) -> Rows:
            rows = df.groupBy(*keys).agg(F.percentile("l", list(QUANTILES)).alias("q"))
            return sorted((*(r[k] for k in keys), *r["q"]) for r in rows.collect())

        seconds, base = _timed(f"Spark's percentile, {label}", sparks)
        out[f"spark_{label.replace(' ', '_')}_s"] = round(seconds, 1)
        out[f"spark_{label.replace(' ', '_')}_ok"] = base is not None
        if base is None:
            break
        out[f"equal_{label.replace(' ', '_')}"] = base == results[label]
        print(f"  equal to the bit: {base == results[label]}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - the JVM may be gone after the baseline's OutOfMemoryError
        print("the Spark JVM had already exited")


if __name__ == "__main__":
    main()
