"""The internal topics' durability: auto replication and min ISR, checks, weak-topic warnings.

A fake AdminClient stands in for Kafka (the real cluster is in
tests/integration/test_internal_topics.py).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from kdelay import topics
from kdelay.buffer import BUFFER_TOPIC, CANCEL_WINDOW_MS, DEAD_LETTER_TOPIC
from kdelay.config_loader import load
from kdelay.delay_service import startup
from kdelay.delay_service.config import ReplicaConfig
from kdelay.errors import ConfigError
from kdelay.proxy.config import ProxyConfig
from kdelay.topics import (
    BUFFER_TOPIC_CONFIG,
    CHECKPOINT_TOPIC,
    MIN_COMPACTION_LAG_MS,
    Durability,
    WeakTopic,
)


def _done(value: object) -> Future[object]:
    future: Future[object] = Future()
    future.set_result(value)
    return future


@dataclass
class _Partition:
    replicas: list[int]


@dataclass
class _Topic:
    partitions: dict[int, _Partition]


@dataclass
class _Entry:
    value: str


@dataclass
class FakeAdmin:
    """Brokers 1..``brokers``; ``existing`` topic -> (replication, min.insync.replicas)."""

    brokers: int
    existing: dict[str, tuple[int, int]] = field(default_factory=dict)
    created: list[Any] = field(default_factory=list)

    def __call__(self, _conf: dict[str, str]) -> FakeAdmin:
        return self  # stands in for the AdminClient class

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(
            brokers={i: object() for i in range(1, self.brokers + 1)},
            topics={
                name: _Topic({p: _Partition(list(range(1, rf + 1))) for p in range(2)})
                for name, (rf, _) in self.existing.items()
            },
        )

    def create_topics(self, new: list[Any], operation_timeout: float) -> dict[str, Any]:
        self.created += new
        return {t.topic: _done(None) for t in new}

    def describe_configs(self, resources: list[Any]) -> dict[Any, Any]:
        return {
            r: _done({"min.insync.replicas": _Entry(str(self.existing[r.name][1]))})
            for r in resources
        }


class Events(list[tuple[str, dict[str, Any]]]):
    def info(self, event: str, **fields: Any) -> None:
        self.append((event, fields))

    warning = debug = info


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Events:
    recorded = Events()
    monkeypatch.setattr(topics, "log", recorded)
    return recorded


def _use(monkeypatch: pytest.MonkeyPatch, admin: FakeAdmin) -> FakeAdmin:
    monkeypatch.setattr(topics, "AdminClient", admin)
    return admin


@pytest.mark.parametrize(
    ("brokers", "replication", "min_insync", "expected"),
    [
        (1, None, None, Durability(1, 1)),
        (2, None, None, Durability(2, 2)),
        (3, None, None, Durability(3, 2)),
        (5, None, None, Durability(3, 2)),
        (5, 5, None, Durability(5, 2)),
        (3, 2, 1, Durability(2, 1)),
        (3, None, 3, Durability(3, 3)),
    ],
)
def test_auto_is_min_3_brokers_and_min_2_replicas(
    brokers: int, replication: int | None, min_insync: int | None, expected: Durability
) -> None:
    assert topics.resolve_durability(brokers, replication, min_insync) == expected


def test_impossible_settings_are_rejected_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="buffer_min_insync_replicas=3 exceeds buffer_repl"):
        topics.check_durability(2, 3)
    with pytest.raises(ConfigError, match="buffer_replication=0"):
        topics.check_durability(0, None)


def test_missing_topics_are_created_replicated(
    monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    admin = _use(monkeypatch, FakeAdmin(brokers=3))
    assert topics.ensure_internal_topics("b:9092", partitions=6) == []
    made = {t.topic: t for t in admin.created}
    assert set(made) == {BUFFER_TOPIC, DEAD_LETTER_TOPIC, CHECKPOINT_TOPIC}
    for t in made.values():
        assert t.replication_factor == 3
        assert t.config["min.insync.replicas"] == "2"
    assert made[BUFFER_TOPIC].config["cleanup.policy"] == "compact"
    assert made[BUFFER_TOPIC].num_partitions == 6
    assert [e for e, _ in events] == ["topics.created"] * 3


def test_too_few_brokers_for_the_replication_asked_fail_at_start(
    monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    admin = _use(monkeypatch, FakeAdmin(brokers=1))
    with pytest.raises(ConfigError, match=r"buffer_replication=3: Kafka at b:9092 has 1 live"):
        topics.ensure_internal_topics("b:9092", replication=3)
    with pytest.raises(ConfigError, match=r"buffer_min_insync_replicas=2 exceeds .* factor 1"):
        topics.ensure_buffer_topic("b:9092", "shard-1", partitions=2, min_insync=2)
    assert admin.created == []


def test_an_existing_weaker_topic_is_left_alone_and_warned_about(
    monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    existing = {BUFFER_TOPIC: (1, 1), DEAD_LETTER_TOPIC: (3, 1), CHECKPOINT_TOPIC: (3, 2)}
    admin = _use(monkeypatch, FakeAdmin(brokers=3, existing=existing))
    weak = topics.ensure_internal_topics("b:9092")
    assert admin.created == []
    wanted = Durability(3, 2)
    assert weak == [
        WeakTopic(BUFFER_TOPIC, 1, 1, wanted),
        WeakTopic(DEAD_LETTER_TOPIC, 3, 1, wanted),
    ]
    warnings = [f for e, f in events if e == "topics.weaker_than_configured"]
    assert [(w["topic"], w["replication"], w["min_insync"]) for w in warnings] == [
        (BUFFER_TOPIC, 1, 1),
        (DEAD_LETTER_TOPIC, 3, 1),
    ]
    assert "buffer_replication" in warnings[0]["settings"]
    assert "buffer_min_insync_replicas" in warnings[0]["settings"]
    assert f"--entity-name {BUFFER_TOPIC} --add-config min.insync.replicas=2" in warnings[0]["fix"]


def test_a_replica_with_its_own_buffer_topic_creates_no_other(
    monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    """A shard's replica creates its buffer topic, not also ``__kdelay_buffer`` with its own
    partition count (which a proxy or the default shard would then find and use)."""
    admin = _use(monkeypatch, FakeAdmin(brokers=1))
    monkeypatch.setattr(startup, "check_acls", lambda cfg: None)
    monkeypatch.setattr(startup, "check_at_start", lambda cfg: None)
    startup.ensure_topics(ReplicaConfig(name="r1", buffer_topic="shard-1", buffer_partitions=2))
    made = {t.topic: t.num_partitions for t in admin.created}
    assert made == {"shard-1": 2, DEAD_LETTER_TOPIC: 1, CHECKPOINT_TOPIC: 1}


def test_what_was_asked_for_explicitly_is_not_weak(
    monkeypatch: pytest.MonkeyPatch, events: Events
) -> None:
    existing = {"shard-1": (1, 1)}
    _use(monkeypatch, FakeAdmin(brokers=3, existing=existing))
    assert topics.ensure_buffer_topic("b:9092", "shard-1", partitions=2, replication=1) == []
    assert events == []


@pytest.mark.parametrize("model", [ReplicaConfig, ProxyConfig])
def test_components_default_to_auto_and_reject_a_min_isr_above_the_replication(
    model: type[ReplicaConfig] | type[ProxyConfig],
) -> None:
    cfg = load(model, {})
    assert (cfg.buffer_replication, cfg.buffer_min_insync_replicas) == (None, None)
    with pytest.raises(ConfigError, match="buffer_min_insync_replicas"):
        load(model, {"buffer_replication": 2, "buffer_min_insync_replicas": 3})


def test_the_cleaner_keeps_a_cancel_for_its_whole_window() -> None:
    """A cancel cancels schedules appended up to CANCEL_WINDOW_MS after it: removed earlier by
    compaction, a store rebuilt from the topic would keep such a schedule pending."""
    lag = int(BUFFER_TOPIC_CONFIG["min.compaction.lag.ms"])
    assert lag > CANCEL_WINDOW_MS
    assert lag == MIN_COMPACTION_LAG_MS
