"""Bulk and confirmed cancels respect owners (README "Message owners"), on a real Kafka with
SCRAM users and ACLs (tests/support/secure_kafka.py) and the HTTP API authenticating against it
(``http_auth=kafka``): bob's bulk cancel over alice's prefix cancels only his own message there
and counts hers as refused; carol, a kdelay administrator (ALTER on the buffer topic), cancels
anyone's; ``kdelay cancel --http --prefix`` logs in with Basic credentials; bob's confirmed
cancel of alice's message is 403 before anything is written.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner

from dev.stack import wait_until
from kdelay.proxy.client import cancel_command
from tests.support.infra import ZooKeeperInfra
from tests.support.owners_stack import OwnersStack, owners_stack


class Stack(OwnersStack):
    def post(self, user: str, msg_id: str) -> None:
        due = (int(time.time() * 1000) // 1000 + 3600) * 1000
        body = {"topic": self.topic, "value": "v", "id": msg_id, "deliver_at": due}
        resp = httpx.post(f"{self.http}/v1/messages", json=body, headers=self.auth(user))
        assert resp.status_code == 202, resp.text

    def state(self, user: str, msg_id: str) -> str | None:
        resp = httpx.get(f"{self.http}/v1/messages/{msg_id}", headers=self.auth(user))
        return str(resp.json()["state"]) if resp.status_code == 200 else None

    def wait_pending(self, user: str, msg_id: str) -> None:
        wait_until(
            lambda: self.state(user, msg_id) == "pending",
            timeout=90,
            what=f"{msg_id} pending",
            interval=0.1,
        )

    def bulk(self, user: str, prefix: str) -> httpx.Response:
        return httpx.delete(
            f"{self.http}/v1/messages",
            params={"id_prefix": prefix, "wait": "30"},
            headers=self.auth(user),
            timeout=60,
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("bulkowners")
    with owners_stack(base, zookeeper.connect, "bulkowners") as s:
        yield Stack(s.secure, s.proxy, s.replicas, s.topic)


def test_bobs_bulk_cancel_over_alices_prefix_cancels_only_his_own(stack: Stack) -> None:
    prefix = f"cust-42-{uuid.uuid4().hex[:8]}-"
    alices = [f"{prefix}a{i}" for i in range(3)]
    for msg_id in alices:
        stack.post("alice", msg_id)
    stack.post("bob", f"{prefix}b0")
    for msg_id in alices:
        stack.wait_pending("alice", msg_id)
    stack.wait_pending("bob", f"{prefix}b0")

    resp = stack.bulk("bob", prefix)
    assert resp.status_code == 200, resp.text
    assert (resp.json()["cancelled"], resp.json()["refused"]) == (1, 3)
    assert [stack.state("alice", m) for m in alices] == ["pending"] * 3
    assert stack.state("bob", f"{prefix}b0") == "cancelled"

    # His confirmed cancel of one of hers: 403 before anything is written.
    denied = httpx.delete(
        f"{stack.http}/v1/messages/{alices[0]}", params={"wait": "5"}, headers=stack.auth("bob")
    )
    assert denied.status_code == 403, denied.text
    assert stack.state("alice", alices[0]) == "pending"

    # carol, an administrator, cancels hers.
    admin = stack.bulk("carol", prefix)
    assert admin.status_code == 200, admin.text
    assert (admin.json()["cancelled"], admin.json()["refused"]) == (3, 0)
    assert [stack.state("alice", m) for m in alices] == ["cancelled"] * 3


def test_kdelay_cancel_prefix_logs_in_over_http(stack: Stack) -> None:
    prefix = f"cust-43-{uuid.uuid4().hex[:8]}-"
    stack.post("alice", f"{prefix}1")
    stack.wait_pending("alice", f"{prefix}1")
    args = ["--http", stack.http, "--prefix", prefix, "--wait", "30"]
    runner = CliRunner()
    anonymous = runner.invoke(cancel_command, args)
    assert anonymous.exit_code != 0
    assert "401" in anonymous.output
    result = runner.invoke(
        cancel_command,
        [*args, "--kafka-sasl-username", "alice"],
        env={"KDELAY_KAFKA_SASL_PASSWORD": stack.secure.password("alice")},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cancelled"] == 1
    assert stack.state("alice", f"{prefix}1") == "cancelled"
    assert stack.secure.password("alice") not in result.output
