"""Whether a principal may WRITE a topic, decided from Kafka's ACL bindings as Kafka decides it.

The owner check before a release (``owner_acls.py``) asks Kafka for the bindings of a target
topic (DescribeAcls) and decides here, the way KRaft's StandardAuthorizer does for a Produce:

- a *super user* (the brokers' ``super.users``, which the Admin API does not show: the
  replicas' ``super_users`` setting repeats it) may do anything;
- a binding applies to topic ``T`` when its resource is TOPIC and its pattern is LITERAL ``T``,
  LITERAL ``*`` (the wildcard) or PREFIXED by a prefix of ``T``; to the principal ``P`` when it
  names ``P`` or ``User:*``; to WRITE when its operation is WRITE or ALL;
- one DENY that applies denies, whatever ALLOWs apply; else one ALLOW allows; else the
  principal is denied (Kafka's ``allow.everyone.if.no.acl.found`` is a broker setting kdelay
  cannot see: with it true Kafka would allow a topic no binding names, kdelay does not).

Hosts are not looked at: the owner writes through a proxy whose address kdelay's replicas do
not know, so a binding counts from whatever host it names (a DENY from one host denies).

Pure functions on immutable values; any thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The principal every ``User:`` principal matches (Kafka's wildcard principal).
ANY_USER = "User:*"
#: A LITERAL resource name that matches every topic.
WILDCARD = "*"
_WRITE_OPS = frozenset(("WRITE", "ALL"))


@dataclass(frozen=True, slots=True)
class Rule:
    """One topic ACL binding, reduced to what the decision reads."""

    pattern: str  # LITERAL or PREFIXED
    name: str
    principal: str
    operation: str  # WRITE, ALL, READ, ...
    permission: str  # ALLOW or DENY

    def applies(self, principal: str, topic: str) -> bool:
        """Whether this binding speaks about ``principal`` writing ``topic``."""
        if self.operation not in _WRITE_OPS or self.principal not in (principal, ANY_USER):
            return False
        if self.pattern == "LITERAL":
            return self.name in (topic, WILDCARD)
        return self.pattern == "PREFIXED" and topic.startswith(self.name)

    def describe(self) -> str:
        """``DENY WRITE on TOPIC orders* for User:alice`` (prefixed names end with ``*``)."""
        name = f"{self.name}*" if self.pattern == "PREFIXED" else self.name
        return f"{self.permission} {self.operation} on TOPIC {name} for {self.principal}"


def rule_of(binding: Any) -> Rule | None:
    """A confluent-kafka ``AclBinding`` as a Rule; None for one that is not about a topic."""
    if _name(binding.restype) != "TOPIC":
        return None
    return Rule(
        _name(binding.resource_pattern_type),
        str(binding.name),
        str(binding.principal),
        _name(binding.operation),
        _name(binding.permission_type),
    )


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's ``super.users`` format, ``User:admin;User:kdelay``, as a set of principals (a
    bare name is taken as a ``User:`` principal)."""
    names = (part.strip() for part in text.split(";"))
    return frozenset(n if ":" in n else f"User:{n}" for n in names if n)


def write_denied(
    rules: Iterable[Rule], principal: str, topic: str, super_users: frozenset[str] = frozenset()
) -> str | None:
    """None when Kafka allows ``principal`` to WRITE ``topic`` by ``rules`` (the topic's
    bindings), else why not, naming the missing or denying ACL."""
    if principal in super_users:
        return None
    allowed = False
    for rule in rules:
        if not rule.applies(principal, topic):
            continue
        if rule.permission == "DENY":
            return f"{principal} may not WRITE topic {topic}: Kafka's ACL {rule.describe()}"
        allowed = allowed or rule.permission == "ALLOW"
    if allowed:
        return None
    return f"{principal} may no longer WRITE topic {topic}: no Kafka ACL allows it"
