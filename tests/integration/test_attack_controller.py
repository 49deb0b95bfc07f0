"""Attack: `kdelay up --secure`'s Kafka lets nobody without credentials in by
its controller listener.

The secured local Kafka is started exactly as `kdelay up --secure` starts it (dev/stack/secure.py
``SecureStack.kafka_security``, dev/stack/kafka.py). Before the fix its KRaft controller listener
spoke PLAINTEXT with ``User:ANONYMOUS`` as a super user, so any local process could send
CreateAcls there, unauthenticated, and grant itself anything (the controller answered
error_code 0). Now the controller listener requires SASL (PLAIN, the admin user) and ANONYMOUS is
no super user: the same request is never answered, and no ACL appears.

Also (point 11): ``--kafka-port`` is the secured listener's port; it was ignored (a random port).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBindingFilter, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from kafka.protocol.admin import CreateAclsRequest

from dev.stack import free_port
from dev.stack.kafka import KafkaSettings, LocalKafka
from dev.stack.secure import SecureStack
from tests.support import infra
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.integration

INTRUDER = "User:intruder"
#: ``kdelay up --secure --kafka-port``'s port (StackOptions.kafka_port reaches LocalKafka's ports).
ASKED_PORT = free_port()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    if infra.backend() != "local":
        pytest.skip("the secured Kafka is started from the pinned jars (KDELAY_TEST_INFRA=local)")
    base = tmp_path_factory.mktemp("attack-controller")
    stack = SecureStack.load_or_create(base / "secrets")
    kafka = LocalKafka(
        base / "kafka",
        ports=[ASKED_PORT],
        settings=KafkaSettings(security=stack.kafka_security()),
    )
    try:
        yield kafka.start()
    finally:
        kafka.stop()


def _create_acl_request() -> CreateAclsRequest:
    """ALLOW User:intruder ALL on every topic (CreateAcls v1, as any admin client sends it)."""
    creation = CreateAclsRequest.AclCreation(
        resource_type=ResourceType.TOPIC.value,
        resource_name="*",
        resource_pattern_type=ResourcePatternType.LITERAL.value,
        principal=INTRUDER,
        host="*",
        operation=AclOperation.ALL.value,
        permission_type=AclPermissionType.ALLOW.value,
    )
    return CreateAclsRequest(creations=[creation], version=1)


def _intruder_acls(kafka: LocalKafka) -> list[object]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, **kafka.admin_config()})
    wanted = AclBindingFilter(
        ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, INTRUDER, "*",
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    return list(admin.describe_acls(wanted).result(timeout=30))


def test_no_acl_can_be_created_on_the_controller_port_without_credentials(
    secured: LocalKafka,
) -> None:
    controller = f"127.0.0.1:{secured.nodes[0].controller_port}"
    with RawClient(controller) as client:
        client.send_bytes(client.encode(_create_acl_request()))
        frame = client.read_frame()
    # Before the fix: a CreateAcls response with error_code 0 (the ACL was created).
    assert frame is None, "the controller answered an unauthenticated CreateAcls"
    assert _intruder_acls(secured) == []


def test_the_secured_listener_takes_the_asked_kafka_port(secured: LocalKafka) -> None:
    # Before the fix the secured listener got a random port and --kafka-port went to a
    # PLAINTEXT listener that up --secure never opens.
    assert secured.bootstrap_servers == f"127.0.0.1:{ASKED_PORT}"
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ASKED_PORT}", **secured.admin_config()})
    assert admin.list_topics(timeout=30).brokers


def test_the_controller_listener_requires_sasl_and_anonymous_is_no_super_user(
    secured: LocalKafka,
) -> None:
    props = (secured.nodes[0].data_dir / "server.properties").read_text()
    settings = dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
    assert "CONTROLLER:SASL_PLAINTEXT" in settings["listener.security.protocol.map"]
    assert settings["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert "ANONYMOUS" not in settings["super.users"]
