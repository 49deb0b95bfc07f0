"""A real Prometheus (Debian's package) scrapes a live `kdelay up` stack under a small load.

Then every dashboard panel query returns data through Prometheus' HTTP API, and
`promtool check metrics` accepts every component's /metrics. Loopback only; every wait is a
condition with a deadline. `kdelay up` runs no verifier, so a continuous `kdelay verify` is
started beside it and scraped too: every panel, the verifier's included, must return data.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.deploy_tools import (
    ROOT,
    Tools,
    dashboard_exprs,
    run,
)

MESSAGES = 300
#: A topic the live stack's replicas limit to 100 releases a second, and its burst.
THROTTLED = "deploy-live-throttled"
THROTTLED_MESSAGES = 300
RATE_WINDOW = "1m"  # stands in for Grafana's $__rate_interval


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)  # sleep: the poll interval of a wait with a deadline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback URL
        body: bytes = response.read()
        return body.decode()


def _http_ok(url: str) -> bool:
    try:
        _http_get(url, timeout=2.0)
    except OSError:
        return False
    return True


@dataclass
class Stack:
    process: subprocess.Popen[str]
    state: dict[str, Any]
    output: list[str]

    @property
    def targets(self) -> dict[str, list[str]]:
        http = urllib.parse.urlparse(self.state["http"]).netloc
        replicas = [urllib.parse.urlparse(r["metrics"]).netloc for r in self.state["replicas"]]
        return {"kdelay-proxy": [http], "kdelay-delay-service": replicas}

    def metrics_urls(self) -> list[str]:
        return [f"{self.state['http']}/metrics"] + [
            f"{r['metrics']}/metrics" for r in self.state["replicas"]
        ]


def _stop(process: subprocess.Popen[str], timeout: float = 120) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
        raise


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("deploy-live")
    state_file = base / "up.json"
    process = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "kdelay"),
            "up",
            "--state-file",
            str(state_file),
            "--data-dir",
            str(base / "data"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The replicas (kdelay up's children) throttle one topic: the smoothing panels' data.
        env={**os.environ, "KDELAY_REPLICA_RELEASE_RATE_LIMITS": json.dumps({THROTTLED: 100})},
    )
    output: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip())
            if line.strip() == "kdelay ready":
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    served = False
    try:
        wait_for(
            "`kdelay up` to print `kdelay ready`",
            lambda: ready.is_set() or process.poll() is not None,
            timeout=300,
        )
        if not ready.is_set():
            pytest.fail("kdelay up exited before ready:\n" + "\n".join(output[-40:]))
        served = True
        yield Stack(process, json.loads(state_file.read_text()), output)
    finally:
        code = _stop(process)
        reader.join(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert not served or code == 0, "kdelay up did not stop cleanly:\n" + "\n".join(output[-40:])


@pytest.fixture(scope="module")
def verifier_metrics(live_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A continuous `kdelay verify` over the live stack's topics; yields its /metrics host:port."""
    base = tmp_path_factory.mktemp("verifier")
    port = _free_port()
    log = (base / "verify.log").open("w")
    process = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "kdelay"),
            "verify",
            "--bootstrap-servers",
            live_stack.state["kafka"],
            "--topics",
            "deploy-live",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--output-topic",
            "",
            "--no-console",
            "--output-dir",
            str(base / "out"),
            "--checkpoint-dir",
            str(base / "checkpoint"),
            "--trigger",
            "1s",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            "the verifier's /metrics",
            lambda: process.poll() is None and _http_ok(f"http://127.0.0.1:{port}/metrics"),
            timeout=180,
        )
        yield f"127.0.0.1:{port}"
    finally:
        code = _stop(process, timeout=60)
        log.close()
    assert code == 0, (base / "verify.log").read_text()[-3000:]


@dataclass
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        qs = urllib.parse.urlencode({"query": expr})
        body = json.loads(_http_get(f"{self.url}/api/v1/query?{qs}"))
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


