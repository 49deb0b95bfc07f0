"""The chaos run's judge: from the client-side history and what the targets hold, count what
kdelay's contract forbids.

Independent of the code it judges (DESIGN.md, "v4 directions": invariants checked by code that
shares nothing with it): it imports nothing of ``kdelay``, ``proxy``, ``delay_service``, ``zk``,
``verifier`` or ``dev`` (an import-linter contract in pyproject.toml), and every rule below is
written from CONTRACT.md and the README's words, not from ``kdelay.buffer.cancel_rule``:

- **lost**: a write acknowledged, due (its first occurrence) before ``end - grace``, never
  delivered, and no cancel or replace of its id sent before its due time plus ``grace``
  ("once the proxy acknowledged it, never lost"). A cancel answered 409 (``already_delivered``)
  excuses nothing: it says the message was delivered.
- **early**: a delivery whose LogAppendTime is before the least due time the client can prove
  (the send time plus the delay, or the requested time; each later occurrence one period on)
  by more than ``early_tolerance`` ("never before its due time").
- **duplicate**: a write's occurrence delivered more than once.
- **delivered_after_cancel**: ``DELETE /v1/messages/{id}?wait=S`` answered 200 and the id's
  last write before it (acknowledged before the cancel was sent) was delivered (for a series:
  an occurrence appended after the 200 came) ("200 only when the message will never be
  delivered").
- **resurrected**: a cancel or replace acknowledged at least ``margin`` before an occurrence's
  due time (so the occurrence was surely pending, in no release in flight), and that occurrence
  was delivered anyway ("a cancel cancels every message with its id appended before it that
  has not been delivered yet").
- **series_missing** / **series_extra**: an occurrence of an acknowledged series due before
  ``end - grace`` and not superseded, never delivered; an occurrence beyond the series' count.
- **order_inversion**: in one target partition, a message appended after another although its
  latest possible due time is more than ``order_tolerance`` before the other's earliest, and it
  was acknowledged ``order_tolerance`` before the other was released (so both were pending):
  "per partition in (due time, arrival) order", which one master keeps for its shard. A message
  acknowledged after its own due time is not judged: overdue on arrival, it leaves when the
  master reads it, which the client cannot see (around a broker fault, seconds after the ack).
  Shards release independently and the client cannot tell an id's shard, so a pair is judged
  only when both were appended while the layout had one shard: not within ``several_shards``
  (the spans, epoch ms, during which more than one shard released), each widened by
  ``order_tolerance``.
- **phantom**: a delivery of a token the run never wrote; **dead_lettered**: a write of the
  run in the dead-letter topic (nothing the run sends is invalid).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.chaos.history import SUPERSEDES, WRITES, Delivery, History, Op

KINDS = (
    "lost",
    "early",
    "duplicate",
    "delivered_after_cancel",
    "resurrected",
    "series_missing",
    "series_extra",
    "order_inversion",
    "phantom",
    "dead_lettered",
)


@dataclass(frozen=True)
class Rules:
    """The checker's tolerances, in milliseconds."""

    grace_ms: int = 30_000
    early_tolerance_ms: int = 1_000
    margin_ms: int = 3_000
    order_tolerance_ms: int = 1_000
    check_order: bool = True


@dataclass(frozen=True)
class Violation:
    kind: str
    msg_id: str
    detail: str


@dataclass
class Verdict:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    violations: list[Violation] = field(default_factory=list)

    def add(self, kind: str, msg_id: str, detail: str) -> None:
        self.counts[kind] += 1
        self.violations.append(Violation(kind, msg_id, detail))

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())


def judge(
    history: History,
    deliveries: Iterable[Delivery],
    end_ms: int,
    rules: Rules = Rules(),
    *,
    several_shards: Sequence[tuple[int, int]] = (),
) -> Verdict:
    """Count every violation of the run whose deliveries were read up to ``end_ms``;
    ``several_shards``: when more than one shard released (the module docstring)."""
    verdict = Verdict()
    writes = history.writes()
    by_token: dict[str, list[Delivery]] = defaultdict(list)
    for d in sorted(deliveries, key=lambda d: (d.ts_ms, d.topic, d.partition, d.offset)):
        if d.token not in writes:
            verdict.add("phantom", "?", f"token {d.token} at {_where(d)}")
        elif d.dead_letter:
            verdict.add("dead_lettered", writes[d.token].msg_id, f"{d.token} at {_where(d)}")
        else:
            by_token[d.token].append(d)
    for ops in history.ops.values():
        for i, op in enumerate(ops):
            if op.token is not None and op.token in writes:
                delivered = by_token.get(op.token, [])
                _judge_write(verdict, op, ops[i + 1 :], delivered, end_ms=end_ms, rules=rules)
    if rules.check_order:
        _judge_order(verdict, writes, by_token, rules, several_shards)
    return verdict


def _where(d: Delivery) -> str:
    return f"{d.topic}[{d.partition}]@{d.offset} ts={d.ts_ms}"


