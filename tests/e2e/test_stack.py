"""The whole stack as a user runs it: `kdelay up`, a Kafka producer, `kdelay verify --once`.

The verifier's report is checked against tests/support/oracle.py, which reads the same topics
independently. Fault injection: a duplicate, an early delivery and a message that can never be
delivered (its target partition does not exist, so it goes to the dead-letter topic).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from dev.stack.process import MARKER, ManagedProcess, python_argv, wait_until
from kdelay import buffer
from kdelay import headers as h
from tests.support import oracle
from tests.support.kafka_helpers import HeaderList, produce_all, unique_topic
from tests.support.schedule import create_target
from tests.support.up import kdelay_up

GRACE_MS = 3000


@dataclass
class Up:
    state: dict[str, Any]
    process: ManagedProcess
    workdir: Path

    @property
    def kafka(self) -> str:
        return str(self.state["kafka"])

    @property
    def proxy(self) -> str:
        return str(self.state["proxy"])


def _pids_with_marker(owner: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"{MARKER}={owner}" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with kdelay_up(tmp_path_factory.mktemp("up"), "--replicas", "3") as running:
        yield Up(running.state, running.process, running.workdir)
    # CONTRACT.md: SIGTERM stops every child; nothing is left running; the state file goes.
    assert running.exit_code == 0, running.process.log_tail()
    assert _pids_with_marker(running.process.pid) == []
    assert not running.state_file.exists()


def test_state_file_follows_the_contract(up: Up) -> None:
    state = up.state
    assert set(state) == {"proxy", "http", "kafka", "zookeeper", "replicas"}
    assert [r["name"] for r in state["replicas"]] == ["replica-1", "replica-2", "replica-3"]
    for replica in state["replicas"]:
        os.kill(replica["pid"], 0)  # alive
        with urllib.request.urlopen(f"{replica['metrics']}/metrics", timeout=5) as resp:  # noqa: S310
            assert b"kdelay_replica_pending_messages" in resp.read()
    with urllib.request.urlopen(f"{state['http']}/readyz", timeout=5) as resp:  # noqa: S310
        assert resp.status == 200
    status = subprocess.run(
        python_argv("status", "--zk-connect", str(state["zookeeper"]), "--json"),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc = json.loads(status.stdout)
    assert doc["master"] in {"replica-1", "replica-2", "replica-3"}
    assert sorted(r["name"] for r in doc["replicas"]) == ["replica-1", "replica-2", "replica-3"]


def _send_through_proxy(up: Up, topics: list[str], count: int, seed: int) -> list[str]:
    """``count`` delayed messages (0-3 s) with every timing header; returns their ids."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": up.proxy, "enable.idempotence": True, "linger.ms": 5})
    ids = []
    for i in range(count):
        msg_id = f"e2e-{seed}-{i}"
        now = int(time.time() * 1000)
        timing: tuple[str, bytes] = [
            (h.DELAY_MS, str(rng.randint(0, 3000)).encode()),
            (h.DELIVER_AT, str(now + rng.randint(-500, 3000)).encode()),
            (h.DELAY_LEVEL, b"1"),
        ][i % 3]
        producer.produce(
            topics[i % len(topics)],
            f"value-{i}".encode(),
            f"key-{i}".encode(),
            partition=i % 4,
            headers=[timing, (h.ID, msg_id.encode()), ("app", b"e2e")],
        )
        ids.append(msg_id)
    assert producer.flush(60) == 0
    return ids


