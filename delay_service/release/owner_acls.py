"""A revoked owner stops writing: before a release, its owner must still be allowed to WRITE.

A message sent through a secured proxy carries its owner (the principal that scheduled it,
``Scheduled.owner``). The proxy checked that owner's WRITE on the target when it accepted the
message; a series' occurrences and messages due later are released by the replicas as their
own principal, so without a check here a user whose ACLs were deleted went on writing through
kdelay. Before each round's releases :meth:`OwnerAcls.screen` asks Kafka (DescribeAcls on the
target topic, MATCH: its LITERAL, PREFIXED and wildcard bindings; it needs DESCRIBE on the
CLUSTER, ``kdelay/acls.py``) and decides as Kafka does (``acl_rules.py``). Per entry of the scan:

- no owner, or the owner a super user (``super_users``): released as before, nothing asked;
- Kafka allows the owner WRITE on the target: released as before;
- Kafka does not: the entry is released to the dead-letter topic instead, as a poison record is
  (``ingest/poison.py``): the original key, value and headers, ``kdelay-error``
  (``TOPIC_AUTHORIZATION_FAILED: <who may no longer WRITE what, and why>``) and
  ``kdelay-target``; its status says dead-lettered with that reason. A series ends there (its
  next occurrence is not written): a revoked owner's series would otherwise dead-letter every
  occurrence for ever;
- Kafka cannot be asked (DescribeAcls failed or did not answer): the entry is neither released
  nor dead-lettered. The scan passes it over as it passes over a held target's entries (it stays
  pending; the checkpoint stays below it; its target's later entries wait behind it in this pass),
  the topic is asked again after a backoff (``retry_backoff_ms`` doubling to
  ``retry_backoff_max_ms``), ``kdelay_replica_owner_acl_failures_total`` counts the failures and
  ``forwarder.owner_acls_unknown`` logs each.

The bound: an answer is used for ``acl_cache_ms`` from when its request was *sent*, so a
release happens at most ``acl_cache_ms`` after Kafka applied a revocation (0: asked every
round). Answers are kept per target topic (all principals' bindings at once) and decided per
owner. A topic in use is asked again in the background (the admin client's own thread) once
half of that has passed, so a round waits for Kafka only for a topic it has no fresh answer for
(one DescribeAcls per such topic, all at once, at most ``ASK_TIMEOUT_S``). Kafka without an
authorizer answers SECURITY_DISABLED: everyone may write, nothing is refused.

Threads: an OwnerAcls belongs to the forwarder thread; librdkafka completes its futures on the
admin client's thread, read here only once done.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBindingFilter, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from kdelay import headers as h
from kdelay import logs
from kdelay.backoff import Backoff
from kdelay.buffer import DEAD_LETTER_TOPIC
from kdelay.clock import SYSTEM_CLOCK, Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.acl_rules import (
    Rule,
    parse_super_users,
    rule_of,
    write_denied,
)
from kdelay.delay_service.release.sender import ERROR_HEADER, TARGET_HEADER
from kdelay.delay_service.store.due_scan import DueScan
from kdelay.delay_service.store.entry import Entry

log = logs.get(__name__)

#: The longest a round waits for Kafka's answers about topics it has none for.
ASK_TIMEOUT_S = 5.0
#: After a failed ask, the wait before the topic is asked again (a replica's: its release
#: retry backoff, ``retry_backoff_ms`` doubling to ``retry_backoff_max_ms``).
ASK_BACKOFF = Backoff(0.1, 5.0)
#: The ``kdelay-error`` of a release refused because its owner may no longer WRITE the target.
REFUSED_ERROR = "TOPIC_AUTHORIZATION_FAILED"

#: confluent-kafka's "any string" in a filter (None; its type hints want a str).
_ANY = cast("str", None)
#: Asks Kafka for a topic's ACL bindings: a future of confluent-kafka ``AclBinding`` s.
Ask = Callable[[str], "concurrent.futures.Future[Any]"]


@dataclass(slots=True)
class _Topic:
    """What is known about one target topic's ACLs."""

    rules: tuple[Rule, ...] | None = None  # None: no authorizer (everyone may write)
    answered_at: float | None = None  # monotonic: when the request that answered was sent
    pending: concurrent.futures.Future[Any] | None = None
    sent_at: float = 0.0
    failures: int = 0  # asks in a row that failed
    retry_at: float = 0.0  # monotonic: no new ask before this after a failure


