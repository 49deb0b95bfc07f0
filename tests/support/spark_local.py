"""A local Spark session for the verifier's Spark-only tests (no Kafka running): the verifier's
own session (:func:`kdelay.verifier.job.spark_session`, ``local[2]`` on loopback, no UI), stopped,
and the sockets ``collect()`` left closed, when the block ends.

It is the verifier's session, Kafka connector included, because the first session of a process
starts Spark's JVM and fixes its class path: a bare session started first leaves a later module's
verifier without its ``kafka`` data source ("Failed to find data source: kafka")."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from kdelay.verifier.config import VerifierConfig


@contextmanager
def local_spark(app: str, *, shuffle_partitions: int = 2) -> Iterator[SparkSession]:
    """The verifier's ``local[2]`` session, named ``app``, with ``shuffle_partitions``."""
    from kdelay.verifier import job

    cfg = VerifierConfig(shuffle_partitions=shuffle_partitions, spark_conf={"spark.app.name": app})
    session = job.spark_session(cfg)
    try:
        yield session
    finally:
        session.stop()
        with warnings.catch_warnings():  # the sockets collect() left, closed here
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
