"""Several brokers, several clocks: what kdelay promises when the brokers disagree on the time.

A 3-broker Kafka whose brokers run under libfaketime: node 1 1 s behind, node 2 true, node 3 1 s
ahead (300 ms apart shows the same on an idle machine; 1 s keeps a loaded machine's release
latency, which hides an early release, below the difference). ``__kdelay_clock`` is led by
node 2, so every replica and the proxy read node 2's clock. Each test topic has partitions led
by the broker behind and by the broker ahead.

Three clocks decide (docs/guarantees.md "Brokers' clocks"):
- a message's due time is its buffer record's append time, by the clock of its buffer
  partition's leader (B), plus its delay;
- the master releases it once ``__kdelay_clock``'s leader's clock (C) has reached it;
- "early" is judged by the target partition leader's clock (T), its LogAppendTime.

So a released record's LogAppendTime is at least its due time minus (C - T) when C is ahead of
T, and never early when C is not ahead; and a record sent after a cancel's acknowledgement is
a new message when B is not ahead of C, and may be cancelled when B is ahead of C by more than
the acknowledgement's hold. Each test measures the brokers' differences from their own stamps
(tests/support/broker_clocks.py: no clock of the test process) and asserts those relations.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import KafkaSettings, LocalKafka, wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC, Cancel, Scheduled, accepted_ms, partition_for
from kdelay.proxy import running_proxy
from kdelay.topics import BUFFER_TOPIC_CONFIG, CLOCK_TOPIC, CLOCK_TOPIC_CONFIG
from tests.support.broker_clocks import LOG_APPEND_TIME, Bounds, BrokerStamps, place_topic
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, decode_buffer, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet

BEHIND, TRUE, AHEAD = 1, 2, 3
#: Seconds each node's clock is off (libfaketime); node 2 runs true.
OFFSETS = {BEHIND: -1.0, AHEAD: 1.0}
CLOCK_LEADER = TRUE
#: Buffer partitions 0-1 led by the broker ahead of the clock leader, 2-3 by the one behind.
BUFFER_LEADERS = [AHEAD, AHEAD, BEHIND, BEHIND]
#: The cancel window's "sent with it" (kdelay.buffer.CANCEL_SENT_WITH_MS).
SENT_WITH_MS = 100
Headers = list[tuple[str, str | bytes | None]]


@dataclass
class Stack:
    kafka: LocalKafka
    rs: ReplicaSet
    proxy_port: int
    stamps: BrokerStamps

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    def clock_minus(self, node: int) -> Bounds:
        """The clock leader's clock minus node ``node``'s."""
        return self.stamps.difference(node, CLOCK_LEADER)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("broker-clocks")
    settings = KafkaSettings(num_partitions=1, clock_offsets=dict(OFFSETS))
    kafka = LocalKafka(base / "kafka", nodes=3, settings=settings)
    try:
        kafka.start()
        bs = kafka.bootstrap_servers
        place_topic(bs, CLOCK_TOPIC, [CLOCK_LEADER], CLOCK_TOPIC_CONFIG)
        buffer_config = {**BUFFER_TOPIC_CONFIG, "min.insync.replicas": "2"}
        place_topic(bs, BUFFER_TOPIC, BUFFER_LEADERS, buffer_config)
        stamps = BrokerStamps(bs)
        with (
            ReplicaSet(
                base, bs, zookeeper.connect, count=1, partitions=4, buffer_topic=BUFFER_TOPIC
            ) as rs,
            running_proxy(loopback_config(bs, buffer_partitions=4)) as proxy,
        ):
            rs.start_all()
            rs.wait_master(timeout=120)
            assert proxy.addresses is not None
            yield Stack(kafka, rs, int(proxy.addresses.kafka.rsplit(":", 1)[1]), stamps)
    finally:
        kafka.stop()


class _Client:
    """An idempotent producer through the proxy that fails the test on any delivery error."""

    def __init__(self, port: int) -> None:
        self.failures: list[KafkaError] = []
        self.producer = Producer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True}
        )

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err)

    def send(self, topic: str, value: bytes, headers: Headers, partition: int = -1) -> None:
        self.producer.produce(
            topic, value, headers=headers, partition=partition, on_delivery=self._report
        )

    def flush(self) -> None:
        assert self.producer.flush(60) == 0
        assert self.failures == [], self.failures[:3]


def _id(r: Record) -> str:
    return (r.header(h.ID) or b"").decode()


def _early_ms(r: Record) -> int:
    """How far before its due time (``kdelay-deliver-at``) the target's leader stamped it."""
    return int(r.header(h.DELIVER_AT) or b"0") - r.timestamp_ms


