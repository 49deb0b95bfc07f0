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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from dev.stack.process import KDELAY, free_port
from kdelay import buffer
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    HeaderList,
    Record,
    consume_until,
    create_topic,
    unique_topic,
)
from tests.support.schedule import create_target
from verifier.cli import verify_continuous
from verifier.config import VerifierConfig
from verifier.metrics import Metrics

# PySpark's collect() leaves its result socket to the garbage collector; a collection during
# a test reports it as unraisable. The module's fixture collects them before it ends.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)

WINDOW_MS = 10_000
SPACING_MS = 10  # between the due times of one _produce call: all in one window
#: One window's totals in the scenario of 20 messages _produce writes (tests/spark, tests/k8s).
WINDOW_OF_20 = {
    "scheduled": 17,
    "delivered": 16,
    "missing": 1,
    "duplicates": 1,
    "early": 0,
    "cancelled": 3,
}
GRACE_MS = 3_000  # more than a delivery's lateness here, even on a busy machine


@pytest.fixture(scope="module")
def spark(kafka: KafkaInfra) -> Iterator[Any]:
    from verifier import job

    session = job.spark_session(VerifierConfig(bootstrap_servers=kafka.bootstrap_servers))
    yield session
    session.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _headers(pairs: Sequence[tuple[str, bytes | None]]) -> HeaderList:
    return list(pairs)


def _next_base(after_ms: int | None = None) -> int:
    """1 s into the first window that starts after ``after_ms`` (default: a second from now)."""
    after = after_ms if after_ms is not None else int(time.time() * 1000) + 1_000
    return (after // WINDOW_MS + 1) * WINDOW_MS + 1_000


def _produce(bootstrap: str, topics: tuple[str, str], base_ms: int, n: int, tag: str) -> None:
    """``n`` messages due from ``base_ms`` (ahead), delivered once all are due; message 3 is
    lost, 4 is cancelled, 5 delivered twice, 6 cancelled by a cancel sent with it but appended
    before it (accepted by a proxy within a second of the cancel's append time), 7 cancelled by
    a bulk cancel of its id prefix on its topic, 8 has that prefix too but was accepted after
    the bulk cancel (a new message: delivered)."""
    buffer_topic, target = topics
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    messages = []
    for i in range(n):
        accepted_ms = int(time.time() * 1000) + (5_000 if i == 8 else 0)
        msg_id = f"{tag}bulk-{i}" if i in (7, 8) else f"{tag}{i}"
        s = buffer.Scheduled(
            msg_id,
            target,
            -1,
            None,
            b"v",
            base_ms + i * SPACING_MS,
            seq=accepted_ms << buffer.ORDER_SHIFT,
        )
        enc = buffer.encode(s)
        if i == 6:
            cancel = buffer.encode(buffer.Cancel(s.id))
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=_headers(cancel.headers)
            )
        producer.produce(buffer_topic, enc.value, enc.key, headers=_headers(enc.headers))
        if i == 4:
            cancel = buffer.encode(buffer.Cancel(s.id))
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=_headers(cancel.headers)
            )
        if i == 7:
            bulk = buffer.Cancel(f"bulk-{tag}", prefix=f"{tag}bulk-", topic=target)
            cancel = buffer.encode(bulk)
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=_headers(cancel.headers)
            )
        if i not in (3, 4, 6, 7):
            messages.extend([s, s] if i == 5 else [s])
    assert producer.flush(30) == 0
    # Waiting for the wall clock itself: the broker stamps each delivery when it is written.
    time.sleep(max(0.0, (base_ms + n * SPACING_MS + 50) / 1000 - time.time()))
    for s in messages:
        producer.produce(target, s.value, headers=_headers(s.delivered_headers()))
    assert producer.flush(30) == 0


