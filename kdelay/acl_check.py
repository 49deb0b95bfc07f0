"""Asks Kafka at start which of a component's ACLs (kdelay/acls.py) its principal lacks.

Every component calls :func:`require` once before its first real use of Kafka, when it logs in
with SASL; it raises :class:`MissingAclsError` naming the principal, each missing operation and
resource, and the ``kafka-acls.sh`` command that grants it. How each kind is asked:

- a topic that exists: DescribeTopics with ``include_authorized_operations`` (KIP-430) gives
  the operations Kafka allows the principal there, implied ones included (WRITE implies
  DESCRIBE); TOPIC_AUTHORIZATION_FAILED means not even DESCRIBE, so READ and WRITE are missing
  (DESCRIBE_CONFIGS, which does not imply DESCRIBE, is then not known);
- a topic that is missing (or hidden): its CREATE is asked with a CreateTopics request that only
  validates (``validate_only``), which Kafka authorizes like a real one and then discards;
- a group: DescribeGroups with ``include_authorized_operations``, for the group id the component
  will use (a prefixed ACL is asked through one concrete name, ``probes``);
- the cluster: DescribeCluster with ``include_authorized_operations``;
- what cannot be asked is returned as *unchecked* and logged: WRITE on target topics (unknown at
  start: the proxy and replicas meet them per message), and transactional ids (Kafka's only
  question that touches one, InitProducerId, would fence the running master).

Optional ACLs (``Acl.required`` False) are logged when missing, never fatal. Without an
authorizer Kafka answers every operation as allowed, so nothing is reported.

Blocking (a few admin requests); call it from a start-up thread, never from an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdelay import logs
from kdelay.acls import TARGETS, Acl, kafka_acls_command
from kdelay.errors import ConfigError, InfrastructureError

log = logs.get(__name__)


class MissingAclsError(ConfigError):
    """The component's principal lacks ACLs it needs; the message says how to grant each."""

    def __init__(self, component: str, principal: str, missing: list[Acl], bootstrap: str) -> None:
        lines = [
            f"{component}: Kafka principal {principal} lacks {len(missing)} ACL(s) kdelay's "
            f"{component} needs (README, Least privilege); grant them as a Kafka administrator:"
        ]
        for acl in missing:
            lines.append(f"  - {acl.describe()} ({acl.why}):")
            lines.append(f"      {kafka_acls_command(principal, acl, bootstrap)}")
        super().__init__("\n".join(lines))
        self.component = component
        self.principal = principal
        self.missing = missing


def _op_names(ops: Any) -> set[str] | None:
    """AclOperation values as names; None when Kafka did not say (not asked, too old)."""
    if ops is None:
        return None
    return {getattr(op, "name", str(op)) for op in ops}


def _allowed(ops: set[str], operation: str) -> bool:
    return operation in ops or "ALL" in ops


def _code(exc: BaseException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _topic_ops(
    admin: AdminClient, topics: list[str], timeout: float
) -> dict[str, set[str] | str | None]:
    """Per topic: its allowed operations, ``"denied"`` (no DESCRIBE) or ``"missing"``."""
    out: dict[str, set[str] | str | None] = {}
    if not topics:
        return out
    futures = admin.describe_topics(
        TopicCollection(topics), include_authorized_operations=True, request_timeout=timeout
    )
    for name, future in futures.items():
        try:
            out[name] = _op_names(future.result(timeout=timeout).authorized_operations)
        except KafkaException as exc:
            code = _code(exc)
            if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                out[name] = "denied"
            elif code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                out[name] = "missing"
            else:
                raise InfrastructureError(f"cannot describe topic {name}: {exc}") from None
    return out


def _may_create(admin: AdminClient, topic: str, timeout: float) -> bool:
    """Whether Kafka would let this principal create ``topic`` (nothing is created)."""
    new = NewTopic(topic, 1)  # the broker's default replication
    future = admin.create_topics(
        [new], validate_only=True, operation_timeout=timeout, request_timeout=timeout
    )[topic]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        code = _code(exc)
        if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            return False
        # TOPIC_ALREADY_EXISTS (hidden from DESCRIBE), a policy or replication refusal: the
        # question was authorized.
    return True


#: Answers while the group coordinator is not ready (a new cluster creates
#: __consumer_offsets on the first question): asked again.
_COORDINATOR_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)


def _group_ops(admin: AdminClient, group: str, timeout: float) -> set[str] | None:
    """The operations allowed on ``group`` (a group that does not exist is answered too)."""
    deadline = time.monotonic() + timeout
    while True:
        future = admin.describe_consumer_groups(
            [group], include_authorized_operations=True, request_timeout=timeout
        )[group]
        try:
            return _op_names(future.result(timeout=timeout).authorized_operations)
        except KafkaException as exc:
            code = _code(exc)
            if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
                return set()
            if code not in _COORDINATOR_NOT_READY or time.monotonic() > deadline:
                raise InfrastructureError(f"cannot describe group {group}: {exc}") from None
        time.sleep(0.2)


