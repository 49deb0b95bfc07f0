"""tests/deploy/containers: kdelay's own images on a container engine (``make test-containers``).

These run only on the testcontainers backend (``KDELAY_TEST_INFRA=testcontainers``, which
``make test-containers`` sets after ``make containers`` built the images): any other run
deselects them, so ``make test`` (the local backend) reports them as deselected and starts no
engine. They carry the marker ``containers``, registered here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.suites import mark_or_deselect

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containers: kdelay's images on a container engine (make test-containers)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_or_deselect(
        config,
        items,
        HERE,
        pytest.mark.containers,
        asked=os.environ.get("KDELAY_TEST_INFRA") == "testcontainers",
    )
