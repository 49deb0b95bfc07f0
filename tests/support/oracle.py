"""An independent reading of the topics, to check the Spark verifier's report against.

It shares no code with ``verifier/``: it consumes the buffer and target topics with
confluent-kafka and computes the CONTRACT.md report with numpy (type-7 percentiles), following
the definitions in the verifier's docs (a message is an (id, due time) pair; delivered =
messages delivered at least once; duplicates = extra deliveries; early = deliveries before the
due time in their own header; missing = undelivered, not cancelled, due + grace < end;
lateness = first delivery - due, by the record timestamp of a LogAppendTime target).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dev.kafka_tools import read_to_end
from tests.support.kafka_helpers import Record

ROUTE = "kdelay-route"
#: README "Cancelling a message": a schedule appended after a cancel of its id, in the same
#: buffer partition, is cancelled when a proxy accepted it at most 100 ms after the cancel's append
#: time, both on the broker's clock (the millisecond in its order field "s" >> 20), and it was
#: appended within 5 minutes. A replace ("rx": true) is also a cancel at its own position.
SENT_WITH_IT_MS, WINDOW_MS = 100, 300_000


@dataclass(frozen=True)
class Truth:
    report: dict[str, object]
    deliveries: dict[str, list[int]]
    due: dict[str, int]


def read_all(bootstrap: str, topics: Sequence[str]) -> list[Record]:
    """Every record currently in ``topics`` (no compaction expected during a test)."""
    return read_to_end(bootstrap, topics, timeout=120)


def compute(
    bootstrap: str,
    targets: Sequence[str],
    *,
    end_ms: int,
    grace_ms: int,
    buffer_topic: str = "__kdelay_buffer",
) -> Truth:
    """The report, from the buffer and target topics. A message is an (id, due time) pair: an
    id may be reused. Copies of one buffer record (same key) count once; a cancel cancels the
    schedules of its id before it in its partition, and after it those sent with it
    (:data:`SENT_WITH_IT_MS`); a delivery's time is its record timestamp
    (the targets use LogAppendTime); early = a delivery before its own ``kdelay-deliver-at``."""
    # (id, due) -> (partition, offset, append ms, accepted ms or 0)
    messages: dict[tuple[str, int], tuple[int, int, int, int]] = {}
    keys: set[bytes | None] = set()
    cancels: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for rec in read_all(bootstrap, [buffer_topic]):
        if rec.value is None or not rec.headers or rec.headers[-1][0] != ROUTE:
            continue
        route = json.loads(rec.headers[-1][1] or b"{}")
        msg_id = str(route["i"]) if "i" in route else (rec.key or b"").decode()
        if route.get("op") == "schedule" and route.get("t") in targets:
            if route.get("v", 1) >= 2 and rec.key in keys:
                continue  # a copy of a record already counted
            keys.add(rec.key)
            d = route.get("d")
            due_ms = int(d) if d is not None else rec.timestamp_ms + int(route["r"])
            accepted = int(route.get("s") or 0) // 2**20
            messages.setdefault(
                (msg_id, due_ms), (rec.partition, rec.offset, rec.timestamp_ms, accepted)
            )
        if route.get("op") == "cancel" or (route.get("op") == "schedule" and route.get("rx")):
            cancels[msg_id].append((rec.partition, rec.offset, rec.timestamp_ms))

    def sent_with(o: int, ts: int, accepted: int, co: int, cts: int) -> bool:
        return o > co and 0 < accepted <= cts + SENT_WITH_IT_MS and ts - cts <= WINDOW_MS

    cancelled = {
        m
        for m, (p, o, ts, acc) in messages.items()
        if any(
            cp == p and (co > o or sent_with(o, ts, acc, co, cts))
            for cp, co, cts in cancels.get(m[0], [])
        )
    }
    deliveries: dict[tuple[str, int], list[int]] = defaultdict(list)
    early = 0
    for rec in read_all(bootstrap, list(targets)):
        raw_id, raw_due = rec.header("kdelay-id"), rec.header("kdelay-deliver-at")
        if raw_id is None or raw_due is None:
            continue
        key = (raw_id.decode(), int(raw_due))
        early += rec.timestamp_ms < key[1]
        if key in messages:
            deliveries[key].append(rec.timestamp_ms)
    delivered = [m for m in messages if deliveries.get(m)]
    missing = [
        m
        for m in messages
        if not deliveries.get(m) and m not in cancelled and m[1] + grace_ms < end_ms
    ]
    lateness = np.array([min(deliveries[m]) - m[1] for m in delivered], dtype=float)

    def q(p: float) -> float:
        return float(np.percentile(lateness, p)) if lateness.size else 0.0

    report: dict[str, object] = {
        "scheduled": len(delivered) + len(missing),
        "delivered": len(delivered),
        "missing": len(missing),
        "duplicates": sum(len(deliveries[m]) - 1 for m in delivered),
        "early": early,
        "lateness_ms": {
            "p50": q(50),
            "p95": q(95),
            "p99": q(99),
            "max": float(lateness.max()) if lateness.size else 0.0,
        },
    }
    by_id = {m[0]: times for m, times in deliveries.items()}
    return Truth(report, by_id, {m[0]: m[1] for m in messages})
