"""Only kdelay writes the buffer: a Kafka ACL letting anyone else WRITE it stops the replicas.

The replicas trust what the buffer topic holds: a record's target, owner and administrator
fields are whatever its writer put there (the proxy stamps them after checking the client's
ACLs). So WRITE on the buffer is a master key: whoever holds it schedules to any topic as any
owner, or cancels anyone's messages as an administrator. Only the proxies and the replicas may
hold it, and the replicas check that Kafka's ACLs say so (DescribeAcls, as ``owner_acls.py``
asks; DESCRIBE on the CLUSTER, ``kdelay/acls.py``):

- the bindings asked are the buffer topic's, MATCH: LITERAL on its name, LITERAL ``*`` and every
  PREFIXED prefix of it, for any principal (``User:*`` included);
- a *foreign writer* is an ALLOW of WRITE or ALL among them for a principal that is not a
  buffer writer (``buffer_writers``, the replica's own login, ``super_users``) and that Kafka's
  DENY bindings do not take back (``acl_rules.write_denied``); ``User:*`` is always foreign;
- at start (:func:`check_at_start`) a foreign writer is a ConfigError naming each binding and
  the ``kafka-acls.sh --remove`` command that deletes it: the replica does not run;
- while running, the master's forwarder calls :class:`BufferWriters` before each round (its
  ``hold``): the bindings are asked again every ``acl_cache_ms`` (at least ``MIN_INTERVAL_S``)
  on the admin client's thread; while a foreign writer exists, or Kafka has not answered for
  ``interval + 2 * ASK_TIMEOUT_S``, the master releases nothing (``forwarder.buffer_writers_
  foreign`` / ``_unknown`` logged once per change, ``kdelay_replica_buffer_foreign_writers``).

What Kafka's admin API does not show cannot be checked: the brokers' ``super.users`` (trusted
like kdelay; the ``super_users`` setting lists them so their bindings are not reported) and
``allow.everyone.if.no.acl.found`` (with it true and no binding on the buffer, anyone may write
it: keep it false). A binding that comes and goes between two asks is not seen, and a record
written while one existed is released once it is gone (docs/security.md says what holds).
Kafka without an authorizer answers SECURITY_DISABLED: anyone may write, nothing is checked.

Threads: :func:`check_at_start` on the start-up thread; a BufferWriters belongs to the forwarder
thread (librdkafka completes its futures on the admin client's thread, read once done).
"""

from __future__ import annotations

import concurrent.futures
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kdelay import logs
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.release.acl_rules import (
    ANY_USER,
    Rule,
    parse_super_users,
    rule_of,
    write_denied,
)
from kdelay.delay_service.release.owner_acls import describe_acls
from kdelay.errors import ConfigError, InfrastructureError

log = logs.get(__name__)

#: The longest one DescribeAcls may take (a start-up check, or the first ask of a master).
ASK_TIMEOUT_S = 5.0
#: The shortest time between two asks while running (``acl_cache_ms`` 0 asks this often).
MIN_INTERVAL_S = 0.5
#: Asks Kafka for the buffer topic's bindings: a future of confluent-kafka ``AclBinding`` s.
Ask = Callable[[], "concurrent.futures.Future[Any]"]


@dataclass(frozen=True, slots=True)
class Foreign:
    """One binding that lets a principal other than kdelay's WRITE the buffer topic."""

    rule: Rule
    host: str

    def describe(self) -> str:
        return f"{self.rule.describe()} from host {self.host}"

    def remove_command(self, bootstrap: str = "BROKER:9093") -> str:
        """The ``kafka-acls.sh`` command that deletes this binding (run as an administrator)."""
        parts = [
            "kafka-acls.sh", "--bootstrap-server", bootstrap,
            "--command-config", "admin.properties", "--remove",
            "--allow-principal", self.rule.principal, "--allow-host", self.host,
            "--operation", self.rule.operation.capitalize(), "--topic", self.rule.name,
        ]  # fmt: skip
        if self.rule.pattern == "PREFIXED":
            parts += ["--resource-pattern-type", "prefixed"]
        return shlex.join(parts)


