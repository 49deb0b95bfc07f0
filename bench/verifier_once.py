"""Records verified per second by ``kdelay verify --once`` on ``local[2]``, against Spark's own
reading rate of the same topics in the same run.

    .venv/bin/python -m bench.verifier_once [--records 1000000] [--runs 1] [--profile]
        [--bootstrap HOST:PORT] [--driver-memory 2g]

It starts a one-broker Kafka (dev.stack) and fills a buffer topic and a LogAppendTime target
topic (4 partitions each) as ``bench.spark_cluster`` does: one schedule record and one delivery
per message, every message delivered once after its due time, nearly every lateness in ms its
own (due times 1 ms apart). ``--bootstrap`` uses a Kafka already running instead, filling its
topics only up to ``--records`` (so repeated runs fill once).

Each run opens one session on ``local[2]`` (the verifier's own, ``job.spark_session``) and times,
in this order: the baseline, a bare Spark job reading both topics earliest..latest with the same
Kafka options into a count (what Spark's Kafka source alone takes); then the ``--once``
verification (``verifier.cli.verify_once`` with one fixed end instant, report, details and
charts written to a temporary directory, as ``kdelay verify --once --report FILE`` does). The
session's start-up is apart. Printed per run: both in seconds, delivered records verified per
second and the verification's time over the baseline's. ``--profile`` turns on Spark's UI and
prints each Spark job's wall time and its stages' task run and CPU seconds (Spark's status API),
and the tasks' CPU seconds of the baseline and of the verification, to see where the time goes.
Not part of ``make test``.

On 2026-12-07 (``--records 1000000 --profile``, load 8-11 on the 2 cores): verify 107.5 s
(9,302 records/s), the baseline 30.8 s, 3.49 of it; the tasks' CPU 42.5 s against the
baseline's 6.3 s. The code before that day's change (its ``verifier/source.py`` and ``job.py``),
right after on the same topics: 140.9 s (7,095/s), baseline 34.1 s, 4.13; CPU 68.4 s against
6.6 s. The reports identical.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.spark_cluster import BUFFER_TOPIC, PARTITIONS, TARGET_TOPIC, create_topics, fill
from dev.stack import KafkaSettings, LocalKafka
from kdelay.verifier.cli import verify_once
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.report import Slo


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def filled(bootstrap: str) -> int:
    """Records in the target topic (the bench's messages filled so far)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-verifier-once"})
    try:
        total = 0
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(TARGET_TOPIC, p), 10)
            total += high - low
        return total
    finally:
        consumer.close()


def ensure_filled(bootstrap: str, records: int) -> None:
    try:
        have = filled(bootstrap)
    except Exception:  # noqa: BLE001 - no topic yet: create it
        create_topics(bootstrap)
        have = 0
    if have > records:
        raise SystemExit(f"{TARGET_TOPIC} holds {have:,} records, more than --records {records:,}")
    if have < records:
        # Due times are fixed by the first message's, so a later fill keeps them 1 ms apart.
        fill(bootstrap, have, records, due0=int(time.time() * 1000) - 3_600_000 - have)


def _jobs(ui: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=10) as resp:  # noqa: S310
        app = json.load(resp)[0]["id"]
    url = f"{ui}/api/v1/applications/{app}/jobs"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
        jobs: list[dict[str, Any]] = json.load(resp)
    return jobs


def _seconds(job: dict[str, Any]) -> float:
    def at(key: str) -> float:
        stamp = str(job[key]).replace("GMT", "+0000")
        whole = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
        return whole + float(stamp[20:23]) / 1e3

    return at("completionTime") - at("submissionTime") if "completionTime" in job else float("nan")


def _stages(ui: str) -> dict[int, dict[str, Any]]:
    with urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=10) as resp:  # noqa: S310
        app = json.load(resp)[0]["id"]
    url = f"{ui}/api/v1/applications/{app}/stages?status=complete"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
        return {int(s["stageId"]): s for s in json.load(resp)}


def cpu_seconds(ui: str, first: int, last: int) -> float:
    """The tasks' CPU seconds in the stages of jobs ``first..last`` (ids, inclusive)."""
    stages = _stages(ui)
    ids = {
        sid for job in _jobs(ui) if first <= int(job["jobId"]) <= last for sid in job["stageIds"]
    }
    return float(sum(stages[sid]["executorCpuTime"] for sid in ids if sid in stages)) / 1e9


