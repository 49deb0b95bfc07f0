"""A revoked owner stops writing: Kafka's rule for WRITE on a topic (acl_rules.py) and the
screen of a round's due entries by their owners (owner_acls.py), with a fake DescribeAcls."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from kdelay import headers as h
from kdelay.backoff import Backoff
from kdelay.buffer import DEAD_LETTER_TOPIC, Scheduled
from kdelay.clock import Clock
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.acl_rules import (
    Rule,
    parse_super_users,
    rule_of,
    write_denied,
)
from kdelay.delay_service.release.delivery_reports import fate_of
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.release.in_flight import Completion
from kdelay.delay_service.release.owner_acls import OwnerAcls
from kdelay.delay_service.release.sender import ERROR_HEADER, Sender
from kdelay.delay_service.release.series import next_occurrence
from kdelay.delay_service.store.due_scan import DueScan
from kdelay.delay_service.store.entry import Entry, entry_key
from kdelay.delay_service.store.outcomes import DEAD_LETTERED
from kdelay.delay_service.store.store import Store
from tests.support.fakes import FakeClock, FakeProducer
from tests.support.forwarder_rigs import FakeCheckpoints, FakeIngest, ids_to, msg

ALICE, BOB = "User:alice", "User:bob"
T0 = 1_800_000_000_000


def allow(name: str, principal: str = ALICE, op: str = "WRITE", pattern: str = "LITERAL") -> Rule:
    return Rule(pattern, name, principal, op, "ALLOW")


def deny(name: str, principal: str = ALICE, op: str = "WRITE", pattern: str = "LITERAL") -> Rule:
    return Rule(pattern, name, principal, op, "DENY")


# -- Kafka's rule ------------------------------------------------------------------------------


def test_a_literal_allow_names_exactly_its_topic() -> None:
    assert write_denied([allow("orders")], ALICE, "orders") is None
    assert write_denied([allow("orders")], ALICE, "orders-eu") is not None
    assert write_denied([allow("orders")], BOB, "orders") is not None


def test_a_prefixed_allow_covers_every_topic_it_begins() -> None:
    rules = [allow("orders-", pattern="PREFIXED")]
    assert write_denied(rules, ALICE, "orders-eu") is None
    assert write_denied(rules, ALICE, "orders-") is None
    assert write_denied(rules, ALICE, "orders") is not None


def test_the_wildcard_topic_and_the_wildcard_user() -> None:
    assert write_denied([allow("*")], ALICE, "anything") is None
    assert write_denied([allow("orders", "User:*")], BOB, "orders") is None
    # A PREFIXED "*" is a prefix of the character "*", not a wildcard.
    assert write_denied([allow("*", pattern="PREFIXED")], ALICE, "orders") is not None


def test_all_implies_write_and_other_operations_do_not() -> None:
    assert write_denied([allow("orders", op="ALL")], ALICE, "orders") is None
    for op in ("READ", "DESCRIBE", "CREATE", "ALTER", "IDEMPOTENT_WRITE"):
        reason = write_denied([allow("orders", op=op)], ALICE, "orders")
        assert reason == f"{ALICE} may no longer WRITE topic orders: no Kafka ACL allows it"


def test_a_deny_wins_over_every_allow() -> None:
    allows = [allow("*"), allow("orders"), allow("or", pattern="PREFIXED"), allow("*", "User:*")]
    for denial in (
        deny("orders"),
        deny("*"),
        deny("ord", pattern="PREFIXED"),
        deny("orders", "User:*"),
        deny("orders", op="ALL"),
    ):
        reason = write_denied([*allows, denial], ALICE, "orders")
        assert reason is not None, denial
        assert denial.describe() in reason
    # A DENY of another user, topic or operation changes nothing.
    others = [deny("orders", BOB), deny("payments"), deny("orders", op="READ")]
    assert write_denied([*allows, *others], ALICE, "orders") is None


def test_no_acl_at_all_denies_and_a_super_user_needs_none() -> None:
    assert write_denied([], ALICE, "orders") is not None
    supers = parse_super_users("User:admin; alice ;")
    assert supers == frozenset({"User:admin", "User:alice"})
    assert write_denied([deny("orders")], ALICE, "orders", supers) is None
    assert parse_super_users("") == frozenset()


def test_rule_of_reads_confluent_kafka_bindings() -> None:
    binding = AclBinding(
        ResourceType.TOPIC,
        "orders-",
        ResourcePatternType.PREFIXED,
        ALICE,
        "*",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    assert rule_of(binding) == Rule("PREFIXED", "orders-", ALICE, "WRITE", "DENY")
    group = AclBinding(
        ResourceType.GROUP,
        "g",
        ResourcePatternType.LITERAL,
        ALICE,
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    assert rule_of(group) is None


# -- the screen of a round -------------------------------------------------------------------


def binding(rule: Rule) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        rule.name,
        ResourcePatternType[rule.pattern],
        rule.principal,
        "*",
        AclOperation[rule.operation],
        AclPermissionType[rule.permission],
    )


@dataclass
class FakeKafka:
    """DescribeAcls over a list of rules; ``down`` fails every question, ``silent`` never
    answers."""

    rules: list[Rule]
    down: bool = False
    silent: bool = False
    no_authorizer: bool = False
    asked: int = 0

    def ask(self, topic: str) -> concurrent.futures.Future[Any]:
        self.asked += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.silent:
            return future
        if self.no_authorizer:
            future.set_exception(KafkaException(KafkaError(KafkaError.SECURITY_DISABLED)))
        elif self.down:
            future.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT)))
        else:
            future.set_result([binding(r) for r in self.rules])
        return future


def entry(
    msg_id: str,
    owner: str | None,
    topic: str = "orders",
    offset: int = 0,
    repeat: str | None = None,
) -> Entry:
    due = T0 + offset
    msg = Scheduled(msg_id, topic, 0, b"k", b"v", due, (("h", b"1"),), uid=msg_id, owner=owner)
    if repeat is not None:
        msg = Scheduled(
            msg_id, topic, 0, b"k", b"v", due, (("h", b"1"),), uid=msg_id, owner=owner,
            repeat=repeat, occurrence=3,
        )  # fmt: skip
    return Entry(entry_key(due, 0, offset), msg, 0, offset)


def scan_of(*entries: Entry) -> DueScan:
    return DueScan(list(entries), 0, None, entries[-1].message.deliver_at_ms, False)


def screen(
    kafka: FakeKafka, clock: FakeClock, cache_ms: int = 5_000, supers: str = ""
) -> tuple[OwnerAcls, Metrics]:
    metrics = Metrics()
    acls = OwnerAcls(
        kafka.ask,
        metrics,
        cache_ms=cache_ms,
        super_users=parse_super_users(supers),
        backoff=Backoff(0.1, 5.0),
        clock=clock,
        ask_timeout_s=0.01,
    )
    return acls, metrics


def value(metrics: Metrics, name: str) -> float:
    got = metrics.registry.get_sample_value(name)
    return 0.0 if got is None else got


def test_messages_without_an_owner_are_never_asked_about() -> None:
    kafka, clock = FakeKafka([]), FakeClock()
    acls, _ = screen(kafka, clock)
    scan = scan_of(entry("a", None), entry("b", None, offset=1))
    assert acls.screen(scan) is scan
    assert kafka.asked == 0


def test_an_allowed_owner_is_released_and_a_revoked_one_dead_lettered_with_the_reason() -> None:
    kafka, clock = FakeKafka([allow("orders")]), FakeClock()
    acls, metrics = screen(kafka, clock)
    mine, bobs, nobody = entry("a", ALICE), entry("b", BOB, offset=1), entry("c", None, offset=2)
    out = acls.screen(scan_of(mine, bobs, nobody))
    assert kafka.asked == 1  # one question for the topic, whoever owns its messages
    assert [e.message for e in out.entries[::2]] == [mine.message, nobody.message]
    refused = out.entries[1]
    assert (refused.key, refused.partition, refused.offset) == (bobs.key, 0, 1)
    assert refused.message.topic == DEAD_LETTER_TOPIC
    assert refused.message.partition == -1
    headers = dict(refused.message.headers)
    assert headers["kdelay-error"] == (
        b"TOPIC_AUTHORIZATION_FAILED: User:bob may no longer WRITE topic orders: "
        b"no Kafka ACL allows it"
    )
    assert headers["kdelay-target"] == b"orders/0"
    assert headers["h"] == b"1"
    assert value(metrics, "kdelay_replica_owner_refused_total") == 1
    # Its status: dead-lettered, with that reason.
    fate = fate_of(Completion(refused, False, None, T0))
    assert fate.state == DEAD_LETTERED
    assert fate.reason is not None
    assert "User:bob may no longer WRITE topic orders" in fate.reason


def test_a_refused_occurrence_ends_its_series_and_keeps_its_number() -> None:
    kafka, clock = FakeKafka([]), FakeClock()
    acls, _ = screen(kafka, clock)
    out = acls.screen(scan_of(entry("s", ALICE, repeat="R/PT1S")))
    refused = out.entries[0]
    assert next_occurrence(refused, "__kdelay_buffer") is None
    assert dict(refused.message.headers)[h.OCCURRENCE] == b"3"


def test_a_super_user_is_released_without_asking() -> None:
    kafka, clock = FakeKafka([]), FakeClock()
    acls, _ = screen(kafka, clock, supers="User:alice")
    scan = scan_of(entry("a", ALICE))
    assert acls.screen(scan) is scan
    assert kafka.asked == 0


def test_kafka_without_an_authorizer_refuses_nothing() -> None:
    kafka, clock = FakeKafka([], no_authorizer=True), FakeClock()
    acls, _ = screen(kafka, clock)
    mine = entry("a", ALICE)
    assert [e.message for e in acls.screen(scan_of(mine)).entries] == [mine.message]


def test_answers_are_reused_for_the_cache_time_and_refreshed_ahead_of_it() -> None:
    kafka, clock = FakeKafka([allow("orders")]), FakeClock()
    acls, _ = screen(kafka, clock, cache_ms=1_000)
    scan = scan_of(entry("a", ALICE))
    acls.screen(scan)
    clock.advance(0.4)
    acls.screen(scan)
    assert kafka.asked == 1  # fresh: not asked again
    clock.advance(0.2)  # past half the cache time: asked again, not waited for
    acls.screen(scan)
    assert kafka.asked == 2
    # Revoked meanwhile: once the answer is older than the cache time, the owner is refused.
    kafka.rules = []
    clock.advance(0.5)  # the refresh answered at 0.6 s (allowed) is used until 1.6 s
    assert acls.screen(scan).entries[0].message.topic == "orders"
    clock.advance(1.0)
    assert acls.screen(scan).entries[0].message.topic == DEAD_LETTER_TOPIC


def test_a_cache_time_of_zero_asks_every_round() -> None:
    kafka, clock = FakeKafka([allow("orders")]), FakeClock()
    acls, _ = screen(kafka, clock, cache_ms=0)
    scan = scan_of(entry("a", ALICE))
    for _ in range(3):
        assert acls.screen(scan).entries[0].message.topic == "orders"
    assert kafka.asked == 3


@pytest.mark.parametrize("failure", ["down", "silent"])
def test_kafka_that_cannot_be_asked_holds_the_messages_pending_and_backs_off(failure: str) -> None:
    kafka, clock = FakeKafka([allow("orders")]), FakeClock()
    setattr(kafka, failure, True)
    acls, metrics = screen(kafka, clock)
    mine, nobody = entry("a", ALICE), entry("b", None, topic="other", offset=1)
    out = acls.screen(scan_of(mine, nobody))
    # Neither released nor dead-lettered: passed over like a held target's entry, so the
    # checkpoint stays below it.
    assert [e.message for e in out.entries] == [nobody.message]
    assert (out.skipped, out.first_skipped_ms) == (1, mine.message.deliver_at_ms)
    assert ("orders", 0) in out.passed
    assert value(metrics, "kdelay_replica_owner_acl_failures_total") == 1
    assert value(metrics, "kdelay_replica_owner_unchecked_messages") == 1
    asked = kafka.asked
    acls.screen(scan_of(mine))  # within the backoff: not asked again
    assert kafka.asked == asked
    # Kafka answers again: after the backoff the owner is asked about and released.
    kafka.down = kafka.silent = False
    clock.advance(0.2)
    out = acls.screen(scan_of(mine))
    assert [e.message for e in out.entries] == [mine.message]
    assert value(metrics, "kdelay_replica_owner_unchecked_messages") == 0


def test_an_expired_answer_is_not_used_when_kafka_stops_answering() -> None:
    kafka, clock = FakeKafka([allow("orders")]), FakeClock()
    acls, _ = screen(kafka, clock, cache_ms=1_000)
    scan = scan_of(entry("a", ALICE))
    assert len(acls.screen(scan).entries) == 1
    kafka.down = True
    clock.advance(1.5)
    out = acls.screen(scan)
    assert out.entries == []
    assert out.skipped == 1


# -- in the forwarder's round (at-least-once; the integration test runs exactly-once) ----------


def forwarder_rig(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka: FakeKafka,
    metrics: Metrics | None = None,
) -> tuple[Forwarder, Store, FakeProducer, FakeCheckpoints]:
    def for_replica(cfg: ReplicaConfig, metrics: Metrics, clock: Clock) -> OwnerAcls:
        return OwnerAcls(kafka.ask, metrics, cache_ms=5_000, clock=clock, ask_timeout_s=0.01)

    monkeypatch.setattr(OwnerAcls, "for_replica", staticmethod(for_replica))
    cfg = ReplicaConfig(name="r1", checkpoint_interval_ms=1, retry_backoff_ms=1)
    clock = FakeClock(now_ms=1_000_000, mono=50.0)
    producer = FakeProducer()
    producer.clock = clock
    sender = Sender(lambda: producer, buffer_topic=cfg.buffer_topic, produce_timeout_ms=1_000)
    store = Store(tmp_path / "db")
    fwd = Forwarder(
        cfg,
        store,
        FakeIngest(),
        metrics or Metrics(),
        sender=sender,
        on_fenced=lambda _: None,
        clock=clock,
    )
    return fwd, store, producer, FakeCheckpoints()


def owned(i: int, at: int, owner: str | None) -> Scheduled:
    return dataclasses.replace(msg(i, at), owner=owner)


def test_the_round_dead_letters_a_revoked_owner_and_releases_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    fwd, store, producer, cps = forwarder_rig(
        tmp_path, monkeypatch, FakeKafka([allow("t", BOB)]), metrics
    )
    try:
        store.apply(
            [(0, 0, owned(1, 100, ALICE)), (0, 1, owned(2, 200, BOB)), (0, 2, owned(3, 300, None))],
            {0: 3},
        )
        fwd.forward_once(cps, fwd.control.activate(cps))
        assert ids_to(producer, "t") == ["m2", "m3"]
        [dead] = producer.to(DEAD_LETTER_TOPIC)
        assert dict(dead.headers)[ERROR_HEADER] == (
            b"TOPIC_AUTHORIZATION_FAILED: User:alice may no longer WRITE topic t: "
            b"no Kafka ACL allows it"
        )
        assert store.pending == 0
        # Counted as a dead letter with its reason, not as a release.
        sample = metrics.registry.get_sample_value
        assert sample("kdelay_replica_forwarded_total") == 2
        reason = {"reason": "TOPIC_AUTHORIZATION_FAILED"}
        assert sample("kdelay_replica_dead_lettered_total", reason) == 1
    finally:
        store.close()


def test_the_round_holds_an_owner_kafka_cannot_be_asked_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka = FakeKafka([allow("t")], down=True)
    fwd, store, producer, cps = forwarder_rig(tmp_path, monkeypatch, kafka)
    try:
        store.apply([(0, 0, owned(1, 100, ALICE)), (0, 1, owned(2, 200, None))], {0: 2})
        fwd.forward_once(cps, fwd.control.activate(cps))
        assert ids_to(producer, "t") == ["m2"]
        assert producer.to(DEAD_LETTER_TOPIC) == []
        assert store.pending == 1
        assert cps.writes[-1][0] < 100  # the claim stays below the held message
    finally:
        store.close()
