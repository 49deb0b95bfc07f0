"""What a follower spends removing a released message, by what reaches it first: the master's
tombstone, or the checkpoint that covers the release.

Run: ``.venv/bin/python -m bench.follower_removal`` (``--messages``, ``--repeat``). No Kafka:
a real store (RocksDB) and the real ingest hold ``--messages`` schedules; then each is removed
as a follower removes a released message, either

- ``tombstone_first``: the tombstones (with their outcomes, as a release writes them) through
  ``Ingest.apply``, then the checkpoint covering them all (``Store.apply_checkpoint``), which
  finds nothing left: what a follower does when it applies a checkpoint only once it has
  settled (``delay_service/release/follower_checkpoints.py``);
- ``checkpoint_first``: the checkpoint first (it drops every entry, decoding each and writing
  a "covered" outcome), then the tombstones (each looks its entry up, misses, and writes its
  outcome again): what a follower did when the ZooKeeper checkpoint beat the tombstones
  committed with the same releases.

Prints the ingest thread's CPU µs a message of each order, the median of ``--repeat`` runs
(alternating, each on a fresh store).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness.buffer_messages import PARTITIONS, batches, buffer_records
from kdelay import memory
from kdelay.checkpoint import Checkpoint
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.store import Store

ORDERS = ("tombstone_first", "checkpoint_first")


def run(order: str, count: int) -> float:
    """CPU µs a message of removing ``count`` released messages in ``order``."""
    flat = buffer_records(2 * count)  # schedules, then tombstones
    schedules, tombstones = flat[:count], flat[count:]
    covering = Checkpoint(2**62, dict.fromkeys(range(PARTITIONS), 2**62))
    with tempfile.TemporaryDirectory(prefix="kdelay-follower-removal-") as tmp:
        store = Store(Path(tmp) / "db")
        try:
            ingest = Ingest(ReplicaConfig(name="bench"), store, Metrics())
            ingest.leading = lambda: False
            for batch in batches(schedules):
                ingest.apply(batch)
            memory.freeze_startup_objects()
            started = time.thread_time()
            if order == "checkpoint_first":
                store.apply_checkpoint(covering)
            for batch in batches(tombstones):
                ingest.apply(batch)
            if order == "tombstone_first":
                store.apply_checkpoint(covering)
            elapsed = time.thread_time() - started
            if store.pending:
                raise SystemExit(f"{order}: {store.pending} entries left")
        finally:
            store.close()
    return elapsed / count * 1e6


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    figures: dict[str, list[float]] = {o: [] for o in ORDERS}
    for i in range(args.repeat):
        for order in ORDERS:
            figures[order].append(run(order, args.messages))
            print(f"run {i + 1}/{args.repeat} {order}: {figures[order][-1]:.1f} CPU-us a message")
    out = {f"{o}_cpu_us_per_message": statistics.median(v) for o, v in figures.items()}
    out["checkpoint_first_vs_tombstone_first"] = (
        out["checkpoint_first_cpu_us_per_message"] / out["tombstone_first_cpu_us_per_message"]
    )
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
