"""The listing shows a principal its own messages only, an administrator everyone's (CONTRACT.md
v3 "Listing" and "Security"), on a real Kafka with SCRAM users and ACLs (tests/support/
secure_kafka.py): alice and bob schedule messages over HTTP (``http_auth=kafka``, HTTP Basic
checked against Kafka), carol holds ALTER on the buffer topic (a kdelay administrator).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dev.stack import wait_until
from tests.support.infra import ZooKeeperInfra
from tests.support.owners_stack import OwnersStack, owners_stack


class Stack(OwnersStack):
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
    with owners_stack(base, zookeeper.connect, "list-owners") as s:
        yield Stack(s.secure, s.proxy, s.replicas, s.topic)


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