def test_a_release_is_early_by_at_most_the_clock_leaders_lead_over_the_targets(
    stack: Stack,
) -> None:
    """Released once C reached the due time, a record's LogAppendTime on a partition led by a
    broker behind C is early by up to C - T; on one led by a broker ahead of C, never early."""
    topic = unique_topic("clocks-release")
    place_topic(stack.bootstrap, topic, [BEHIND, AHEAD], LOG_APPEND_TIME)
    client = _Client(stack.proxy_port)
    run = uuid.uuid4().hex[:8]
    count = 40
    for i in range(count):
        headers: Headers = [(h.DELAY_MS, b"1500"), (h.ID, f"rel-{run}-{i}".encode())]
        client.send(topic, b"x", headers, partition=i % 2)
    client.flush()
    records = consume_until(stack.bootstrap, [topic], lambda got: len(got) >= count, timeout=90)
    lead = {p: stack.clock_minus(node) for p, node in enumerate([BEHIND, AHEAD])}
    early = {p: max(_early_ms(r) for r in records if r.partition == p) for p in lead}
    print(f"\nC - T by partition {lead}; most early by partition {early} (ms)")
    assert sorted(_id(r) for r in records) == sorted(f"rel-{run}-{i}" for i in range(count))
    for p, bounds in lead.items():
        # The rule: early by at most C - T, never early when C is not ahead of T.
        assert early[p] <= max(0, bounds.high), (p, early[p], bounds)
    # The rule is tight: behind C by ~1 s, the target's leader does see early records
    # (a release round takes less than the difference on this machine).
    assert lead[0].low > 0, lead[0]
    assert early[0] > 0, (lead[0], early[0])
    assert lead[1].high < 0, lead[1]


