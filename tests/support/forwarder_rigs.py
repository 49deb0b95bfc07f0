"""Fakes and helpers for driving a forwarder in process (tests/unit/test_forwarder.py,
test_exactly_once.py, test_scan_sweep.py, test_smoothing.py, and the integration tests that
load checkpoints): a checkpoint store, an ingest that is always caught up, a transactional
producer, and message builders."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException

from kdelay.buffer import Scheduled
from kdelay.checkpoint import CheckpointRecord
from kdelay.zk.errors import FencedError
from tests.support.fakes import FakeProducer, Sent


@dataclass
class FakeCheckpoints:
    """Records each written checkpoint as (time_ms, offsets)."""

    writes: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    records: list[CheckpointRecord] = field(default_factory=list)
    fenced: bool = False

    def claim_epoch(self) -> int:
        return 1

    def load(self) -> bytes | None:
        return None

    def write(self, data: bytes) -> object:
        if self.fenced:
            raise FencedError("newer epoch")
        record = CheckpointRecord.decode(data)
        self.records.append(record)
        self.writes.append((record.time_ms, dict(record.offsets)))
        return None


class FakeIngest:
    def wait_ingested(
        self, offsets: Mapping[int, int], timeout: float, stop: threading.Event
    ) -> bool:
        return True


@dataclass
class FakeTxnProducer(FakeProducer):
    """Records become ``committed`` only at commit_transaction; abort drops them."""

    committed: list[Sent] = field(default_factory=list)
    inits: int = 0
    commits: int = 0
    aborts: int = 0
    fence_at_commit: bool = False
    open: bool = False
    leaderless: set[str] = field(default_factory=set)  # topics whose partitions have no leader
    leaderless_partitions: set[tuple[str, int]] = field(default_factory=set)  # one partition's
    invalid: dict[str, KafkaError] = field(default_factory=dict)  # the metadata's topic errors
    probes: list[str] = field(default_factory=list)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> SimpleNamespace:
        assert topic is not None
        self.probes.append(topic)
        partitions = {
            p: SimpleNamespace(
                leader=-1
                if topic in self.leaderless or (topic, p) in self.leaderless_partitions
                else 1
            )
            for p in (0, 1)
        }
        error = self.invalid.get(topic)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions=partitions)})

    def init_transactions(self, timeout: float = -1) -> None:
        self.inits += 1

    begun: float = 0.0

    def begin_transaction(self) -> None:
        assert not self.open, "a transaction is already open"
        self.open = True
        self.sent = []
        self.begun = self.clock.mono if self.clock is not None else 0.0

    def commit_transaction(self, timeout: float = -1) -> None:
        assert self.open
        self.poll(0)
        if self.fence_at_commit:
            raise KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
        self.commits += 1
        self.committed += self.sent
        self.open = False

    def abort_transaction(self, timeout: float = -1) -> None:
        assert self.open
        self.aborts += 1
        self.queued = []
        self.sent = []
        self.open = False

    def visible(self, topic: str) -> list[Sent]:
        return [s for s in self.committed if s.topic == topic]


def msg(i: int, at: int, topic: str = "t", partition: int = 0) -> Scheduled:
    return Scheduled(
        f"m{i}", topic, partition, f"k{i}".encode(), f"v{i}".encode(), at, (("h", b"x"),)
    )


def ids_to(producer: FakeProducer, topic: str) -> list[str]:
    ids = [dict(s.headers)["kdelay-id"] for s in producer.to(topic)]
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