def writers_of(cfg: ReplicaConfig) -> frozenset[str]:
    """The principals that may WRITE ``cfg``'s buffer topic: ``buffer_writers``, the replica's
    own SASL login, and ``super_users``."""
    own = cfg.kafka_principal()
    listed = (p.strip() for p in cfg.buffer_writers.split(","))
    writers = {p if ":" in p else f"User:{p}" for p in listed if p}
    return frozenset(
        writers | parse_super_users(cfg.super_users) | ({own} if own is not None else set())
    )


def foreign_writers(bindings: Iterable[Any], topic: str, writers: frozenset[str]) -> list[Foreign]:
    """The bindings among ``bindings`` (confluent-kafka ``AclBinding`` s, or anything with the
    same attributes) that let a principal not in ``writers`` WRITE ``topic``."""
    pairs = [(rule_of(b), str(getattr(b, "host", "*"))) for b in bindings]
    rules = [r for r, _ in pairs if r is not None]
    found: list[Foreign] = []
    for rule, host in pairs:
        if rule is None or rule.permission != "ALLOW" or rule.principal in writers:
            continue
        if not rule.applies(rule.principal, topic):
            continue  # not WRITE or ALL, or not this topic
        if write_denied(rules, rule.principal, topic) is not None and rule.principal != ANY_USER:
            continue  # a DENY takes it back
        if rule.principal == ANY_USER and _denied_to_all(rules, topic):
            continue
        found.append(Foreign(rule, host))
    return found


def _denied_to_all(rules: list[Rule], topic: str) -> bool:
    return any(
        r.permission == "DENY" and r.principal == ANY_USER and r.applies(ANY_USER, topic)
        for r in rules
    )


def refusal(found: list[Foreign], topic: str, writers: frozenset[str], bootstrap: str) -> str:
    """The start-up error: each foreign binding and the command that removes it."""
    lines = [
        f"buffer_writers: Kafka's ACLs let {len(found)} principal(s) other than kdelay's buffer "
        f"writers ({', '.join(sorted(writers)) or 'none'}) WRITE {topic}; a record written there "
        "is released to any topic as any owner (docs/security.md, the buffer is a master key). "
        "Remove each binding as a Kafka administrator, or add a principal that is a kdelay "
        "proxy to --buffer-writers:"
    ]
    for one in found:
        lines.append(f"  - {one.describe()}:")
        lines.append(f"      {one.remove_command(bootstrap)}")
    return "\n".join(lines)


def admin_client(cfg: ReplicaConfig) -> AdminClient:
    return AdminClient(
        {
            **cfg.kafka_connection(cfg.bootstrap_servers),
            "client.id": f"kdelay-replica-{cfg.name}-buffer-writers",
        }
    )