def _cluster_ops(admin: AdminClient, timeout: float) -> set[str] | None:
    """The operations allowed on the cluster (DescribeCluster, KIP-700: Kafka 2.8); None when
    Kafka is too old to be asked."""
    future = admin.describe_cluster(include_authorized_operations=True, request_timeout=timeout)
    try:
        ops = _op_names(future.result(timeout=timeout).authorized_operations)
    except KafkaException as exc:
        code = _code(exc)
        if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            return set()
        if code in (KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION):
            return None
        raise InfrastructureError(f"cannot describe the cluster: {exc}") from None
    # Kafka answers 0 operations without DESCRIBE on the cluster, which confluent-kafka turns
    # into None: asked for them, no answer means none.
    return set() if ops is None else ops


def missing_acls(
    admin: AdminClient,
    acls: list[Acl],
    *,
    probes: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[list[Acl], list[Acl]]:
    """The ``acls`` Kafka does not allow this admin client's principal, and those that cannot
    be asked (see the module docstring). ``probes`` maps a PREFIXED group name to the group id
    to ask about."""
    probes = probes or {}
    topics = sorted(
        {a.name for a in acls if a.resource == "TOPIC" and a.pattern == "LITERAL"} - {TARGETS}
    )
    described = _topic_ops(admin, topics, timeout)
    missing: list[Acl] = []
    unchecked: list[Acl] = []
    creatable: dict[str, bool] = {}
    for acl in acls:
        if acl.resource == "TOPIC" and acl.name != TARGETS and acl.pattern == "LITERAL":
            state = described[acl.name]
            if acl.operation == "CREATE" and state in ("missing", "denied"):
                if acl.name not in creatable:
                    creatable[acl.name] = _may_create(admin, acl.name, timeout)
                verdict: bool | None = creatable[acl.name]
            else:
                verdict = _topic_verdict(acl, state)
        elif acl.resource == "GROUP":
            group = probes.get(acl.name, acl.name) if acl.pattern == "PREFIXED" else acl.name
            ops = _group_ops(admin, group, timeout)
            verdict = None if ops is None else _allowed(ops, acl.operation)
        elif acl.resource == "CLUSTER":
            ops = _cluster_ops(admin, timeout)
            verdict = None if ops is None else _allowed(ops, acl.operation)
        else:
            verdict = None
        if verdict is None:
            unchecked.append(acl)
        elif not verdict:
            missing.append(acl)
    return missing, unchecked


#: Topic operations Kafka allows only with DESCRIBE too (each implies it); CREATE and
#: DESCRIBE_CONFIGS do not, so a topic hidden from DESCRIBE says nothing about them.
_IMPLY_DESCRIBE = frozenset(("READ", "WRITE", "DESCRIBE", "DELETE", "ALTER", "ALL"))


def _topic_verdict(acl: Acl, state: set[str] | str | None) -> bool | None:
    """Whether ``acl`` (not a CREATE of a missing topic) is allowed; None: cannot tell."""
    if acl.operation == "CREATE":
        return True  # the topic exists: it is never created
    if state == "denied":  # not even DESCRIBE: nothing that implies it is allowed
        return False if acl.operation in _IMPLY_DESCRIBE else None
    if isinstance(state, set):
        return _allowed(state, acl.operation)
    return None  # missing (whoever creates it: asked once it exists), or not answered


def awaiting_topics(unchecked: list[Acl]) -> bool:
    """Whether some of ``unchecked`` are about named topics that did not exist yet: ask again
    once they are created."""
    return any(
        a.resource == "TOPIC" and a.pattern == "LITERAL" and a.name != TARGETS for a in unchecked
    )


def require(
    component: str,
    principal: str,
    acls: list[Acl],
    client_config: Mapping[str, str],
    *,
    probes: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[Acl]:
    """Raise MissingAclsError for the required ``acls`` ``principal`` lacks (logging optional
    ones it lacks); return the ones not asked. ``client_config``: librdkafka settings with
    ``bootstrap.servers`` and this component's own login."""
    bootstrap = str(client_config.get("bootstrap.servers", ""))
    admin = AdminClient({**client_config, "client.id": f"kdelay-{component}-acl-check"})
    try:
        missing, unchecked = missing_acls(admin, acls, probes=probes, timeout=timeout)
    except KafkaException as exc:
        raise InfrastructureError(
            f"{component}: cannot ask Kafka at {bootstrap} for {principal}'s ACLs: {exc}"
        ) from None
    required = [a for a in missing if a.required]
    optional = [a for a in missing if not a.required]
    if optional:
        log.warning(
            "kafka_acls.optional_missing",
            component=component,
            principal=principal,
            missing=[f"{a.describe()} ({a.why})" for a in optional],
        )
    if required:
        raise MissingAclsError(component, principal, required, bootstrap)
    log.info(
        "kafka_acls.checked",
        component=component,
        principal=principal,
        checked=len(acls) - len(unchecked),
        unchecked=[a.describe() for a in unchecked],
    )
    return unchecked
