"""The verdict of ``bench.reliability``: what the producer and the consumer saw, judged by
the broker's clock, and the Markdown table of docs/reliability.md.

Definitions (docs/reliability.md repeats them):

- acknowledged: delivery callbacks without error; lost: acknowledged ids never delivered;
- duplicates: extra deliveries of one (kdelay-id, kdelay-deliver-at) pair; extra per id: extra
  deliveries of one kdelay-id whatever its due time (a retried produce may get a new due time);
- early: broker timestamp (LogAppendTime, checked) < the delivered kdelay-deliver-at header;
  early vs request: broker timestamp < the bench's clock at produce() + kdelay-delay-ms, which
  no clock of the system under test can move;
- lateness: broker timestamp - kdelay-deliver-at, over every delivery;
- recovery: from a fault's injection (or its end) to the broker timestamp of the first delivery
  that is due at or after that moment and is 0 <= lateness < 1 s; the worst over the case's
  faults; "never" when no such delivery came;
- longest ack gap: the longest time during the stream without an acknowledgement.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from bench.harness.faults import Event
from kdelay.stats import percentile

HEALTHY_MS = 1_000
START, END = "<!-- reliability:table:start -->", "<!-- reliability:table:end -->"


@dataclass
class Delivery:
    msg_id: str
    due_ms: int
    ts_ms: int
    ts_type: int


@dataclass
class Ledger:
    """What the producer and the consumer saw; shared by their threads under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (produce ms, delay)
    acked: set[str] = field(default_factory=set)
    ack_ms: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    fatal: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    dead_letters: set[str] = field(default_factory=set)
    last_delivery: float = field(default_factory=time.monotonic)
    #: Seconds after its start the stream stops; set once the faults are injected.
    stream_until: float = math.inf


def recovery_s(by_ts: list[Delivery], keys: list[int], ref_ms: int) -> float | None:
    """Seconds from ``ref_ms`` to the first delivery due at or after it with 0 <= lateness < 1 s."""
    for d in by_ts[bisect.bisect_left(keys, ref_ms) :]:
        if d.due_ms >= ref_ms and 0 <= d.ts_ms - d.due_ms < HEALTHY_MS:
            return (d.ts_ms - ref_ms) / 1000
    return None


def judge(ledger: Ledger, events: list[Event], span: tuple[int, int]) -> dict[str, Any]:
    with ledger.lock:
        ours = [d for d in ledger.deliveries if d.msg_id in ledger.sent]
        ids = Counter(d.msg_id for d in ours)
        pairs = Counter((d.msg_id, d.due_ms) for d in ours)
        late = [float(d.ts_ms - d.due_ms) for d in ours]
        sent = ledger.sent
        by_ts = sorted(ours, key=lambda d: d.ts_ms)
        keys = [d.ts_ms for d in by_ts]
        # From the first acknowledgement: the producer's first connection is no fault.
        acks = sorted(t for t in ledger.ack_ms if span[0] <= t <= span[1]) or [span[0]]
        acks.append(span[1])
        gaps = [(b - a, a) for a, b in itertools.pairwise(acks)]
        firsts: dict[tuple[str, int], Delivery] = {}
        for d in by_ts:
            firsts.setdefault((d.msg_id, d.due_ms), d)
        again = [d for d in by_ts if firsts[d.msg_id, d.due_ms] is not d]
        early = [d for d in by_ts if d.ts_ms < d.due_ms]
        worst = max(ours, key=lambda d: d.ts_ms - d.due_ms, default=None)
        return {
            "sent": len(sent),
            "acknowledged": len(ledger.acked),
            "delivered": len(ids),
            "deliveries": len(ours),
            "unknown_deliveries": len(ledger.deliveries) - len(ours),
            "lost": len(ledger.acked - set(ids)),
            "duplicates": sum(c - 1 for c in pairs.values()),
            "extra_per_id": sum(c - 1 for c in ids.values()),
            "early": len(early),
            "early_vs_request": sum(d.ts_ms < sent[d.msg_id][0] + sent[d.msg_id][1] for d in ours),
            "not_log_append_time": sum(d.ts_type != TIMESTAMP_LOG_APPEND_TIME for d in ours),
            "lateness_ms": {
                "min": min(late, default=0.0),
                "p50": percentile(late, 0.5),
                "p99": percentile(late, 0.99),
                "max": max(late, default=0.0),
            },
            "recovery_s": [
                {
                    "event": e.what,
                    "from_injection": recovery_s(by_ts, keys, e.at_ms),
                    "from_end": None if e.end_ms is None else recovery_s(by_ts, keys, e.end_ms),
                }
                for e in events
            ],
            # When (broker time, s after the stream started) repeats, early ones, the latest one.
            "duplicates_at_s": _when([d.ts_ms for d in again], span[0]),
            "early_at_s": _when([d.ts_ms for d in early], span[0]),
            "max_lateness_at_s": _when([worst.ts_ms] if worst else [], span[0]),
            "first_ack_s": (acks[0] - span[0]) / 1000,
            "longest_ack_gap_s": max(gaps)[0] / 1000,
            "longest_ack_gap_at_s": (max(gaps)[1] - span[0]) / 1000,
            "producer_fatal_errors": ledger.fatal,
            "errors": dict(ledger.errors.most_common(8)),
            "dead_letters": len(ledger.dead_letters),
        }


