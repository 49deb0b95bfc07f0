"""The Kafka ACLs each kdelay component needs (least privilege): one table for the docs and checks.

Each function below returns, for one component with its settings, the list of
:class:`Acl` s its Kafka principal must hold, derived from what its code does (the ``why`` of
each names it). ``required=False`` marks what a component uses when it may and works without
(reading a topic's config to warn about weak durability, or to check the clock topic's
``message.timestamp.type`` at start rather than on each probe).

What is deliberately absent:

- ``IDEMPOTENT_WRITE`` on the cluster: since Kafka 3.0 WRITE on any topic allows an idempotent
  producer (KIP-679), and every kdelay producer is idempotent.
- ``ALTER`` on the buffer topic: it makes a principal a kdelay *administrator* at the proxy
  (proxy/auth/authorization.py), which no kdelay component needs.
- Client principals' ACLs for *direct* access to the internal topics: they go through the
  proxy, which writes the buffer as its own principal after checking theirs.

:func:`kafka_acls_command` prints the ``kafka-acls.sh`` command that grants an ACL, and
kdelay/acl_check.py asks Kafka at start which of them a principal lacks.

Pure data and functions; no I/O, any thread.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kdelay.buffer import BUFFER_TOPIC, DEAD_LETTER_TOPIC
from kdelay.topics import CHECKPOINT_TOPIC, CLOCK_TOPIC

#: The verifier's default output topic (verifier/config.py's OUTPUT_TOPIC).
VERIFIER_TOPIC = "__kdelay_verifier"
#: Stands for every topic messages are delayed to: the wildcard, or one ACL per target topic.
TARGETS = "*"
#: Group ids a replica's consumers use (``kdelay-replica-<name>``, ``-takeover``,
#: ``-checkpoint``): assigned partitions only, never joined, offsets never committed.
REPLICA_GROUPS = "kdelay-replica-"
#: Transactional ids of exactly-once releases (``kdelay-release:<zk root>|<buffer topic>``).
RELEASE_TRANSACTIONAL_IDS = "kdelay-release:"
#: The group id prefix of the verifier's Spark Kafka source (its ``groupIdPrefix``).
VERIFIER_GROUPS = "kdelay-verifier"

#: The name of Kafka's one CLUSTER resource.
CLUSTER = "kafka-cluster"

COMPONENTS = ("proxy", "replica", "verifier", "client")


@dataclass(frozen=True, slots=True)
class Acl:
    """One ALLOW ACL: ``operation`` on ``resource`` ``name`` (``pattern`` LITERAL or PREFIXED)."""

    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    name: str
    pattern: str  # LITERAL, PREFIXED
    operation: str  # READ, WRITE, CREATE, DESCRIBE, DESCRIBE_CONFIGS
    why: str
    required: bool = True

    def describe(self) -> str:
        """``WRITE on TOPIC __kdelay_buffer`` (prefixed names end with ``*``)."""
        name = f"{self.name}*" if self.pattern == "PREFIXED" else self.name
        if self.resource == "TOPIC" and self.name == TARGETS:
            name = "* (every target topic)"
        return f"{self.operation} on {self.resource} {name}"


def _created(topics: list[str], who: str) -> list[Acl]:
    return [
        Acl("TOPIC", t, "LITERAL", "CREATE", f"{who} creates {t} when it is missing")
        for t in topics
    ]


def _durability_check(topics: list[str]) -> list[Acl]:
    return [
        Acl(
            "TOPIC",
            t,
            "LITERAL",
            "DESCRIBE_CONFIGS",
            f"warns when {t} is weaker than configured (skipped if denied)",
            required=False,
        )
        for t in topics
    ]


def _clock(who: str) -> list[Acl]:
    return [
        Acl("TOPIC", CLOCK_TOPIC, "LITERAL", "WRITE", f"{who} probes the broker's clock"),
        Acl("TOPIC", CLOCK_TOPIC, "LITERAL", "CREATE", f"{who} creates {CLOCK_TOPIC} if missing"),
        Acl(
            "TOPIC",
            CLOCK_TOPIC,
            "LITERAL",
            "DESCRIBE_CONFIGS",
            "checks LogAppendTime once at start (else on each probe)",
            required=False,
        ),
    ]


def replica_acls(buffer_topic: str = BUFFER_TOPIC, *, exactly_once: bool = True) -> list[Acl]:
    """A delay-service replica's ACLs (delay_service/: ingest, forwarder, senders, startup)."""
    internal = [buffer_topic, DEAD_LETTER_TOPIC, CHECKPOINT_TOPIC]
    if buffer_topic != BUFFER_TOPIC:
        internal = [BUFFER_TOPIC, *internal]  # ensure_internal_topics creates the shared ones
    acls = [
        Acl("TOPIC", buffer_topic, "LITERAL", "READ", "ingest reads the buffer (and takeovers)"),
        Acl("TOPIC", buffer_topic, "LITERAL", "WRITE", "tombstones, a series' next occurrence"),
        Acl("TOPIC", DEAD_LETTER_TOPIC, "LITERAL", "WRITE", "undeliverable records go there"),
        Acl("TOPIC", TARGETS, "LITERAL", "WRITE", "releases due messages to their topics"),
        Acl("GROUP", REPLICA_GROUPS, "PREFIXED", "READ", "its consumers' group ids (not joined)"),
        Acl(
            "CLUSTER",
            CLUSTER,
            "LITERAL",
            "DESCRIBE",
            "asks Kafka's ACLs whether a message's owner may still WRITE its target (DescribeAcls)",
        ),
    ]
    if exactly_once:
        acls += [
            Acl("TOPIC", CHECKPOINT_TOPIC, "LITERAL", "READ", "a new master loads the checkpoint"),
            Acl("TOPIC", CHECKPOINT_TOPIC, "LITERAL", "WRITE", "checkpoints in each transaction"),
            Acl(
                "TRANSACTIONAL_ID",
                RELEASE_TRANSACTIONAL_IDS,
                "PREFIXED",
                "WRITE",
                "exactly-once releases' transactions",
            ),
        ]
    return (
        acls
        + _clock("the forwarder")
        + _created(internal, "start-up")
        + _durability_check(internal)
    )