class OwnerAcls:
    """Screens each round's due entries by their owners' WRITE on their targets."""

    def __init__(
        self,
        ask: Ask,
        metrics: Metrics,
        *,
        cache_ms: int,
        super_users: frozenset[str] = frozenset(),
        backoff: Backoff = ASK_BACKOFF,
        clock: Clock = SYSTEM_CLOCK,
        ask_timeout_s: float = ASK_TIMEOUT_S,
    ) -> None:
        self._ask = ask
        self._metrics = metrics
        self._cache_s = cache_ms / 1000
        self._super_users = super_users
        self._backoff = backoff
        self._clock = clock
        self._ask_timeout_s = ask_timeout_s
        self._topics: dict[str, _Topic] = {}

    @classmethod
    def for_replica(cls, cfg: ReplicaConfig, metrics: Metrics, clock: Clock) -> OwnerAcls:
        """The check for ``cfg``'s replica: its Kafka login, ``acl_cache_ms``, ``super_users``;
        the admin client is created at the first owned message (never without owners)."""
        admin: list[AdminClient] = []

        def ask(topic: str) -> concurrent.futures.Future[Any]:
            if not admin:
                admin.append(_admin_client(cfg))
            return describe_acls(admin[0], topic)

        backoff = Backoff(cfg.retry_backoff_ms / 1000, cfg.retry_backoff_max_ms / 1000)
        return cls(
            ask,
            metrics,
            cache_ms=cfg.acl_cache_ms,
            super_users=parse_super_users(cfg.super_users),
            backoff=backoff,
            clock=clock,
        )

    def screen(self, scan: DueScan) -> DueScan:
        """``scan`` with the entries of owners Kafka no longer allows to WRITE their target
        addressed to the dead-letter topic, and those it could not be asked about passed over."""
        owned = {
            e.message.topic
            for e in scan.entries
            if e.message.owner is not None and e.message.owner not in self._super_users
        }
        if not owned:
            return scan
        verdicts = self._verdicts(owned)
        kept: list[Entry] = []
        unknown: list[Entry] = []
        for entry in scan.entries:
            msg = entry.message
            if msg.owner is None or msg.owner in self._super_users:
                kept.append(entry)
                continue
            if msg.topic not in verdicts:
                unknown.append(entry)
                continue
            rules = verdicts[msg.topic]
            reason = None if rules is None else write_denied(rules, msg.owner, msg.topic)
            kept.append(entry if reason is None else self._refused(entry, reason))
        self._metrics.owner_unchecked.set(len(unknown))
        if not unknown:
            return dataclasses.replace(scan, entries=kept)
        first = min(e.message.deliver_at_ms for e in unknown)
        if scan.first_skipped_ms is not None:
            first = min(first, scan.first_skipped_ms)
        return dataclasses.replace(
            scan,
            entries=kept,
            skipped=scan.skipped + len(unknown),
            first_skipped_ms=first,
            passed=scan.passed | {(e.message.topic, e.message.partition) for e in unknown},
        )

    # -- Kafka's answers -------------------------------------------------------------------

    def _verdicts(self, topics: set[str]) -> dict[str, tuple[Rule, ...] | None]:
        """The bindings of each of ``topics`` Kafka answered within the cache time (None: no
        authorizer); a topic missing from the result could not be asked."""
        began = now = self._clock.monotonic()
        self._harvest(now)
        waiting: list[concurrent.futures.Future[Any]] = []
        for topic in topics:
            state = self._topics.setdefault(topic, _Topic())
            if self._fresh(state, now):
                assert state.answered_at is not None
                if now - state.answered_at >= self._cache_s / 2:
                    self._send(topic, state, now)  # ahead of expiry, not waited for
            elif now >= state.retry_at:
                future = self._send(topic, state, now)
                if future is not None:
                    waiting.append(future)
        if waiting:
            concurrent.futures.wait(waiting, timeout=self._ask_timeout_s)
            now = self._clock.monotonic()
            self._harvest(now)
            for topic in topics:
                state = self._topics[topic]
                if state.pending is not None and state.pending in waiting:
                    self._failed(topic, state, now, "no answer in time")
        now = self._clock.monotonic()
        return {
            t: self._topics[t].rules for t in topics if self._fresh(self._topics[t], now, began)
        }

    def _fresh(self, state: _Topic, now: float, began: float | None = None) -> bool:
        """Whether ``state``'s answer may be used: asked within the cache time, or (a cache
        time of 0) during this round, which ``began`` then."""
        at = state.answered_at
        if at is None:
            return False
        return now - at < self._cache_s or (began is not None and at >= began)

    def _send(self, topic: str, state: _Topic, now: float) -> concurrent.futures.Future[Any] | None:
        """Ask about ``topic`` unless a question is already out; the future asked, or None."""
        if state.pending is not None:
            if now - state.sent_at < 2 * self._ask_timeout_s:
                return state.pending
            state.pending = None  # librdkafka's request timeout should have ended it: ask anew
        try:
            state.pending = self._ask(topic)
        except (KafkaException, ValueError, TypeError) as exc:
            self._failed(topic, state, now, str(exc))
            return None
        state.sent_at = now
        return state.pending

    def _harvest(self, now: float) -> None:
        """Take the answers that arrived."""
        for topic, state in self._topics.items():
            future = state.pending
            if future is None or not future.done():
                continue
            state.pending = None
            try:
                bindings = future.result()
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.SECURITY_DISABLED:
                    self._answered(state, None)  # no authorizer: Kafka allows everyone
                else:
                    self._failed(topic, state, now, str(exc))
                continue
            rules = (rule_of(b) for b in bindings or ())
            self._answered(state, tuple(r for r in rules if r is not None))

    def _answered(self, state: _Topic, rules: tuple[Rule, ...] | None) -> None:
        if state.answered_at is None or state.sent_at >= state.answered_at:
            state.rules, state.answered_at = rules, state.sent_at
        state.failures = 0
        state.retry_at = 0.0

    def _failed(self, topic: str, state: _Topic, now: float, error: str) -> None:
        state.failures += 1
        wait_s = self._backoff.delay(state.failures)
        state.retry_at = now + wait_s
        self._metrics.owner_acl_failures.inc()
        log.warning(
            "forwarder.owner_acls_unknown",
            topic=topic,
            error=error,
            failures=state.failures,
            backoff_ms=int(wait_s * 1000),
            consequence="its owned messages stay pending: neither released nor dead-lettered",
        )

    # -- a refused release -------------------------------------------------------------------

    def _refused(self, entry: Entry, reason: str) -> Entry:
        msg = entry.message
        self._metrics.owner_refused.inc()
        log.warning(
            "forwarder.owner_write_refused",
            id=msg.id,
            owner=msg.owner,
            topic=msg.topic,
            partition=msg.partition,
            occurrence=msg.occurrence if msg.repeat is not None else None,
            reason=reason,
        )
        return refused_entry(entry, reason)


