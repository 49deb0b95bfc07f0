"""An independent reading of the topics, to check the Spark verifier's report against.

It shares no code with ``verifier/``: it consumes the buffer and target topics with
confluent-kafka and computes the CONTRACT.md report with numpy (type-7 percentiles), following
the definitions in the verifier's docs (delivered = distinct ids; duplicates = extra
deliveries; early = deliveries before the due time; missing = undelivered, not cancelled,
due + grace < end; lateness = first delivery - due).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tests.support.kafka_helpers import Record, consume_until

ROUTE = "kdelay-route"


@dataclass(frozen=True)
class Truth:
    report: dict[str, object]
    deliveries: dict[str, list[int]]
    due: dict[str, int]


def _end_offsets_reached(bootstrap: str, topics: Sequence[str]) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "oracle-watermarks"})
    try:
        meta = consumer.list_topics(timeout=10)
        total = 0
        for topic in topics:
            for p in meta.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()


def read_all(bootstrap: str, topics: Sequence[str]) -> list[Record]:
    """Every record currently in ``topics`` (no compaction expected during a test)."""
    expected = _end_offsets_reached(bootstrap, topics)
    return consume_until(bootstrap, topics, lambda r: len(r) >= expected, timeout=120)


def compute(
    bootstrap: str,
    targets: Sequence[str],
    *,
    end_ms: int,
    grace_ms: int,
    buffer_topic: str = "__kdelay_buffer",
) -> Truth:
    due: dict[str, int] = {}
    cancelled: set[str] = set()
    for rec in read_all(bootstrap, [buffer_topic]):
        if rec.value is None or not rec.headers or rec.headers[-1][0] != ROUTE:
            continue
        route = json.loads(rec.headers[-1][1] or b"{}")
        msg_id = (rec.key or b"").decode()
        if route.get("op") == "schedule" and route.get("t") in targets:
            due.setdefault(msg_id, int(route["d"]))
        elif route.get("op") == "cancel":
            cancelled.add(msg_id)
    deliveries: dict[str, list[int]] = defaultdict(list)
    for rec in read_all(bootstrap, list(targets)):
        raw = rec.header("kdelay-id")
        if raw is not None and raw.decode() in due:
            deliveries[raw.decode()].append(rec.timestamp_ms)
    delivered = [i for i in due if deliveries.get(i)]
    missing = [
        i
        for i in due
        if not deliveries.get(i) and i not in cancelled and due[i] + grace_ms < end_ms
    ]
    lateness = np.array([min(deliveries[i]) - due[i] for i in delivered], dtype=float)

    def q(p: float) -> float:
        return float(np.percentile(lateness, p)) if lateness.size else 0.0

    report: dict[str, object] = {
        "scheduled": len(delivered) + len(missing),
        "delivered": len(delivered),
        "missing": len(missing),
        "duplicates": sum(len(deliveries[i]) - 1 for i in delivered),
        "early": sum(1 for i in delivered for t in deliveries[i] if t < due[i]),
        "lateness_ms": {
            "p50": q(50),
            "p95": q(95),
            "p99": q(99),
            "max": float(lateness.max()) if lateness.size else 0.0,
        },
    }
    return Truth(report, dict(deliveries), due)
