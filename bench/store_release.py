"""The store's cost per released message must not grow with how many were released.

    .venv/bin/python -m bench.store_release [--messages 600000] [--round 500]

In one process, without Kafka: ``--messages`` schedules are applied to a store, all due, then
released in rounds of ``--round`` as the master does (``Store.due``, then ``Store.remove`` with
each message's fate), while no tombstone is read back (an ingest thread that lags behind its
own master's releases, or a release larger than the store's memory of them,
``RELEASED_MEMORY``). Prints the mean cost of a release in each fifth and the ratio of the last
fifth's to the first's: about 1 when a release costs the same throughout. On 2026-11-27, with
600,000 messages: 6.16 (10.9 -> 67.4 µs a message) while the store's memory of its releases was
a plain dict, whose oldest key is found by stepping over every key deleted before it; 1.15 with
an OrderedDict.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from kdelay.buffer import Fate, Scheduled
from kdelay.delay_service.store.store import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=600_000)
    ap.add_argument("--round", type=int, default=500, help="messages released per round")
    args = ap.parse_args()
    n, size = args.messages, args.round
    due_ms = int(time.time() * 1000) + 3_600_000
    with tempfile.TemporaryDirectory(prefix="kdelay-bench-") as tmp:
        store = Store(Path(tmp) / "store")
        t0 = time.perf_counter()
        for first in range(0, n, size):
            batch = [
                (first % 4, first + i, Scheduled(f"m{first + i}", "t", 0, None, b"x" * 100,
                                                 due_ms + (first + i) // 10, uid=uuid.uuid4().hex))
                for i in range(min(size, n - first))
            ]  # fmt: skip
            store.apply(batch, {first % 4: first + len(batch)})
        print(f"applied {n:,} in {time.perf_counter() - t0:.1f} s")
        per_message: list[float] = []  # µs a message, one value per round
        released = 0
        while True:
            t0 = time.perf_counter()
            due = store.due(2**62, size)
            if not due:
                break
            fates = {
                e.key: Fate("delivered", "t", 0, 1, due_ms, e.message.deliver_at_ms, None)
                for e in due
            }
            released += store.remove(due, fates)
            per_message.append((time.perf_counter() - t0) / len(due) * 1e6)
        store.close()
    fifth = max(1, len(per_message) // 5)
    means = [  # fewer than five rounds: one a fifth, as many as there are
        statistics.mean(per_message[i : i + fifth])
        for i in range(0, fifth * 5, fifth)
        if per_message[i : i + fifth]
    ]
    print(f"released {released:,}; µs a message by fifth: " + ", ".join(f"{m:.1f}" for m in means))
    print(f"last fifth / first fifth: {means[-1] / means[0]:.2f}")


if __name__ == "__main__":
    main()