def _when(ts_ms: list[int], t0: int) -> list[float]:
    """[first, last] of ``ts_ms`` in seconds after ``t0``; [] when empty."""
    return [round((min(ts_ms) - t0) / 1000, 1), round((max(ts_ms) - t0) / 1000, 1)] if ts_ms else []


def _recovery(r: dict[str, Any]) -> str:
    kind = r.get("recovery_from")
    if kind is None:
        return "n/a (whole run)"
    key = "from_injection" if kind == "injection" else "from_end"
    values = [x[key] for x in r["recovery_s"]]
    if not values:
        return "-"
    if any(v is None for v in values):
        return f"never ({kind})"
    return f"{max(values):.1f} ({'inj.' if kind == 'injection' else 'end'})"


def table(results: list[dict[str, Any]]) -> str:
    cols = [
        "case",
        "sent",
        "acked",
        "delivered",
        "lost",
        "duplicates (id, due)",
        "extra per id",
        "early (broker)",
        "early vs request",
        "max lateness ms",
        "recovery s",
        "longest ack gap s",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        if "error" in r:
            error = str(r["error"]).splitlines()[0][:160].replace("|", "/")
            lines.append(f"| `{r['case']}` | run failed: {error} |" + " |" * (len(cols) - 2))
            continue
        cells = [
            f"`{r['case']}`",
            *(str(r[k]) for k in ("sent", "acknowledged", "delivered", "lost", "duplicates")),
            *(str(r[k]) for k in ("extra_per_id", "early", "early_vs_request")),
            f"{r['lateness_ms']['max']:.0f}",
            _recovery(r),
            f"{r['longest_ack_gap_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per case: the faults (seconds after the stream started), and more figures:", ""]
    lines += [_details(r) for r in results if "error" not in r]
    return "\n".join(lines) + "\n"


def _span(when: list[float] | None) -> str:
    if not when:
        return "-"
    return f"{when[0]:.1f} s" if when[0] == when[1] else f"{when[0]:.1f}-{when[1]:.1f} s"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def _details(r: dict[str, Any]) -> str:
    t0 = r.get("stream_start_ms", 0)
    events = "; ".join(
        f"{e['what']} at {(e['at_ms'] - t0) / 1000:.1f} s"
        + ("" if e["end_ms"] is None else f", undone at {(e['end_ms'] - t0) / 1000:.1f} s")
        for e in r["events"]
    )
    rec = ", ".join(
        f"{_s(x['from_injection'])}/{'-' if e['end_ms'] is None else _s(x['from_end'])}"
        for x, e in zip(r["recovery_s"], r["events"], strict=True)
    )
    errors = "; ".join(f"{k} x{v}" for k, v in r["errors"].items()) or "none"
    lat = r["lateness_ms"]
    return (
        f"- `{r['case']}` ({r['date']}, commit {r['commit']}, {r['cores']} cores, "
        f"{r['rate']}/s for {r['seconds']:.0f} s): {r['fault']}. Events: {events or '-'}. "
        f"Recovery s per event, from injection/from end: {rec or '-'}. Lateness ms min "
        f"{lat['min']:.0f}, p50 {lat['p50']:.0f}, p99 {lat['p99']:.0f}; max lateness at "
        f"{_span(r.get('max_lateness_at_s'))}; repeats at {_span(r.get('duplicates_at_s'))}; "
        f"early ones at {_span(r.get('early_at_s'))}. First ack after "
        f"{r['first_ack_s']:.1f} s; producers replaced after a fatal error: "
        f"{r['producer_fatal_errors']}; producer errors: {errors}. Dead letters: "
        f"{r['dead_letters']}. Master at the end: {r['master_at_end']}."
    )


def update_doc(doc: Path, text: str) -> None:
    body = doc.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(body):
        raise SystemExit(f"{doc} has no {START} ... {END} section")
    doc.write_text(pattern.sub(lambda _m: f"{START}\n{text}{END}", body))