def _verify(up: Up, topics: list[str], name: str, *slo: str) -> tuple[int, dict[str, Any], int]:
    report = up.workdir / f"{name}.json"
    end_ms = int(time.time() * 1000)
    result = subprocess.run(
        python_argv(
            "verify",
            "--once",
            "--bootstrap-servers",
            up.kafka,
            "--topics",
            ",".join(topics),
            "--grace-ms",
            str(GRACE_MS),
            "--end-ms",
            str(end_ms),
            "--output-dir",
            str(up.workdir / f"{name}-out"),
            "--report",
            str(report),
            *slo,
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert report.exists(), result.stderr[-3000:]
    return result.returncode, json.loads(report.read_text()), end_ms


def _assert_matches(report: dict[str, Any], truth: dict[str, Any]) -> None:
    for key in ("scheduled", "delivered", "missing", "duplicates", "early"):
        assert report[key] == truth[key], (key, report, truth)
    for key in ("p50", "p95", "p99", "max"):
        assert abs(report["lateness_ms"][key] - truth["lateness_ms"][key]) <= 1.0, (
            key,
            report,
            truth,
        )


def test_report_matches_an_independent_count(up: Up) -> None:
    topics = [unique_topic("e2e-a"), unique_topic("e2e-b")]
    for topic in topics:
        create_target(up.kafka, topic, partitions=4)
    ids = _send_through_proxy(up, topics, 1200, seed=1)
    wait_until(
        lambda: len(oracle.compute(up.kafka, topics, end_ms=0, grace_ms=0).deliveries) >= len(ids),
        timeout=120,
        what="every message to be delivered",
        interval=1.0,
    )
    code, report, end_ms = _verify(up, topics, "clean", "--max-missing", "0", "--max-early", "0")
    truth = oracle.compute(up.kafka, topics, end_ms=end_ms, grace_ms=GRACE_MS)
    _assert_matches(report, truth.report)
    assert report["scheduled"] == len(ids)
    assert report["missing"] == 0
    assert report["early"] == 0
    assert code == 0


def test_injected_faults_are_reported_exactly(up: Up) -> None:
    topic = unique_topic("e2e-faults")
    create_target(up.kafka, topic, partitions=4)
    ids = _send_through_proxy(up, [topic], 200, seed=2)
    wait_until(
        lambda: len(oracle.compute(up.kafka, [topic], end_ms=0, grace_ms=0).deliveries) >= len(ids),
        timeout=120,
        what="the clean messages to be delivered",
        interval=1.0,
    )
    truth = oracle.compute(up.kafka, [topic], end_ms=0, grace_ms=0)
    now = int(time.time() * 1000)

    # 1. a duplicate: a second copy of a delivered message on its topic.
    dup_id = ids[0]
    dup_headers: HeaderList = [
        (h.ID, dup_id.encode()),
        (h.DELIVER_AT, str(truth.due[dup_id]).encode()),
    ]
    produce_all(up.kafka, topic, [(b"key-0", b"value-0", dup_headers)])

    # 2. an early delivery: scheduled an hour ahead through the proxy, "delivered" now.
    early_id = f"early-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": up.proxy})
    producer.produce(
        topic, b"late-order", headers=[(h.DELAY_MS, b"3600000"), (h.ID, early_id.encode())]
    )
    assert producer.flush(30) == 0
    # Its due time counts from the buffer's append time: read it from the buffer.
    wait_until(
        lambda: early_id in oracle.compute(up.kafka, [topic], end_ms=0, grace_ms=0).due,
        timeout=60,
        what="the early message in the buffer topic",
    )
    early_due = oracle.compute(up.kafka, [topic], end_ms=0, grace_ms=0).due[early_id]
    early_headers: HeaderList = [
        (h.ID, early_id.encode()),
        (h.DELIVER_AT, str(early_due).encode()),
    ]
    produce_all(up.kafka, topic, [(None, b"late-order", early_headers)])

    # 3. a message that can never arrive: its target partition does not exist.
    lost = buffer.encode(
        buffer.Scheduled(
            id=f"lost-{uuid.uuid4().hex[:8]}",
            topic=topic,
            partition=99,
            key=None,
            value=b"nowhere",
            deliver_at_ms=now - 60_000,
        )
    )
    produce_all(up.kafka, buffer.BUFFER_TOPIC, [(lost.key, lost.value, list(lost.headers))])

    code, report, end_ms = _verify(up, [topic], "faults", "--max-early", "0")
    truth = oracle.compute(up.kafka, [topic], end_ms=end_ms, grace_ms=GRACE_MS)
    _assert_matches(report, truth.report)
    assert report["duplicates"] == 1
    assert report["early"] == 1
    assert report["missing"] == 1
    assert report["scheduled"] == len(ids) + 2
    assert code != 0  # --max-early 0 is breached


def test_http_api_schedules_and_cancels_through_the_whole_stack(up: Up) -> None:
    topic = unique_topic("e2e-http")
    create_target(up.kafka, topic, partitions=2)
    api = str(up.state["http"])
    with httpx.Client(base_url=api, timeout=30) as http:

        def post(msg_id: str, delay_ms: int) -> dict[str, Any]:
            body = {"topic": topic, "partition": 1, "key": msg_id, "value": msg_id}
            resp = http.post("/v1/messages", json={**body, "delay_ms": delay_ms, "id": msg_id})
            assert resp.status_code == 202, resp.text
            doc: dict[str, Any] = resp.json()
            assert doc["id"] == msg_id
            return doc

        kept = post("http-kept", 500)
        post("http-cancelled", 1500)
        sentinel = post("http-sentinel", 2500)
        resp = http.delete("/v1/messages/http-cancelled")
        assert resp.status_code == 202, resp.text
        bad = http.post("/v1/messages", json={"topic": topic, "value": "x"})
        assert bad.status_code == 400
        assert "delay_ms" in bad.json()["error"]

    # One partition delivers in due order: once the sentinel (due last) is out, the cancelled
    # message (due earlier) would have been out before it, had the cancel not worked.
    wait_until(
        lambda: any(r.header(h.ID) == b"http-sentinel" for r in oracle.read_all(up.kafka, [topic])),
        timeout=60,
        what="the sentinel to be delivered",
    )
    records = oracle.read_all(up.kafka, [topic])
    assert [r.header(h.ID) for r in records] == [b"http-kept", b"http-sentinel"]
    by_id = {r.header(h.ID): r for r in records}
    for doc in (kept, sentinel):
        record = by_id[doc["id"].encode()]
        assert record.partition == 1
        assert record.value == doc["id"].encode()
        assert record.timestamp_ms >= doc["deliver_at"]
