"""The stack the console tests drive a browser against: two real delay-service replicas (a
master and a follower) and a proxy that finds them in ZooKeeper (as
tests/integration/test_message_status.py), its HTTP API open, and a target topic of their own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dev.stack import wait_until
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import running_proxy
from tests.support.kafka_helpers import unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target

MIN = 60_000


@dataclass
class ConsoleStack:
    rs: ReplicaSet
    http: httpx.Client
    base: str
    bootstrap: str
    topic: str

    @property
    def ui(self) -> str:
        return self.base + "/ui/"

    def post(self, msg_id: str, due_ms: int, topic: str | None = None, **fields: Any) -> None:
        doc = {"topic": topic or self.topic, "value": "v", "id": msg_id, "deliver_at": due_ms}
        resp = self.http.post("/v1/messages", json={**doc, **fields})
        assert resp.status_code == 202, resp.text

    def status(self, msg_id: str) -> dict[str, Any]:
        resp = self.http.get(f"/v1/messages/{msg_id}")
        return dict(resp.json()) if resp.status_code == 200 else {}

    def wait_state(self, msg_id: str, state: str, timeout: float = 120.0) -> dict[str, Any]:
        wait_until(
            lambda: self.status(msg_id).get("state") == state,
            timeout=timeout,
            what=f"message {msg_id} to be {state} (last: {self.status(msg_id)})",
            interval=0.1,
        )
        return self.status(msg_id)

    def new_topic(self, prefix: str) -> str:
        topic = unique_topic(prefix)
        create_target(self.bootstrap, topic, partitions=2)
        return topic


def now_ms() -> int:
    return int(time.time() * 1000)


@contextlib.contextmanager
def console_stack(base: Path, bootstrap: str, zk_connect: str) -> Iterator[ConsoleStack]:
    topic = unique_topic("console")
    create_target(bootstrap, topic, partitions=2)
    with ReplicaSet(base, bootstrap, zk_connect, count=2, buffer_topic=BUFFER_TOPIC) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        rs.wait_roles(list(rs.replicas), {"master", "follower"}, timeout=90)
        cfg = loopback_config(bootstrap, zk_connect=zk_connect, zk_root=rs.root)
        with running_proxy(cfg) as proxy:
            assert proxy.addresses is not None
            url = proxy.addresses.http
            with httpx.Client(base_url=url, timeout=30) as http:
                yield ConsoleStack(rs, http, url, bootstrap, topic)
