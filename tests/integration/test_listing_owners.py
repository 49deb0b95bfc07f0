"""The listing shows a principal its own messages only, an administrator everyone's (CONTRACT.md
v3 "Listing" and "Security"), on a real Kafka with SCRAM users and ACLs (tests/support/
secure_kafka.py): alice and bob schedule messages over HTTP (``http_auth=kafka``, HTTP Basic
checked against Kafka), carol holds ALTER on the buffer topic (a kdelay administrator).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dev.stack import wait_until
from kdelay import buffer
from proxy import running_proxy
from proxy.app import Proxy
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import SecureKafka, secured_kafka


@dataclass
class Stack:
    secure: SecureKafka
    proxy: Proxy
    topic: str

    @property
    def http(self) -> str:
        assert self.proxy.addresses is not None
        return self.proxy.addresses.http

    def auth(self, user: str) -> dict[str, str]:
        pair = f"{user}:{self.secure.password(user)}".encode()
        return {"authorization": "Basic " + base64.b64encode(pair).decode()}

    def listing(self, user: str, **params: Any) -> list[str]:
        """Every id ``user`` is listed, following ``next``, 3 a page."""
        ids: list[str] = []
        params = {"limit": "3", **params}
        while True:
            resp = httpx.get(
                f"{self.http}/v1/messages", params=params, headers=self.auth(user), timeout=30
            )
            assert resp.status_code == 200, resp.text
            doc = resp.json()
            ids += [m["id"] for m in doc["messages"]]
            if doc["next"] is None:
                return ids
            params["cursor"] = doc["next"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("listing-owners")
    with secured_kafka(base, "SASL_PLAINTEXT") as secure:
        topic = unique_topic("list-owners")
        create_topic(secure.plain, topic, partitions=1)
        for user in ("alice", "bob", "carol"):
            secure.grant(user, topic, "WRITE", "DESCRIBE")
        secure.grant("carol", buffer.BUFFER_TOPIC, "ALTER")  # a kdelay administrator
        with ReplicaSet(
            base / "replicas", secure.plain, zookeeper.connect, count=1, partitions=3,
            buffer_topic=buffer.BUFFER_TOPIC,
        ) as rs:  # fmt: skip
            config = secure.proxy_config(
                zk_connect=zookeeper.connect,
                zk_root=rs.root,
                http_auth="kafka",
                http_allow_plaintext_auth=True,
            )
            with running_proxy(config) as px:
                rs.start_all()
                rs.wait_master(timeout=90)
                yield Stack(secure, px, topic)


def test_alice_lists_hers_bob_his_and_an_administrator_all(stack: Stack) -> None:
    run = f"lo{uuid.uuid4().hex[:8]}"
    mine: dict[str, list[str]] = {"alice": [], "bob": []}
    for i in range(10):
        user = "alice" if i % 3 else "bob"
        msg_id = f"{run}-{i:02d}"
        resp = httpx.post(
            f"{stack.http}/v1/messages",
            json={"topic": stack.topic, "id": msg_id, "value": "v", "delay_ms": 600_000 + i},
            headers=stack.auth(user),
            timeout=30,
        )
        assert resp.status_code == 202, resp.text
        mine[user].append(msg_id)
    everyone = sorted(mine["alice"] + mine["bob"])  # due in the order sent, as the ids sort
    wait_until(
        lambda: stack.listing("carol", id_prefix=run) == everyone,
        timeout=60,
        what="the replica to have ingested the 10 messages",
    )
    assert stack.listing("alice", id_prefix=run) == mine["alice"]
    assert stack.listing("bob", id_prefix=run) == mine["bob"]
    assert stack.listing("bob", id_prefix=run, topic=stack.topic) == mine["bob"]
    # No authentication: 401, as everywhere in the API.
    assert httpx.get(f"{stack.http}/v1/messages", timeout=30).status_code == 401
    for user, ids in mine.items():
        for msg_id in ids:
            url = f"{stack.http}/v1/messages/{msg_id}"
            assert httpx.delete(url, headers=stack.auth(user), timeout=30).status_code == 202
    wait_until(
        lambda: stack.listing("carol", id_prefix=run) == [],
        timeout=60,
        what="the cancels to empty the listing",
    )
