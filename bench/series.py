"""Recurring messages: what a series costs in the store, and the forward rate when many fire at
once, against plain delayed messages in the same run.

    .venv/bin/python -m bench.series [--series 100000] [--json F]

Starts its own Kafka and ZooKeeper (dev.stack) and three replicas (``kdelay delay-service``,
exactly-once, the default) on a buffer topic of their own; buffer records are written straight
to it, as the proxy would. Measured:

- the forward rate of ``--series`` plain messages all due at once (the baseline), then of as
  many series (``R2/PT10M``: each release also writes the next occurrence to the buffer topic,
  in the same transaction), all due at once: messages released per second, from the spread of
  their broker timestamps (LogAppendTime targets);
- bytes per series in the store, from the codec (entry key and value, id index, and the
  outcome an occurrence leaves behind) beside a plain message of the same content, and the
  replicas' store size on disk (``kdelay_replica_store_bytes``) with the series pending.

Not part of ``make test``; figures depend on the machine: compare the two rows of one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from bench.harness.lateness import consume_lateness, produce_buffer
from bench.harness.replicas import PARTITIONS, Replicas, kafka_settings
from dev.kafka_tools import create_topic
from dev.stack import LocalKafka, LocalZooKeeper, wait_until
from kdelay.buffer import Scheduled
from kdelay.delay_service.store.entry import encode_entry, entry_key
from kdelay.delay_service.store.ids import id_key

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
REPEAT = "R2/PT10M"
#: A delivered occurrence's outcome: its JSON document and time index (outcomes.py), measured
#: on a typical one.
OUTCOME = (
    b'{"state":"delivered","source":"tombstone","deliver_at_ms":1795463860521,"topic":'
    b'"bench-xxxxxxxx","partition":3,"offset":123456,"at_ms":1795463860522,"occurrence":1,'
    b'"w":1795463860530}'
)


def message(i: int, topic: str, due: int, repeat: str | None) -> Scheduled:
    uid = uuid.uuid4().hex  # the replicas keep one record per (id, buffer key)
    return Scheduled(
        f"{topic}-{i}", topic, i % PARTITIONS, None, b"v" * 100, due, (), uid, repeat=repeat
    )


def codec_bytes(repeat: str | None) -> int:
    """Key + value + id index of one pending entry, plus the outcome when it left."""
    m = message(1, "bench-xxxxxxxx", 1_795_463_860_521, repeat)
    key = entry_key(m.deliver_at_ms, 3, 123_456, 1 << 60)
    pending = len(key) + len(encode_entry(m)) + len(id_key(m.id, m.uid)) + len(key)
    return pending + len(OUTCOME) + len(m.id) + 8 + 8 + len(m.id)


def store_bytes(rs: Replicas) -> int:
    total = 0
    for r in rs.status().values():
        url = str(r["metrics"])  # http://host:port/metrics, from the replica's status znode
        body = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310
        for line in body.splitlines():
            if line.startswith("kdelay_replica_store_bytes "):
                total += int(float(line.split()[1]))
    return total // len(rs.names)


def pending(rs: Replicas) -> int:
    return min(int(str(s.get("pending", 0))) for s in rs.status().values())


def burst(rs: Replicas, n: int, repeat: str | None) -> tuple[float, int]:
    """Messages released per second when ``n`` fall due at once; store bytes meanwhile."""
    topic = f"bench-series-{uuid.uuid4().hex[:8]}"
    create_topic(rs.bootstrap, topic, PARTITIONS, config=LOG_APPEND_TIME)
    # Due once every replica holds all of them, whatever the machine's speed.
    due = int(time.time() * 1000) + 60_000 + n * 2
    produce_buffer(rs.bootstrap, rs.buffer, (message(i, topic, due, repeat) for i in range(n)))
    wait_until(
        lambda: pending(rs) >= n,
        timeout=max(30, (due - time.time() * 1000) / 1000),
        what=f"{n} pending on every replica before they are due",
    )
    disk = store_bytes(rs)
    lat = consume_lateness(rs.bootstrap, topic, n, timeout=900)
    spread_ms = max(lat.release, default=0) - min(lat.release, default=0)
    return len(lat.release) / max(spread_ms / 1000, 1e-3), disk


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=100_000, help="series (and messages) at once")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-series-"))
    kafka = LocalKafka(base / "kafka", settings=kafka_settings())
    zk = LocalZooKeeper(base / "zk")
    results: dict[str, object] = {
        "codec_bytes_plain": codec_bytes(None),
        "codec_bytes_series": codec_bytes(REPEAT),
    }
    try:
        kafka.start()
        zk.start()
        # Each phase on a replica set and buffer topic of its own: the store's size with the
        # burst pending, less the same store empty, is that burst's alone (a phase that ran
        # before in the same store would still be compacting its deletions away).
        for label, repeat in (("plain", None), ("series", REPEAT)):
            rs = Replicas(base / label, kafka.bootstrap_servers, zk.connect_string, 3, ())
            try:
                rs.start_all()
                rs.wait_master()
                empty = store_bytes(rs)
                rate, disk = burst(rs, args.series, repeat)
            finally:
                rs.close()
            results[f"{label}/forward_per_s"] = round(rate)
            results[f"{label}/disk_bytes_per_pending"] = round((disk - empty) / args.series)
            print(f"{label}: {rate:,.0f} msg/s released, {disk - empty:,} bytes on disk "
                  f"with {args.series:,} pending", flush=True)  # fmt: skip
    finally:
        kafka.stop()
        zk.stop()
        shutil.rmtree(base, ignore_errors=True)
    plain, series = results["plain/forward_per_s"], results["series/forward_per_s"]
    assert isinstance(plain, int)
    assert isinstance(series, int)
    results["series/plain forward ratio"] = round(series / max(plain, 1), 2)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
