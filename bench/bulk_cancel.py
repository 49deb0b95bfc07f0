"""What a bulk cancel over a million pending messages costs a replica.

    .venv/bin/python -m bench.bulk_cancel [--messages 1000000] [--others 1000000]

In one process, without Kafka, as a replica's ingest thread does it: ``--messages`` schedules
with ids ``cust-42-<n>`` and ``--others`` with ids ``cust-43-<n>`` (four buffer partitions,
accepted before the bulk cancel) are applied to a fresh store in batches of 5,000
(:meth:`Store.apply`, what ingest calls per poll); then one bulk cancel record with prefix
``cust-42-`` is applied as ingest applies it: in steps of ``BULK_STEP`` entries
(``Store.bulk_step``: the prefix scan of the ids index, each entry read and decoded for its
topic and owner, its deletion and outcome, one RocksDB WriteBatch per step, the store's lock
free between steps), then the batch with the record (``Store.apply``). Printed: wall and CPU
time of the bulk cancel (this process: the replica's one ingest thread does all of it) and
of its longest step (the longest the store's lock is held), against the baseline measured in
the same run, the time to ingest the ``--messages`` it cancels; the count it records; that
the others are still pending; and the process's peak RSS.

Not included: the master writing one tombstone per cancelled message to the buffer topic
afterwards (the same tombstones a per-message cancel writes, at the forwarder's usual rate).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.writes import BULK_STEP

BATCH = 5_000
T0 = 1_800_000_000_000  # the bulk cancel's append time


def fill(store: Store, prefix: str, n: int, start_offset: int) -> int:
    """Apply ``n`` schedules ``<prefix><i>``; returns the next buffer offset per partition."""
    offset = start_offset
    for first in range(0, n, BATCH):
        batch = []
        for i in range(first, min(n, first + BATCH)):
            msg = Scheduled(
                f"{prefix}{i}", "orders", -1, b"k", b"x" * 100, T0 + 3_600_000 + i, (),
                f"{prefix}u{i}", seq=(T0 - 60_000) << 20 | (i & 0xFFFFF),
            )  # fmt: skip
            batch.append((i % 4, offset + i // 4, msg, T0 - 60_000))
        store.apply(batch, dict.fromkeys(range(4), offset + (first + BATCH) // 4 + 1))
    return offset + n // 4 + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--others", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kdelay-bulk-") as tmp:
        store = Store(Path(tmp) / "db")
        w0, c0 = time.perf_counter(), time.process_time()
        offset = fill(store, "cust-42-", args.messages, 0)
        ingest_wall, ingest_cpu = time.perf_counter() - w0, time.process_time() - c0
        offset = fill(store, "cust-43-", args.others, offset)
        assert store.pending == args.messages + args.others
        record = Cancel("bulk.bench", "kbulk", prefix="cust-42-")
        at = (0, offset, T0)
        w0, c0 = time.perf_counter(), time.process_time()
        longest, steps, done = 0.0, 0, False
        while not done:  # as ingest does: steps, the store's lock free between them
            s0 = time.perf_counter()
            _, done = store.bulk_step(at, record)
            longest, steps = max(longest, time.perf_counter() - s0), steps + 1
        result = store.apply([(*at[:2], record, T0)], {0: offset + 1})
        bulk_wall, bulk_cpu = time.perf_counter() - w0, time.process_time() - c0
        counted = store.bulk_result("bulk.bench")
        left = store.pending
        store.close()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"pending before: {args.messages:,} matching + {args.others:,} others")
    print(
        f"baseline, ingest of the {args.messages:,} matching: wall {ingest_wall:.1f} s, "
        f"cpu {ingest_cpu:.1f} s"
    )
    print(
        f"bulk cancel: wall {bulk_wall:.1f} s, cpu {bulk_cpu:.1f} s "
        f"(x{bulk_wall / ingest_wall:.2f} wall, x{bulk_cpu / ingest_cpu:.2f} cpu of the baseline)"
    )
    print(
        f"in {steps} steps of at most {BULK_STEP:,} entries (one WriteBatch each; the store's "
        f"lock held {longest:.2f} s at most), then the batch ({result.bulk_cancelled:,} left)"
    )
    print(f"recorded count: {counted}; still pending {left:,}")
    print(f"peak RSS: {rss_mb:.0f} MB")


if __name__ == "__main__":
    main()
