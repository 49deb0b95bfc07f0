"""The master's Python work per released record, counted so that code changes compare on a
noisy machine.

Run: ``.venv/bin/python -m bench.forward_cpu`` (``--callgrind`` for instruction counts). No
Kafka: a real store (RocksDB) holds ``--records`` entries all due, and the code under test
releases them against a producer that acknowledges every record at ``poll()`` and sends
nothing, so what is measured is the replica's own work per record, not the broker's:

- ``kdelay``: exactly-once rounds of the real ``ExactlyOnceForwarder`` (store, transactional
  sender, retry policy, outcomes, tombstones, metrics), as a replica runs them, with its
  collector settings (``kdelay.memory``);
- ``baseline``: the least a forwarder does per record with the same libraries: iterate the
  store, decode the entry, produce the release with its headers and a delivery callback,
  produce a tombstone, delete the entry.

Each is a child process (``bench/harness/cpu_count.py``); the figure is per record of the measured
part: CPU time (median of ``--repeat`` runs), or with ``--callgrind`` instructions under
valgrind (deterministic to a fraction of a percent, about a minute). The ratio
``kdelay / baseline`` is what this repository's code adds to the libraries' own cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from rocksdict import WriteBatch

from bench.harness import cpu_count
from kdelay.buffer import Scheduled, Tombstone, encode
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.release.exactly_once import ExactlyOnceForwarder
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.delay_service.store.entry import decode_entry
from kdelay.delay_service.store.store import Store

_CHUNK = 5_000
Callback = Callable[[Any, Any], None]


class _Ack:
    """What a delivery report's message tells the sender: where the record was written."""

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 1


class NullProducer:
    """A transactional producer that acknowledges every record at poll() and sends nothing."""

    def __init__(self) -> None:
        self._reports: list[Callback] = []

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callback | None = None,
        on_delivery: Callback | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        if on_delivery is not None:
            self._reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        reports, self._reports = self._reports, []
        ack = _Ack()
        for report in reports:
            report(None, ack)
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return 0

    def init_transactions(self, timeout: float = -1) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self, timeout: float = -1) -> None:
        self.poll()

    def abort_transaction(self, timeout: float = -1) -> None:
        self._reports.clear()

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        raise AssertionError("no target fails here, so none is probed")


class _Checkpoints:
    def claim_epoch(self) -> int:
        return 1

    def load(self) -> bytes | None:
        return None

    def write(self, data: bytes) -> object:
        return None


class _Ingested:
    def wait_ingested(self, offsets: object, timeout: float, stop: object) -> bool:
        return True


def _fill(store: Store, records: int) -> None:
    """``records`` entries due at 1 s after the epoch (all due), six target partitions."""
    for start in range(0, records, _CHUNK):
        end = min(records, start + _CHUNK)
        batch = [
            (
                i % 4,
                i // 4,
                Scheduled(
                    f"id-{i}", "target", i % 6, f"k{i}".encode(), b"v" * 100, 1_000,
                    (("h", b"x"),), uid=f"u-{i}",
                ),
            )
            for i in range(start, end)
        ]  # fmt: skip
        store.apply(batch, dict.fromkeys(range(4), end // 4 + 1))


def _kdelay(store: Store) -> int:
    cfg = ReplicaConfig(name="bench", delivery="exactly-once")
    producer = NullProducer()
    sender = TxnSender(
        lambda: producer,
        buffer_topic=cfg.buffer_topic,
        produce_timeout_ms=cfg.produce_timeout_ms,
        checkpoint_key="bench",
    )
    fwd = ExactlyOnceForwarder(
        cfg, store, _Ingested(), Metrics(), sender=sender, on_fenced=lambda _why: None
    )
    checkpoints = _Checkpoints()
    generation = fwd.control.activate(checkpoints)
    sender.start()
    released = 0
    while (done := fwd.forward_once(checkpoints, generation).delivered) > 0:
        released += done
    return released


def _baseline(store: Store) -> int:
    producer = NullProducer()
    reports: list[object] = []
    db = store.state.db
    it = db.iter()
    it.seek_to_first()
    batch = WriteBatch(raw_mode=True)
    released = 0
    while it.valid():
        key = bytes(it.key())
        msg = decode_entry(bytes(it.value()))
        producer.produce(
            msg.topic,
            value=msg.value,
            key=msg.key,
            partition=msg.partition,
            on_delivery=lambda err, m: reports.append(m),
            headers=cast("list[tuple[str, str | bytes | None]]", msg.delivered_headers()),
        )
        tombstone = encode(Tombstone(msg.id, 0, msg.uid))
        producer.produce("buffer", None, tombstone.key, 0, headers=list(tombstone.headers))
        batch.delete(key)
        released += 1
        it.next()
    producer.poll()
    db.write(batch)
    return released


def child(mode: str, records: int) -> None:
    """One measurement in this process: print the measured part's CPU µs per record."""
    cpu_count.in_store(mode, records, lambda store: _fill(store, records), _kdelay, _baseline)


def main(argv: list[str] | None = None) -> dict[str, float]:
    return cpu_count.main("bench.forward_cpu", __doc__ or "", child, argv, what="releases")


if __name__ == "__main__":
    main()