def _security_disabled(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError.SECURITY_DISABLED


def _cluster_denied(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def check_at_start(cfg: ReplicaConfig, timeout: float = 30.0) -> None:
    """Raise ConfigError naming each foreign writer of ``cfg``'s buffer topic (module
    docstring); nothing is checked when Kafka has no authorizer."""
    writers = writers_of(cfg)
    admin = admin_client(cfg)
    try:
        bindings = describe_acls(admin, cfg.buffer_topic).result(timeout=timeout)
    except KafkaException as exc:
        if _security_disabled(exc):
            log.info("replica.buffer_writers_unchecked", reason="Kafka has no authorizer")
            return
        if _cluster_denied(exc):
            raise ConfigError(
                f"buffer_writers: the replica may not ask Kafka's ACLs of {cfg.buffer_topic} "
                "(DescribeAcls needs DESCRIBE on the CLUSTER, docs/security.md Least privilege)"
            ) from None
        raise InfrastructureError(
            f"cannot ask Kafka for the ACLs of {cfg.buffer_topic}: {exc}"
        ) from None
    except concurrent.futures.TimeoutError:
        raise InfrastructureError(
            f"Kafka did not answer DescribeAcls of {cfg.buffer_topic} within {timeout:.0f} s"
        ) from None
    found = foreign_writers(bindings or (), cfg.buffer_topic, writers)
    if found:
        raise ConfigError(refusal(found, cfg.buffer_topic, writers, cfg.bootstrap_servers))
    log.info("replica.buffer_writers_checked", topic=cfg.buffer_topic, writers=sorted(writers))


class BufferWriters:
    """The forwarder's hold on a foreign writer of the buffer (module docstring): call it
    before each round; a reason to release nothing, or None."""

    def __init__(
        self,
        ask: Ask,
        topic: str,
        writers: frozenset[str],
        *,
        interval_ms: int,
        metrics: Any = None,
        bootstrap: str = "BROKER:9093",
        clock: Clock = SYSTEM_CLOCK,
        ask_timeout_s: float = ASK_TIMEOUT_S,
    ) -> None:
        self._ask = ask
        self._topic = topic
        self._writers = writers
        self._interval_s = max(interval_ms / 1000, MIN_INTERVAL_S)
        self._metrics = metrics
        self._bootstrap = bootstrap
        self._clock = clock
        self._ask_timeout_s = ask_timeout_s
        self._pending: concurrent.futures.Future[Any] | None = None
        self._sent_at = 0.0
        self._answered_at: float | None = None  # monotonic: when the answering ask was sent
        self._found: list[Foreign] = []
        self._reason: str | None = None

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig, metrics: Any) -> BufferWriters:
        """The hold for ``cfg``'s replica; its admin client is made at the first ask."""
        admin: list[AdminClient] = []

        def ask() -> concurrent.futures.Future[Any]:
            if not admin:
                admin.append(admin_client(cfg))
            return describe_acls(admin[0], cfg.buffer_topic)

        return cls(
            ask,
            cfg.buffer_topic,
            writers_of(cfg),
            interval_ms=cfg.acl_cache_ms,
            metrics=metrics,
            bootstrap=cfg.bootstrap_servers,
        )

    @property
    def found(self) -> list[Foreign]:
        """The foreign writers of the last answer."""
        return list(self._found)

    def __call__(self) -> str | None:
        now = self._clock.monotonic()
        self._harvest()
        if self._answered_at is None or now - self._sent_at >= self._interval_s:
            self._send(now)
        if self._answered_at is None and self._pending is not None:
            concurrent.futures.wait([self._pending], timeout=self._ask_timeout_s)
            self._harvest()
            now = self._clock.monotonic()
        reason = None
        if self._found:
            reason = (
                f"Kafka lets {len(self._found)} principal(s) other than kdelay's buffer writers "
                f"WRITE {self._topic}: " + "; ".join(f.describe() for f in self._found)
            )
        elif self._answered_at is None or (
            now - self._answered_at > self._interval_s + 2 * self._ask_timeout_s
        ):
            reason = f"Kafka's ACLs of {self._topic} are not known (DescribeAcls did not answer)"
        self._changed(reason)
        return reason

    def _send(self, now: float) -> None:
        if self._pending is not None and now - self._sent_at < 2 * self._ask_timeout_s:
            return
        try:
            self._pending = self._ask()
        except (KafkaException, ValueError, TypeError) as exc:
            self._pending = None
            log.warning("forwarder.buffer_writers_ask_failed", error=str(exc))
        self._sent_at = now

    def _harvest(self) -> None:
        future = self._pending
        if future is None or not future.done():
            return
        self._pending = None
        try:
            bindings = future.result()
        except KafkaException as exc:
            if not _security_disabled(exc):
                log.warning("forwarder.buffer_writers_ask_failed", error=str(exc))
                return
            bindings = ()  # no authorizer: nothing to find
        self._found = foreign_writers(bindings or (), self._topic, self._writers)
        self._answered_at = self._sent_at

    def _changed(self, reason: str | None) -> None:
        if self._metrics is not None:
            self._metrics.buffer_foreign_writers.set(len(self._found))
        if reason == self._reason:
            return
        self._reason = reason
        if reason is None:
            log.info("forwarder.buffer_writers_clear", topic=self._topic)
        elif self._found:
            log.error(
                "forwarder.buffer_writers_foreign",
                topic=self._topic,
                bindings=[f.describe() for f in self._found],
                remove=[f.remove_command(self._bootstrap) for f in self._found],
                consequence="no release until these bindings are removed",
            )
        else:
            log.error("forwarder.buffer_writers_unknown", topic=self._topic, reason=reason)


def combined(*holds: Callable[[], str | None]) -> Callable[[], str | None]:
    """A hold that asks each of ``holds`` (every one, each round) and gives the first reason."""

    def hold() -> str | None:
        reasons = [h() for h in holds]
        return next((r for r in reasons if r is not None), None)

    return hold
