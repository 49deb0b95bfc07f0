"""Soak of the streaming verifier on a two-worker Spark cluster: memory and
checkpoint size over a long run.

    .venv/bin/python -m bench.verifier_soak [--minutes 30] [--rate 500] [--workers 2] [--out DIR]

It starts a one-broker Kafka (dev.stack) and a standalone cluster (``dev.spark.SparkCluster``),
then ``kdelay verify`` (continuous, 10 s windows, a checkpoint directory, Prometheus on a port)
as a subprocess on the cluster. A feeder writes ``--rate`` messages a second for ``--minutes``:
each second, schedule records due one second later to the buffer topic, and the deliveries of
the previous second's messages to a LogAppendTime target topic (on time; one in a thousand
never delivered, so "missing" moves too). Every 30 s it samples the verifier driver's resident
set size, the executors' (the workers' ``CoarseGrainedExecutorBackend`` children), the
checkpoint directory's size on disk, and the verifier's ``kdelay_verifier_scheduled_total``
(progress); the driver's figure is the ``kdelay verify`` process and the JVM it starts. It
prints a line per sample and, at the end, the first, last and largest of each figure and the
last half's growth; a JSON file goes to ``--out``. Not part of ``make test``.

On 2026-11-29, ``--minutes 120 --rate 300`` (2,160,000 messages; its minutes 76-96 beside a CI
run): checkpoint 45-71 MB from minute 20 on; executors 2.4-2.5 GB from minute 25 on; the
driver's largest sample per 20 minutes 1,164, 1,239, 1,278, 1,262, 1,283 and 1,353 MB; the
published windows about 150 s behind the feed throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.harness.replicas import rss_bytes
from dev.kafka_tools import HeaderList, create_topic
from dev.spark import SparkCluster
from dev.stack import KDELAY, KafkaSettings, LocalKafka, free_port
from kdelay.buffer import Scheduled, encode

BUFFER_TOPIC = "soak-buffer"
TARGET_TOPIC = "soak-target"
PARTITIONS = 4
SAMPLE_S = 30.0
MB = 1024 * 1024


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def create_topics(bootstrap: str) -> None:
    """The buffer topic and the LogAppendTime target topic."""
    create_topic(bootstrap, BUFFER_TOPIC, PARTITIONS, timeout=60)
    config = {"message.timestamp.type": "LogAppendTime"}
    create_topic(bootstrap, TARGET_TOPIC, PARTITIONS, config=config, timeout=60)


def feed(bootstrap: str, rate: int, until: float, stop: threading.Event) -> int:
    """Schedules due a second ahead, and last second's deliveries, ``rate`` a second."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "1"})
    sent = 0
    previous: list[Scheduled] = []
    tick = time.time()
    while time.time() < until and not stop.is_set():
        now_ms = int(time.time() * 1000)
        batch = [
            Scheduled(f"s{sent + i}", TARGET_TOPIC, -1, None, b"v" * 32, now_ms + 1_000)
            for i in range(rate)
        ]
        for i, s in enumerate(batch):
            enc = encode(s)
            headers: HeaderList = list(enc.headers)
            producer.produce(
                BUFFER_TOPIC, enc.value, enc.key, partition=i % PARTITIONS, headers=headers
            )
        for i, s in enumerate(previous):
            if (sent + i) % 1000 == 999:
                continue  # never delivered: missing
            delivered: HeaderList = list(s.delivered_headers())
            producer.produce(TARGET_TOPIC, s.value, partition=i % PARTITIONS, headers=delivered)
        producer.poll(0)
        sent += len(batch)
        previous = batch
        tick += 1.0
        time.sleep(max(0.0, tick - time.time()))
    producer.flush(60)
    return sent


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def executor_pids(base: Path) -> list[int]:
    """This soak's Spark executors (the workers' children, working under ``base``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = (entry / "cwd").readlink()
        except (FileNotFoundError, PermissionError, ProcessLookupError, OSError):
            continue
        if b"CoarseGrainedExecutorBackend" in cmdline and cwd.is_relative_to(base):
            pids.append(int(entry.name))
    return pids


def with_children(pid: int) -> list[int]:
    """``pid`` and its children (the verifier CLI and the driver JVM it starts)."""
    out = [pid]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def scheduled_total(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("kdelay_verifier_scheduled_total "):
            return float(line.split()[1])
    return None


def stop_verifier(verifier: subprocess.Popen[bytes]) -> None:
    if verifier.poll() is None:
        verifier.terminate()
        try:
            verifier.wait(timeout=60)
        except subprocess.TimeoutExpired:
            verifier.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=500, help="messages a second")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("soak-verifier"))
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kdelay-verifier-soak-"))
    kafka = LocalKafka(
        base / "kafka", settings=KafkaSettings(heap_mb=1024, auto_create_topics=False)
    )
    samples: list[dict[str, Any]] = []
    verifier: subprocess.Popen[bytes] | None = None
    try:
        kafka.start()
        bootstrap = kafka.bootstrap_servers
        create_topics(bootstrap)
        with SparkCluster(base / "spark", workers=args.workers) as cluster:
            progress(f"cluster {cluster.master_url} with {args.workers} workers")
            port = free_port()
            checkpoint = base / "checkpoint"
            argv = [
                KDELAY, "verify", "--spark-master", cluster.master_url,
                "--bootstrap-servers", bootstrap, "--buffer-topic", BUFFER_TOPIC,
                "--topics", TARGET_TOPIC, "--window", "10s", "--trigger", "2s",
                "--grace-ms", "5000", "--checkpoint-dir", str(checkpoint),
                "--output-dir", str(base / "out"), "--no-console",
                "--metrics-host", "127.0.0.1", "--metrics-port", str(port),
            ]  # fmt: skip
            log = (base / "verifier.log").open("wb")
            verifier = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            stop = threading.Event()
            until = time.time() + args.minutes * 60
            result: dict[str, int] = {}
            feeder = threading.Thread(
                target=lambda: result.update(sent=feed(bootstrap, args.rate, until, stop)),
                name="feeder",
                daemon=True,
            )
            feeder.start()
            start = time.time()
            while time.time() < until + 30:
                time.sleep(SAMPLE_S)
                if verifier.poll() is not None:
                    raise RuntimeError(
                        f"the verifier exited ({verifier.returncode}): {base / 'verifier.log'}"
                    )
                sample = {
                    "t_s": round(time.time() - start),
                    "driver_rss_mb": round(
                        sum(rss_bytes(p) for p in with_children(verifier.pid)) / MB, 1
                    ),
                    "executors_rss_mb": round(
                        sum(rss_bytes(p) for p in executor_pids(base)) / MB, 1
                    ),
                    "checkpoint_mb": round(dir_bytes(checkpoint) / MB, 2),
                    "scheduled": scheduled_total(port),
                }
                samples.append(sample)
                progress(
                    f"t={sample['t_s']:>5} s  driver {sample['driver_rss_mb']:>7} MB"
                    f"  executors {sample['executors_rss_mb']:>7} MB"
                    f"  checkpoint {sample['checkpoint_mb']:>6} MB  scheduled {sample['scheduled']}"
                )
            stop.set()
            feeder.join(timeout=60)
            stop_verifier(verifier)  # before its cluster
    finally:
        if verifier is not None:
            stop_verifier(verifier)
        kafka.stop()
    half = samples[len(samples) // 2 :]
    summary = {
        "minutes": args.minutes,
        "rate": args.rate,
        "sent": result.get("sent"),
        "samples": samples,
        **{
            key: {
                "first": samples[0][key],
                "last": samples[-1][key],
                "max": max(s[key] for s in samples),
                "last_half_growth": round(half[-1][key] - half[0][key], 2),
            }
            for key in ("driver_rss_mb", "executors_rss_mb", "checkpoint_mb")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verifier_soak.json").write_text(json.dumps(summary, indent=2))
    for key in ("driver_rss_mb", "executors_rss_mb", "checkpoint_mb"):
        s = summary[key]
        print(
            f"{key}: first {s['first']}, last {s['last']}, max {s['max']}, "
            f"growth over the last half {s['last_half_growth']}"
        )
    print(f"sent {summary['sent']:,} messages in {args.minutes} min; samples in {args.out}")


if __name__ == "__main__":
    main()
