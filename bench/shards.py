"""Shards: what one replica costs per message with 1 shard and with 2, not a test.

    .venv/bin/python -m bench.shards [--messages 200000] [--shards 1,2] [--json F]

Starts its own Kafka and ZooKeeper (dev.stack). For each shard count, one replica per shard
(``kdelay delay-service --shards N --shard i``, exactly-once, the default) reads a fresh buffer
topic of 4 partitions; ``--messages`` buffer records (100 B values, round-robin over the
partitions) are written straight to it (as the proxy would), all due
at one time once every replica has caught up; the target is a LogAppendTime topic. Per shard
count it reports:

- CPU-seconds per million messages per replica: each replica's user + system CPU time (from
  /proc) while a batch due 2 s later is ingested and released, over the batch; the mean over
  the replicas. With 2 shards each replica ingests and releases half of them, so this should
  halve. Also the same for ingest alone (a first batch, due in an hour, ingested first);
- ingest time of that first batch: from the first write until every store holds its share;
- the aggregate forward rate: messages / (last - first release), by the broker's clock;
- the ratio of each figure to the 1-shard run of the same invocation (the baseline).

Figures depend on the machine (2 cores here: two replicas compete for them, so the aggregate
rate cannot double; the CPU per replica is the figure that shows the division of work).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.harness.lateness import consume_lateness, produce_buffer
from bench.harness.replicas import PARTITIONS, Replicas, kafka_settings
from dev.kafka_tools import create_topic
from dev.stack import LocalKafka, LocalZooKeeper, wait_until
from kdelay.buffer import Scheduled
from kdelay.shards import owns

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
VALUE = b"v" * 100


def _holds(rs: Replicas, count: int) -> Callable[[], bool]:
    """Whether ``rs``'s replica says its store holds ``count`` entries."""
    return lambda: rs.status().get(rs.names[0], {}).get("pending") == count


def run(base: Path, bs: str, zk: str, shards: int, n: int) -> dict[str, float]:
    """One shard count: the figures of the module docstring."""
    root = f"/kdelay-bench/{uuid.uuid4().hex[:8]}"
    buffer = f"bench-buffer-{uuid.uuid4().hex[:8]}"
    sets = [
        Replicas(base / f"{shards}-{i}", bs, zk, 1, shard=(i, shards), root=root, buffer=buffer)
        for i in range(shards)
    ]
    try:
        for rs in sets:
            rs.start_all()
        for rs in sets:
            rs.wait_master()
        topic = f"bench-shards-{uuid.uuid4().hex[:8]}"
        create_topic(bs, topic, PARTITIONS, config=LOG_APPEND_TIME)
        ids = [f"s{i}-{uuid.uuid4().hex[:12]}" for i in range(n)]
        # bench.delay_service.produce_buffer writes record i to partition i % PARTITIONS.
        share = {
            s: sum(1 for i in range(n) if owns(i % PARTITIONS, s, shards)) for s in range(shards)
        }
        cpu0 = {(rs.shard, name): rs.cpu_seconds(name) for rs in sets for name in rs.names}
        due = int(time.time() * 1000) + 3_600_000  # far away: ingest first, release later
        began = time.monotonic()
        produce_buffer(bs, buffer, (
            Scheduled(m, topic, i % PARTITIONS, None, VALUE, due) for i, m in enumerate(ids)
        ))  # fmt: skip
        for rs in sets:
            wait_until(
                _holds(rs, share[rs.shard]),
                timeout=900,
                what=f"shard {rs.shard} to ingest its {share[rs.shard]} messages",
                interval=0.2,
            )
        ingest_s = time.monotonic() - began
        cpu1 = {(rs.shard, name): rs.cpu_seconds(name) for rs in sets for name in rs.names}
        # A second batch, due in 2 s: ingested and released (the first stays pending).
        due = int(time.time() * 1000) + 2_000
        ids2 = [f"t{i}-{uuid.uuid4().hex[:12]}" for i in range(n)]
        produce_buffer(bs, buffer, (
            Scheduled(m, topic, i % PARTITIONS, None, VALUE, due) for i, m in enumerate(ids2)
        ))  # fmt: skip
        lat = consume_lateness(bs, topic, n, timeout=900)
        spread_ms = max(lat.release, default=0) - min(lat.release, default=0)
        keys = list(cpu0)
        ingest_cpu = [cpu1[k] - cpu0[k] for k in keys]
        both_cpu = [rs.cpu_seconds(k[1]) - cpu1[k] for rs in sets for k in keys if k[0] == rs.shard]
        millions = n / 1e6
        return {
            "shards": shards,
            "messages": n,
            "cpu_s_per_million_per_replica": sum(both_cpu) / len(both_cpu) / millions,
            "ingest_cpu_s_per_million_per_replica": sum(ingest_cpu) / len(ingest_cpu) / millions,
            "ingest_s": ingest_s,
            "ingest_per_s": n / ingest_s,
            "forward_per_s": n / max(spread_ms / 1000, 1e-3),
            "delivered": len(lat.release),
        }
    finally:
        for rs in sets:
            rs.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--shards", default="1,2", help="shard counts; the first is the baseline")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.shards.split(",")]
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-shards-"))
    kafka = LocalKafka(base / "kafka", settings=kafka_settings())
    zk = LocalZooKeeper(base / "zk")
    rows: list[dict[str, float]] = []
    try:
        kafka.start()
        zk.start()
        for shards in counts:
            row = run(base, kafka.bootstrap_servers, zk.connect_string, shards, args.messages)
            first = rows[0] if rows else row
            for key in (
                "cpu_s_per_million_per_replica",
                "ingest_cpu_s_per_million_per_replica",
                "ingest_per_s",
                "forward_per_s",
            ):
                row[f"{key}_ratio"] = row[key] / first[key]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        kafka.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    print("shards  CPU-s/M/replica (ratio)  ingest-only (ratio)  ingest/s  forward/s")
    for r in rows:
        print(
            f"{r['shards']:>6}  {r['cpu_s_per_million_per_replica']:>9.1f} "
            f"({r['cpu_s_per_million_per_replica_ratio']:.2f})"
            f"  {r['ingest_cpu_s_per_million_per_replica']:>11.1f} "
            f"({r['ingest_cpu_s_per_million_per_replica_ratio']:.2f})"
            f"  {r['ingest_per_s']:>8,.0f}  {r['forward_per_s']:>9,.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