@pytest.fixture(scope="module")
def prometheus(
    tools: Tools,
    live_stack: Stack,
    verifier_metrics: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    base = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "rules.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": targets}]}
            for job, targets in {
                **live_stack.targets,
                "kdelay-verifier": [verifier_metrics],
            }.items()
        ],
    }
    (base / "prometheus.yml").write_text(json.dumps(config))
    port = _free_port()
    log = (base / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            str(tools.prometheus),
            f"--config.file={base / 'prometheus.yml'}",
            f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.console.templates=",
            "--web.console.libraries=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("Prometheus to be ready", lambda: _http_ok(f"{url}/-/ready"), timeout=60)
        yield Prometheus(url)
    finally:
        _stop(process, timeout=60)
        log.close()


def _produce_load(stack: Stack) -> None:
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": stack.state["proxy"], "linger.ms": 5})
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(MESSAGES):
        headers: list[tuple[str, str | bytes | None]] = [
            ("kdelay-delay-ms", str(200 + (i % 20) * 100).encode())
        ]
        producer.produce("deploy-live", value=f"m{i}".encode(), headers=headers, on_delivery=report)
    due = str(int(time.time() * 1000) + 1_500).encode()
    for i in range(THROTTLED_MESSAGES):  # due together, released at 100/s: smoothed
        producer.produce(
            THROTTLED, value=f"t{i}".encode(), headers=[("kdelay-deliver-at", due)],
            on_delivery=report,
        )  # fmt: skip
    producer.produce("deploy-live", value=b"now")  # immediate: passes straight through
    assert producer.flush(60) == 0
    assert not errors, errors[:5]

    # One rejected batch (two delay headers) feeds the proxy's "rejected" series.
    rejected: list[str] = []
    bad = Producer({"bootstrap.servers": stack.state["proxy"], "retries": 0})
    bad.produce(
        "deploy-live",
        value=b"bad",
        headers=[("kdelay-delay-ms", b"1000"), ("kdelay-delay-level", b"2")],
        on_delivery=lambda err, _m: rejected.append(str(err)) if err else None,
    )
    with contextlib.suppress(KafkaException):
        bad.flush(30)
    assert rejected, "the proxy accepted a record with two delay headers"

    for path in ("/healthz", "/readyz"):
        assert _http_ok(f"{stack.state['http']}{path}")


def _panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) for every panel target, the verifier's included."""
    out = []
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        for title, expr in dashboard_exprs(path):
            out.append((path.stem, title, expr.replace("$__rate_interval", RATE_WINDOW)))
    assert any("kdelay_verifier_" in e for _, _, e in out)
    return out


def test_every_dashboard_query_returns_data(live_stack: Stack, prometheus: Prometheus) -> None:
    _produce_load(live_stack)
    wait_for(
        f"Prometheus to see {MESSAGES} forwarded messages",
        lambda: any(
            float(s["value"][1]) >= MESSAGES
            for s in prometheus.query("sum(kdelay_replica_forwarded_total)")
        ),
        timeout=180,
    )
    queries = _panel_queries()
    assert len(queries) >= 20
    empty: list[str] = []

    def all_have_data() -> bool:
        empty.clear()
        empty.extend(f"{d} / {t}: {e}" for d, t, e in queries if not prometheus.query(e))
        return not empty

    deadline = time.monotonic() + 60
    while not all_have_data() and time.monotonic() < deadline:
        time.sleep(0.25)  # sleep: the poll interval of a wait with a deadline
    assert not empty, "panel queries without data after 60 s:\n" + "\n".join(empty)


def test_promtool_accepts_every_metrics_endpoint(
    tools: Tools, live_stack: Stack, verifier_metrics: str
) -> None:
    for url in [*live_stack.metrics_urls(), f"http://{verifier_metrics}/metrics"]:
        body = _http_get(url)
        assert "kdelay_" in body, url
        result = run([tools.promtool, "check", "metrics"], stdin=body)
        assert result.returncode == 0, f"{url}:\n{result.stdout}{result.stderr}"


def test_prometheus_loaded_the_rules(prometheus: Prometheus) -> None:
    body = json.loads(_http_get(f"{prometheus.url}/api/v1/rules"))
    names = {r["name"] for g in body["data"]["groups"] for r in g["rules"]}
    assert {"KdelayNoMaster", "kdelay:replica_lateness_seconds:p99_rate5m"} <= names
    wait_for(
        "every rule to be evaluated",
        lambda: all(
            r["health"] == "ok"
            for g in json.loads(_http_get(f"{prometheus.url}/api/v1/rules"))["data"]["groups"]
            for r in g["rules"]
        ),
        timeout=30,
    )
