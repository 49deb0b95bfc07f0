"""The secured proxies the fuzzers attack, and what they check.

The fuzzers run the same tests against two targets (:data:`tests.support.fuzz_targets.TARGETS`):

- ``proxy``: :func:`secured_proxy` starts ``kdelay proxy`` as a process (so "still alive" means
  the process, not a task) in front of a secured Kafka (tests/support/secure_kafka.py): its Kafka
  listener requires SASL (SASL_PLAINTEXT, so a fuzzer can send exactly the bytes it generated),
  its HTTP API is HTTPS with ``http_auth=kafka``.
- ``up-secure``: the whole stack as a user starts it, ``kdelay up --secure``
  (tests/support/fuzz_targets.py): the proxy's Kafka listener on SASL_SSL (the raw client speaks
  inside TLS), replicas behind the HTTP API.

Either way the failed-login backoff is kept to a millisecond or two: the fuzzers fail hundreds of
logins from 127.0.0.1 and test what the proxy answers, not how long it waits
(tests/integration/test_proxy_sasl_hostile.py tests the backoff). :class:`SecuredProxy` is what
a test sees of either; :class:`Users` makes the SCRAM users its "still serving" checks log in as.

:func:`series` reads ``/metrics`` into its series, so a fuzzer can check that what it sent never
became a label value (proxy/metric_labels.py).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from dev.stack import KDELAY, ManagedProcess, free_port, wait_until
from kdelay.topics import ensure_clock_topic
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.proxies import wait_accepting
from tests.support.raw_client import RawClient
from tests.support.secure_kafka import MECHANISMS, SecureKafka

#: Multiplies every fuzzer's example count: 1 in ``make test``; a deep run sets
#: ``KDELAY_FUZZ_SCALE=20`` (still seeded, so still deterministic).
SCALE = int(os.environ.get("KDELAY_FUZZ_SCALE", "1"))
#: The proxy's login deadline (``sasl_authentication_timeout_ms``) in the fuzzers.
LOGIN_DEADLINE_MS = 2_000
#: The proxy's largest request before login (``sasl_max_receive_bytes``, its default).
SASL_MAX_RECEIVE = 65_536
#: The proxy's settings in the fuzzers, by environment (``kdelay up`` passes it to the proxy).
PROXY_ENV = {
    "KDELAY_PROXY_SASL_AUTHENTICATION_TIMEOUT_MS": str(LOGIN_DEADLINE_MS),
    "KDELAY_PROXY_SASL_MAX_RECEIVE_BYTES": str(SASL_MAX_RECEIVE),
    "KDELAY_PROXY_AUTH_FAILURE_DELAY_MS": "1",
    "KDELAY_PROXY_AUTH_FAILURE_MAX_DELAY_MS": "2",
}


class Users(Protocol):
    """The SCRAM users of a target's Kafka, for the checks that a fuzzed proxy still serves."""

    def password(self, user: str) -> str:
        """``user``'s password (SCRAM-SHA-512), the user made first if need be."""
        ...

    def topic_for(self, user: str, prefix: str) -> str:
        """A new topic ``user`` may write (and describe)."""
        ...

    def grant(self, user: str, topic: str) -> None:
        """Allow ``user`` to write (and describe) ``topic`` too."""
        ...

    def client(self, user: str) -> dict[str, Any]:
        """A librdkafka configuration logging in to the proxy's Kafka listener as ``user``."""
        ...


class KafkaUsers:
    """:class:`Users` of a secured Kafka of tests/support/secure_kafka.py (a proxy on
    SASL_PLAINTEXT in front of it)."""

    def __init__(self, secure: SecureKafka) -> None:
        self.secure = secure

    def password(self, user: str) -> str:
        return self.secure.password(user)

    def topic_for(self, user: str, prefix: str) -> str:
        topic = unique_topic(prefix)
        create_topic(self.secure.plain, topic)
        self.secure.grant(user, topic)
        return topic

    def grant(self, user: str, topic: str) -> None:
        self.secure.grant(user, topic)

    def client(self, user: str) -> dict[str, Any]:
        conf = self.secure.client(user, "SCRAM-SHA-512", **{"security.protocol": "SASL_PLAINTEXT"})
        conf.pop("ssl.ca.location", None)
        return conf


@dataclass
class SecuredProxy:
    """A running secured proxy: its Kafka listener (in TLS when ``tls`` is set), HTTPS API, a
    client of it, the CA its certificate is signed by, its Kafka's users, whether its process
    still runs (and its log's tail), the share of each fuzzer's examples run against it and the
    SASL mechanisms it offers."""

    name: str
    kafka: str
    url: str
    http: httpx.Client
    ca: Path
    users: Users
    alive: Callable[[], bool]
    log_tail: Callable[[], str]
    tls: ssl.SSLContext | None = None
    share: float = 1.0
    #: The SASL mechanisms its Kafka listener offers (those its Kafka enables).
    mechanisms: tuple[str, ...] = MECHANISMS

    def metrics(self) -> str:
        resp = self.http.get(f"{self.url}/metrics")
        assert resp.status_code == 200, resp.text
        return resp.text

    def raw(self, timeout: float, *, source: str | None = None, tls: bool = True) -> RawClient:
        """A raw Kafka-protocol connection to the proxy's Kafka listener (from ``source``; one
        that never starts the listener's TLS if not ``tls``)."""
        return RawClient(self.kafka, timeout=timeout, tls=self.tls if tls else None, source=source)

    def examples(self, count: int, minimum: int = 1) -> int:
        """A fuzzer's ``count`` examples scaled to this target's share (at least ``minimum``:
        the first of Hypothesis' examples are its simplest)."""
        return max(min(minimum, count), round(count * self.share))

    def basic(self, user: str) -> str:
        """HTTP Basic credentials of ``user``."""
        return basic(user, self.users.password(user))


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
        **PROXY_ENV,
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
        users = KafkaUsers(secure)
        kafka = f"127.0.0.1:{port}"
        yield SecuredProxy(
            "proxy", kafka, url, client, ca.ca_cert, users, proc.alive, proc.log_tail
        )
    finally:
        client.close()
        proc.stop()


def produce_as(px: SecuredProxy, user: str, topic: str | None = None) -> None:
    """One record through the proxy's Kafka listener as ``user`` (SCRAM-SHA-512), allowed to
    write ``topic`` (else a new one); fails unless acknowledged within a generous wait."""
    topic = topic or px.users.topic_for(user, "fuzz")
    producer = Producer({"bootstrap.servers": px.kafka, **px.users.client(user), "linger.ms": 0})
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
