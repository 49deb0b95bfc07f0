"""`kdelay up --secure`: the embedded stack secured end to end, tried from outside as a user would.

With only what the state file gives (the CA and the Kafka super user), the test creates a user
allowed to WRITE one topic, schedules through the proxy's SASL_SSL listener and its HTTPS API,
and checks every door that must stay shut: Kafka without credentials, a user without the ACL,
ZooKeeper without kdelay's digest, the HTTP API without credentials. Then it reads every log the
run wrote and every file of the state directory for each password it used.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from kdelay import headers as h
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.up import add_user, admin_config, kdelay_up, sasl_config

pytestmark = pytest.mark.e2e


def _produce(proxy: str, conf: dict[str, str], topic: str, msg_id: str) -> KafkaError | None:
    """One delayed record through the proxy: None once delivered, else the first error, from
    its delivery report or (a failed login) librdkafka's error callback."""
    errors: list[KafkaError] = []
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": proxy,
            "message.timeout.ms": 30_000,
            "error_cb": errors.append,
            **conf,
        }
    )
    producer.produce(
        topic,
        b"secured",
        b"k",
        headers=[(h.DELAY_MS, b"500"), (h.ID, msg_id.encode())],
        on_delivery=lambda err, _msg: reports.append(err),
    )
    deadline = time.monotonic() + 40
    while not reports and not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert reports or errors, "no delivery report and no error within 40 s"
    first = reports[0] if reports else errors[0]
    producer.purge()
    producer.flush(5)
    return first


def _http(
    state: dict[str, Any], method: str, path: str, auth: tuple[str, str] | None, body: Any = None
) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cafile=state["security"]["ca_file"])
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(state["http"] + path, data=data, method=method)  # noqa: S310
    req.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_up_secure_serves_users_by_their_acls_and_keeps_every_door_shut(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir = tmp_path_factory.mktemp("up-secure")
    used: set[str] = set()
    with kdelay_up(workdir, "--secure", "--replicas", "2") as up:
        state = up.state
        sec = state["security"]
        assert (sec["protocol"], sec["mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
        assert Path(sec["ca_file"]).is_file()
        assert state["http"].startswith("https://")
        used.add(sec["admin"]["password"])

        topic = unique_topic("up-secure")
        admin = AdminClient({"bootstrap.servers": state["kafka"], **admin_config(state)})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
        alice = add_user(state, "alice", topic)
        mallory = add_user(state, "mallory", None)
        used |= {alice, mallory}

        # A user with WRITE on the topic schedules through the SASL_SSL proxy; it is delivered.
        sent_ms = int(time.time() * 1000)
        assert _produce(state["proxy"], sasl_config(state, "alice", alice), topic, "s-1") is None
        status, body = _http(
            state,
            "POST",
            "/v1/messages",
            ("alice", alice),
            {"topic": topic, "value": "over https", "delay_ms": 300, "id": "s-2"},
        )
        assert status == 202, body
        records = consume_until(
            state["kafka"], [topic], lambda r: len(r) >= 2, config=dict(admin_config(state))
        )
        assert sorted(r.header(h.ID) or b"" for r in records) == [b"s-1", b"s-2"]
        assert all(r.timestamp_ms >= sent_ms + 300 for r in records)

        # The doors that must stay shut.
        err = _produce(state["proxy"], sasl_config(state, "mallory", mallory), topic, "m-1")
        assert err is not None
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
        wrong = sasl_config(state, "alice", "not-her-password")
        err = _produce(state["proxy"], wrong, topic, "m-2")
        assert err is not None
        assert err.code() == KafkaError._AUTHENTICATION, err
        anonymous = AdminClient(
            {"bootstrap.servers": state["kafka"], "security.protocol": "SSL", **_ca(state)}
        )
        with pytest.raises(KafkaException):
            anonymous.list_topics(timeout=5)
        assert _http(state, "POST", "/v1/messages", None, {"topic": topic, "value": "x"})[0] == 401
        assert _http(state, "GET", "/v1/messages/s-1", ("alice", "wrong"))[0] == 401
        assert _http(state, "GET", "/healthz", None)[0] == 200
        zk = KazooClient(hosts=state["zookeeper"], timeout=10.0)
        zk.start(timeout=10)
        try:
            roots = [c for c in zk.get_children("/") if c != "zookeeper"]
            assert roots, "kdelay created no znode"
            for root in roots:
                with pytest.raises(NoAuthError):
                    zk.get_children(f"/{root}")
        finally:
            zk.stop()
            zk.close()
    assert up.exit_code == 0, up.process.log_tail()

    # Every secret the run used, looked for in everything it wrote but the secrets themselves.
    secrets_dir = next(workdir.rglob("secrets"))
    used |= {p.read_text().strip() for p in secrets_dir.glob("*.password")}
    state_file = next(workdir.rglob("up.json"), None)
    leaks = []
    for path in workdir.rglob("*"):
        if not path.is_file() or secrets_dir in path.parents or path.suffix in (".pem", ".key"):
            continue
        if path.name == "server.properties":
            continue  # Kafka's own secret store (mode 0600): its PLAIN users' JAAS entry
        if path.stat().st_size > 64 * 1024 * 1024:
            continue
        text = path.read_bytes()
        leaks += [f"{path}" for secret in used if secret.encode() in text]
    assert state_file is None, "kdelay up left its state file behind"
    assert leaks == [], f"a password of the run is written in {leaks}"


def _ca(state: dict[str, Any]) -> dict[str, str]:
    return {"ssl.ca.location": state["security"]["ca_file"]}
