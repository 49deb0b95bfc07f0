"""Messages have owners, on a real Kafka with SCRAM users and ACLs.

A secured Kafka (tests/support/secure_kafka.py, SASL_PLAINTEXT so that a raw client can read the
Produce response's record errors), the proxy's Kafka listener on SASL_PLAINTEXT, one replica.
alice schedules messages through the proxy; bob, who may WRITE the same topic, may not cancel or
replace them (INVALID_RECORD with a record error naming the id and who may), and neither does a
cancel of his written straight to the buffer topic, around the proxy's check (the race where
the proxy accepts a cancel before the replicas know its message): the replica leaves alice's
message pending and counts the refusal. alice cancels her own; carol, with ALTER on the buffer
topic (a kdelay administrator), cancels anyone's. Over HTTP, the owner's and an administrator's
cancel, replace and status are allowed and another principal gets 403; the pending timeline is
for administrators. The HTTP API authenticates with the same principals (``http_auth=kafka``,
HTTP Basic checked against Kafka; plain HTTP here, ``http_allow_plaintext_auth``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay import buffer
from kdelay import headers as h
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import consume_until
from tests.support.owners_stack import OwnersStack, owners_stack
from tests.support.raw_client import (
    RawClient,
    plain_token,
    produce_request,
    record_batch,
    sasl_authenticate_request,
    sasl_handshake_request,
)

#: Long enough for every step before the messages fall due; the test never waits for it to
#: pass except for the one message it expects delivered.
DUE_MS = 45_000
REFUSED = "belongs to another principal: only its owner or a principal with ALTER on"


Stack = OwnersStack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("owners")
    with owners_stack(base, zookeeper.connect, "owners") as s:
        s.secure.add_user("dave")
        s.secure.grant("dave", s.topic, "DESCRIBE")  # dave may not WRITE it
        yield s


def _produce(stack: Stack, user: str, records: list[tuple[bytes, list[tuple[str, bytes]]]]) -> None:
    """Produce ``records`` (value, headers) as ``user`` with librdkafka; each acknowledged."""
    failed: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(err)

    producer = Producer(
        {"bootstrap.servers": stack.kafka, **stack.secure.client(user), "linger.ms": 0}
    )
    for value, headers in records:
        hdrs: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(stack.topic, value, partition=0, headers=hdrs, on_delivery=report)
    assert producer.flush(60) == 0
    assert failed == []


def _raw_produce(stack: Stack, user: str, headers: list[tuple[str, bytes]]) -> Any:
    """One record produced as ``user`` (SASL PLAIN on a raw connection): the partition's
    response, its error message and record errors as Kafka's protocol carries them."""
    with RawClient(stack.kafka) as c:
        assert c.request(sasl_handshake_request("PLAIN")).error_code == 0
        token = plain_token(user, stack.secure.password(user))
        assert c.request(sasl_authenticate_request(token)).error_code == 0
        batch = record_batch([(b"k", b"v", headers)])
        response = c.request(produce_request(stack.topic, 0, batch, version=9))
    return response.responses[0].partition_responses[0]


def _status(stack: Stack, msg_id: str, user: str = "carol") -> httpx.Response:
    """The status of ``msg_id`` as ``user`` sees it (carol: an administrator)."""
    return httpx.get(f"{stack.http}/v1/messages/{msg_id}", headers=stack.auth(user), timeout=30)


def _pending_owner(stack: Stack, msg_id: str) -> str | None:
    """The owner the replica reports for ``msg_id`` once it has it pending."""
    found: dict[str, Any] = {}

    def pending() -> bool:
        r = _status(stack, msg_id)
        if r.status_code == 200 and r.json()["state"] == "pending":
            found.update(r.json())
            return True
        return False

    wait_until(pending, timeout=60, what=f"{msg_id} pending at the replica")
    return found.get("owner")


def _state(stack: Stack, msg_id: str) -> str:
    return str(_status(stack, msg_id).json()["state"])


