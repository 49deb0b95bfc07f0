"""What one listing page costs a replica over a million pending messages.

    .venv/bin/python -m bench.listing [--messages 1000000] [--repeat 5]

In one process, without Kafka: ``--messages`` schedules (two topics, ids ``c<customer>-<n>``,
one in 100,000 with the id prefix ``rare-`` and the topic ``rare``) are applied to a store, and
the replica's HTTP port (``delay_service/health.py``, the app a replica serves) answers over
loopback. Each question is asked ``--repeat`` times; printed: the median wall time and the
median CPU time of this process per answer (the server's threads, plus a small client that
reads the raw bytes), and each against the baselines measured in the same run: one message's
status (``GET /v1/messages/<id>``, a point lookup) and the timeline (``GET /v1/pending``, the
existing scan of the whole store, up to ``status_scan_limit`` = ``--messages``).

The questions: the first page (100 and 1,000 messages), a page from a cursor in the middle,
a page filtered by a common topic (half match), and pages filtered by a rare id prefix and a
rare topic (each page examines at most ``LIST_SCAN`` entries and says where to go on: the
whole walk to find every match is timed too).

On 2026-11-28, 1,000,000 pending, 2 cores shared with other jobs (load about 12, so wall times
are inflated; CPU times are the measure), median of 5, CPU ms: a point lookup 1.7; the
timeline of the whole store 10,944; the first page of 100 14.9 (0.1 % of the timeline), of
1,000 32.9; a page half-way in 9.9; topic=orders 17.3; a rare prefix's first page 684 (200,000
examined; 6 % of the timeline), its whole walk 3,453 (6 pages, 10 found).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from kdelay.buffer import Scheduled
from kdelay.delay_service import health
from kdelay.delay_service.queries.listing import LIST_SCAN
from kdelay.delay_service.queries.queries import Answers
from kdelay.delay_service.store.store import Store

RARE_EVERY = 100_000
BATCH = 5_000


def fill(store: Store, n: int, due0: int) -> None:
    """``n`` pending messages, due 1 ms apart from ``due0``, four buffer partitions."""
    for first in range(0, n, BATCH):
        batch = []
        for i in range(first, min(n, first + BATCH)):
            rare = i % RARE_EVERY == RARE_EVERY // 2
            msg_id = f"rare-{i}" if rare else f"c{i % 5000:04d}-{i}"
            topic = "rare" if rare else ("orders" if i % 2 else "refunds")
            msg = Scheduled(msg_id, topic, -1, b"k", b"x" * 100, due0 + i, (), f"u{i}", seq=i)
            batch.append((i % 4, i // 4, msg))
        offsets: dict[int, int] = {}
        for part, offset, _ in batch:
            offsets[part] = max(offsets.get(part, 0), offset + 1)
        store.apply(batch, offsets)


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def measure(ask: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Median wall and CPU milliseconds of ``ask()``, and its last result."""
    walls, cpus = [], []
    result = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        result = ask()
        cpus.append((time.process_time() - c0) * 1000)
        walls.append((time.perf_counter() - w0) * 1000)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n, repeat = args.messages, args.repeat
    due0 = int(time.time() * 1000) + 3_600_000
    with tempfile.TemporaryDirectory(prefix="kdelay-bench-") as tmp:
        store = Store(Path(tmp) / "store")
        t0 = time.perf_counter()
        fill(store, n, due0)
        print(f"applied {n:,} pending in {time.perf_counter() - t0:.1f} s")
        answers = Answers(store, "bench", max_scan=n)
        answers.attach(role=lambda: "master", lag=lambda: 0, clock=lambda: due0 - 3_600_000)
        port = health.serve(
            "127.0.0.1", 0, health.app(CollectorRegistry(), lambda: None, lambda: None, answers)
        )

        def page(**params: str) -> dict[str, Any]:
            status, body = get(port, "/v1/messages?" + urllib.parse.urlencode(params))
            assert status == 200, body[:300]
            doc: dict[str, Any] = json.loads(body)
            return doc

        def walk(**params: str) -> tuple[int, int]:
            """Pages and matches of a whole walk."""
            pages = found = 0
            while True:
                doc = page(**params)
                pages += 1
                found += len(doc["messages"])
                if doc["next"] is None:
                    return pages, found
                params["cursor"] = doc["next"]

        mid_cursor = page(limit="1000")["next"]
        for _ in range(n // 2000 - 1):  # a cursor half-way in, 1,000 at a time
            mid_cursor = page(limit="1000", cursor=str(mid_cursor))["next"]
        rows: list[tuple[str, float, float, str]] = []

        def row(name: str, ask: Callable[[], Any], note: Callable[[Any], str]) -> None:
            wall, cpu, result = measure(ask, repeat)
            rows.append((name, wall, cpu, note(result)))
            print(f"{name:<44} {wall:9.1f} ms wall {cpu:9.1f} ms CPU  {note(result)}", flush=True)

        row("baseline: GET /v1/messages/<id>", lambda: get(port, "/v1/messages/c0001-1"),
            lambda r: f"HTTP {r[0]}")  # fmt: skip
        row(
            "baseline: GET /v1/pending (whole store)",
            lambda: json.loads(get(port, "/v1/pending?bucket=1h&horizon=3650d")[1]),
            lambda d: f"counted {d['counted']:,}",
        )
        row("first page, limit=100", lambda: page(limit="100"),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("first page, limit=1000", lambda: page(limit="1000"),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("a page half-way (cursor), limit=100",
            lambda: page(limit="100", cursor=str(mid_cursor)),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("topic=orders (half match), limit=100", lambda: page(limit="100", topic="orders"),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("id_prefix=rare- (1 in 100k), first page", lambda: page(id_prefix="rare-"),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("topic=rare (1 in 100k), first page", lambda: page(topic="rare"),
            lambda d: f"{len(d['messages'])} listed, {d['scanned']:,} examined")  # fmt: skip
        row("id_prefix=rare-, every page (walk)", lambda: walk(id_prefix="rare-"),
            lambda r: f"{r[0]} pages, {r[1]} found")  # fmt: skip
        row("id_prefix=c0042- (1 in 5000), every page", lambda: walk(id_prefix="c0042-"),
            lambda r: f"{r[0]} pages, {r[1]} found")  # fmt: skip
        store.close()
    base_wall, scan_wall, scan_cpu = rows[0][1], rows[1][1], rows[1][2]
    print(f"\n{n:,} pending, LIST_SCAN {LIST_SCAN:,}, median of {repeat}")
    print(
        f"{'question':<44} {'wall ms':>9} {'CPU ms':>9} {'x lookup':>9} "
        f"{'wall/timeline':>14} {'CPU/timeline':>13}"
    )
    for name, wall, cpu, _ in rows:
        print(
            f"{name:<44} {wall:9.1f} {cpu:9.1f} {wall / base_wall:9.1f} "
            f"{wall / scan_wall:14.3f} {cpu / scan_cpu:13.3f}"
        )


if __name__ == "__main__":
    main()
