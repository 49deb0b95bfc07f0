"""kdelay.retry (the consumer retry helper): the policy, the next record's headers (which the
proxy must read as intended), the settings it refuses, and the commit rule, with an in-process
consumer and producer standing in for librdkafka's."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kdelay import headers as h
from kdelay.errors import ConfigError
from kdelay.retry import RetryingConsumer, RetryPolicy, RetryProduceError
from kdelay.retry import consumer as retry_consumer
from kdelay.retry import setup as retry_setup
from kdelay.retry.plan import (
    ERROR,
    MAX_ERROR_BYTES,
    Kind,
    Next,
    Origin,
    attempt_of,
    carried,
    error_text,
    next_record,
    retry_id,
)
from tests.support.fakes import FakeConsumer, FakeProducer, Sent

NOW = 1_700_000_000_000
GROUP = "billing"
RETRY = "billing.retry"
DLQ = "billing.dlq"
HERE = Origin("orders", 2, 41)
Headers = Sequence[tuple[str, bytes | None]]


def plan(headers: Headers, here: Origin = HERE, policy: RetryPolicy | None = None) -> Next:
    return next_record(
        policy or RetryPolicy(delays_ms=[500, 500]),
        group=GROUP,
        retry_topic=RETRY,
        dead_letter_topic=DLQ,
        here=here,
        headers=headers,
        error=RuntimeError("boom"),
    )


def get(headers: Sequence[tuple[str, str | bytes | None]], name: str) -> str | bytes | None:
    values = [v for n, v in headers if n == name]
    assert len(values) <= 1, f"{name} appears {len(values)} times"
    return values[0] if values else None


# -- the policy -------------------------------------------------------------------------------


def test_default_policy_is_rocketmqs_levels_3_to_18() -> None:
    policy = RetryPolicy()
    assert policy.levels == tuple(range(3, 19))
    assert policy.max_attempts == 17
    assert policy.timing(2) == (h.DELAY_LEVEL, b"3")  # the first retry: level 3, 10 s
    assert policy.timing(17) == (h.DELAY_LEVEL, b"18")


def test_delays_policy() -> None:
    policy = RetryPolicy(delays_ms=[1000, 5000])
    assert policy.levels is None
    assert policy.max_attempts == 3
    assert [policy.timing(n) for n in (2, 3)] == [(h.DELAY_MS, b"1000"), (h.DELAY_MS, b"5000")]
    with pytest.raises(ValueError, match="attempt 4"):
        policy.timing(4)
    assert RetryPolicy(delays_ms=[]).max_attempts == 1  # no retry: dead-lettered at once
    assert RetryPolicy(levels=range(3, 6)).max_attempts == 4


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"levels": [3], "delays_ms": [1]}, "not both"),
        ({"levels": [0]}, "levels must be 1 or more"),
        ({"delays_ms": [-1]}, "delays_ms must be 0 or more"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RetryPolicy(**kwargs)


# -- what goes back: retries ------------------------------------------------------------------


def test_first_retry_carries_attempt_2_the_origin_and_the_timing() -> None:
    nxt = plan([("app", b"1"), ("trace", None)])
    assert (nxt.kind, nxt.topic, nxt.attempt, nxt.origin) == (Kind.RETRIED, RETRY, 2, HERE)
    hs = nxt.headers
    assert hs[:2] == [("app", b"1"), ("trace", None)]  # the producer's own, first, in order
    assert get(hs, h.ATTEMPT) == b"2"
    assert get(hs, h.ORIGINAL_TOPIC) == b"orders"
    assert get(hs, h.ORIGINAL_PARTITION) == b"2"
    assert get(hs, h.ORIGINAL_OFFSET) == b"41"
    assert get(hs, h.DELAY_MS) == b"500"
    assert get(hs, ERROR) == b"RuntimeError: boom"
    assert get(hs, h.ID) == retry_id(GROUP, HERE, 2).encode()


def test_the_proxy_reads_a_retry_as_a_delay_with_its_id() -> None:
    nxt = plan([("app", b"1")], policy=RetryPolicy())
    asked = h.classify(nxt.headers, NOW, h.DelayPolicy())
    assert asked == h.Delay(NOW + 10_000, retry_id(GROUP, HERE, 2), 10_000)


def test_a_delivered_retry_fails_again_attempt_3_same_origin() -> None:
    """The record the delay service delivers carries kdelay-id and kdelay-deliver-at (the due
    time): both must go, or the proxy would take the old due time for the new one."""
    first = plan([("app", b"1")])
    delivered = [
        *[(n, v) for n, v in first.headers if n not in h.TIMING_HEADERS],
        (h.DELIVER_AT, str(NOW).encode()),
        (h.OCCURRENCE, b"1"),
    ]
    nxt = plan(delivered, here=Origin(RETRY, 0, 7))
    assert (nxt.kind, nxt.attempt, nxt.origin) == (Kind.RETRIED, 3, HERE)
    hs = nxt.headers
    assert get(hs, h.ATTEMPT) == b"3"
    assert get(hs, h.ORIGINAL_OFFSET) == b"41"
    assert get(hs, h.DELIVER_AT) is None
    assert get(hs, h.OCCURRENCE) is None
    assert get(hs, h.ID) == retry_id(GROUP, HERE, 3).encode() != get(first.headers, h.ID)
    assert isinstance(h.classify(hs, NOW, h.DelayPolicy()), h.Delay)


def test_after_the_last_attempt_a_dead_letter_the_proxy_passes_through() -> None:
    on_retry = [("app", b"1"), (h.ATTEMPT, b"3"), (h.ID, b"retry-x"), (h.DELIVER_AT, b"1")]
    on_retry += [(h.ORIGINAL_TOPIC, b"orders"), (h.ORIGINAL_PARTITION, b"2")]
    on_retry += [(h.ORIGINAL_OFFSET, b"41"), (ERROR, b"RuntimeError: earlier")]
    nxt = plan(on_retry, here=Origin(RETRY, 0, 9))
    assert (nxt.kind, nxt.topic, nxt.attempt, nxt.origin) == (Kind.DEAD_LETTERED, DLQ, 3, HERE)
    hs = nxt.headers
    assert get(hs, h.ATTEMPT) == b"3"  # the attempts made
    assert get(hs, ERROR) == b"RuntimeError: boom"  # the last one's error, once
    assert all(get(hs, name) is None for name in h.CONTROL_HEADERS)
    assert h.classify(hs, NOW, h.DelayPolicy()) is None  # delivered at once, as it is


def test_attempt_headers_count_only_on_the_retry_topic() -> None:
    """A record replayed from the dead-letter topic into a main topic starts over."""
    stale = [(h.ATTEMPT, b"17"), (h.ORIGINAL_TOPIC, b"old"), (h.ORIGINAL_PARTITION, b"0")]
    stale += [(h.ORIGINAL_OFFSET, b"1")]
    nxt = plan(stale)
    assert (nxt.kind, nxt.attempt, nxt.origin) == (Kind.RETRIED, 2, HERE)
    assert get(nxt.headers, h.ORIGINAL_TOPIC) == b"orders"
    assert attempt_of(stale, from_retry_topic=True) == 17
    assert attempt_of([], from_retry_topic=True) == 1
    assert attempt_of([(h.ATTEMPT, b"two")], from_retry_topic=True) == 1
    assert attempt_of([(h.ATTEMPT, None)], from_retry_topic=True) == 1
    # Without (complete) original headers, the retry topic's coordinates are the origin.
    here = Origin(RETRY, 0, 3)
    assert plan([(h.ATTEMPT, b"2"), (h.ORIGINAL_TOPIC, b"x")], here=here).origin == here


def test_carried_headers() -> None:
    given: Headers = [
        ("app", b"1"),
        ("kdelay-source", b"s"),  # kdelay's own delivered names pass through the proxy
        ("KDELAY-X", b"?"),  # the proxy would refuse the whole record for it
        ("kdelay-repeat", b"R2/PT1S"),
        (h.CANCEL, b"x"),
        (h.DELAY_LEVEL, b"3"),
        (h.ATTEMPT, b"2"),
        ("kdelayed", b"not ours"),
    ]
    assert carried(given) == [("app", b"1"), ("kdelay-source", b"s"), ("kdelayed", b"not ours")]


def test_retry_ids_are_stable_short_and_distinct() -> None:
    a = retry_id(GROUP, HERE, 2)
    assert a == retry_id(GROUP, HERE, 2)
    assert len({a, retry_id(GROUP, HERE, 3), retry_id("other", HERE, 2)}) == 3
    assert h.validate_id(h.ID, retry_id(GROUP, Origin("t" * 249, 2**31, 2**63), 99).encode())


def test_error_text_is_cut_on_a_character_boundary() -> None:
    text = error_text(ValueError("é" * MAX_ERROR_BYTES))
    assert len(text) <= MAX_ERROR_BYTES
    assert text.decode("utf-8").startswith("ValueError: éé")


# -- settings ---------------------------------------------------------------------------------


def test_consumer_settings() -> None:
    conf, group = retry_setup.consumer_config({"group.id": "g", "bootstrap.servers": "x"})
    assert (group, conf["enable.auto.commit"]) == ("g", False)
    with pytest.raises(ConfigError, match=r"'group\.id' is required"):
        retry_setup.consumer_config({"bootstrap.servers": "x"})
    for value in (True, "true", "TRUE"):
        with pytest.raises(ConfigError, match=r"'enable\.auto\.commit' must be false"):
            retry_setup.consumer_config({"group.id": "g", "enable.auto.commit": value})
    assert retry_setup.cooperative({"partition.assignment.strategy": "cooperative-sticky"})
    assert retry_setup.cooperative({"group.protocol": "consumer"})
    assert not retry_setup.cooperative({"partition.assignment.strategy": "range,roundrobin"})


def test_producer_settings() -> None:
    conf = retry_setup.producer_config("127.0.0.1:9192", {"delivery.timeout.ms": 3000})
    assert conf == {
        "bootstrap.servers": "127.0.0.1:9192",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 3000,
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"acks": 1}, "'acks' must stay 'all'"),
        ({"enable.idempotence": "false"}, "'enable.idempotence' must stay true"),
        ({"bootstrap.servers": "k:9092"}, "'bootstrap.servers' is proxy_bootstrap"),
        ({"transactional.id": "t"}, "'transactional.id'"),
    ]
    for extra, words in cases:
        with pytest.raises(ConfigError, match=re.escape(words)):
            retry_setup.producer_config("p:1", extra)


def test_topic_settings() -> None:
    retry_setup.check_topics(["a"], "a.retry", "a.dlq")
    for topics, retry_topic, dlq, words in [
        ([], "r", "d", "at least one"),
        (["a", "r"], "r", "d", "retry_topic: 'r'"),
        (["a", "d"], "r", "d", "dead_letter_topic: 'd'"),
        (["a"], "r", "r", "both 'r'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            retry_setup.check_topics(topics, retry_topic, dlq)


def test_metrics_are_registered_once_per_registry() -> None:
    one, two = CollectorRegistry(), CollectorRegistry()
    assert retry_setup.metrics_for(one) is retry_setup.metrics_for(one)
    assert retry_setup.metrics_for(one) is not retry_setup.metrics_for(two)


# -- the commit rule, with fakes --------------------------------------------------------------


class Fakes:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        self.fail: set[bytes] = set()
        self.consumers: list[FakeConsumer] = []
        self.producers: list[FakeProducer] = []

        def consumer(conf: dict[str, Any]) -> FakeConsumer:
            self.consumers.append(FakeConsumer(conf=conf, events=self.events))
            return self.consumers[-1]

        def producer(conf: dict[str, Any]) -> FakeProducer:
            # Acknowledged at flush, except the values in ``fail``.
            self.producers.append(FakeProducer(conf=conf, events=self.events, fail=self.fails))
            return self.producers[-1]

        monkeypatch.setattr(retry_consumer, "Consumer", consumer)
        monkeypatch.setattr(retry_consumer, "Producer", producer)

    def fails(self, sent: Sent) -> KafkaError | None:
        return KafkaError(KafkaError._MSG_TIMED_OUT) if sent.value in self.fail else None

    @property
    def consumer(self) -> FakeConsumer:
        return self.consumers[-1]


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Fakes:
    return Fakes(monkeypatch)


def message(
    topic: str, partition: int, offset: int, value: bytes, headers: Headers | None = None
) -> Message:
    hs: list[tuple[str, str | bytes | None]] = list(headers or [])
    return Message(
        topic=topic, partition=partition, offset=offset, key=b"k", value=value, headers=hs
    )


def helper(
    handler: Callable[[Message], None], registry: CollectorRegistry, **kw: Any
) -> RetryingConsumer:
    return RetryingConsumer(
        {"group.id": GROUP, "bootstrap.servers": "127.0.0.1:1"},
        "127.0.0.1:2",
        ["orders"],
        handler,
        policy=RetryPolicy(delays_ms=[500]),
        create_topics=False,
        registry=registry,
        **kw,
    )


def fail_on(values: set[bytes]) -> Callable[[Message], None]:
    def handle(msg: Message) -> None:
        if msg.value() in values:
            raise ValueError(f"cannot handle {msg.value()!r}")

    return handle


def test_subscribes_to_the_retry_topic_and_turns_auto_commit_off(fakes: Fakes) -> None:
    with helper(fail_on(set()), CollectorRegistry()) as rc:
        assert fakes.consumer.subscribed == ["orders", RETRY]
        assert fakes.consumer.conf["enable.auto.commit"] is False
        assert rc.dead_letter_topic == DLQ
    assert fakes.events[-2:] == ["close", "flush"]


def test_commits_only_after_the_retries_are_acknowledged(fakes: Fakes) -> None:
    registry = CollectorRegistry()
    rc = helper(fail_on({b"b"}), registry)
    fakes.consumer.queued.extend(
        [
            message("orders", 0, 5, b"a"),
            message("orders", 0, 6, b"b"),
            message("orders", 1, 9, b"c"),
        ]
    )
    assert rc.poll_once(0) == 3
    assert fakes.events == [f"produce {RETRY}", "flush", "commit"]
    assert fakes.consumer.commits == [[("orders", 0, 7), ("orders", 1, 10)]]
    sent = fakes.producers[0].produced[0]
    (topic, key, value, hs) = (sent.topic, sent.key, sent.value, sent.headers)
    assert (topic, key, value, get(hs, h.ATTEMPT)) == (RETRY, b"k", b"b", b"2")
    sample = registry.get_sample_value
    assert sample("kdelay_retry_handled_total", {"group": GROUP, "outcome": "ok"}) == 2
    assert sample("kdelay_retry_handled_total", {"group": GROUP, "outcome": "retried"}) == 1
    assert sample("kdelay_retry_retried_total", {"group": GROUP}) == 1
    rc.close()


def test_the_last_attempt_goes_to_the_dead_letter_topic(fakes: Fakes) -> None:
    registry = CollectorRegistry()
    seen: list[int] = []

    def handle(msg: Message) -> None:
        seen.append(rc.attempt(msg))
        raise ValueError("cannot handle it")

    rc = helper(handle, registry)
    fakes.consumer.queued.extend([message(RETRY, 0, 3, b"x", [(h.ATTEMPT, b"2")])])
    with capture_logs() as logs:
        rc.poll_once(0)
    assert seen == [2]
    sent = fakes.producers[0].produced[0]
    (topic, hs) = (sent.topic, sent.headers)
    assert (topic, get(hs, h.ATTEMPT), get(hs, ERROR)) == (
        DLQ,
        b"2",
        b"ValueError: cannot handle it",
    )
    assert fakes.consumer.commits == [[(RETRY, 0, 4)]]
    assert registry.get_sample_value("kdelay_retry_dead_lettered_total", {"group": GROUP}) == 1
    assert [e["event"] for e in logs] == ["retry.dead_lettered"]
    rc.close()


def test_a_failed_produce_leaves_the_offset_uncommitted_and_rewinds(fakes: Fakes) -> None:
    registry = CollectorRegistry()
    rc = helper(fail_on({b"b", b"c"}), registry)
    fakes.fail.add(b"b")  # the proxy never acknowledges b's retry
    fakes.consumer.queued.extend(
        [
            message("orders", 0, 5, b"a"),
            message("orders", 0, 6, b"b"),
            message("orders", 0, 7, b"c"),  # after b in its partition: handled again later
            message("orders", 1, 9, b"d"),
        ]
    )
    with pytest.raises(RetryProduceError, match=r"orders\[0\]@6 to billing.retry") as info:
        rc.poll_once(0)
    assert info.value.origin == Origin("orders", 0, 6)
    assert fakes.consumer.commits == [[("orders", 0, 6), ("orders", 1, 10)]]
    assert fakes.consumer.seeks == [("orders", 0, 6)]
    assert len(fakes.producers) == 2  # a fresh producer for what comes next
    assert registry.get_sample_value("kdelay_retry_produce_errors_total", {"group": GROUP}) == 1
    # Polled again, the message is handled again and its retry produced by the new producer.
    fakes.fail.clear()
    fakes.consumer.queued.extend([message("orders", 0, 6, b"b"), message("orders", 0, 7, b"c")])
    assert rc.poll_once(0) == 2
    assert [s.value for s in fakes.producers[1].produced] == [b"b", b"c"]
    assert fakes.consumer.commits[-1] == [("orders", 0, 8)]
    rc.close()


def test_a_never_committed_retry_partition_starts_at_its_beginning(fakes: Fakes) -> None:
    rc = helper(fail_on(set()), CollectorRegistry())
    c = fakes.consumer
    c.committed_offsets[(RETRY, 1)] = 12
    parts = [TopicPartition("orders", 0), TopicPartition(RETRY, 0), TopicPartition(RETRY, 1)]
    assert c.on_assign is not None
    c.on_assign(c, parts)
    assert c.assignment is not None
    assert [(p.topic, p.partition, p.offset) for p in c.assignment] == [
        ("orders", 0, -1001),  # the user's auto.offset.reset decides for their own topics
        (RETRY, 0, OFFSET_BEGINNING),
        (RETRY, 1, -1001),  # committed: resumes there
    ]
    c.assignment = None
    c.on_assign(c, [TopicPartition("orders", 1)])
    assert c.assignment is None  # nothing to change: librdkafka assigns it
    rc.close()


def test_a_poll_handles_what_is_queued_without_waiting_for_a_full_batch(fakes: Fakes) -> None:
    """librdkafka's ``consume(n, timeout)`` waits out the timeout unless ``n`` records are
    there (kdelay/consuming.py): the helper handled a lone message up to its poll timeout late."""
    rc = helper(fail_on(set()), CollectorRegistry())
    fakes.consumer.queued.extend([message("orders", 0, 1, b"a")])
    assert rc.poll_once(1.0) == 1
    assert fakes.consumer.waited_s == 0
    assert rc.poll_once(1.0) == 0  # nothing queued: one wait of the timeout
    assert fakes.consumer.waited_s == 1.0
    rc.close()


def test_run_stops_after_max_messages(fakes: Fakes) -> None:
    rc = helper(fail_on(set()), CollectorRegistry(), batch_size=2)
    fakes.consumer.queued.extend([message("orders", 0, i, b"a") for i in range(5)])
    assert rc.run(max_messages=3, poll_timeout=0) == 3
    assert fakes.consumer.commits == [[("orders", 0, 2)], [("orders", 0, 3)]]
    assert len(fakes.consumer.queued) == 2  # still queued for the next poll
    rc.close()
