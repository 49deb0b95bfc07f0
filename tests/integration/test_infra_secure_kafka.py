"""The dev Kafka launcher's optional security (dev/stack/kafka_security.py) without the open
PLAINTEXT listener, as ``kdelay up --secure`` will run it: the brokers talk SASL_SSL among
themselves, the first super user administers over PLAIN, SCRAM users log in, and the
StandardAuthorizer refuses what no ACL allows."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from dev.stack import KafkaSecurity, KafkaSettings, LocalKafka
from tests.support import infra


def _produce(
    bootstrap: str, conf: dict[str, str], topic: str, timeout_ms: int = 20_000
) -> tuple[list[KafkaError | None], list[KafkaError]]:
    """One record's delivery report, and what the error callback reported meanwhile."""
    reports: list[KafkaError | None] = []
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, _msg: Message) -> None:
        reports.append(err)

    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.timeout.ms": timeout_ms,
         "error_cb": errors.append, **conf}
    )  # fmt: skip
    producer.produce(topic, b"v", on_delivery=report)
    producer.flush(30)
    return reports, errors


def test_a_secured_kafka_without_the_open_listener(tmp_path: Path) -> None:
    if infra.backend() != "local":
        pytest.skip("the launcher under test runs the pinned jars (KDELAY_TEST_INFRA=local)")
    security = KafkaSecurity(
        users={"admin": "admin-secret-1", "alice": "alice-secret-1"},
        protocol="SASL_SSL",
        mechanisms=("SCRAM-SHA-512", "PLAIN"),
        open_listener=False,
    )
    kafka = LocalKafka(tmp_path / "kafka", settings=KafkaSettings(security=security))
    with kafka:
        assert kafka.bootstrap_servers == kafka.secure_bootstrap_servers
        config = kafka.nodes[0].data_dir / "server.properties"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600  # PLAIN's passwords are in it
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, **kafka.admin_config()})
        assert len(admin.list_topics(timeout=30).brokers) == 1
        bootstrap = kafka.secure_bootstrap_servers
        assert _produce(bootstrap, kafka.client_config("admin"), "made-by-admin")[0] == [None]
        refused, _ = _produce(bootstrap, kafka.client_config("alice"), "made-by-admin")
        assert [e.code() for e in refused if e] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
        wrong = {**kafka.client_config("alice"), "sasl.password": "nope"}
        _, errors = _produce(bootstrap, wrong, "made-by-admin", timeout_ms=3_000)
        assert any("invalid credentials" in e.str() for e in errors), errors
