"""``kdelay verify --once`` against a real Kafka and a real (local) Spark.

The tests write buffer records (kdelay.buffer.encode) and "delivered" records (with the
kdelay-id / kdelay-deliver-at headers) straight into fresh topics, then compare the verifier's
report with counts computed here, independently, from the topics. Target topics are
LogAppendTime (the broker stamps every delivery), so an early delivery is one whose due time
is still ahead when it is written, whatever timestamp its producer claims.
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack import KDELAY
from kdelay import buffer
from kdelay import headers as h
from kdelay.verifier.cli import verify_once
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.report import Slo
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import HeaderList, consume_until, create_topic, unique_topic
from tests.support.verifier_scenarios import (
    ONCE_GRACE_MS,
    Scenario,
    assert_same_report,
    build_faults,
    independent_report,
)

# PySpark's collect() leaves its result socket to the garbage collector (see
# release_pyspark_sockets); a collection during a test reports it as unraisable.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def spark(kafka: KafkaInfra) -> Iterator[Any]:
    """One SparkSession for the module (start-up is the slow part)."""
    from kdelay.verifier import job

    session = job.spark_session(VerifierConfig(bootstrap_servers=kafka.bootstrap_servers))
    yield session
    session.stop()
    release_pyspark_sockets()


def release_pyspark_sockets() -> None:
    """Close the sockets PySpark's ``collect()`` leaves to the garbage collector (pyspark/util.py),
    so their ResourceWarning cannot surface later in another module's test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_injected_faults_are_reported_exactly(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    sc = build_faults(kafka.bootstrap_servers)
    end_ms = int(time.time() * 1000)
    outcome = verify_once(spark, sc.config(end_ms=end_ms), Slo(), tmp_path / "report.json")
    want = independent_report(sc, end_ms)
    assert (want["missing"], want["duplicates"], want["early"]) == (1, 1, 1)
    assert_same_report(outcome.report, want)
    assert outcome.report["scheduled"] == 19  # the cancelled message is left out
    assert outcome.details["cancelled"] == 1
    assert outcome.details["pending"] == 0
    assert outcome.report["isolation"] == "read_committed"
    assert json.loads((tmp_path / "report.json").read_text()) == outcome.report
    assert outcome.exit_code == 0


