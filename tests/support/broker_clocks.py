"""Brokers whose clocks disagree: topics whose partitions are led by chosen brokers, and the
difference between two brokers' clocks bounded from their own LogAppendTime stamps alone.

A broker's clock is read by producing to a LogAppendTime partition it leads: the stamp is its
clock at the append. Three stamps in a row, ``a1`` on broker A, then ``b`` on B, then ``a2`` on
A (each produced after the previous one's acknowledgement), were taken in that order in real
time, so B's clock minus A's lies between ``b - a2`` and ``b - a1`` (each stamp floored to the
millisecond: 1 ms more either way). No clock of the test process takes part.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from dev.stack import wait_until

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> the node id leading it now (-1: none)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: m.leader for p, m in meta.partitions.items()}


def place_topic(
    bootstrap: str, topic: str, led_by: list[int], config: dict[str, str], nodes: int = 3
) -> None:
    """Create ``topic`` with partition ``i`` led by node ``led_by[i]`` (the first replica of its
    assignment, every node a replica), and wait until metadata shows those leaders."""
    assignment = [[n, *[m for m in range(1, nodes + 1) if m != n]] for n in led_by]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, len(led_by), replica_assignment=assignment, config=config)
    admin.create_topics([new], operation_timeout=30)[topic].result(timeout=60)
    want = dict(enumerate(led_by))
    wait_until(
        lambda: leaders(bootstrap, topic) == want,
        timeout=60,
        what=f"{topic}'s partitions led by {want}",
    )


@dataclass(frozen=True)
class Bounds:
    """One broker's clock minus another's, in milliseconds: at least ``low``, at most ``high``."""

    low: int
    high: int


class BrokerStamps:
    """Reads each broker's clock as a LogAppendTime stamp: a probe topic with partition
    ``n - 1`` led by node ``n``."""

    def __init__(self, bootstrap: str, nodes: int = 3) -> None:
        self.topic = f"broker-stamps-{uuid.uuid4().hex[:8]}"
        place_topic(bootstrap, self.topic, list(range(1, nodes + 1)), LOG_APPEND_TIME, nodes)
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0})

    def stamp(self, node: int) -> int:
        """Node ``node``'s clock now (ms), as it stamped a record it appended."""
        out: list[int] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            assert err is None, err
            kind, stamp = msg.timestamp()
            assert kind == TIMESTAMP_LOG_APPEND_TIME, kind
            out.append(stamp)

        self._producer.produce(self.topic, b"", partition=node - 1, on_delivery=on_delivery)
        assert self._producer.flush(30) == 0, f"no acknowledgement from node {node}"
        return out[0]

    def difference(self, a: int, b: int, rounds: int = 5) -> Bounds:
        """Node ``b``'s clock minus node ``a``'s: the tightest of ``rounds`` brackets."""
        low, high = -(2**62), 2**62
        for _ in range(rounds):
            a1 = self.stamp(a)
            at_b = self.stamp(b)
            a2 = self.stamp(a)
            low, high = max(low, at_b - a2 - 1), min(high, at_b - a1 + 1)
        return Bounds(low, high)
