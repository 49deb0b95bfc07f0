"""The broker clock against real Kafka: the probe topic it creates, its estimate on a machine
whose clock is right, and a process whose wall clock runs 5 s ahead (Debian's faketime)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from dev.stack import wait_until
from kdelay.broker_clock import BrokerClock, Probe, ProbeWindow
from kdelay.delay_service.metrics import Metrics
from kdelay.errors import BrokerClockError
from kdelay.topics import CLOCK_TOPIC_CONFIG
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import create_topic, unique_topic

ROOT = Path(__file__).resolve().parents[2]

#: Run under faketime: a BrokerClock on the default topic, after a few probes, prints what it
#: measured and its own (faked) wall clock as one JSON line.
PROBE = """
import json, sys, threading, time
from kdelay.broker_clock import BrokerClock
from kdelay import logs
logs.configure("INFO")  # to stderr: stdout carries the one JSON line
clock = BrokerClock(sys.argv[1], interval_s=0.2)
clock.start()
if not clock.wait_ready(120):
    print(f"no probe succeeded: {clock.problem}", file=sys.stderr)
    sys.exit(1)
# A few more probes: the best bound of several. (time.sleep fails with EINVAL under
# libfaketime 0.9.10: its clock_nanosleep wrapper; an Event's timed wait works.)
threading.Event().wait(1.5)
wall = time.time_ns() // 1_000_000
skew, now = clock.skew_ms(), clock.now_ms()
print(json.dumps({"wall_ms": wall, "skew_ms": skew, "now_ms": now}), flush=True)
clock.close()
"""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CountingWindow(ProbeWindow):
    """The clock's probe window (its ``window`` argument), counting the probes added to it."""

    def __init__(self) -> None:
        super().__init__()
        self.added = 0

    def add(self, probe: Probe) -> bool:
        self.added += 1
        return super().add(probe)


def test_clock_topic_has_log_append_time_and_the_estimate_matches_the_machine(
    kafka: KafkaInfra,
) -> None:
    topic = unique_topic("clock")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    assert topic not in admin.list_topics(timeout=30).topics
    metrics = Metrics()
    window = CountingWindow()
    clock = BrokerClock(
        kafka.bootstrap_servers, topic=topic, interval_s=0.2, window=window, metrics=metrics
    )
    clock.start()
    try:
        assert clock.wait_ready(120), f"no probe succeeded: {clock.problem}"
        probes = window.added
        # Ten more probes: the best bound of several, on a busy machine.
        wait_until(lambda: window.added >= probes + 10, timeout=60, what="ten more probes")
        before = _now_ms()
        now = clock.now_ms()
        after = _now_ms()
        skew = clock.skew_ms()
        uncertainty = clock.uncertainty_ms()
        age = clock.last_probe_age_s()
    finally:
        clock.close()
    assert now is not None
    assert now <= after, "the estimate ran ahead of the broker's (this machine's) clock"
    assert before - now < 300, f"the estimate lags {before - now} ms"
    assert skew is not None
    assert abs(skew) < 300
    assert uncertainty is not None
    assert 0 < uncertainty < 1_000
    assert age is not None
    assert age < 1.5
    # The topic: created here, 1 partition, with the settings of CLOCK_TOPIC_CONFIG.
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    assert len(meta.partitions) == 1
    assert len(meta.partitions[0].replicas) == 1  # min(3, brokers) on one broker
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["message.timestamp.type"].value == "LogAppendTime"
    assert {k: config[k].value for k in CLOCK_TOPIC_CONFIG} == CLOCK_TOPIC_CONFIG
    value = metrics.registry.get_sample_value
    assert value("kdelay_clock_skew_seconds") is not None
    assert abs(value("kdelay_clock_skew_seconds") or 0.0) < 0.3
    assert 0 < (value("kdelay_clock_uncertainty_seconds") or 0.0) < 1.0


def test_a_clock_topic_without_log_append_time_is_reported_and_never_used(
    kafka: KafkaInfra,
) -> None:
    topic = unique_topic("clock-create-time")
    create_topic(kafka.bootstrap_servers, topic, config={"message.timestamp.type": "CreateTime"})
    metrics = Metrics()

    def failed_probes() -> float:
        return metrics.registry.get_sample_value("kdelay_clock_probe_failures_total") or 0.0

    clock = BrokerClock(kafka.bootstrap_servers, topic=topic, interval_s=0.2, metrics=metrics)
    clock.start()
    try:
        wait_until(lambda: clock.problem is not None, timeout=60, what="the problem reported")
        failures = failed_probes()
        wait_until(lambda: failed_probes() > failures, timeout=60, what="one more failed probe")
        now = clock.now_ms()
    finally:
        clock.close()
    assert now is None
    problem = clock.problem
    assert isinstance(problem, BrokerClockError)
    assert f"{topic} has message.timestamp.type=CreateTime" in str(problem)
    assert "LogAppendTime" in str(problem)
    assert (metrics.registry.get_sample_value("kdelay_clock_probe_failures_total") or 0) >= 1


def test_a_process_5s_ahead_measures_the_skew_and_stays_behind_the_broker(
    kafka: KafkaInfra,
) -> None:
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.fail("faketime is not installed: apt-get install faketime (this test needs it)")
    env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    started = _now_ms()
    proc = subprocess.Popen(
        [faketime, "-f", "+5s", sys.executable, "-c", PROBE, kafka.bootstrap_servers],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline() if ready else ""
        real_after = time.time() * 1000  # the real clock, after the line was printed
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-4000:]
    assert line, f"the probing process printed nothing: {stderr[-4000:]}"
    seen = json.loads(line)
    assert seen["wall_ms"] - started > 4_000, "faketime did not move the process's clock"
    assert 4_000 <= seen["skew_ms"] <= 6_000
    assert seen["now_ms"] <= real_after, (
        f"the estimate {seen['now_ms']} is ahead of the broker's clock ({real_after:.1f})"
    )