def _window_totals(records: list[Record], start_ms: int) -> dict[str, int]:
    totals: dict[str, int] = {}
    for rec in records:
        result = json.loads(rec.value or b"{}")
        if result["window_start_ms"] != start_ms:
            continue
        for key in ("scheduled", "delivered", "missing", "duplicates", "early", "cancelled"):
            totals[key] = totals.get(key, 0) + int(result[key])
    return totals


def _scenario_topics(bootstrap: str, tag: str) -> tuple[str, str, str]:
    """A buffer topic and a LogAppendTime target (2 partitions each) and an output topic."""
    names = (unique_topic(f"{tag}buf"), unique_topic(f"{tag}tgt"), unique_topic(f"{tag}out"))
    create_topic(bootstrap, names[0], partitions=2)
    create_target(bootstrap, names[1], partitions=2)
    create_topic(bootstrap, names[2])
    return names


def _settled(
    starts: Sequence[int], errors: Sequence[Exception] = ()
) -> Callable[[list[Record]], bool]:
    """Whether the windows starting at ``starts`` were all published with _produce's 17
    scheduled messages; fails at once on an error of a verifier run in a thread."""

    def done(records: list[Record]) -> bool:
        assert not errors, errors
        return all(_window_totals(records, s).get("scheduled", 0) >= 17 for s in starts)

    return done


def test_streaming_verifier_publishes_window_results_and_stops_cleanly(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    bootstrap = kafka.bootstrap_servers
    buffer_topic, target, out_topic = _scenario_topics(bootstrap, "s")
    # Written straight to the target two minutes before its due time: early, though no schedule
    # exists, and stamped as if released after its due time.
    forged_due = int(time.time() * 1000) + 120_000
    headers: HeaderList = [("kdelay-id", b"forged"), ("kdelay-deliver-at", b"%d" % forged_due)]
    forger = Producer({"bootstrap.servers": bootstrap})
    forger.produce(target, b"v", headers=headers, timestamp=forged_due + 1_000)
    assert forger.flush(30) == 0
    first = _next_base() - 1_000  # a window start
    # Something is scheduled before the start, so the target topic is found in the buffer.
    _produce(bootstrap, (buffer_topic, target), first + 1_000, 20, "a")
    port = free_port()
    cfg = VerifierConfig(
        bootstrap_servers=bootstrap,
        buffer_topic=buffer_topic,
        grace_ms=GRACE_MS,
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
        second = _next_base() - 1_000
        _produce(bootstrap, (buffer_topic, target), second + 1_000, 20, "b")
        _produce(bootstrap, (buffer_topic, target), _next_base(second + GRACE_MS), 10, "c")

        def first_two_windows_settled(records: list[Record]) -> bool:
            forged = _window_totals(records, forged_due // WINDOW_MS * WINDOW_MS)
            return _settled((first, second), errors)(records) and forged.get("early", 0) >= 1

        published = consume_until(bootstrap, [out_topic], first_two_windows_settled, timeout=180)
        for start in (first, second):
            assert _window_totals(published, start) == {
                "scheduled": 17,  # 20 minus the three cancelled
                "delivered": 16,
                "missing": 1,
                "duplicates": 1,
                "early": 0,
                "cancelled": 3,
            }
        forged_window = forged_due // WINDOW_MS * WINDOW_MS
        assert _window_totals(published, forged_window) == {
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
        str(GRACE_MS),
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
        first = _next_base()
        _produce(bootstrap, (buffer_topic, target), first, 10, "a")
        # Moves the watermark past the first (due + grace).
        _produce(bootstrap, (buffer_topic, target), _next_base(first + GRACE_MS), 10, "b")
        # Spark's start-up, then a few micro-batches through four stateful operators (two
        # de-duplications, the join, the aggregation): minutes on a busy two-core machine.
        deadline = time.monotonic() + 240
        while not list(out_dir.glob("windows/batch-*.json")):
            assert proc.poll() is None, proc.communicate(timeout=10)
            assert time.monotonic() < deadline, "no window result within 240 s"
            time.sleep(0.2)  # polling a file for a condition, with a deadline
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
