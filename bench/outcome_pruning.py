"""Store writes while outcomes are pruned: the cost must not grow with what was pruned.

    .venv/bin/python -m bench.outcome_pruning [--keep 20000] [--rounds 200]

Each round applies 1,000 schedules due at once to a store and removes them as delivered (as the
master does), keeping at most ``--keep`` outcomes, so every round past the first ``keep / 1000``
prunes 1,000. Prints the time of both writes every 20 rounds and the ratio of the last fifth's
mean to the first fifth's: about 1 when the pruning scan starts at its floor; it grew with the
tombstones of everything pruned when it started at the first key (2026-11-26, 200 rounds:
1.18 with the floor, 2.65 before it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kdelay.buffer import Fate, Scheduled
from kdelay.delay_service.store.store import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=int, default=20_000, help="outcomes kept at most")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kdelay-bench-") as tmp:
        store = Store(Path(tmp) / "store", status_max_entries=args.keep)
        now = int(time.time() * 1000)
        offset = 0
        costs: list[float] = []
        for rnd in range(args.rounds):
            records = []
            for _ in range(1000):
                records.append((0, offset, Scheduled(f"m{offset}", "t", 0, None, b"v", now - 10)))
                offset += 1
            t0 = time.perf_counter()
            store.apply(records, {0: offset})
            due = store.due(now, 1000)
            fate = Fate("delivered", "t", 0, 1, now, now, None)
            store.remove(due, {e.key: fate for e in due})
            costs.append((time.perf_counter() - t0) * 1000)
            if rnd % 20 == 0:
                cost = costs[-1]
                print(f"round {rnd:4}: outcomes {store.outcomes:7,}  apply+remove {cost:6.1f} ms")
        store.close()
    fifth = max(1, args.rounds // 5)
    first, last = statistics.mean(costs[:fifth]), statistics.mean(costs[-fifth:])
    print(f"last fifth / first fifth: {last / first:.2f} ({first:.1f} -> {last:.1f} ms a round)")


if __name__ == "__main__":
    main()
