"""``kdelay proxy --workers 2`` against real Kafka: two processes on one Kafka port and one HTTP
port, connections spread over both, metrics reported for both together, a SIGKILLed worker
restarted while an idempotent producer keeps sending (nothing acknowledged lost), and a clean
stop on SIGTERM that leaves no worker behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import KDELAY, wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC, Scheduled
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    Record,
    consume_until,
    create_topic,
    decode_buffer,
    unique_topic,
)

TIMEOUT_S = 60
_READY = re.compile(r"kdelay proxy ready kafka=(\S+) http=(\S+) workers=2")


@dataclass
class Workers:
    proc: subprocess.Popen[str]
    kafka: str
    http: str
    log: Path

    @property
    def port(self) -> int:
        return int(self.kafka.rpartition(":")[2])

    def pids(self) -> set[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return {int(p) for p in out.split()}

    def metric(self, line_prefix: str) -> float:
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=10) as resp:  # noqa: S310
            text = resp.read().decode()
        values = [
            float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_prefix)
        ]
        assert len(values) == 1, f"{line_prefix!r}: {values}"
        return values[0]


def _established(pid: int, port: int) -> int:
    """Client connections process ``pid`` holds on its listening ``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == port and cols[3] == "01" and cols[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


@pytest.fixture
def workers(kafka: KafkaInfra, tmp_path: Path) -> Iterator[Workers]:
    """``kdelay proxy --workers 2`` on ports it picks itself (0): the ready line names them."""
    log = tmp_path / "proxy.log"
    with log.open("w") as err, subprocess.Popen(
        [KDELAY, "proxy", "--workers", "2", "--listen", "127.0.0.1:0",
         "--http-listen", "127.0.0.1:0", "--bootstrap-servers", kafka.bootstrap_servers],
        stdout=subprocess.PIPE, stderr=err, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            m = _READY.match(line)
            assert m, f"{line!r}\n{log.read_text()}"
            running = Workers(proc, m.group(1), m.group(2), log)
            assert len(running.pids()) == 2
            yield running
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(TIMEOUT_S) == 0, log.read_text()  # a clean stop on SIGTERM
            assert not running.pids()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT_S)


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "reconnect.backoff.max.ms": 500,
        }
    )


def test_two_workers_share_the_ports_and_report_metrics_together(
    kafka: KafkaInfra, workers: Workers
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("px-workers")
    create_topic(bs, topic, partitions=3)
    producers: list[Producer] = []
    # Connections until each worker serves some: the kernel spreads them by a hash.
    while len(producers) < 40 and not all(
        _established(pid, workers.port) for pid in workers.pids()
    ):
        p = _producer(workers.kafka)
        p.list_topics(timeout=30)  # connects
        producers.append(p)
    served = {pid: _established(pid, workers.port) for pid in workers.pids()}
    assert all(served.values()), served
    for n, p in enumerate(producers):
        for i in range(100):
            delayed = i % 2 == 1
            hdrs: list[tuple[str, str | bytes | None]] = [(h.DELAY_MS, b"3600000")]
            p.produce(topic, f"{n}-{i}".encode(), headers=hdrs if delayed else [])
    for p in producers:
        assert p.flush(TIMEOUT_S) == 0
    sent = 100 * len(producers)
    immediate = {f"{n}-{i}".encode() for n in range(len(producers)) for i in range(0, 100, 2)}
    records = consume_until(
        bs, [topic], lambda rs: {r.value for r in rs} >= immediate, timeout=TIMEOUT_S
    )
    assert Counter(r.value for r in records) == Counter(immediate)  # each once, nothing else
    # Both workers' counts in one answer, from either worker.
    assert workers.metric('kdelay_proxy_records_total{kind="immediate"}') == sent / 2
    assert workers.metric('kdelay_proxy_records_total{kind="delayed"}') == sent / 2
    assert workers.metric("kdelay_proxy_connections") >= len(producers)
    want_buffered = {f"{n}-{i}".encode() for n in range(len(producers)) for i in range(1, 100, 2)}

    def ours(rs: list[Record]) -> list[bytes]:
        decoded = (decode_buffer(r) for r in rs)
        return [b.value or b"" for b in decoded if isinstance(b, Scheduled) and b.topic == topic]

    buffered = consume_until(
        bs, [BUFFER_TOPIC], lambda rs: set(ours(rs)) >= want_buffered, timeout=TIMEOUT_S
    )
    assert Counter(ours(buffered)) == Counter(want_buffered)


def test_a_killed_worker_is_restarted_and_nothing_acknowledged_is_lost(
    kafka: KafkaInfra, workers: Workers
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("px-workers-kill")
    create_topic(bs, topic, partitions=2)
    acked: set[bytes] = set()
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked.add(msg.value() or b"")
        else:
            failed.append(err.str())

    def send(n: int) -> None:
        p = _producer(workers.kafka)
        i = 0
        while not stop.is_set():
            p.produce(topic, f"{n}-{i}".encode(), on_delivery=on_delivery)
            p.poll(0.002)
            i += 1
        assert p.flush(TIMEOUT_S) == 0

    def wait_acks(more: int) -> None:
        floor = len(acked) + more
        wait_until(lambda: len(acked) >= floor, timeout=TIMEOUT_S, what=f"{more} more acks")

    senders = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for t in senders:
        t.start()
    try:
        for _ in range(2):
            victim = min(workers.pids())
            wait_acks(200)
            os.kill(victim, signal.SIGKILL)

            def replaced(gone: int = victim) -> bool:
                pids = workers.pids()
                return len(pids) == 2 and gone not in pids

            wait_until(replaced, timeout=TIMEOUT_S, what="the supervisor to restart the worker")
        wait_acks(200)
    finally:
        stop.set()
        for t in senders:
            t.join(TIMEOUT_S)
    assert not failed, failed[:5]
    records = consume_until(
        bs, [topic], lambda rs: {r.value for r in rs} >= acked, timeout=TIMEOUT_S
    )
    assert {r.value for r in records} >= acked  # every acknowledged record is there
    assert "proxy.worker_restarted" in workers.log.read_text()
    assert workers.metric('kdelay_proxy_records_total{kind="immediate"}') >= len(acked)


def test_a_taken_port_is_refused_naming_the_setting() -> None:
    """A port another process listens on (without SO_REUSEPORT): exit 2 and one line naming
    the setting, before any worker or upstream connection is started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [KDELAY, "proxy", "--workers", "2", "--listen", f"127.0.0.1:{port}",
             "--http-listen", "127.0.0.1:0", "--bootstrap-servers", "127.0.0.1:1"],
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"listen 127.0.0.1:{port}: the proxy workers cannot listen there" in result.stderr
