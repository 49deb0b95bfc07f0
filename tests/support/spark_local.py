"""A local Spark session for the verifier's Spark-only tests (no Kafka): ``local[2]`` on
loopback, no UI, few shuffle partitions; stopped, and the sockets ``collect()`` left closed, when
the block ends."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession


@contextmanager
def local_spark(
    app: str, *, shuffle_partitions: int = 2, time_zone: str | None = "UTC"
) -> Iterator[SparkSession]:
    """A ``local[2]`` session named ``app`` (``time_zone`` None: Spark's default)."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    )
    if time_zone is not None:
        builder = builder.config("spark.sql.session.timeZone", time_zone)
    session = (
        builder.config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()
        with warnings.catch_warnings():  # the sockets collect() left, closed here
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
