"""``kdelay verify`` (continuous): the streaming job publishes window results, then stops.

Target topics are LogAppendTime, so a delivery's time is when it was written: the tests
schedule messages due in a moment, wait until they are due, then deliver them.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from dev.stack.process import KDELAY, free_port
from kdelay.verifier.cli import verify_continuous
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.metrics import Metrics
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    HeaderList,
    Record,
    consume_until,
    create_topic,
    unique_topic,
)
from tests.support.schedule import create_target
from tests.support.verifier_scenarios import (
    STREAM_GRACE_MS,
    WINDOW_MS,
    next_base,
    produce_scenario,
    scenario_topics,
    settled,
    window_totals,
)

# PySpark's collect() leaves its result socket to the garbage collector; a collection during
# a test reports it as unraisable. The module's fixture collects them before it ends.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture(scope="module")
def spark(kafka: KafkaInfra) -> Iterator[Any]:
    from kdelay.verifier import job

    session = job.spark_session(VerifierConfig(bootstrap_servers=kafka.bootstrap_servers))
    yield session
    session.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_streaming_verifier_publishes_window_results_and_stops_cleanly(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    bootstrap = kafka.bootstrap_servers
    buffer_topic, target, out_topic = scenario_topics(bootstrap, "s")
    # Written straight to the target two minutes before its due time: early, though no schedule
    # exists, and stamped as if released after its due time.
    forged_due = int(time.time() * 1000) + 120_000
    headers: HeaderList = [("kdelay-id", b"forged"), ("kdelay-deliver-at", b"%d" % forged_due)]
    forger = Producer({"bootstrap.servers": bootstrap})
    forger.produce(target, b"v", headers=headers, timestamp=forged_due + 1_000)
    assert forger.flush(30) == 0
    first = next_base() - 1_000  # a window start
    # Something is scheduled before the start, so the target topic is found in the buffer.
    produce_scenario(bootstrap, (buffer_topic, target), first + 1_000, 20, "a")
    port = free_port()
    cfg = VerifierConfig(
        bootstrap_servers=bootstrap,
        buffer_topic=buffer_topic,
        grace_ms=STREAM_GRACE_MS,
        early_horizon_ms=1_000,
        window="10s",
        trigger="500ms",
        output_dir=tmp_path / "out",
        output_topic=out_topic,
        console=False,
        checkpoint_dir=tmp_path / "checkpoint",
    )
    # The checkpoint keeps a bounded number of batches (bench.verifier_soak: 2 MB a batch).
    assert spark.conf.get("spark.sql.streaming.minBatchesToRetain") == "20"
    metrics = Metrics()
    metrics.serve(port, "127.0.0.1")
    stop = threading.Event()
    errors: list[Exception] = []

    def run() -> None:
        try:
            verify_continuous(spark, cfg, stop, metrics)
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    runner = threading.Thread(target=run, name="verifier", daemon=True)
    runner.start()
    try:
        # More data after the start: a second window, then a third, whose event time moves
        # the watermark past the second (due + grace).
        second = next_base() - 1_000
        produce_scenario(bootstrap, (buffer_topic, target), second + 1_000, 20, "b")
        produce_scenario(
            bootstrap, (buffer_topic, target), next_base(second + STREAM_GRACE_MS), 10, "c"
        )

        def first_two_windows_settled(records: list[Record]) -> bool:
            forged = window_totals(records, forged_due // WINDOW_MS * WINDOW_MS)
            return settled((first, second), errors)(records) and forged.get("early", 0) >= 1

        published = consume_until(bootstrap, [out_topic], first_two_windows_settled, timeout=180)
        for start in (first, second):
            assert window_totals(published, start) == {
                "scheduled": 17,  # 20 minus the three cancelled
                "delivered": 16,
                "missing": 1,
                "duplicates": 1,
                "early": 0,
                "cancelled": 3,
            }
        forged_window = forged_due // WINDOW_MS * WINDOW_MS
        assert window_totals(published, forged_window) == {
            "scheduled": 0,
            "delivered": 0,
            "missing": 0,
            "duplicates": 0,
            "early": 1,
            "cancelled": 0,
        }
        files = sorted((tmp_path / "out" / "windows").glob("batch-*.json"))
        assert files, "no per-batch JSON file was written"
        in_files = [w for f in files for w in json.loads(f.read_text())]
        assert sum(w["scheduled"] for w in in_files if w["window_start_ms"] == first) == 17
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        scheduled = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("kdelay_verifier_scheduled_total ")
        ]
        assert scheduled
        assert scheduled[0] >= 34
        assert "kdelay_verifier_lateness_seconds_bucket" in text
    finally:
        stop.set()
        runner.join(timeout=90)
    assert not runner.is_alive(), "the verifier did not stop within 90 s"
    assert errors == []
    assert spark.streams.active == []


def test_cli_verify_runs_until_sigterm_and_exits_cleanly(kafka: KafkaInfra, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    buffer_topic, target = unique_topic("sbuf"), unique_topic("stgt")
    create_topic(bootstrap, buffer_topic)
    create_target(bootstrap, target)
    out_dir = tmp_path / "out"
    argv = [
        KDELAY,
        "verify",
        "--bootstrap-servers",
        bootstrap,
        "--buffer-topic",
        buffer_topic,
        "--topics",
        target,
        "--grace-ms",
        str(STREAM_GRACE_MS),
        "--early-horizon-ms",
        "500",
        "--trigger",
        "500ms",
        "--output-dir",
        str(out_dir),
        "--output-topic",
        "",
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = next_base()
        produce_scenario(bootstrap, (buffer_topic, target), first, 10, "a")
        # Moves the watermark past the first (due + grace).
        produce_scenario(
            bootstrap, (buffer_topic, target), next_base(first + STREAM_GRACE_MS), 10, "b"
        )
        # Spark's start-up, then a few micro-batches through four stateful operators (two
        # de-duplications, the join, the aggregation): minutes on a busy two-core machine.
        deadline = time.monotonic() + 240
        while not list(out_dir.glob("windows/batch-*.json")):
            assert proc.poll() is None, proc.communicate(timeout=10)
            assert time.monotonic() < deadline, "no window result within 240 s"
            time.sleep(0.2)  # sleep: the poll interval of a wait with a deadline (a file)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    # The console sink printed the same window results as JSON lines.
    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(r["window_start_ms"] <= first < r["window_end_ms"] for r in printed)