def test_a_send_after_a_cancels_ack_is_new_unless_the_buffer_leader_is_ahead_of_the_clocks(
    stack: Stack,
) -> None:
    """Cancel an id, wait for the acknowledgement, send the id again at once. The cancel's
    append time is B's clock, the acknowledgement's hold and the new record's acceptance stamp
    C's: in a buffer partition led by a broker behind C the new record is always delivered; led
    by one ahead of C by more than the hold, it can be cancelled by the cancel acknowledged
    before it was sent."""
    topic = unique_topic("clocks-cancel")
    place_topic(stack.bootstrap, topic, [TRUE], LOG_APPEND_TIME)
    run = uuid.uuid4().hex[:8]
    ids: dict[int, list[str]] = {p: [] for p in range(len(BUFFER_LEADERS))}
    n = 0
    while min(len(v) for v in ids.values()) < 8:
        msg_id = f"move-{run}-{n}"
        n += 1
        part = ids[partition_for(msg_id, len(BUFFER_LEADERS))]
        if len(part) < 8:
            part.append(msg_id)
    moved = [i for v in ids.values() for i in v]
    client = _Client(stack.proxy_port)
    # The cancels from another producer: one producer's cancel and reschedule to one partition
    # are ordered by its sequence numbers, whatever the clocks (docs/cancelling.md); this is
    # the rule for the others.
    canceller = _Client(stack.proxy_port)
    for msg_id in moved:
        client.send(topic, b"first", [(h.DELAY_MS, b"60000"), (h.ID, msg_id.encode())])
    client.flush()
    for msg_id in moved:
        canceller.send(topic, b"", [(h.CANCEL, msg_id.encode())])
        canceller.flush()  # the cancel's acknowledgement
        client.send(topic, b"second", [(h.DELAY_MS, b"1000"), (h.ID, msg_id.encode())])
    control = f"control-{run}"
    client.send(topic, b"control", [(h.DELAY_MS, b"1000"), (h.ID, control.encode())])
    client.flush()
    margins = _acceptance_after_cancel(stack.bootstrap, set(moved))
    records = consume_until(
        stack.bootstrap, [topic], lambda got: control in {_id(r) for r in got}, timeout=90
    )
    after = max(r.timestamp_ms for r in records) + 2_000
    wait_until(
        lambda: (cp := stack.rs.checkpoint()) is not None and cp.time_ms > after,
        timeout=60,
        what="the master's checkpoint to pass every reschedule's due time",
    )
    records = consume_until(
        stack.bootstrap, [topic], lambda got: control in {_id(r) for r in got}, timeout=30
    )
    delivered = {_id(r) for r in records if r.value == b"second"}
    assert not any(r.value == b"first" for r in records)
    lost = {p: [i for i in v if i not in delivered] for p, v in ids.items()}
    ahead = {p: stack.clock_minus(node) for p, node in enumerate(BUFFER_LEADERS)}
    print(f"\nC - B by buffer partition {ahead}; reschedules cancelled "
          f"{ {p: len(v) for p, v in lost.items()} } of 8 each")  # fmt: skip
    least = {p: min(margins[i] for i in v) for p, v in ids.items()}
    print(f"least (acceptance stamp - cancel's append time) by buffer partition {least} (ms)")
    for p, bounds in ahead.items():
        # The replicas' rule, on two brokers' clocks: cancelled iff the new record's acceptance
        # stamp (C's clock) is within 100 ms of the cancel's append time (B's clock).
        assert {i for i in ids[p] if margins[i] <= SENT_WITH_MS} == set(lost[p]), (p, margins)
        if bounds.low >= 0:  # B not ahead of C: every reschedule is a new message
            assert not lost[p], (p, bounds, lost[p])
            assert least[p] > SENT_WITH_MS, (p, bounds, least[p])
    # B ahead of C by ~1 s, more than the hold (100 ms and a probe's round trip): sent
    # right after the acknowledgement, reschedules were cancelled.
    assert all(ahead[p].high < -SENT_WITH_MS for p in (0, 1)), ahead
    assert lost[0] or lost[1], "no reschedule cancelled in the partitions led ahead of C"


def _acceptance_after_cancel(bootstrap: str, ids: set[str]) -> dict[str, int]:
    """Per id: the reschedule's acceptance stamp (the proxy's upper bound of C's clock, in its
    order field) minus its cancel's append time (B's clock, the buffer record's timestamp)."""

    def pairs(records: list[Record]) -> tuple[dict[str, int], dict[str, int]]:
        cancels: dict[str, int] = {}
        seconds: dict[str, int] = {}
        for r in records:
            d = decode_buffer(r)
            if isinstance(d, Cancel) and d.id in ids:
                cancels[d.id] = r.timestamp_ms
            elif isinstance(d, Scheduled) and d.id in ids and d.value == b"second":
                seconds[d.id] = accepted_ms(d.seq) or 0
        return cancels, seconds

    def complete(records: list[Record]) -> bool:
        cancels, seconds = pairs(records)
        return len(cancels) == len(seconds) == len(ids)

    cancels, seconds = pairs(consume_until(bootstrap, [BUFFER_TOPIC], complete, timeout=60))
    return {i: seconds[i] - cancels[i] for i in ids}
