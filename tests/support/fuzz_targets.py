"""The targets of the fuzzers: a ``kdelay proxy`` process, and ``kdelay up --secure``.

A fuzz module parametrizes its module-scoped ``proxy`` fixture over :data:`TARGETS` and enters
:func:`fuzz_target`, so the same tests run against both:

- ``proxy``: tests/support/fuzz.py's :func:`~tests.support.fuzz.secured_proxy` in front of a
  secured Kafka of tests/support/secure_kafka.py (SASL_PLAINTEXT listener).
- ``up-secure``: the whole stack as a user starts it (``kdelay up --secure --replicas 1``,
  tests/support/up.py): Kafka on SASL_SSL with ACLs, ZooKeeper with ACLs, the proxy's Kafka
  listener on SASL_SSL (the raw client speaks inside TLS, trusting the stack's CA), its HTTPS API
  with replicas behind it. The proxy's settings in :data:`~tests.support.fuzz.PROXY_ENV` reach it
  through ``kdelay up``'s environment; nothing else differs from what a user runs. Only
  :data:`UP_SECURE_SHARE` of each fuzzer's examples run against it (``make test`` time): the
  ``proxy`` target runs them all.

"Still alive" for ``up-secure`` is the proxy ``kdelay up`` started: ``kdelay up`` runs and has
not reported it exited (it would restart it).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.support.fuzz import PROXY_ENV, SecuredProxy, secured_proxy
from tests.support.kafka_helpers import unique_topic
from tests.support.secure_kafka import secured_kafka
from tests.support.up import UpProcess, add_user, admin_config, grant_write, kdelay_up, sasl_config

TARGETS = ("proxy", "up-secure")
#: The share of each fuzzer's examples run against ``kdelay up --secure``.
UP_SECURE_SHARE = 0.2
#: The mechanisms ``kdelay up --secure``'s Kafka enables (dev/stack/secure.py), so its proxy's.
UP_SECURE_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: What ``kdelay up`` logs when the proxy exited (dev/stack/restarts.py).
PROXY_EXITED = "kdelay: proxy exited"


class UpUsers:
    """:class:`~tests.support.fuzz.Users` of ``kdelay up --secure``'s Kafka, made by its super
    user from the state file."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.passwords: dict[str, str] = {}

    def password(self, user: str) -> str:
        if user not in self.passwords:
            self.passwords[user] = add_user(self.state, user)
        return self.passwords[user]

    def topic_for(self, user: str, prefix: str) -> str:
        self.password(user)
        topic = unique_topic(prefix)
        admin = AdminClient({"bootstrap.servers": self.state["kafka"], **admin_config(self.state)})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        grant_write(self.state, user, topic)
        return topic

    def grant(self, user: str, topic: str) -> None:
        self.password(user)
        grant_write(self.state, user, topic)

    def client(self, user: str) -> dict[str, Any]:
        return sasl_config(self.state, user, self.password(user))


def _tail(path: Path, chars: int = 4_000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} missing)"


@contextmanager
def up_secure(workdir: Path) -> Iterator[SecuredProxy]:
    """``kdelay up --secure`` as a fuzz target (see the module docstring)."""
    with kdelay_up(workdir, "--secure", "--replicas", "1", env=PROXY_ENV) as up:
        yield _target(up)
    assert up.exit_code == 0, up.process.log_tail()


def _target(up: UpProcess) -> SecuredProxy:
    state = up.state
    ca = Path(state["security"]["ca_file"])
    tls = ssl.create_default_context(cafile=str(ca))
    http = httpx.Client(verify=tls, timeout=30)
    proxy_log = up.workdir / "data" / "proxy.log"

    def alive() -> bool:
        return up.process.alive() and PROXY_EXITED not in up.log

    def log_tail() -> str:
        return f"--- proxy.log\n{_tail(proxy_log)}\n--- kdelay up\n{_tail(up.process.log_path)}"

    users = UpUsers(state)
    url = str(state["http"])
    kafka, share, mechanisms = str(state["proxy"]), UP_SECURE_SHARE, UP_SECURE_MECHANISMS
    return SecuredProxy(
        "up-secure", kafka, url, http, ca, users, alive, log_tail, tls, share, mechanisms
    )


@contextmanager
def fuzz_target(name: str, workdir: Path) -> Iterator[SecuredProxy]:
    """The target ``name`` of :data:`TARGETS`, its files under ``workdir``."""
    if name == "up-secure":
        with up_secure(workdir) as px:
            try:
                yield px
            finally:
                px.http.close()
        return
    assert name == "proxy", name
    with secured_kafka(workdir, "SASL_SSL") as sk, secured_proxy(sk, workdir / "proxy.log") as px:
        yield px