def print_jobs(ui: str, since: int) -> None:
    """Each Spark job after job id ``since``: its id, wall seconds, stages, tasks, name; and
    each stage it ran: tasks' run and CPU seconds, records read, shuffled."""
    stages = _stages(ui)
    for job in sorted(_jobs(ui), key=lambda j: int(j["jobId"])):
        if int(job["jobId"]) <= since:
            continue
        progress(
            f"    job {job['jobId']:>3} {_seconds(job):7.2f} s  stages {len(job['stageIds']):>2}"
            f"  tasks {job['numTasks']:>4}  {job['name'][:90]}"
        )
        for sid in sorted(job["stageIds"]):
            st = stages.get(sid)
            if st is None or st["executorRunTime"] < 200:
                continue
            progress(
                f"      stage {sid:>3} run {st['executorRunTime'] / 1e3:6.1f} s"
                f" cpu {st['executorCpuTime'] / 1e9:6.1f} s in {st['inputRecords']:>8}"
                f" shuffle r/w {st['shuffleReadRecords']:>8}/{st['shuffleWriteRecords']:>8}"
                f"  {st['name'][:60]}"
            )


Timing = tuple[float, float, float, float, float]


def run(cfg: VerifierConfig, records: int, profile: bool) -> tuple[Timing, dict[str, Any]]:
    """(start-up s, baseline s, verification s, and with ``profile`` the tasks' CPU seconds of
    the baseline and of the verification, else NaN), and the report; in one session."""
    from kdelay.verifier import job
    from kdelay.verifier.source import read_batch

    t0 = time.monotonic()
    session = job.spark_session(cfg)
    ui = session.sparkContext.uiWebUrl if profile else None
    out = Path(tempfile.mkdtemp(prefix="kdelay-bench-once-"))
    try:
        started = time.monotonic() - t0
        t1 = time.monotonic()
        counted = read_batch(session, cfg, subscribe=f"{BUFFER_TOPIC},{TARGET_TOPIC}").count()
        baseline = time.monotonic() - t1
        if counted != 2 * records:
            raise RuntimeError(f"the baseline counted {counted:,} records, not {2 * records:,}")
        last = max((int(j["jobId"]) for j in _jobs(ui)), default=-1) if ui else -1
        t2 = time.monotonic()
        outcome = verify_once(session, cfg, Slo(), out / "report.json")
        took = time.monotonic() - t2
        cpu = (float("nan"), float("nan"))
        if ui:
            print_jobs(ui, last)
            cpu = (cpu_seconds(ui, 0, last), cpu_seconds(ui, last + 1, 1 << 30))
    finally:
        session.stop()
        shutil.rmtree(out, ignore_errors=True)
        gc.collect()
    return (started, baseline, took, *cpu), outcome.report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--bootstrap", default="", help="a running Kafka [start one]")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--shuffle-partitions", type=int, default=0, help="[the verifier's default]")
    ap.add_argument("--profile", action="store_true", help="print each Spark job's time")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kdelay-bench-once-"))
    kafka = None
    try:
        bootstrap = args.bootstrap
        if not bootstrap:
            kafka = LocalKafka(
                base / "kafka",
                settings=KafkaSettings(heap_mb=1024, auto_create_topics=False, quick_jit=False),
            )
            kafka.start()
            bootstrap = kafka.bootstrap_servers
        ensure_filled(bootstrap, args.records)
        extra: dict[str, Any] = {}
        if args.shuffle_partitions:
            extra["shuffle_partitions"] = args.shuffle_partitions
        cfg = VerifierConfig(
            bootstrap_servers=bootstrap,
            buffer_topic=BUFFER_TOPIC,
            topics=TARGET_TOPIC,
            output_topic="",
            console=False,
            end_ms=int(time.time() * 1000) + 60_000,
            spark_master="local[2]",
            driver_memory=args.driver_memory,
            spark_conf={"spark.ui.enabled": "true", "spark.ui.port": "0"} if args.profile else {},
            log_level="WARNING",
            **extra,
        )
        rows = []
        for i in range(args.runs):
            (started, baseline, took, base_cpu, cpu), report = run(cfg, args.records, args.profile)
            if report["delivered"] != args.records or report["missing"] != 0:
                raise RuntimeError(f"unexpected report {report}")
            load = os.getloadavg()
            progress(
                f"  run {i + 1}: start-up {started:.1f} s, baseline {baseline:.1f} s, "
                f"verify {took:.1f} s, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
            )
            if args.profile:
                progress(f"  tasks' CPU: baseline {base_cpu:.1f} s, verify {cpu:.1f} s")
            progress(f"  report {json.dumps(report, sort_keys=True)}")
            rows.append((baseline, took, load[1]))
        print(
            f"{'delivered':>12} {'baseline s':>11} {'read rec/s':>11} {'verify s':>9}"
            f" {'rec/s':>9} {'ratio':>6} {'load 5m':>8}"
        )
        for baseline, took, load5 in rows:
            print(
                f"{args.records:>12,} {baseline:>11.1f} {2 * args.records / baseline:>11,.0f}"
                f" {took:>9.1f} {args.records / took:>9,.0f} {took / baseline:>6.2f}"
                f" {load5:>8.1f}"
            )
    finally:
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