def _delayed(msg_id: str, delay_ms: int = DUE_MS) -> list[tuple[str, bytes]]:
    return [(h.DELAY_MS, str(delay_ms).encode()), (h.ID, msg_id.encode())]


def test_only_the_owner_and_administrators_cancel_or_replace_over_kafka(stack: Stack) -> None:
    x, y, z, w = (f"{n}-{uuid.uuid4().hex[:8]}" for n in "xyzw")
    # x is due last: once it is delivered, y, z and w (due before it) would have been too.
    _produce(stack, "alice", [
        (b"y", _delayed(y)), (b"z", _delayed(z)), (b"w", _delayed(w)),
        (b"x", _delayed(x, DUE_MS + 1_000)),
    ])  # fmt: skip
    for msg_id in (x, y, z, w):
        assert _pending_owner(stack, msg_id) == "User:alice"  # status shows the owner

    # bob may WRITE the topic, but x is alice's: his cancel and his replace are refused.
    for headers, action in (
        ([(h.CANCEL, x.encode())], "cancel"),
        ([*_delayed(x, 1_000), (h.REPLACE, b"true")], "replace"),
    ):
        part = _raw_produce(stack, "bob", headers)
        assert part.error_code == kerr.InvalidRecordError.errno
        message = f"record 0: message {x!r} {REFUSED} {buffer.BUFFER_TOPIC}"
        assert part.error_message == f"{message} (a kdelay administrator) may {action} it"
        assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [
            (0, part.error_message)
        ]
        assert "alice" not in part.error_message

    # A cancel of bob's written around the proxy (forged, or accepted before the replicas knew
    # the message): the replica leaves alice's message pending and counts the refusal.
    forged = buffer.encode(buffer.Cancel(x, uuid.uuid4().hex, owner="User:bob"))
    producer = Producer({"bootstrap.servers": stack.secure.plain})
    producer.produce(
        buffer.BUFFER_TOPIC,
        forged.value,
        forged.key,
        partition=buffer.partition_for(x, 3),
        headers=list[tuple[str, str | bytes | None]](forged.headers),
    )
    assert producer.flush(30) == 0
    wait_until(
        lambda: (
            (stack.replicas.metric("replica-1", "kdelay_replica_cancels_refused_total") or 0) >= 1
        ),
        timeout=60,
        what="the replica's refusal of bob's cancel",
    )

    # alice cancels her own y; carol, an administrator (ALTER on the buffer), cancels z.
    _produce(stack, "alice", [(b"", [(h.CANCEL, y.encode())])])
    _produce(stack, "carol", [(b"", [(h.CANCEL, z.encode())])])
    wait_until(
        lambda: _state(stack, y) == "cancelled" and _state(stack, z) == "cancelled",
        timeout=60,
        what="y and z cancelled",
    )
    assert _state(stack, x) == "pending"
    # w is cancelled over HTTP by an administrator, after bob was refused (below).
    url = f"{stack.http}/v1/messages/{w}"
    assert httpx.delete(url, headers=stack.auth("bob"), timeout=30).status_code == 403
    assert httpx.delete(url, headers=stack.auth("carol"), timeout=30).status_code == 202
    wait_until(lambda: _state(stack, w) == "cancelled", timeout=60, what="w cancelled")

    records = consume_until(
        stack.secure.plain, [stack.topic], lambda rs: any(r.value == b"x" for r in rs), timeout=120
    )
    assert [r.value for r in records] == [b"x"]  # x delivered; y, z and w never

    # Each message's history tells who scheduled it and who cancelled it, or how late it was
    # delivered; what became of alice's message is hers to read, not bob's.
    y_doc = _status(stack, y, "alice").json()
    assert y_doc["cancelled_by"] == {"principal": "User:alice", "admin": False}
    assert [(e["event"], e.get("by")) for e in y_doc["history"]] == [
        ("accepted", "User:alice"),
        ("cancelled", {"principal": "User:alice", "admin": False}),
    ]
    assert _status(stack, z, "alice").json()["cancelled_by"]["admin"] is True  # carol's
    wait_until(lambda: _state(stack, x) == "delivered", timeout=60, what="x delivered")
    x_doc = _status(stack, x, "alice").json()
    assert [e["event"] for e in x_doc["history"]] == ["accepted", "delivered"]
    delivered = x_doc["history"][1]
    assert delivered["lateness_ms"] == delivered["at"] - delivered["deliver_at"] >= 0
    assert _status(stack, x, "bob").status_code == 403
    # bob reuses the id: his message's status tells nothing of alice's, and alice may not read his.
    _produce(stack, "bob", [(b"x2", _delayed(x, 600_000))])
    wait_until(lambda: _pending_owner(stack, x) == "User:bob", timeout=60, what="bob's x")
    bobs = _status(stack, x, "bob").json()
    assert [(e["event"], e.get("owner")) for e in bobs["history"]] == [("accepted", "User:bob")]
    assert "last_outcome" not in bobs
    assert [e.get("owner") for e in _status(stack, x, "carol").json()["history"]] == [
        "User:alice",
        "User:alice",
        "User:bob",
    ]  # an administrator sees the whole history
    assert _status(stack, x, "alice").status_code == 403


