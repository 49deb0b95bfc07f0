"""A secured ``kdelay proxy`` process for the fuzzers, and what they check.

:func:`secured_proxy` starts ``kdelay proxy`` as a process (so "still alive" means the process,
not a task) in front of a secured Kafka (tests/support/secure_kafka.py): its Kafka listener
requires SASL (SASL_PLAINTEXT, so a fuzzer can send exactly the bytes it generated), its HTTP
API is HTTPS with ``http_auth=kafka``. The failed-login backoff is kept to a millisecond or two:
the fuzzers fail hundreds of logins from 127.0.0.1 and test what the proxy answers, not how long
it waits (tests/integration/test_proxy_sasl_hostile.py tests the backoff).

:func:`series` reads ``/metrics`` into its series, so a fuzzer can check that what it sent never
became a label value (proxy/metric_labels.py).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from dev.stack import KDELAY, ManagedProcess, free_port, wait_until
from kdelay.topics import ensure_clock_topic
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.proxies import wait_accepting
from tests.support.secure_kafka import SecureKafka

#: Multiplies every fuzzer's example count: 1 in ``make test``; a deep run sets
#: ``KDELAY_FUZZ_SCALE=20`` (still seeded, so still deterministic).
SCALE = int(os.environ.get("KDELAY_FUZZ_SCALE", "1"))
#: The proxy's login deadline (``sasl_authentication_timeout_ms``) in the fuzzers.
LOGIN_DEADLINE_MS = 2_000
#: The proxy's largest request before login (``sasl_max_receive_bytes``, its default).
SASL_MAX_RECEIVE = 65_536


@dataclass
class SecuredProxy:
    """A running ``kdelay proxy`` process: its Kafka listener, HTTPS API, a client of it and the
    CA its certificate is signed by."""

    kafka: str
    url: str
    http: httpx.Client
    proc: ManagedProcess
    ca: Path

    def metrics(self) -> str:
        resp = self.http.get(f"{self.url}/metrics")
        assert resp.status_code == 200, resp.text
        return resp.text


@contextmanager
def secured_proxy(secure: SecureKafka, log: Path) -> Iterator[SecuredProxy]:
    """``kdelay proxy`` with SASL on its Kafka listener and an authenticated HTTPS API."""
    ca = secure.local.ca
    assert ca is not None, "the HTTPS API needs the secured Kafka's CA (SASL_SSL)"
    port, http = free_port(), free_port()
    upstream = {k: str(v) for k, v in secure.client("kdelay").items()}
    # The probe topic first, with LogAppendTime, as the proxy would create it: once in CI the
    # proxy found __kdelay_clock already there with CreateTime on this fresh cluster (cause not
    # found; see the closing note of 2026-12-07), and a fuzzer's module then met 503s only.
    admin = AdminClient({"bootstrap.servers": secure.secure, **secure.client("kdelay")})
    ensure_clock_topic(admin, timeout=30.0)
    env = {
        **os.environ,
        "KDELAY_PROXY_UPSTREAM_CONFIG": json.dumps(upstream),
        "KDELAY_PROXY_LISTENER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KDELAY_PROXY_SASL_AUTHENTICATION_TIMEOUT_MS": str(LOGIN_DEADLINE_MS),
        "KDELAY_PROXY_SASL_MAX_RECEIVE_BYTES": str(SASL_MAX_RECEIVE),
        "KDELAY_PROXY_AUTH_FAILURE_DELAY_MS": "1",
        "KDELAY_PROXY_AUTH_FAILURE_MAX_DELAY_MS": "2",
    }
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
        "--bootstrap-servers", secure.secure, "--buffer-partitions", "3",
        "--http-auth", "kafka", "--http-tls-cert", str(ca.server_cert),
        "--http-tls-key", str(ca.server_key),
    ]  # fmt: skip
    proc = ManagedProcess("proxy", argv, log, env=env)
    client = httpx.Client(verify=ssl.create_default_context(cafile=str(ca.ca_cert)), timeout=30)
    url = f"https://127.0.0.1:{http}"

    def healthy() -> bool:
        try:
            return client.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    proc.start()
    try:
        wait_until(healthy, timeout=90, what="the proxy's HTTPS API", interval=0.25, proc=proc)
        wait_accepting(port)
        yield SecuredProxy(f"127.0.0.1:{port}", url, client, proc, ca.ca_cert)
    finally:
        client.close()
        proc.stop()


def produce_as(secure: SecureKafka, px: SecuredProxy, user: str) -> None:
    """One record through the proxy's Kafka listener as ``user`` (SCRAM-SHA-512), allowed to
    write its topic; fails unless acknowledged within a generous wait."""
    topic = unique_topic("fuzz")
    create_topic(secure.plain, topic)
    secure.grant(user, topic)
    conf = secure.client(user, "SCRAM-SHA-512", **{"security.protocol": "SASL_PLAINTEXT"})
    conf.pop("ssl.ca.location", None)
    producer = Producer({"bootstrap.servers": px.kafka, **conf, "linger.ms": 0})
    producer.produce(topic, b"still served")
    assert producer.flush(60) == 0, f"{user}'s record was not acknowledged after the fuzzing"


def series(exposition: str, *names: str) -> dict[str, list[dict[str, str]]]:
    """The label sets of each metric of ``names`` in a Prometheus text ``exposition``."""
    found: dict[str, list[dict[str, str]]] = {name: [] for name in names}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name].append(dict(sample.labels))
    return found


def basic(user: str, password: str) -> str:
    """An HTTP Basic ``Authorization`` value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def describe(resp: httpx.Response) -> dict[str, Any]:
    """A response in a failure message: enough to replay what the fuzzer found."""
    req = resp.request
    return {
        "request": f"{req.method} {req.url}",
        "body": req.content[:500],
        "status": resp.status_code,
        "answer": resp.text[:500],
    }