def proxy_acls(buffer_topic: str = BUFFER_TOPIC, *, ensure_topics: bool = True) -> list[Acl]:
    """The proxy's upstream principal's ACLs (proxy/upstream/producer.py, broker clock, app
    start-up).
    A client's own SASL login is relayed to Kafka and checked as that client, not as this."""
    acls = [
        Acl("TOPIC", TARGETS, "LITERAL", "WRITE", "writes immediate records to their topics"),
        Acl("TOPIC", buffer_topic, "LITERAL", "WRITE", "writes delayed records and cancels"),
        *_clock("the acceptance order"),
    ]
    if ensure_topics:
        internal = [buffer_topic, DEAD_LETTER_TOPIC, CHECKPOINT_TOPIC]
        acls += _created(internal, "start-up (ensure_topics)") + _durability_check(internal)
    return acls


def verifier_acls(
    buffer_topic: str = BUFFER_TOPIC, *, output_topic: str = VERIFIER_TOPIC
) -> list[Acl]:
    """``kdelay verify``'s ACLs (verifier/source.py, verifier/sinks.py)."""
    acls = [
        Acl("TOPIC", buffer_topic, "LITERAL", "READ", "reads schedules and cancels"),
        Acl("TOPIC", TARGETS, "LITERAL", "READ", "reads deliveries (each target topic)"),
        Acl("GROUP", VERIFIER_GROUPS, "PREFIXED", "READ", "Spark's Kafka source's group ids"),
    ]
    if output_topic:
        acls.append(Acl("TOPIC", output_topic, "LITERAL", "WRITE", "publishes window results"))
    return acls


def client_acls() -> list[Acl]:
    """``kdelay send`` / ``kdelay cancel`` through a SASL proxy: checked by the proxy as the
    client's principal (README "Least privilege")."""
    return [
        Acl(
            "TOPIC",
            TARGETS,
            "LITERAL",
            "WRITE",
            "kdelay send to T, and kdelay cancel --topic T (T carries the cancel; the "
            "principal must own the message or be a kdelay administrator)",
        ),
    ]


def table() -> dict[str, list[Acl]]:
    """Every component's ACLs with the default settings (the README's table)."""
    return {
        "proxy": proxy_acls(),
        "replica": replica_acls(),
        "verifier": verifier_acls(),
        "client": client_acls(),
    }


_RESOURCE_FLAGS = {
    "TOPIC": "--topic",
    "GROUP": "--group",
    "TRANSACTIONAL_ID": "--transactional-id",
    "CLUSTER": "--cluster",
}


def kafka_acls_command(principal: str, acl: Acl, bootstrap: str = "BROKER:9093") -> str:
    """The ``kafka-acls.sh`` command that grants ``acl`` to ``principal`` (``User:name``); run
    it as an administrator (``--command-config`` holds that login, never this component's)."""
    parts = [
        "kafka-acls.sh",
        "--bootstrap-server",
        bootstrap,
        "--command-config",
        "admin.properties",
        "--add",
        "--allow-principal",
        principal,
        "--operation",
        "".join(w.capitalize() for w in acl.operation.split("_")),
    ]
    flag = _RESOURCE_FLAGS[acl.resource]
    parts += [flag] if acl.resource == "CLUSTER" else [flag, acl.name]
    if acl.pattern == "PREFIXED":
        parts += ["--resource-pattern-type", "prefixed"]
    return shlex.join(parts)


def markdown_table(principals: dict[str, str] | None = None) -> str:
    """The README's table: component, principal, resource, pattern, operation, why."""
    names = principals or {c: f"User:kdelay-{c}" for c in COMPONENTS}
    rows = ["| component | resource | pattern | operation | required | why |", "|---" * 6 + "|"]
    for component, acls in table().items():
        for acl in acls:
            rows.append(
                f"| {component} ({names[component]}) | {acl.resource} `{acl.name}` | "
                f"{acl.pattern} | {acl.operation} | {'yes' if acl.required else 'no'} | "
                f"{acl.why} |"
            )
    return "\n".join(rows)