def count_released(metrics: Metrics, released: list[Entry]) -> None:
    """Count what a round released: a refused release (addressed to the dead-letter topic by
    :func:`refused_entry`) is a dead letter with its reason, not a forwarded message."""
    refused = sum(1 for e in released if _is_refused(e))
    metrics.forwarded.inc(len(released) - refused)
    if refused:
        metrics.dead_lettered.labels(REFUSED_ERROR).inc(refused)


def _is_refused(entry: Entry) -> bool:
    msg = entry.message
    if msg.topic != DEAD_LETTER_TOPIC:
        return False
    error = dict(msg.headers).get(ERROR_HEADER)
    return error is not None and error.startswith(f"{REFUSED_ERROR}: ".encode())


def refused_entry(entry: Entry, reason: str) -> Entry:
    """``entry`` addressed to the dead-letter topic with ``reason`` (a series' occurrence keeps
    its number as a header and ends there)."""
    msg = entry.message
    extra: list[tuple[str, bytes | None]] = [
        (ERROR_HEADER, f"{REFUSED_ERROR}: {reason}".encode("utf-8", "backslashreplace")),
        (TARGET_HEADER, f"{msg.topic}/{msg.partition}".encode("utf-8", "backslashreplace")),
    ]
    if msg.repeat is not None:
        extra.append((h.OCCURRENCE, str(msg.occurrence).encode()))
    moved = dataclasses.replace(
        msg, topic=DEAD_LETTER_TOPIC, partition=-1, headers=(*msg.headers, *extra), repeat=None
    )
    return dataclasses.replace(entry, message=moved)


def _admin_client(cfg: ReplicaConfig) -> AdminClient:
    return AdminClient(
        {**cfg.kafka_connection(cfg.bootstrap_servers), "client.id": f"kdelay-replica-{cfg.name}"}
    )


def describe_acls(admin: AdminClient, topic: str) -> concurrent.futures.Future[Any]:
    """DescribeAcls of every binding that applies to ``topic`` (MATCH: literal, prefixed and
    ``*``), any principal, any operation: what Kafka's authorizer decides from."""
    match = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.MATCH,
        _ANY,  # every principal's: User:* and each owner's decide together
        _ANY,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    future: concurrent.futures.Future[Any] = admin.describe_acls(
        match, request_timeout=ASK_TIMEOUT_S
    )
    return future
