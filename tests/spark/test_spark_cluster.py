"""``kdelay verify`` on a real two-worker standalone Spark cluster (``dev.spark.SparkCluster``).

One cluster for the module (a master and two workers from pyspark's jars, on loopback). The
scenarios are those of test_verifier_once.py and test_verifier_continuous.py (from
tests/support/verifier_scenarios.py): a ``--once`` report must be identical on ``local[2]``
and on the cluster; the streaming verifier must survive a worker SIGKILLed mid-run with the
same window counts, and resume from its checkpoint after a stop (one test: both need a
streaming run on the cluster, the slow part). Each test prints its own duration (``-s``).
"""

from __future__ import annotations

import gc
import json
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.spark import SparkCluster
from kdelay.verifier.cli import verify_continuous, verify_once
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.metrics import Metrics
from kdelay.verifier.report import Slo
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import consume_until
from tests.support.verifier_scenarios import (
    STREAM_GRACE_MS,
    WINDOW_OF_20,
    assert_same_report,
    build_faults,
    independent_report,
    next_base,
    produce_scenario,
    scenario_topics,
    settled,
    window_totals,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture(autouse=True)
def _duration(request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.monotonic()
    yield
    print(f"\n{request.node.name}: {time.monotonic() - start:.1f} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with SparkCluster(tmp_path_factory.mktemp("spark"), workers=2) as c:
        yield c


def _release_sockets() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


class ClusterSession:
    """The module's one SparkSession on the cluster, made on first use: a process has one
    SparkContext at a time, and the first test runs ``local[2]`` before it."""

    def __init__(self, bootstrap: str, master: str) -> None:
        self.cfg = VerifierConfig(bootstrap_servers=bootstrap, spark_master=master)
        self.session: Any = None

    def get(self) -> Any:
        from kdelay.verifier import job

        if self.session is None:
            self.session = job.spark_session(self.cfg)
            deadline = time.monotonic() + 60
            while _executors(self.session) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)  # sleep: the poll interval: executors register after the driver
        return self.session


@pytest.fixture(scope="module")
def cluster_spark(kafka: KafkaInfra, cluster: SparkCluster) -> Iterator[ClusterSession]:
    holder = ClusterSession(kafka.bootstrap_servers, cluster.master_url)
    yield holder
    if holder.session is not None:
        holder.session.stop()
    _release_sockets()


def _executors(session: Any) -> int:
    """Executors registered with the driver (the driver's own block manager excluded)."""
    return int(session.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def test_once_gives_the_identical_report_on_local_and_on_a_two_worker_cluster(
    kafka: KafkaInfra, cluster: SparkCluster, cluster_spark: ClusterSession
) -> None:
    from kdelay.verifier import job

    sc = build_faults(kafka.bootstrap_servers)  # missing, duplicate, early, cancelled
    end_ms = int(time.time() * 1000)
    local_cfg = sc.config(end_ms=end_ms, spark_master="local[2]")
    session = job.spark_session(local_cfg)
    try:
        local = verify_once(session, local_cfg, Slo(), None).report
    finally:
        session.stop()
        _release_sockets()
    on_cluster = cluster_spark.get()
    assert _executors(on_cluster) == 2
    remote_cfg = sc.config(end_ms=end_ms, spark_master=cluster.master_url)
    remote = verify_once(on_cluster, remote_cfg, Slo(), None).report
    assert json.dumps(local, sort_keys=True) == json.dumps(remote, sort_keys=True)
    assert (remote["missing"], remote["duplicates"], remote["early"]) == (1, 1, 1)
    assert_same_report(remote, independent_report(sc, end_ms))
    # The work ran in executors on both workers, which fetched what the driver ships: the
    # package zip and the pinned spark-sql-kafka jars.
    for w in cluster.workers:
        executor_dirs = [p.parent for p in w.work_dir.glob("app-*/*/stderr")]
        assert executor_dirs, f"no executor ran on {w.work_dir}"
        fetched = {p.name for d in executor_dirs for p in d.iterdir()}
        assert "kdelay-packages.zip" in fetched
        assert any(n.startswith("spark-sql-kafka-") and n.endswith(".jar") for n in fetched)


class Streaming:
    """The streaming verifier on a thread, publishing to its own output topic."""

    def __init__(self, session: Any, cfg: VerifierConfig) -> None:
        self.session = session
        self.cfg = cfg
        self.stop = threading.Event()
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._run, name="verifier", daemon=True)

    def _run(self) -> None:
        try:
            verify_continuous(self.session, self.cfg, self.stop, Metrics())
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            self.errors.append(exc)

    def __enter__(self) -> Streaming:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=90)
        assert not self.thread.is_alive(), "the verifier did not stop within 90 s"
        assert self.errors == []

    def wait_for_progress(self, timeout: float = 120) -> None:
        """Until the main query has completed a micro-batch."""
        deadline = time.monotonic() + timeout
        while True:
            assert not self.errors, self.errors
            active = self.session.streams.active
            if any(q.lastProgress is not None for q in active):
                return
            assert time.monotonic() < deadline, "no micro-batch within the timeout"
            time.sleep(0.2)  # sleep: the poll interval of a wait with a deadline (Spark's progress)


def _stream_config(
    bootstrap: str, topics: tuple[str, str, str], checkpoint: Path
) -> VerifierConfig:
    buffer_topic, target, out_topic = topics
    return VerifierConfig(
        bootstrap_servers=bootstrap,
        buffer_topic=buffer_topic,
        topics=target,
        grace_ms=STREAM_GRACE_MS,
        early_horizon_ms=1_000,
        window="10s",
        trigger="500ms",
        output_topic=out_topic,
        console=False,
        checkpoint_dir=checkpoint,
    )


def test_streaming_survives_a_worker_killed_mid_run_and_resumes_from_its_checkpoint(
    kafka: KafkaInfra, cluster: SparkCluster, cluster_spark: ClusterSession, tmp_path: Path
) -> None:
    """Run 1: a worker (and its executor) SIGKILLed while the first window's messages are in
    the join's state; the first window comes out with the same counts as with no failure.
    Stopped, then run 2 from the same checkpoint: the second window, still open at the stop,
    comes out right, and the first is not published again (no double counting anywhere)."""
    session = cluster_spark.get()
    bootstrap = kafka.bootstrap_servers
    topics = scenario_topics(bootstrap, "k")
    buffer_topic, target, out_topic = topics
    cfg = _stream_config(bootstrap, topics, tmp_path / "checkpoint")
    first = next_base() - 1_000
    produce_scenario(bootstrap, (buffer_topic, target), first + 1_000, 20, "a")
    second = next_base(first + 1_000 + STREAM_GRACE_MS) - 1_000
    with Streaming(session, cfg) as run:
        run.wait_for_progress()
        cluster.kill_worker(0)
        # The second window's events move the watermark past the first (due + grace).
        produce_scenario(bootstrap, (buffer_topic, target), second + 1_000, 20, "b")
        published = consume_until(bootstrap, [out_topic], settled([first], run.errors), timeout=240)
        assert _executors(session) == 1
    assert window_totals(published, first) == WINDOW_OF_20
    with Streaming(session, cfg) as run:
        # A third window closes the second.
        produce_scenario(
            bootstrap, (buffer_topic, target), next_base(second + STREAM_GRACE_MS), 10, "c"
        )
        published = consume_until(
            bootstrap, [out_topic], settled([first, second], run.errors), timeout=240
        )
    assert window_totals(published, first) == WINDOW_OF_20
    assert window_totals(published, second) == WINDOW_OF_20