def _judge_write(
    verdict: Verdict,
    op: Op,
    rest: list[Op],
    delivered: list[Delivery],
    *,
    end_ms: int,
    rules: Rules,
) -> None:
    later = [s for s in rest if s.kind in SUPERSEDES]
    by_occurrence: dict[int, list[Delivery]] = defaultdict(list)
    for d in delivered:
        by_occurrence[d.occurrence or 1].append(d)
    for k, ds in sorted(by_occurrence.items()):
        _judge_occurrence(verdict, op, k, ds, rest=rest, rules=rules)
    if not op.acked:
        return
    for k in range(1, op.repeat_count + 1):
        due_lo, due_hi = op.occurrence_due(k)
        if k in by_occurrence or due_hi >= end_ms - rules.grace_ms:
            continue
        if not any(s.sent_ms < due_hi + rules.grace_ms and s.status != 409 for s in later):
            kind = "series_missing" if op.repeat_count > 1 else "lost"
            verdict.add(kind, op.msg_id, f"{op.token} #{k} due {due_lo}..{due_hi} never delivered")


def _judge_occurrence(
    verdict: Verdict, op: Op, k: int, ds: list[Delivery], *, rest: list[Op], rules: Rules
) -> None:
    """Occurrence ``k`` of write ``op`` was delivered as ``ds`` (in append-time order)."""
    first = ds[0]
    for extra in ds[1:]:
        verdict.add("duplicate", op.msg_id, f"{op.token} #{k} again at {_where(extra)}")
    if not 1 <= k <= op.repeat_count:
        verdict.add("series_extra", op.msg_id, f"{op.token} #{k} of {op.repeat_count}")
        return
    due_lo, _ = op.occurrence_due(k)
    for d in ds:
        if d.ts_ms < due_lo - rules.early_tolerance_ms:
            verdict.add(
                "early", op.msg_id, f"{op.token} #{k} {due_lo - d.ts_ms} ms early, {_where(d)}"
            )
    if not op.acked:
        return  # never promised: it may have been written after its cancel
    # A confirmed cancel speaks for the id's latest write before it only.
    upto = next((j for j, s in enumerate(rest) if s.kind in WRITES), len(rest))
    series = op.repeat_count > 1
    cancel = next(
        (c for c in rest[:upto] if c.confirmed and (not series or _after(first, c.done_ms))),
        None,
    )
    if cancel is not None:
        verdict.add(
            "delivered_after_cancel",
            op.msg_id,
            f"{op.token} #{k} at {_where(first)}; {cancel.kind} answered 200 at {cancel.done_ms}",
        )
        return
    superseder = next(
        (
            s
            for s in rest
            if s.kind in SUPERSEDES
            and s.acked
            and s.done_ms is not None
            and s.done_ms + rules.margin_ms < due_lo
        ),
        None,
    )
    if superseder is not None:
        verdict.add(
            "resurrected",
            op.msg_id,
            f"{op.token} #{k} due >= {due_lo} delivered at {_where(first)}; {superseder.kind} "
            f"acknowledged at {superseder.done_ms}",
        )


def _after(d: Delivery, done_ms: int | None) -> bool:
    return done_ms is not None and d.ts_ms > done_ms


def _judge_order(
    verdict: Verdict,
    writes: dict[str, Op],
    by_token: dict[str, list[Delivery]],
    rules: Rules,
    several_shards: Sequence[tuple[int, int]],
) -> None:
    """Single, acknowledged, delayed writes only, by their first delivery, appended while one
    shard released."""
    tol = rules.order_tolerance_ms
    per_partition: dict[tuple[str, int], list[tuple[Delivery, Op]]] = defaultdict(list)
    for token, ds in by_token.items():
        op, first = writes[token], ds[0]
        if any(lo - tol <= first.ts_ms <= hi + tol for lo, hi in several_shards):
            continue
        if op.acked and op.repeat_count == 1 and op.kind != "immediate" and op.done_ms:
            if op.done_ms > op.occurrence_due(1)[1]:  # overdue on arrival: released when read
                continue
            per_partition[(first.topic, first.partition)].append((first, op))
    for rows in per_partition.values():
        rows.sort(key=lambda row: row[0].offset)
        for j, (late, late_op) in enumerate(rows):
            late_hi, acked = late_op.occurrence_due(1)[1], late_op.done_ms or 0
            for before, before_op in rows[:j]:
                if late_hi + tol < before_op.occurrence_due(1)[0] and acked + tol < before.ts_ms:
                    verdict.add(
                        "order_inversion",
                        late_op.msg_id,
                        f"{late_op.token} (due <= {late_hi}) at {_where(late)} after "
                        f"{before_op.token} (due >= {before_op.due_lo}) at {_where(before)}",
                    )
                    break


def explain(history: History, deliveries: Iterable[Delivery], msg_id: str) -> str:
    """An id's history and deliveries, one line each, for a violation's report."""
    ops = history.ops.get(msg_id, [])
    tokens = {op.token for op in ops if op.token}
    lines = [
        f"  {op.kind:<22} sent={op.sent_ms} done={op.done_ms} {op.outcome}"
        + (f" {op.status}" if op.status is not None else "")
        + (f" token={op.token} due={op.due_lo}..{op.due_hi}" if op.token else "")
        + (f" x{op.repeat_count}/{op.period_ms}ms" if op.repeat_count > 1 else "")
        + (f" {op.answer}" if op.answer else "")
        for op in ops
    ]
    lines += [
        f"  delivered {d.token} #{d.occurrence or 1} {_where(d)}"
        for d in sorted(deliveries, key=lambda d: d.ts_ms)
        if d.token in tokens
    ]
    return "\n".join(lines)
