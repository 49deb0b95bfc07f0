"""tests/spark: the verifier on a real standalone Spark cluster (``make test-spark``).

A master and two workers from pyspark's jars (``dev.spark.SparkCluster``, ``kdelay spark up``)
beside the driver: five JVMs on the machine's two cores, about 5 minutes of a loaded `make test`
run, which its 30-minute CI budget no longer holds. They run only when
``KDELAY_TEST_SPARK_CLUSTER=1`` (what ``make test-spark`` sets): any other run deselects them,
so ``make test`` reports them as deselected. Marker ``spark_cluster``. The verifier on
``local[2]`` stays in ``make test`` (tests/integration/test_verifier_*.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.suites import mark_or_deselect

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spark_cluster: the verifier on a standalone Spark cluster (make test-spark)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_or_deselect(
        config,
        items,
        HERE,
        pytest.mark.spark_cluster,
        asked=os.environ.get("KDELAY_TEST_SPARK_CLUSTER") == "1",
    )
