"""The real ``kdelay proxy``, ``kdelay send`` and ``kdelay cancel`` commands as subprocesses,
against real Kafka: what a user types, what they see, and what lands in the buffer topic.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from dev.stack import KDELAY, free_port
from kdelay import buffer
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import (
    about,
    consume_until,
    create_topic,
    unique_topic,
)

TIMEOUT_S = 60


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KDELAY, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _ready_line(proc: subprocess.Popen[str], deadline_s: float) -> str:
    """The first stdout line of ``proc``, or an error with its stderr when it ends first."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if line:
                return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"kdelay proxy did not report ready (exit {proc.poll()})")


@pytest.fixture(scope="module")
def proxy(kafka: KafkaInfra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("cli") / "proxy.log"
    with log.open("w") as err, subprocess.Popen(
        [KDELAY, "proxy", "--listen", f"127.0.0.1:{port}",
         "--http-listen", f"127.0.0.1:{free_port()}",
         "--bootstrap-servers", kafka.bootstrap_servers, "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=err, text=True,
    ) as proc:  # fmt: skip
        try:
            assert "kdelay proxy ready" in _ready_line(proc, TIMEOUT_S), log.read_text()
            yield f"127.0.0.1:{port}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(TIMEOUT_S) == 0, log.read_text()  # a clean stop on SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT_S)


def _buffered(bootstrap: str, msg_id: str) -> buffer.BufferRecord:
    records = consume_until(bootstrap, [buffer.BUFFER_TOPIC], lambda rs: bool(about(rs, msg_id)))
    (record,) = about(records, msg_id)
    return record


@pytest.fixture(scope="module")
def topic(kafka: KafkaInfra) -> str:
    name = unique_topic("px-cli")
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    return name


TIMINGS = [
    pytest.param(["--delay", "30s"], 30_000, id="delay"),
    pytest.param(["--level", "2"], 5_000, id="level"),
    pytest.param(["--at", "AT"], 3_600_000, id="at-rfc3339"),
]


@pytest.mark.parametrize(("timing", "ahead_ms"), TIMINGS)
def test_send_prints_the_id_and_buffers_the_record(
    kafka: KafkaInfra, proxy: str, topic: str, timing: list[str], ahead_ms: int
) -> None:
    before = int(time.time() * 1000)
    at = datetime.now(UTC) + timedelta(milliseconds=ahead_ms)
    timing = [at.isoformat() if t == "AT" else t for t in timing]
    result = _run("send", "--bootstrap-servers", proxy, "--topic", topic, "--key", "k1",
                  *timing, "hello")  # fmt: skip
    after = int(time.time() * 1000)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["delayed"] is True
    assert out["id"]
    scheduled = _buffered(kafka.bootstrap_servers, out["id"])
    assert isinstance(scheduled, buffer.Scheduled)
    assert (scheduled.topic, scheduled.partition) == (topic, out["partition"])
    assert (scheduled.key, scheduled.value, scheduled.headers) == (b"k1", b"hello", ())
    assert before + ahead_ms - 1 <= scheduled.deliver_at_ms <= after + ahead_ms + 1


def test_send_without_timing_goes_straight_through(
    kafka: KafkaInfra, proxy: str, topic: str
) -> None:
    value = uuid.uuid4().hex
    result = _run("send", "--bootstrap-servers", proxy, "--topic", topic, value)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["delayed"], out["id"]) == (False, None)
    records = consume_until(
        kafka.bootstrap_servers, [topic], lambda rs: any(r.value == value.encode() for r in rs)
    )
    (record,) = [r for r in records if r.value == value.encode()]
    assert (record.partition, record.offset) == (out["partition"], out["offset"])


def test_cancel_writes_a_cancel_for_that_id(kafka: KafkaInfra, proxy: str) -> None:
    msg_id = f"cli-{uuid.uuid4().hex}"
    result = _run("cancel", "--bootstrap-servers", proxy, msg_id)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"id": msg_id, "cancel": "accepted"}
    cancel = _buffered(kafka.bootstrap_servers, msg_id)
    assert isinstance(cancel, buffer.Cancel)
    assert cancel.id == msg_id


BAD_SEND = [
    pytest.param(["--delay", "5parsecs"], ["--delay", "5parsecs"], id="bad-duration"),
    pytest.param(["--delay", "5s", "--level", "2"], ["--delay", "--level"], id="two-timings"),
    pytest.param(["--at", "next tuesday"], ["--at"], id="bad-at"),
    pytest.param(["--level", "0"], ["--level"], id="level-zero"),
    pytest.param(["--delay", "1s", "--id", "x" * 256], ["--id", "255"], id="id-too-long"),
]


@pytest.mark.parametrize(("flags", "named"), BAD_SEND)
def test_bad_send_flags_name_the_flag(flags: list[str], named: list[str]) -> None:
    # No proxy needed: the command must refuse before it connects anywhere.
    result = _run("send", "--bootstrap-servers", "127.0.0.1:9", "--topic", "t", *flags, "v")
    assert result.returncode != 0
    assert result.stdout == ""
    for text in named:
        assert text in result.stderr


def test_bad_cancel_id_names_the_argument() -> None:
    result = _run("cancel", "--bootstrap-servers", "127.0.0.1:9", "x" * 256)
    assert result.returncode != 0
    assert "MESSAGE_ID" in result.stderr


BAD_PROXY = [
    pytest.param(["--listen", "nonsense"], {}, ["'listen'", "--listen", "nonsense"], id="listen"),
    pytest.param(
        [],
        {"KDELAY_PROXY_MAX_REQUEST_BYTES": "-1"},
        ["'max_request_bytes'", "KDELAY_PROXY_MAX_REQUEST_BYTES"],
        id="env-max-request-bytes",
    ),
    pytest.param(
        ["--max-decompressed-bytes", "10"], {}, ["'max_decompressed_bytes'"], id="decompressed"
    ),
]


@pytest.mark.parametrize(("flags", "env", "named"), BAD_PROXY)
def test_proxy_refuses_invalid_settings(
    flags: list[str], env: dict[str, str], named: list[str]
) -> None:
    result = _run("proxy", "--bootstrap-servers", "127.0.0.1:9", *flags, env=env)
    assert result.returncode != 0
    assert "invalid configuration" in result.stderr
    for text in named:
        assert text in result.stderr