def test_report_matches_an_independent_count_over_5000_messages(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    sc = Scenario(kafka.bootstrap_servers)
    rng = random.Random(11)
    now = int(time.time() * 1000)
    base = now - 300_000
    pending = 0
    for i in range(5_000):
        roll = rng.random()
        early = 0.02 <= roll < 0.025  # due in a minute or two, delivered now
        due = now + rng.randint(60_000, 120_000) if early else base + rng.randint(0, 290_000)
        s = sc.schedule(f"m{i}", due, sc.targets[i % 2], due - rng.randint(0, 60_000))
        if roll < 0.01:
            continue  # missing
        if roll < 0.02:
            sc.cancel(s.id, due - 1_000)
            continue
        sc.deliver(s)
        if roll > 0.99:
            sc.deliver(s)
    for i in range(5):  # not due yet: pending, part of no verdict
        sc.schedule(f"later{i}", now + 600_000, sc.targets[0], now - 1_000)
        pending += 1
    sc.flush()
    end_ms = int(time.time() * 1000)
    report_path = tmp_path / "out" / "report.json"
    outcome = verify_once(spark, sc.config(end_ms=end_ms, window="30s"), Slo(), report_path)
    want = independent_report(sc, end_ms)
    assert_same_report(outcome.report, want)
    assert outcome.details["pending"] == pending
    assert outcome.details["unmatched_deliveries"] == 0
    assert sorted(outcome.details["topics"]) == sorted(sc.targets)
    windows = outcome.details["windows"]
    assert sum(w["scheduled"] for w in windows) == want["scheduled"]
    assert sum(w["duplicates"] for w in windows) == want["duplicates"]
    assert all(w["window_end_ms"] - w["window_start_ms"] == 30_000 for w in windows)
    for png in (
        report_path.parent / "report.lateness.png",
        report_path.parent / "report.histogram.png",
    ):
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 10_000


def test_topics_option_judges_only_messages_bound_for_those_topics(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    sc = build_faults(kafka.bootstrap_servers)
    end_ms = int(time.time() * 1000)
    both = verify_once(spark, sc.config(end_ms=end_ms), Slo(), None)
    first = verify_once(spark, sc.config(end_ms=end_ms, topics=sc.targets[0]), Slo(), None)
    # build_faults alternates targets: even ids go to targets[0] (f13 missing and f17
    # cancelled are odd, so targets[0] holds 10 messages, all delivered; f5 and f9 are odd too).
    assert both.report["scheduled"] == 19
    assert first.report["scheduled"] == 10
    assert first.report["missing"] == 0
    assert first.details["topics"] == [sc.targets[0]]


def test_slos_met_exit_zero_and_one_missed_slo_is_named(
    spark: Any, kafka: KafkaInfra, tmp_path: Path
) -> None:
    sc = build_faults(kafka.bootstrap_servers)
    cfg = sc.config()
    met = verify_once(spark, cfg, Slo(max_p99_ms=60_000, max_early=1, max_duplicates=1), None)
    assert met.exit_code == 0
    assert met.breaches == []
    early = verify_once(spark, cfg, Slo(max_early=0, max_p99_ms=60_000), None)
    assert early.exit_code == 1
    assert len(early.breaches) == 1
    assert "--max-early" in early.breaches[0]


def test_cli_once_in_a_subprocess_writes_report_and_charts_and_fails_on_missed_slos(
    kafka: KafkaInfra, tmp_path: Path
) -> None:
    sc = build_faults(kafka.bootstrap_servers)
    report = tmp_path / "cli" / "report.json"
    out_topic = unique_topic("vout")
    argv = [
        KDELAY,
        "verify",
        "--once",
        "--report",
        str(report),
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--buffer-topic",
        sc.buffer_topic,
        "--grace-ms",
        str(ONCE_GRACE_MS),
        "--output-topic",
        out_topic,
        "--output-dir",
        str(tmp_path / "cli-out"),
        "--max-p99-ms",
        "1",
        "--max-early",
        "0",
        "--max-missing",
        "5",
        "--isolation-level",
        "read_uncommitted",
    ]
    env = {**os.environ, "KDELAY_VERIFIER_LOG_LEVEL": "WARNING"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "--max-p99-ms" in proc.stderr
    assert "--max-early" in proc.stderr
    assert "--max-missing" not in proc.stderr
    got = json.loads(report.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == got
    assert got["isolation"] == "read_uncommitted"
    end_ms = json.loads(report.with_name("report.details.json").read_text())["end_ms"]
    assert_same_report(got, independent_report(sc, end_ms))
    for name in ("report.lateness.png", "report.histogram.png"):
        data = (report.parent / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 10_000
    windows = json.loads((tmp_path / "cli-out" / "windows" / "once.json").read_text())
    assert sum(w["scheduled"] for w in windows) == got["scheduled"]
    published = consume_until(
        kafka.bootstrap_servers, [out_topic], lambda r: len(r) >= len(windows)
    )
    assert sorted(json.loads(r.value or b"")["window_start_ms"] for r in published) == sorted(
        w["window_start_ms"] for w in windows
    )


@pytest.mark.parametrize(
    ("config", "clock"),
    [({"message.timestamp.type": "LogAppendTime"}, "log-append-time"), ({}, "receipt")],
)
def test_a_record_written_to_a_target_before_its_due_time_is_early_whatever_it_claims(
    spark: Any, kafka: KafkaInfra, tmp_path: Path, config: dict[str, str], clock: str
) -> None:
    sc, target = Scenario(kafka.bootstrap_servers, targets=[]), unique_topic("vraw")
    create_topic(sc.bootstrap, target, config=config)
    due = int(time.time() * 1000) + 60_000
    # No schedule, no proxy, no delay service: a record stamped as if released after its due
    # time (a master whose clock runs two minutes ahead).
    headers: HeaderList = [(h.ID, b"forged"), (h.DELIVER_AT, str(due).encode())]
    sc.producer.produce(target, b"v", headers=headers, timestamp=due + 60_000)
    sc.flush()
    outcome = verify_once(spark, sc.config(topics=target), Slo(max_early=0), tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["early"], report["clock"]) == (1, clock)
    assert (report["scheduled"], report["delivered"], report["duplicates"]) == (0, 0, 0)
    assert outcome.details["unmatched_deliveries"] == 1
    assert outcome.exit_code == 1


def test_a_message_is_its_id_and_due_time_so_a_reused_id_is_a_new_message(
    spark: Any, kafka: KafkaInfra
) -> None:
    sc = Scenario(kafka.bootstrap_servers)
    now, target = int(time.time() * 1000), sc.targets[0]
    sc.deliver(sc.schedule("reused", now - 30_000, target, now - 40_000, uid="a1"))
    second = sc.schedule("reused", now - 20_000, target, now - 35_000, uid="a2")
    sc.deliver(second)
    sc.deliver(second)  # the one duplicate: the same id and due time twice
    # A cancel after "again"'s first use has no say over its second, which is missing.
    sc.deliver(sc.schedule("again", now - 30_000, target, now - 40_000, uid="b1"))
    sc.cancel("again", now - 39_000)
    sc.schedule("again", now - 20_000, target, now - 38_000, uid="b2")
    sc.schedule("gone", now - 20_000, target, now - 40_000, uid="c1")
    sc.cancel("gone", now - 39_000)
    # A relative delay counts from the buffer record's timestamp; a later copy of the record
    # (same buffer key: a client's retried produce) is the same message.
    written = now - 30_000
    rel = sc.schedule("rel", written + 5_000, target, written, uid="d1", delay_ms=5_000)
    sc.write_buffer(rel, written + 2_000)
    sc.deliver(rel)
    # Format version 1 is still read: the record key is the id.
    v1 = {"v": 1, "op": "schedule", "t": target, "p": -1, "k": None, "d": now - 25_000, "n": False}
    route: HeaderList = [(buffer.ROUTE_HEADER, json.dumps(v1).encode())]
    sc.producer.produce(sc.buffer_topic, b"v", b"old", headers=route)
    sc.deliver(buffer.Scheduled("old", target, -1, None, b"v", now - 25_000))
    sc.flush()
    outcome = verify_once(spark, sc.config(end_ms=int(time.time() * 1000)), Slo(), None)
    counts = ("scheduled", "delivered", "missing", "duplicates", "early")
    assert [outcome.report[k] for k in counts] == [6, 5, 1, 1, 0]
    assert (outcome.details["cancelled"], outcome.details["unmatched_deliveries"]) == (1, 0)


def test_a_cancel_appended_before_a_message_sent_with_it_cancels_it(
    spark: Any, kafka: KafkaInfra
) -> None:
    """A message and its cancel sent together may reach the buffer cancel first (README
    "Cancelling a message"); the replicas cancel it on arrival, so it is cancelled, not missing.
    One a proxy accepted more than CANCEL_SENT_WITH_MS after the cancel's append, or appended
    beyond the window, is a new message. The independent oracle agrees."""
    sc = Scenario(kafka.bootstrap_servers)
    now, target = int(time.time() * 1000), sc.targets[0]
    sc.deliver(sc.schedule("kept", now - 25_000, target, now - 30_000))
    cancel_ms, window = now - 40_000, buffer.CANCEL_SENT_WITH_MS
    for msg_id, accepted_ms in (("with", cancel_ms + window), ("later", cancel_ms + window + 1)):
        sc.cancel(msg_id, cancel_ms)
        sc.schedule(
            msg_id, now - 20_000, target, cancel_ms + 5, seq=accepted_ms << buffer.ORDER_SHIFT
        )
    old_ms = now - 400_000
    sc.cancel("far", old_ms)
    appended = old_ms + buffer.CANCEL_WINDOW_MS + 1
    sc.schedule("far", now - 20_000, target, appended, seq=old_ms << buffer.ORDER_SHIFT)
    sc.flush()
    end_ms = int(time.time() * 1000)
    outcome = verify_once(spark, sc.config(end_ms=end_ms), Slo(), None)
    counts = ("scheduled", "delivered", "missing")
    assert [outcome.report[k] for k in counts] == [3, 1, 2]  # "later" and "far" are missing
    assert outcome.details["cancelled"] == 1
    assert_same_report(outcome.report, independent_report(sc, end_ms))


def test_a_bulk_cancel_cancels_the_prefix_it_names_on_its_topic_not_later_messages(
    spark: Any, kafka: KafkaInfra
) -> None:
    """A bulk cancel (route field ``px``, delay_service/store/bulk_cancels.py) cancels what it names
    that was accepted before it, in any buffer partition; the verifier counts those cancelled,
    not missing. Another prefix, another topic and a message accepted after it stay judged."""
    sc = Scenario(kafka.bootstrap_servers)
    now, (target, other) = int(time.time() * 1000), sc.targets
    bulk_ms = now - 40_000
    before = (bulk_ms - 1_000) << buffer.ORDER_SHIFT
    for i in range(6):  # ids spread over the buffer partitions
        sc.schedule(f"cust-42-{i}", now - 20_000, target, bulk_ms - 1_000, seq=before)
    sc.schedule("cust-42-elsewhere", now - 20_000, other, bulk_ms - 1_000, seq=before)
    sc.schedule("cust-43-0", now - 20_000, target, bulk_ms - 1_000, seq=before)
    after = (bulk_ms + buffer.CANCEL_SENT_WITH_MS + 1) << buffer.ORDER_SHIFT
    sc.schedule("cust-42-late", now - 20_000, target, bulk_ms + 200, seq=after)
    sc.write_buffer(buffer.Cancel("bulk.00ff", prefix="cust-42-", topic=target), bulk_ms)
    sc.flush()
    outcome = verify_once(spark, sc.config(end_ms=int(time.time() * 1000)), Slo(), None)
    # Judged: cust-42-elsewhere, cust-43-0 and cust-42-late, none delivered: missing.
    assert [outcome.report[k] for k in ("scheduled", "missing")] == [3, 3]
    assert outcome.details["cancelled"] == 6
