"""A follower's Python work per ingested buffer record, counted so that code changes compare on
a noisy machine.

Run: ``.venv/bin/python -m bench.ingest_cpu`` (``--callgrind`` for instruction counts). No
Kafka: ``--records`` schedules, then the master's tombstone of each (with its outcome, as a
release writes it), as confluent-kafka ``Message`` objects in batches of ingest's size, go
into a real store (RocksDB), so what is measured is the replica's own work per record:

- ``kdelay``: ``Ingest.apply`` of the real ingest and store, as a follower runs it (its
  collector settings from ``kdelay.memory``): decode, check, the duplicate and cancel rules,
  the entry and its index, the outcome a tombstone tells, offsets and metrics;
- ``baseline``: the least an ingest does per record with the same libraries: read the
  record's key, value, headers and timestamp, decode it, and write a schedule's entry and
  index key, or look a tombstone's index key up and delete both; one WriteBatch a batch.

The figure is per buffer record (a schedule and its tombstone are two), from
``bench/harness/cpu_count.py``: CPU time (median of ``--repeat`` runs) or, with ``--callgrind``,
instructions under valgrind minus the setup's own. The ratio ``kdelay / baseline`` is what
this repository's code adds to the libraries' own cost.
"""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message
from rocksdict import WriteBatch

from bench.harness import cpu_count
from bench.harness.buffer_messages import messages
from kdelay.buffer import Scheduled, Tombstone, decode
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.entry import encode_entry, entry_key
from kdelay.delay_service.store.ids import id_key
from kdelay.delay_service.store.store import Store


def _kdelay(store: Store, batches: list[list[Message]]) -> int:
    ingest = Ingest(ReplicaConfig(name="bench"), store, Metrics())
    ingest.leading = lambda: False
    for batch in batches:
        ingest.apply(batch)
    if store.pending != _left(batches):
        raise SystemExit(f"kdelay: {store.pending} entries left, expected {_left(batches)}")
    return sum(len(b) for b in batches)


def _left(batches: list[list[Message]]) -> int:
    """Entries a correct ingest leaves pending: schedules without a tombstone."""
    kinds = [m.value() is None for b in batches for m in b]
    return kinds.count(False) - kinds.count(True)


def _baseline(store: Store, batches: list[list[Message]]) -> int:
    db, ids, ids_cf = store.state.db, store.state.ids, store.state.ids_cf
    handled = 0
    for batch in batches:
        wb = WriteBatch(raw_mode=True)
        for msg in batch:
            _, timestamp = msg.timestamp()
            headers = cast("list[tuple[str, bytes | None]]", msg.headers() or [])
            record = decode(msg.key(), msg.value(), headers, timestamp)
            if isinstance(record, Scheduled):
                key = entry_key(record.deliver_at_ms, msg.partition() or 0, msg.offset() or 0)
                wb.put(key, encode_entry(record))
                wb.put(id_key(record.id, record.uid), key, ids_cf)
            elif isinstance(record, Tombstone):
                index_key = id_key(record.id, record.uid)
                if (found := ids.get(index_key)) is not None:
                    wb.delete(found)
                    wb.delete(index_key, ids_cf)
            handled += 1
        db.write(wb)
    return handled


def child(mode: str, records: int) -> None:
    """One measurement in this process: print the measured part's CPU µs per record."""
    batches = messages(records)
    cpu_count.in_store(
        mode,
        records,
        lambda _store: None,
        lambda store: _kdelay(store, batches),
        lambda store: _baseline(store, batches),
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    return cpu_count.main("bench.ingest_cpu", __doc__ or "", child, argv, what="ingested records")


if __name__ == "__main__":
    main()
