"""The Spark verifier's test scenarios, shared by its tiers (integration on ``local[2]``,
tests/spark on a standalone cluster, tests/deploy/k8s on Kubernetes) so each runs the same one.

Two families, each with its own grace: the streaming scenario (``produce_scenario``: 20
messages in one 10 s window, a lost, a cancelled, a duplicated, a bulk-cancelled message ...,
``STREAM_GRACE_MS``) judged window by window, and the ``--once`` scenario (``Scenario``,
``build_faults``, ``ONCE_GRACE_MS``) whose report is checked against the independent oracle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from kdelay import buffer
from kdelay.verifier.config import VerifierConfig
from tests.support import oracle
from tests.support.kafka_helpers import HeaderList, Record, create_topic, unique_topic
from tests.support.schedule import create_target

# -- the streaming scenario (kdelay verify, continuous) --------------------------------------

WINDOW_MS = 10_000
SPACING_MS = 10  # between the due times of one produce_scenario call: all in one window
#: One window's totals in the scenario of 20 messages produce_scenario writes.
WINDOW_OF_20 = {
    "scheduled": 17,
    "delivered": 16,
    "missing": 1,
    "duplicates": 1,
    "early": 0,
    "cancelled": 3,
}
STREAM_GRACE_MS = 3_000  # more than a delivery's lateness here, even on a busy machine


def headers_list(pairs: Sequence[tuple[str, bytes | None]]) -> HeaderList:
    return list(pairs)


def next_base(after_ms: int | None = None) -> int:
    """1 s into the first window that starts after ``after_ms`` (default: a second from now)."""
    after = after_ms if after_ms is not None else int(time.time() * 1000) + 1_000
    return (after // WINDOW_MS + 1) * WINDOW_MS + 1_000


def produce_scenario(
    bootstrap: str, topics: tuple[str, str], base_ms: int, n: int, tag: str
) -> None:
    """``n`` messages due from ``base_ms`` (ahead), delivered once all are due; message 3 is
    lost, 4 is cancelled, 5 delivered twice, 6 cancelled by a cancel sent with it but appended
    before it (accepted by a proxy within a second of the cancel's append time), 7 cancelled by
    a bulk cancel of its id prefix on its topic, 8 has that prefix too but was accepted after
    the bulk cancel (a new message: delivered)."""
    buffer_topic, target = topics
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    messages = []
    for i in range(n):
        accepted_ms = int(time.time() * 1000) + (5_000 if i == 8 else 0)
        msg_id = f"{tag}bulk-{i}" if i in (7, 8) else f"{tag}{i}"
        s = buffer.Scheduled(
            msg_id,
            target,
            -1,
            None,
            b"v",
            base_ms + i * SPACING_MS,
            seq=accepted_ms << buffer.ORDER_SHIFT,
        )
        enc = buffer.encode(s)
        if i == 6:
            cancel = buffer.encode(buffer.Cancel(s.id))
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=headers_list(cancel.headers)
            )
        producer.produce(buffer_topic, enc.value, enc.key, headers=headers_list(enc.headers))
        if i == 4:
            cancel = buffer.encode(buffer.Cancel(s.id))
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=headers_list(cancel.headers)
            )
        if i == 7:
            bulk = buffer.Cancel(f"bulk-{tag}", prefix=f"{tag}bulk-", topic=target)
            cancel = buffer.encode(bulk)
            producer.produce(
                buffer_topic, cancel.value, cancel.key, headers=headers_list(cancel.headers)
            )
        if i not in (3, 4, 6, 7):
            messages.extend([s, s] if i == 5 else [s])
    assert producer.flush(30) == 0
    # sleep: waiting for the wall clock itself: the broker stamps each delivery when it is written.
    time.sleep(max(0.0, (base_ms + n * SPACING_MS + 50) / 1000 - time.time()))
    for s in messages:
        producer.produce(target, s.value, headers=headers_list(s.delivered_headers()))
    assert producer.flush(30) == 0


def window_totals(records: list[Record], start_ms: int) -> dict[str, int]:
    """The counts the verifier published for the window starting at ``start_ms``, summed."""
    totals: dict[str, int] = {}
    for rec in records:
        result = json.loads(rec.value or b"{}")
        if result["window_start_ms"] != start_ms:
            continue
        for key in ("scheduled", "delivered", "missing", "duplicates", "early", "cancelled"):
            totals[key] = totals.get(key, 0) + int(result[key])
    return totals


def scenario_topics(bootstrap: str, tag: str) -> tuple[str, str, str]:
    """A buffer topic and a LogAppendTime target (2 partitions each) and an output topic."""
    names = (unique_topic(f"{tag}buf"), unique_topic(f"{tag}tgt"), unique_topic(f"{tag}out"))
    create_topic(bootstrap, names[0], partitions=2)
    create_target(bootstrap, names[1], partitions=2)
    create_topic(bootstrap, names[2])
    return names


def settled(
    starts: Sequence[int], errors: Sequence[Exception] = ()
) -> Callable[[list[Record]], bool]:
    """Whether the windows starting at ``starts`` were all published with produce_scenario's 17
    scheduled messages; fails at once on an error of a verifier run in a thread."""

    def done(records: list[Record]) -> bool:
        assert not errors, errors
        return all(window_totals(records, s).get("scheduled", 0) >= 17 for s in starts)

    return done


# -- the --once scenario (kdelay verify --once) ----------------------------------------------

ONCE_GRACE_MS = 5_000
BUFFER_PARTITIONS = 3
REPORT_KEYS = {"scheduled", "delivered", "missing", "duplicates", "early", "lateness_ms"}


@dataclass
class Scenario:
    """Topics written by a test, and what was written to them."""

    bootstrap: str
    buffer_topic: str = field(default_factory=lambda: unique_topic("vbuf"))
    targets: list[str] = field(default_factory=lambda: [unique_topic("vtgt"), unique_topic("vtgt")])
    buffer_records: int = 0
    delivered_records: int = 0

    def __post_init__(self) -> None:
        create_topic(self.bootstrap, self.buffer_topic, partitions=BUFFER_PARTITIONS)
        for t in self.targets:
            create_target(self.bootstrap, t, partitions=2)
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,  # a cancel stays after its schedule
                "linger.ms": 5,
            }
        )
        self.failures: list[KafkaError] = []

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err)

    def schedule(
        self, msg_id: str, due_ms: int, topic: str, written_ms: int, **fields: Any
    ) -> buffer.Scheduled:
        s = buffer.Scheduled(msg_id, topic, -1, None, b"v", due_ms, **fields)
        self.write_buffer(s, written_ms)
        return s

    def cancel(self, msg_id: str, written_ms: int) -> None:
        self.write_buffer(buffer.Cancel(msg_id), written_ms)

    def write_buffer(self, record: buffer.Scheduled | buffer.Cancel, written_ms: int) -> None:
        """As the proxy writes it: every record of an id in one partition, in order."""
        enc = buffer.encode(record)
        self.producer.produce(
            self.buffer_topic,
            enc.value,
            enc.key,
            partition=buffer.partition_for(record.id, BUFFER_PARTITIONS),
            headers=headers_list(enc.headers),
            timestamp=written_ms,
            on_delivery=self._on_delivery,
        )
        self.buffer_records += 1

    def deliver(self, s: buffer.Scheduled) -> None:
        """Write ``s`` to its target now; the broker stamps it (LogAppendTime). The producer
        claims the due time as the timestamp, as a master with a wrong clock might."""
        self.producer.produce(
            s.topic,
            s.value,
            s.key,
            headers=headers_list(s.delivered_headers()),
            timestamp=s.deliver_at_ms,
            on_delivery=self._on_delivery,
        )
        self.delivered_records += 1

    def flush(self) -> None:
        assert self.producer.flush(60) == 0
        assert self.failures == []

    def config(self, **overrides: Any) -> VerifierConfig:
        settings: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "buffer_topic": self.buffer_topic,
            "grace_ms": ONCE_GRACE_MS,
            "output_topic": "",
            "console": False,
            **overrides,
        }
        return VerifierConfig(**settings)


def independent_report(sc: Scenario, end_ms: int) -> dict[str, Any]:
    """The report, computed from what the topics hold (not from what the test wrote) by the
    project's independent oracle, which shares no code with verifier/."""
    truth = oracle.compute(
        sc.bootstrap,
        sc.targets,
        end_ms=end_ms,
        grace_ms=ONCE_GRACE_MS,
        buffer_topic=sc.buffer_topic,
    )
    # Every record the scenario delivered was read back and matched to a scheduled message.
    assert sum(len(t) for t in truth.deliveries.values()) == sc.delivered_records
    return truth.report


def assert_same_report(got: dict[str, Any], want: dict[str, Any]) -> None:
    """The verifier's report ``got`` has the oracle's counts and, within 1 ms, its lateness."""
    assert set(got) == REPORT_KEYS | {"clock", "isolation"}
    assert got["clock"] == "log-append-time"
    counts = REPORT_KEYS - {"lateness_ms"}
    assert {k: got[k] for k in counts} == {k: want[k] for k in counts}
    assert set(got["lateness_ms"]) == {"p50", "p95", "p99", "max"}
    for key, value in want["lateness_ms"].items():
        assert isinstance(got["lateness_ms"][key], float)
        assert abs(got["lateness_ms"][key] - value) <= 1.0, (key, got, want)


def build_faults(bootstrap: str) -> Scenario:
    """20 messages due 40..21 s ago: one duplicated, one early (due in a minute), one never
    delivered, one cancelled."""
    sc = Scenario(bootstrap)
    base_ms = int(time.time() * 1000) - 40_000
    for i in range(20):
        due = base_ms + 100_000 if i == 5 else base_ms + i * 1_000
        s = sc.schedule(f"f{i}", due, sc.targets[i % 2], base_ms - 60_000)
        if i == 13:
            continue  # missing
        if i == 17:
            sc.cancel(s.id, base_ms - 30_000)  # cancelled in time: not missing
            continue
        sc.deliver(s)
        if i == 9:
            sc.deliver(s)  # a duplicate, e.g. after a failover
    sc.flush()
    return sc
