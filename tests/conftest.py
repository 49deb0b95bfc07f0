"""Session fixtures: real Kafka (single and 3-broker) and ZooKeeper, per tests/support/infra.py.

Tier markers are applied by directory: tests/unit -> unit, tests/integration -> integration,
tests/e2e -> e2e, tests/deploy -> deploy. When a test fails, the servers' log tails are printed
with its report.
"""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.support import infra
from tests.support.deploy_tools import Tools, ensure_tools

_TIERS = ("unit", "integration", "e2e", "deploy")
#: Run first, in this order: the long tiers. xdist's loadfile (the Makefile's `make test`) hands
#: out files in collection order, so the short files fill the end; tests/deploy, short files
#: (helm, promtool) that sort before tests/e2e by name, runs after tests/integration, as it did
#: inside it, when the deployment tools' builds that CI starts beside the install are done.
_FIRST = ("e2e", "integration")


def _run_order(item: pytest.Item) -> int:
    parts = Path(str(item.fspath)).parts
    return next((i for i, tier in enumerate(_FIRST) if tier in parts), len(_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=_run_order)  # stable: each tier keeps its own order


def _collect_dropped_clients() -> None:
    """Let clients that tests dropped inside reference cycles close while Kafka still runs;
    otherwise librdkafka logs 'Connection refused' from them after the broker has stopped."""
    gc.collect()


@pytest.fixture(scope="session")
def infra_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("infra")


@pytest.fixture(scope="session")
def kafka(infra_dir: Path) -> Iterator[infra.KafkaInfra]:
    """A single-broker Kafka (KRaft), auto-create on, 1 partition by default."""
    with infra.kafka(infra_dir, nodes=1) as k:
        yield k
        _collect_dropped_clients()


@pytest.fixture(scope="session")
def kafka_cluster(infra_dir: Path) -> Iterator[infra.KafkaInfra]:
    """A 3-broker Kafka on loopback, for failure tests."""
    with infra.kafka(infra_dir, nodes=3) as k:
        yield k
        _collect_dropped_clients()


@pytest.fixture(scope="session")
def zookeeper(infra_dir: Path) -> Iterator[infra.ZooKeeperInfra]:
    """A standalone ZooKeeper (tickTime 500 ms: session timeouts from 1 s)."""
    with infra.zookeeper(infra_dir) as z:
        yield z


@pytest.fixture(scope="session")
def tools(pytestconfig: pytest.Config) -> Tools:
    """helm, kubeconform, promtool, prometheus, hadolint: installed once per session by
    dev/tools/install.sh (pinned, cached in .cache/tools); skips, naming why, if impossible."""
    return ensure_tools(pytestconfig)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when != "call" or not report.failed:
        return report
    for name in ("kafka", "kafka_cluster", "zookeeper"):
        fixture = getattr(item, "funcargs", {}).get(name)
        local = getattr(fixture, "local", None)
        if local is not None and hasattr(local, "log_tails"):
            report.sections.append((f"{name} log tail", local.log_tails()))
        elif local is not None and getattr(local, "process", None) is not None:
            report.sections.append((f"{name} log tail", local.process.log_tail()))
    return report
