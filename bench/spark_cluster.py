"""Records verified per second by ``kdelay verify --once`` on ``local[2]`` and on a two-worker
standalone Spark cluster.

    .venv/bin/python -m bench.spark_cluster [--records 1000000,10000000] [--workers 2]

It starts a one-broker Kafka (dev.stack) and a standalone cluster (``dev.spark.SparkCluster``:
a master and ``--workers`` workers of one core and 1 GiB each, on loopback), then fills a
buffer topic and a LogAppendTime target topic (4 partitions each) itself, fast: one schedule
record and one delivery per message, produced with large batches and lingering. Every
message is due before it is delivered and delivered once (no fault: the work is the full
pipeline, read, parse, join, aggregate, percentiles). Sizes are cumulative: the topics are
filled up to each ``--records`` figure in turn.

For each size, the same bounded verification (``verifier.cli.verify_once``, the ``--once``
code path, with one fixed end instant) runs on ``local[2]`` (the baseline, measured in the
same run: two cores in the driver's JVM) and on the cluster (two executors of one core,
spark.jars and the package zip shipped from the driver); printed: wall seconds of the
verification (the session's start-up apart), delivered records verified per second, and the
cluster's rate against the baseline's. Both reports must be identical (it stops otherwise).
Figures depend on the machine (this one: 2 cores, shared).

On 2026-11-28, 2 cores shared with other jobs (load 4-5), 1,000,000 delivered records (and as
many schedule records): local[2] 110.8 s (9,025 records/s), the two-worker cluster 155.8 s
(6,418/s), 0.71 of local[2]; a second run 126.9 s (7,878/s) against 197.9 s (5,052/s), 0.64
(executors' start-up, 8.9 s, apart). At 1M the cluster is slower here: the same two cores, plus
two executor JVMs, the shuffle over loopback and the driver's serving of tasks.

On 2026-11-29, 10,000,000 delivered records (``--records 10000000 --driver-memory 4g
--executor-memory 3g``, beside a soak of the streaming verifier on another cluster, load 4-6):
local[2] 632.8 s (15,804 records/s), the cluster 464.3 s (21,538/s), 1.36 of local[2]; the
reports identical. At 10M the two executors' heaps (3 GiB each, against one 4 GiB driver heap
for local[2]) pay off. With ``--executor-memory 1g`` the cluster failed: the exact percentiles
(Spark's ``percentile``) keep each distinct lateness value of the run with its count in one
task, and this fill gives nearly every message its own lateness in milliseconds (due times 1 ms
apart, delivered at about 75,000 a second), so the final merge of 10M values ran out of a
1 GiB heap (``OutOfMemoryError`` in ``PercentileBase.merge``, executor exit 52). Real lateness
takes far fewer distinct values; a backlog released hours late does not.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from dev.kafka_tools import HeaderList, create_topic
from dev.spark import SparkCluster
from dev.stack import KafkaSettings, LocalKafka
from kdelay.buffer import Scheduled, encode
from kdelay.verifier.cli import verify_once
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.report import Slo

PARTITIONS = 4
BUFFER_TOPIC = "bench-spark-buffer"
TARGET_TOPIC = "bench-spark-target"
FAST_PRODUCER = {
    "acks": "1",
    "linger.ms": 100,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "lz4",
}


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def create_topics(bootstrap: str) -> None:
    """The buffer topic and the LogAppendTime target topic."""
    create_topic(bootstrap, BUFFER_TOPIC, PARTITIONS, timeout=60)
    config = {"message.timestamp.type": "LogAppendTime"}
    create_topic(bootstrap, TARGET_TOPIC, PARTITIONS, config=config, timeout=60)


def fill(bootstrap: str, first: int, last: int, due0: int) -> None:
    """Messages ``first..last-1``: a schedule record and its delivery (due at ``due0 + i``)."""
    producer = Producer({"bootstrap.servers": bootstrap, **FAST_PRODUCER})
    start = time.monotonic()
    for i in range(first, last):
        s = Scheduled(f"m{i}", TARGET_TOPIC, -1, None, b"v" * 32, due0 + i)
        enc = encode(s)
        part = i % PARTITIONS
        buffer_headers: HeaderList = list(enc.headers)
        delivered_headers: HeaderList = list(s.delivered_headers())
        while True:
            try:
                producer.produce(
                    BUFFER_TOPIC, enc.value, enc.key, partition=part, headers=buffer_headers
                )
                producer.produce(TARGET_TOPIC, s.value, partition=part, headers=delivered_headers)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 100_000 == 0:
            producer.poll(0)
            if i % 1_000_000 == 0 and i > first:
                progress(f"  filled {i:,} ({i - first:,} in {time.monotonic() - start:.0f} s)")
    left = producer.flush(600)
    if left:
        raise RuntimeError(f"{left} records were not delivered to Kafka")
    progress(f"  filled {last:,} messages ({last - first:,} in {time.monotonic() - start:.0f} s)")


def measure(cfg: VerifierConfig, executors: int) -> tuple[float, float, dict[str, Any]]:
    """(start-up seconds, verification seconds, report) on ``cfg.spark_master``; start-up
    includes the registration of ``executors`` executors (0 for local)."""
    from kdelay.verifier import job

    t0 = time.monotonic()
    session = job.spark_session(cfg)
    try:
        # Executors register after the driver starts: their launch is start-up, not work.
        # The status counts the driver's own block manager too.
        deadline = time.monotonic() + 120
        while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() <= executors:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{executors} executors did not register within 120 s")
            time.sleep(0.1)
        started = time.monotonic() - t0
        t1 = time.monotonic()
        outcome = verify_once(session, cfg, Slo(), None)
        took = time.monotonic() - t1
    finally:
        session.stop()
        gc.collect()
    return started, took, outcome.report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default="1000000", help="comma-separated cumulative sizes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument(
        "--executor-memory",
        default="1g",
        help="each executor's (and worker's) memory; 10M records need more than 1g (see above)",
    )
    args = ap.parse_args()
    sizes = sorted(int(x) for x in args.records.split(","))
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-spark-"))
    kafka = LocalKafka(
        base / "kafka",
        settings=KafkaSettings(heap_mb=1024, auto_create_topics=False, quick_jit=False),
    )
    try:
        kafka.start()
        bootstrap = kafka.bootstrap_servers
        create_topics(bootstrap)
        memory = args.executor_memory
        with SparkCluster(base / "spark", workers=args.workers, worker_memory=memory) as cluster:
            progress(f"cluster {cluster.master_url}: {args.workers} workers, 1 core, {memory} each")
            due0 = int(time.time() * 1000) - 3_600_000
            filled = 0
            rows = []
            for n in sizes:
                fill(bootstrap, filled, n, due0)
                filled = n
                end_ms = int(time.time() * 1000) + 60_000
                results = {}
                for master in ("local[2]", cluster.master_url):
                    cfg = VerifierConfig(
                        bootstrap_servers=bootstrap,
                        buffer_topic=BUFFER_TOPIC,
                        topics=TARGET_TOPIC,
                        output_topic="",
                        console=False,
                        end_ms=end_ms,
                        spark_master=master,
                        shuffle_partitions=args.shuffle_partitions,
                        driver_memory=args.driver_memory,
                        executor_memory=memory,
                        log_level="WARNING",
                    )
                    executors = 0 if master.startswith("local") else args.workers
                    started, took, report = measure(cfg, executors)
                    if report["delivered"] != n or report["missing"] != 0:
                        raise RuntimeError(f"{master}: unexpected report {report}")
                    results[master] = (started, took, report)
                    progress(f"  {n:,} on {master}: start-up {started:.1f} s, verify {took:.1f} s")
                local, remote = results["local[2]"], results[cluster.master_url]
                if json.dumps(local[2], sort_keys=True) != json.dumps(remote[2], sort_keys=True):
                    raise RuntimeError(f"reports differ: {local[2]} vs {remote[2]}")
                rows.append((n, local[1], remote[1]))
        print(
            f"{'delivered':>12} {'local[2] s':>11} {'rec/s':>10} {'cluster s':>10} {'rec/s':>10}"
            f" {'ratio':>6}"
        )
        for n, lt, ct in rows:
            print(
                f"{n:>12,} {lt:>11.1f} {n / lt:>10,.0f} {ct:>10.1f} {n / ct:>10,.0f}"
                f" {lt / ct:>6.2f}"
            )
    finally:
        kafka.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