def test_http_cancel_replace_and_status_are_for_the_owner_and_administrators(
    stack: Stack,
) -> None:
    msg_id = f"h-{uuid.uuid4().hex[:8]}"
    alice, bob, admin = stack.auth("alice"), stack.auth("bob"), stack.auth("carol")
    body = {"topic": stack.topic, "partition": 0, "value": "h", "delay_ms": 600_000}
    posted = httpx.post(
        f"{stack.http}/v1/messages", json={**body, "id": msg_id}, headers=alice, timeout=30
    )
    assert posted.status_code == 202, posted.text
    assert _pending_owner(stack, msg_id) == "User:alice"
    # A caller Kafka does not allow WRITE on the topic: 403 for POST and PUT.
    dave = stack.auth("dave")
    for method, url in (("POST", "/v1/messages"), ("PUT", f"/v1/messages/other-{msg_id}")):
        denied = httpx.request(method, f"{stack.http}{url}", json=body, headers=dave, timeout=30)
        assert denied.status_code == 403, denied.text
        assert denied.json()["error"] == (
            f"topic: Kafka's ACLs do not allow User:dave to WRITE topic {stack.topic}"
        )

    # Another principal: 403 for status, replace and cancel, naming the id and who may.
    status = _status(stack, msg_id, "bob")
    assert status.status_code == 403
    assert status.json()["error"] == (
        f"message {msg_id!r} {REFUSED} {buffer.BUFFER_TOPIC} (a kdelay administrator) may read it"
    )
    url = f"{stack.http}/v1/messages/{msg_id}"
    assert httpx.put(url, json=body, headers=bob, timeout=30).status_code == 403
    assert httpx.delete(url, headers=bob, timeout=30).status_code == 403
    assert _status(stack, msg_id, "alice").json()["state"] == "pending"
    # The pending timeline counts everyone's messages: administrators only.
    assert httpx.get(f"{stack.http}/v1/pending", headers=bob, timeout=30).status_code == 403
    assert httpx.get(f"{stack.http}/v1/pending", headers=admin, timeout=60).status_code == 200

    # The owner replaces its message; an administrator reads and cancels it.
    replaced = httpx.put(url, json={**body, "value": "h2"}, headers=alice, timeout=30)
    assert replaced.status_code == 202, replaced.text
    assert _status(stack, msg_id, "carol").status_code == 200
    assert httpx.delete(url, headers=admin, timeout=30).status_code == 202
    wait_until(lambda: _state(stack, msg_id) == "cancelled", timeout=60, what="cancelled")
    # Its history: alice's message, replaced by alice; the replacement, cancelled by carol.
    history = _status(stack, msg_id, "alice").json()["history"]
    assert [e["event"] for e in history] == ["accepted", "replaced", "accepted", "cancelled"]
    assert history[1]["by"] == {"principal": "User:alice", "admin": False}
    assert history[3]["by"]["admin"] is True
