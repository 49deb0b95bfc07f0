"""A randomized fault run (CONTRACT.md, v4 additions).

    .venv/bin/python -m bench.chaos --minutes 10 --seed 7 --json reports/chaos.json \\
        [--brokers 3] [--fault-every 20]

Starts ZooKeeper, Kafka (1 or 3 brokers), the proxy and three replicas as real processes
(bench/harness/faults.py's Cluster), with the buffer topic's cleaner made eager
(``segment.ms=10000``, ``min.cleanable.dirty.ratio=0.01``, ``delete.retention.ms=60000``;
:data:`EAGER_COMPACTION`) so compaction races the run. For
``--minutes``, producer threads run the seeded plan's operations (bench/chaos/plan.py) through
the proxy's Kafka listener and HTTP API while the nemesis injects a fault every
``--fault-every`` seconds. Then it drains (until every promised message arrived, or the last
due time plus the grace), reads every target back read_committed and judges the history with
bench/chaos/checker.py. Each violation is printed with its id's history. The JSON holds
``operations`` (planned counts by kind), ``faults`` (kind, planned ``at`` s, what happened),
``violations`` (counts by kind) and the history's outcomes. Exit 0 when nothing is violated,
1 when something is, 2 when the stack could not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

# Not re-exported in the stubs (as kdelay/topics.py imports ConfigResource).
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from bench.chaos import checker
from bench.chaos.faults import Injected, heal, nemesis
from bench.chaos.history import History
from bench.chaos.operations import Runner, now_ms
from bench.chaos.plan import make_plan
from bench.chaos.readback import Reader, merged, partition_ends, read_again
from bench.harness.faults import Cluster
from bench.harness.replicas import PARTITIONS
from dev.kafka_tools import create_topic
from kdelay.buffer import BUFFER_TOPIC, DEAD_LETTER_TOPIC
from kdelay.topics import MIN_COMPACTION_LAG_MS

#: The buffer topic's cleaner made eager: a segment rolls every 10 s, is cleaned as soon as
#: anything in it is dirty, and its tombstones go a minute after that (Kafka: 24 h), so
#: compaction races the run. ``min.compaction.lag.ms`` stays what kdelay sets (the cancel
#: window and a minute, 6 min): shorter, a cancel could be cleaned away within its window, a
#: misconfiguration, not a fault. So the cleaner removes records once they are 6 min old: a
#: run shorter than that rolls segments but cleans nothing. A replica away longer than the
#: retention less a tenth (54 s) rebuilds its store (delay_service/away.py).
EAGER_COMPACTION = {
    "segment.ms": "10000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "60000",
    "min.compaction.lag.ms": str(MIN_COMPACTION_LAG_MS),
}
TARGETS = ("chaos-a", "chaos-b")
SHOWN = 40  # violations printed with their history


def eager_compaction(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in EAGER_COMPACTION.items()
    ]
    resource = ConfigResource("topic", BUFFER_TOPIC, incremental_configs=entries)
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=30)


def proxy_with_queries(cluster: Cluster) -> None:
    """Restart the Cluster's proxy pointed at the replicas' ZooKeeper root: status reads,
    listings and confirmed cancels ask the replicas (503 without it)."""
    assert cluster.proxy is not None
    assert cluster.zk is not None
    cluster.proxy.stop()
    cluster.proxy_args += ["--zk-connect", cluster.zk.connect_string, "--zk-root", cluster.rs.root]
    cluster.proxy_clock(None)
    cluster.proxy.start()
    cluster.wait_proxy()


def drain(reader: Reader, runner: Runner, grace_ms: int) -> int:
    """Wait until every promised occurrence arrived (judged with no grace), or the last due
    time plus the grace; returns the end (epoch ms) the checker judges against."""
    with runner.lock:
        dues = [
            op.occurrence_due(op.repeat_count)[1]
            for op in runner.history.writes().values()
            if op.acked
        ]
    last_due = max(dues, default=now_ms())
    quick = checker.Rules(grace_ms=0, check_order=False)
    while True:
        now = now_ms()
        if now > last_due + grace_ms + 5_000:
            return now
        if now > last_due + 3_000:
            verdict = checker.judge(runner.history, reader.snapshot(), now, quick)
            if not verdict.counts["lost"] and not verdict.counts["series_missing"]:
                time.sleep(3)  # a duplicate or an extra occurrence may still come
                return now_ms()
        time.sleep(2)


def report(history: History, deliveries: list[Any], verdict: checker.Verdict) -> None:
    for v in verdict.violations[:SHOWN]:
        print(f"[chaos] VIOLATION {v.kind} id={v.msg_id}: {v.detail}")
        if v.msg_id in history.ops:
            print(checker.explain(history, deliveries, v.msg_id))
    if len(verdict.violations) > SHOWN:
        print(f"[chaos] ... and {len(verdict.violations) - SHOWN} more (all in the JSON)")


def outcomes(history: History) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for ops in history.ops.values():
        for op in ops:
            label = op.outcome if op.status is None else f"{op.outcome} {op.status}"
            counts.setdefault(op.kind, Counter())[label] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(counts.items())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.minutes * 60
    plan = make_plan(
        args.seed,
        seconds,
        rate=args.rate,
        workers=args.producers,
        fault_every=args.fault_every,
        brokers=args.brokers,
    )
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cluster = Cluster(work, args.brokers)
    injected: list[Injected] = []
    crashes: list[str] = []
    stop = threading.Event()
    try:
        cluster.start()
        proxy_with_queries(cluster)
        eager_compaction(cluster.bootstrap)
        rf = min(3, args.brokers)
        config = {"message.timestamp.type": "LogAppendTime", "min.insync.replicas": str(min(2, rf))}
        for topic in TARGETS:
            create_topic(cluster.bootstrap, topic, PARTITIONS, replication=rf, config=config)
        reader = Reader(cluster.bootstrap, list(TARGETS), DEAD_LETTER_TOPIC)
        reader.start()
        runner = Runner(
            cluster.proxy_address,
            f"http://127.0.0.1:{cluster.http_port}",
            list(TARGETS),
            args.seed,
            args.producers,
        )
        print(f"[chaos] stack up; {len(plan.scenarios)} scenarios, {len(plan.faults)} faults")
        t0 = time.monotonic()
        chaos = threading.Thread(
            target=nemesis,
            args=(cluster, plan.faults),
            kwargs={"seed": args.seed, "t0": t0, "stop": stop, "out": injected, "crashes": crashes},
            name="chaos-nemesis",
        )
        chaos.start()
        runner.run(plan.scenarios, t0, t0 + seconds + 180)
        chaos.join()
        crashes += heal(cluster)
        print(f"[chaos] operations done at {time.monotonic() - t0:.0f} s; draining")
        end_ms = drain(reader, runner, args.grace_ms)
        reader.stop()
        again = read_again(cluster.bootstrap, list(TARGETS), DEAD_LETTER_TOPIC)
        deliveries, missed = merged(reader.snapshot(), again)
        if missed:
            print(f"[chaos] the run-long reader missed {missed} records a fresh read found")
        ends = partition_ends(cluster.bootstrap, list(TARGETS), deliveries)
        for name, row in ends.items():
            # The last offset is a transaction's marker: read + 1 == lso is all there is.
            if row.get("lso") != row.get("end") or row.get("read", 0) + 1 < row.get("lso", 0):
                print(
                    f"[chaos] {name}: last stable offset {row.get('lso')}, log end "
                    f"{row.get('end')}, read up to {row.get('read', 0)}"
                )
    finally:
        stop.set()
        cluster.stop()
        for d in (
            []
            if args.keep_data
            else [*work.glob("kafka/node-*/logs"), work / "zk" / "data", *work.glob("set/r*")]
        ):
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
    rules = checker.Rules(grace_ms=args.grace_ms, early_tolerance_ms=args.early_tolerance_ms)
    spans = [f.shards_ms for f in injected if f.shards_ms is not None]
    verdict = checker.judge(runner.history, deliveries, end_ms, rules, several_shards=spans)
    report(runner.history, deliveries, verdict)
    return {
        "seed": args.seed,
        "minutes": args.minutes,
        "brokers": args.brokers,
        "fault_every": args.fault_every,
        "operations": plan.operations(),
        "faults": [
            {
                "kind": f.kind,
                "at": f.at,
                "duration": f.duration,
                "started": f.started,
                "ended": f.ended,
                "target": f.target,
                "error": f.error,
                "span_ms": f.span_ms,
                **({"shards_ms": f.shards_ms} if f.shards_ms is not None else {}),
            }
            for f in injected
        ],
        "violations": verdict.counts,
        "violation_details": [v.__dict__ for v in verdict.violations],
        "outcomes": outcomes(runner.history),
        "deliveries": len(deliveries),
        "crashes": crashes,
        "partitions": ends,
        "reader_errors": reader.errors,
        "reader_missed": missed,
        "client_errors": runner.errors,
        "rules": rules.__dict__,
        "logs": str(work),
        "history": {
            "ops": runner.history.to_json(),
            "deliveries": [d.__dict__ for d in deliveries],
            "end_ms": end_ms,
            "several_shards": spans,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="how long operations run")
    ap.add_argument("--seed", type=int, required=True, help="the plan's seed")
    ap.add_argument("--json", type=Path, required=True, help="write the result here")
    ap.add_argument("--brokers", type=int, choices=(1, 3), default=1, help="Kafka brokers [1]")
    ap.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults [30]")
    ap.add_argument("--rate", type=float, default=4.0, help="scenarios started a second [4]")
    ap.add_argument("--producers", type=int, default=3, help="producer threads [3]")
    ap.add_argument("--grace-ms", type=int, default=30_000, help="lateness allowed [30000]")
    ap.add_argument("--early-tolerance-ms", type=int, default=1_000, help="clocks [1000]")
    ap.add_argument("--keep-data", action="store_true", help="keep Kafka's and the stores' data")
    ap.add_argument("--work", type=Path, default=Path("reports/chaos"), help="logs go here")
    args = ap.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # ZooKeeper restarts are the point
    try:
        result = run(args)
    except Exception as err:  # noqa: BLE001 - the stack could not run: exit 2, not a verdict
        print(f"[chaos] error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)
    history = result.pop("history")
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    # The whole client-side history and read-back, to judge again or to read a violation's case.
    args.json.with_suffix(".history.json").write_text(json.dumps(history) + "\n")
    print(json.dumps({k: result[k] for k in ("seed", "operations", "violations")}, indent=1))
    print(f"[chaos] {len(result['faults'])} faults: {Counter(f['kind'] for f in result['faults'])}")
    return 0 if not any(result["violations"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
